"""`make bench` leaves the checkout clean: where the suite and the migration piece write
by default, git ignores; only `make bench-record` writes the tracked bench/results."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bench import migration, run

pytestmark = pytest.mark.timeout(30)
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
@pytest.mark.parametrize(
    "written",
    [run.RESULTS / "latest.json", run.RESULTS / "latest.png", migration.RESULTS / "migration.json"],
)
def test_a_default_run_writes_only_where_git_ignores(written: Path) -> None:
    ignored = subprocess.run(
        ["git", "-C", str(ROOT), "check-ignore", "-q", str(written)], check=False
    )
    assert ignored.returncode == 0, f"{written} would show in git status"


def test_bench_record_writes_the_tracked_results() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "bench-record:" in makefile
    assert "-m bench.run --results bench/results $(ARGS)" in makefile
    assert (ROOT / "bench" / "results" / "latest.json").exists()
