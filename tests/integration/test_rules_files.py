"""What a rules file says is what is published, or it is refused in one line naming the
file: a bare rule name YAML reads as a number or a date, a key given twice, bytes that
are not UTF-8, a file that is gone. `shardlimit rules apply --dry-run` refuses what the
apply refuses. Real router and node HTTP servers, the CLI as a child process."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.conftest import Cluster, eventually
from tests.integration.test_rules_apply import _cli, _rules

pytestmark = pytest.mark.timeout(60)


async def _rejected_cause(cluster: Cluster) -> str | None:
    status, body = await cluster.get("/v1/rules")
    assert status == 200
    rejected = body["file"]["rejected"]
    return None if rejected is None else str(rejected["cause"])


@pytest.mark.parametrize(
    ("written", "read"),
    [
        ("0x10", "int 16"),
        ("010", "int 8"),
        ("1_0", "int 10"),
        ("12:30", "int 750"),
        (".5", "float 0.5"),
        ("+1", "int 1"),  # quoted, not a rule name either: refused as such
        ("2030-01-01", "date 2030-01-01"),
    ],
)
async def test_a_bare_rule_name_yaml_reads_as_another_type_is_refused_until_quoted(
    cluster: Cluster, tmp_path: Path, written: str, read: str
) -> None:
    before = await _rules(cluster)
    path = tmp_path / "named.yaml"
    body = "\n    limits: 3/minute\n"
    path.write_text(f"rules:\n  basic:{body}  {written}:{body}")
    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path), "--dry-run")
    assert (code, out, err) == (
        2,
        "",
        f"shardlimit: {path}:4:3: rule name {written} is the {read} to YAML: "
        f'quote it ("{written}":)\n',
    )
    path.write_text(f'rules:\n  basic:{body}  "{written}":{body}')
    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path), "--prune")
    if written.startswith("+"):
        assert (code, out) == (2, ""), err
        assert f"rules.{written}: rule names are 1-64 characters" in err
        return
    assert code == 0, err
    assert await _rules(cluster) == (before[0] + 1, sorted([written, "basic"]))


async def test_a_key_given_twice_is_refused_by_apply_and_by_the_router(
    cluster: Cluster, tmp_path: Path
) -> None:
    assert cluster.rules_file is not None
    before = await _rules(cluster)
    twice = (
        "rules:\n  basic:\n    limits: 5/minute\n  login:\n    limits: 3/minute\n"
        "  basic:\n    limits: 7/minute\n"
    )
    field_twice = "rules:\n  basic:\n    limits: 5/minute\n    limits: 7/minute\n"
    for text, where in (
        (twice, ":6:3: not YAML: duplicate key 'basic' (first at line 2, column 3)"),
        (field_twice, ":4:5: not YAML: duplicate key 'limits' (first at line 3, column 5)"),
    ):
        path = tmp_path / "twice.yaml"
        path.write_text(text)
        for dry_run in ((), ("--dry-run",)):
            code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path), *dry_run)
            assert (code, out, err) == (2, "", f"shardlimit: {path}{where}\n")
        cluster.rules_file.write_text(text)
        cause = f"{cluster.rules_file}{where}"

        async def refused(cause: str = cause) -> bool:
            return await _rejected_cause(cluster) == cause

        await eventually(refused)
        assert await _rules(cluster) == before


async def test_apply_of_a_file_that_is_not_utf8_is_one_line_exit_2(
    cluster: Cluster, tmp_path: Path
) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("rules:\n  café:\n    limits: 5/minute\n".encode("latin-1"))
    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path))
    assert (code, out, err) == (
        2,
        "",
        f"shardlimit: {path}: not UTF-8 text (byte 0xe9 at offset 12)\n",
    )


async def test_a_dry_run_refuses_what_the_apply_refuses(cluster: Cluster, tmp_path: Path) -> None:
    assert cluster.rules_file is not None
    before = await _rules(cluster)
    path = tmp_path / "expired.yaml"
    path.write_text(
        cluster.rules_file.read_text()
        + "  gone:\n    limits:\n"
        + "      - {algorithm: quota, limit: 5, expires_at: '2020-01-01T00:00:00Z'}\n"
    )
    said = f"shardlimit: {path}: rules.gone.limits[0].expires_at: must be in the future\n"
    for dry_run in (("--dry-run",), ()):
        code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path), *dry_run)
        assert (code, out, err) == (2, "", said)
    assert await _rules(cluster) == before


async def test_no_changes_is_one_whole_line(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    version, _names = await _rules(cluster)
    for dry_run in ((), ("--dry-run",)):
        code, out, err = await _cli(
            cluster, "rules", "apply", "-f", str(cluster.rules_file), *dry_run
        )
        assert (code, out, err) == (
            0,
            f"no changes: the cluster's rules (version {version}) match {cluster.rules_file}\n",
            "",
        )


async def test_a_deleted_rules_file_is_said_missing_and_the_rules_stay(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    before = await _rules(cluster)
    kept = cluster.rules_file.read_text()
    cluster.rules_file.unlink()
    missing = f"cannot read {cluster.rules_file}: the rules file does not exist"

    async def said_missing() -> bool:
        return await _rejected_cause(cluster) == missing

    await eventually(said_missing)
    assert await _rules(cluster) == before
    cluster.rules_file.write_text(kept)

    async def accepted() -> bool:
        return await _rejected_cause(cluster) is None

    await eventually(accepted)
    assert await _rules(cluster) == before


async def test_a_router_whose_rules_file_does_not_exist_starts_nothing(tmp_path: Path) -> None:
    from cluster.local.redis_proc import free_port

    config = tmp_path / "router.yaml"
    rules = tmp_path / "no-such-rules.yaml"
    port = free_port()
    config.write_text(
        f"router: {{host: 127.0.0.1, port: {port}, data_dir: {tmp_path / 'data'},"
        f" rules_file: {rules}}}\n"
        f"cluster: {{nodes: [{{id: n1, url: 'http://127.0.0.1:{free_port()}'}}]}}\n"
    )
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cluster.cli", "serve", "router", "--config", str(config)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), 20)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 2, (out, err)
    assert "Traceback" not in err.decode()
    assert err.decode().splitlines()[-1] == (
        "shardlimit router: rules file rejected: "
        f"rules_file: cannot read {rules}: the rules file does not exist"
    )
    assert "listening on" not in err.decode()
