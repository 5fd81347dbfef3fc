"""`shardlimit up` refuses a rules file or Envoy descriptors its routers would refuse
(read by the router's own parsers) before anything starts: one line, exit status 2, no
data dir, no process. A rules file its config names that does not exist is refused the
same way. Descriptors with a key given twice stop `serve router` in one line too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cluster.local.ports import free_port, free_port_run

pytestmark = pytest.mark.timeout(90)

CALENDAR = "[{algorithm: calendar, period: day, timezone: Mars/Olympus, max_count: 5}]"
BAD_RULES = [
    (
        f"rules:\n  daily:\n    limits: {CALENDAR}\n",
        ": rules.daily.limits[0].timezone: unknown timezone 'Mars/Olympus'",
    ),
    (
        "rules:\n  basic:\n    limits: 5/fortnight\n",
        ": rules.basic.limits[0]: '5/fortnight' is not a rate like '10/second' or '500/7 days'",
    ),
    (
        "rules:\n  basic:\n    limits: [{algorithm: fixed_window, limit: 2.5, window: 1m}]\n",
        ": rules.basic.limits[0].limit: must be an integer",
    ),
    (
        "rules:\n  basic:\n    limits: [5/minute\n",
        ":4:1: not YAML: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence)",
    ),
    (
        "rules:\n  basic:\n    limits: 5/minute\n  basic:\n    limits: 6/minute\n",
        ":4:3: not YAML: duplicate key 'basic' (first at line 2, column 3)",
    ),
    (
        "rules:\n  0x10:\n    limits: 5/minute\n",
        ':2:3: rule name 0x10 is the int 16 to YAML: quote it ("0x10":)',
    ),
]
HEAD = "domain: web\ndescriptors:\n  - key: k\n"
TWICE = HEAD + "    key: j\n    rate_limit: {unit: second, requests_per_unit: 5}\n"
BAD_DESCRIPTORS = [
    (TWICE, ":4:5: not YAML: duplicate key 'key' (first at line 3, column 5)"),
    (
        HEAD + "    rate_limit: {unit: fortnight, requests_per_unit: 5}\n",
        ": web.descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'",
    ),
    (
        HEAD + "    rate_limit: {unit: second, requests_per_unit: 1.5}\n",
        ": documents[0].descriptors[0].rate_limit.requests_per_unit: error checking config: "
        "1.5 is a float; a value here must be a string, an integer or a boolean",
    ),
    ("domain: [web\n", ":2:1: not YAML: expected ',' or ']', but got '<stream end>'"),
]


def _up(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "cluster.cli", "up", "--port", str(free_port())),
            *("--nodes", "1", "--base-port", str(free_port_run(1)), *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, SHARDLIMIT_ADMIN_TOKEN="admin-of-the-test"),
    )


def _refused_config(tmp_path: Path, config_text: str) -> str:
    """What `up --config` of `config_text` says on stderr; it must have refused (exit 2,
    nothing on stdout) before making its data directory."""
    config = tmp_path / "cluster.yaml"
    config.write_text(config_text)
    data_dir = tmp_path / "data"
    done = _up("--config", str(config), "--data-dir", str(data_dir))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert not data_dir.exists()
    return done.stderr


@pytest.mark.parametrize(
    ("text", "says"), BAD_RULES, ids=["timezone", "unit", "float", "not-yaml", "twice", "0x10"]
)
def test_up_refuses_a_rules_file_the_router_would_refuse_before_starting_anything(
    tmp_path: Path, text: str, says: str
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(text)
    stderr = _refused_config(tmp_path, "router: {rules_file: rules.yaml}\n")
    assert stderr == f"shardlimit up: {rules}{says}\n"


def test_up_refuses_a_rules_file_that_does_not_exist(tmp_path: Path) -> None:
    stderr = _refused_config(tmp_path, "router: {rules_file: gone.yaml}\n")
    assert stderr == (
        f"shardlimit up: cannot read {tmp_path / 'gone.yaml'}: the rules file does not exist\n"
    )


@pytest.mark.parametrize(
    ("text", "says"), BAD_DESCRIPTORS, ids=["twice", "unit", "float", "not-yaml"]
)
def test_up_refuses_envoy_descriptors_the_router_would_refuse_before_starting_anything(
    tmp_path: Path, text: str, says: str
) -> None:
    descriptors = tmp_path / "ratelimit.yaml"
    descriptors.write_text(text)
    data_dir = tmp_path / "data"
    done = _up(
        *("--grpc-port", str(free_port()), "--envoy-config", str(descriptors)),
        *("--data-dir", str(data_dir)),
    )
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith(f"shardlimit up: {descriptors}{says}"), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert not data_dir.exists()


def test_serve_router_refuses_envoy_descriptors_with_a_key_given_twice(tmp_path: Path) -> None:
    descriptors = tmp_path / "ratelimit.yaml"
    descriptors.write_text(TWICE)
    config = tmp_path / "cluster.yaml"
    router = {
        "port": free_port(),
        "grpc_port": free_port(),
        "data_dir": str(tmp_path / "router"),
        "envoy_config": str(descriptors),
    }
    nodes = [{"id": "n1", "url": f"http://127.0.0.1:{free_port()}"}]
    config.write_text(yaml.safe_dump({"router": router, "cluster": {"nodes": nodes}}))
    done = subprocess.run(
        [sys.executable, "-m", "cluster.cli", "serve", "router", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"shardlimit router: envoy config rejected: {descriptors}:4:5: not YAML: duplicate key 'key' "
        "(first at line 3, column 5)"
    )


def test_up_refuses_tls_settings_before_starting_anything(tmp_path: Path) -> None:
    """Its nodes serve plain HTTP, which a router with TLS settings would refuse only
    once Redis and the nodes were up."""
    stderr = _refused_config(tmp_path, "router: {tls_cert: router.pem, tls_key: router.key}\n")
    assert stderr == (
        f"shardlimit up: {tmp_path / 'cluster.yaml'}: router.tls_cert, router.tls_key: a local "
        "cluster runs without TLS; start a TLS cluster with `shardlimit serve node` and "
        "`serve router` (docs/tls.md)\n"
    )
