"""The distribution ships every package of the source tree: setuptools builds a wheel from
the explicit list in pyproject.toml, so a new sub-package left out of it would exist in a
checkout (and in an editable install) but not in an installed shardlimit."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("cluster", "router", "node")


def _source_packages() -> set[str]:
    return {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in SHIPPED
        for init in (ROOT / top).rglob("__init__.py")
    }


def test_every_source_package_is_in_the_wheel() -> None:
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert _source_packages() - set(listed) == set()
    # Also listed: folders of package data only (the Lua scripts), each one that exists.
    assert [name for name in listed if not (ROOT / name.replace(".", "/")).is_dir()] == []
    assert len(listed) == len(set(listed))
