"""The layering of the packages, checked on the source (every import, also those inside
functions), so it holds by rule rather than by luck:

- `router` and `node` never import each other: they speak `cluster.wire`.
- `cluster.model` is pure: it imports nothing of this project outside itself, and no
  I/O library (aiohttp, redis, grpc, sockets).
- Inside `cluster`, only `cluster.cli` imports `router` or `node`.
- `cluster.sdk` (what applications install) imports only itself and the model, and
  nothing a server needs (redis, grpc, prometheus).
- `cluster.web` and `cluster.local` import only the model, the wire and themselves.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("cluster", "router", "node")
IO_LIBRARIES = ("aiohttp", "redis", "grpc", "socket", "asyncio", "prometheus_client")
SERVER_LIBRARIES = ("redis", "grpc", "prometheus_client", "xds_protos", "envoy")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                # `from cluster import wire` imports the module cluster.wire
                yield (
                    node.lineno,
                    f"{base}.{alias.name}"
                    if base in OURS or base.startswith(("cluster.",))
                    else base,
                )


def modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / package.replace(".", "/")).rglob("*.py"))


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def violations(
    package: str, allowed: tuple[str, ...], forbidden: tuple[str, ...], root: Path = ROOT
) -> list[str]:
    """Imports in `package` of our code outside `allowed`, or of any `forbidden` module."""
    found = []
    for path in modules(package, root):
        for line, name in imports_of(path, root):
            top = name.split(".")[0]
            ours = top in OURS
            if (ours and not any(within(name, a) for a in allowed)) or any(
                within(name, f) for f in forbidden
            ):
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return found


RULES = {
    "router": (("router", "cluster.wire", "cluster.model", "cluster.web"), ()),
    "node": (("node", "cluster.wire", "cluster.model", "cluster.web"), ()),
    "cluster.model": (("cluster.model",), IO_LIBRARIES),
    "cluster.sdk": (("cluster.sdk", "cluster.model"), SERVER_LIBRARIES),
    "cluster.web": (("cluster.web", "cluster.model", "cluster.wire"), ()),
    "cluster.local": (("cluster.local", "cluster.model", "cluster.web"), ()),
    "cluster.wire": ((), IO_LIBRARIES),
}


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_only_what_its_room_allows(package: str) -> None:
    allowed, forbidden = RULES[package]
    if package == "cluster.wire":
        paths = [ROOT / "cluster" / "wire.py"]
        found = [
            f"cluster/wire.py:{line} imports {name}"
            for line, name in imports_of(paths[0])
            if name.split(".")[0] in OURS or any(within(name, f) for f in forbidden)
        ]
    else:
        found = violations(package, allowed, forbidden)
    assert found == []


def test_only_the_cli_imports_router_or_node_inside_cluster() -> None:
    found = []
    for path in modules("cluster"):
        if within(module_name(path), "cluster.cli"):
            continue
        for line, name in imports_of(path):
            if within(name, "router") or within(name, "node"):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert found == []


def test_the_checker_sees_violations(tmp_path: Path) -> None:
    """The rules can fail: function-level, relative and `from cluster import x` imports."""
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "app.py").write_text(
        "from . import ops\nfrom cluster import cli\n\ndef f():\n    from router.app import x\n"
    )
    assert violations("node", RULES["node"][0], (), root=tmp_path) == [
        "node/app.py:2 imports cluster.cli",
        "node/app.py:5 imports router.app",
    ]


def test_cluster_holds_at_most_eight_modules_directly() -> None:
    direct = sorted(p.name for p in (ROOT / "cluster").glob("*.py"))
    assert len(direct) <= 8, direct
