"""The SDK's import paths of the previous release still work, with a DeprecationWarning,
and name the very same classes as cluster.sdk (isinstance and except keep working)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import cluster.sdk
from cluster._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_path_warns_and_is_the_new_module(old: str) -> None:
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old]):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])


def test_old_names_are_the_sdk_classes() -> None:
    sys.modules.pop("cluster.client", None)
    with pytest.warns(DeprecationWarning):
        client = importlib.import_module("cluster.client")
        decorator = importlib.import_module("cluster.decorator")
    assert (client.AsyncClient, client.Client, client.Unavailable, decorator.limited) == (
        cluster.sdk.AsyncClient,
        cluster.sdk.Client,
        cluster.sdk.Unavailable,
        cluster.sdk.limited,
    )


def test_the_sdk_imports_no_server_package() -> None:
    """An application importing the SDK loads neither the router, a node, Redis nor gRPC."""
    code = (
        "import sys, cluster.sdk; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('router', 'node', 'redis', 'grpc', 'prometheus_client', 'uhashring', 'yaml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_distribution_requires_only_what_the_sdk_imports() -> None:
    """`pip install shardlimit` brings the SDK's needs; servers take the `server` extra."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    names = {dep.split(">")[0].split("[")[0] for dep in project["project"]["dependencies"]}
    assert names == {"aiohttp", "orjson", "msgspec", "tzdata"}
    assert "redis>=5.0" in project["project"]["optional-dependencies"]["server"]
