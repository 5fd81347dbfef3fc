"""The layering of the packages, checked on the source (every import, also those inside
functions), so it holds by rule rather than by luck:

- `router` and `node` never import each other: they speak `cluster.wire`.
- `cluster.model` is pure: it imports nothing of this project outside itself, and no
  I/O library (aiohttp, redis, grpc, sockets).
- Inside `cluster`, only `cluster.cli` imports `router` or `node`.
- `cluster.sdk` (what applications install) imports only itself and the model, and
  nothing a server needs (redis, grpc, prometheus).
- `cluster.web` and `cluster.local` import only the model, the wire and themselves.

The rooms of the services (sub-packages, each with one job):

- `router.channel` (everything that talks to nodes) imports no other router room and
  no router module but `router.errors`.
- `router.front` and `router.envoy` reach the decision code only through
  `router.service` (or `router.api`'s shared check handling): nothing of
  `router.decide`, `router.channel` or `router.control`.
- The exception modules, `router.errors` and `node.errors`, import nothing of their
  service.
- `node.store` imports nothing of the node but `node.errors`.
- No import cycle among the product's modules, `TYPE_CHECKING` imports included.
- `router/` and `node/` hold at most 10 modules directly; no product module is over
  450 lines and no class over 250.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable, Iterator
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
                # and `from node.topology import kept` the module node.topology.kept
                package_of_ours = base.split(".")[0] in OURS and (
                    (root / base.replace(".", "/")).is_dir()
                )
                yield (
                    node.lineno,
                    f"{base}.{alias.name}"
                    if base in OURS or base.startswith(("cluster.",)) or package_of_ours
                    else base,
                )


def modules(package: str, root: Path = ROOT) -> list[Path]:
    """The files of a package, or the one file of a module (none: it does not exist)."""
    path = root / package.replace(".", "/")
    if path.is_dir():
        return sorted(path.rglob("*.py"))
    file = path.with_suffix(".py")
    return [file] if file.is_file() else []


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
    # a package (batch, channel, codec, control, paths)
    "cluster.wire": (("cluster.wire",), IO_LIBRARIES),
}


@pytest.mark.parametrize("package", sorted(RULES))
def test_package_imports_only_what_its_room_allows(package: str) -> None:
    allowed, forbidden = RULES[package]
    assert modules(package), f"{package} does not exist: move its rule with it"
    assert violations(package, allowed, forbidden) == []


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


# Rooms of the services: (allowed of our code, forbidden), as RULES. Imports of `cluster`
# are allowed here and held to the service's own rule above.
DECISION_ROOMS = ("router.decide", "router.channel", "router.control")
ROOM_RULES = {
    "router.channel": (("cluster", "router.channel", "router.errors"), ()),
    "router.front": (("cluster", "router"), DECISION_ROOMS),
    "router.envoy": (("cluster", "router"), DECISION_ROOMS),
    "router.errors": (("cluster",), ()),
    "node.errors": (("cluster",), ()),
    "node.store": (("cluster", "node.store", "node.errors"), ()),
}


@pytest.mark.parametrize("room", sorted(ROOM_RULES))
def test_room_imports_only_what_its_rule_allows(room: str) -> None:
    assert modules(room), f"{room} does not exist: move its rule with it"
    allowed, forbidden = ROOM_RULES[room]
    assert violations(room, allowed, forbidden) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checker_sees_room_violations(tmp_path: Path) -> None:
    """Each room rule can fail: a tree breaking every one of them, with relative,
    function-level, `TYPE_CHECKING` and `from package import module` imports."""
    _write(
        tmp_path,
        {
            "router/channel/link.py": "from router.errors import E\nfrom router import config\n",
            "router/channel/queue.py": "from ..control import view\n",
            "router/control/view.py": "",
            "router/front/server.py": "from router.service import Router\n"
            "def f():\n    from router.decide.spread import Spread\n",
            "router/envoy/servicer.py": "from router.channel.link import NodeLink\n",
            "router/errors.py": "from enum import Enum\nfrom router.requests import X\n",
            "node/errors.py": "from node import state\n",
            "node/store/counter_store.py": "from node.errors import E\n"
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from node.topology import ownership\n",
            "node/topology/ownership.py": "",
        },
    )
    found = {
        room: violations(room, allowed, forbidden, root=tmp_path)
        for room, (allowed, forbidden) in ROOM_RULES.items()
    }
    assert found == {
        "router.channel": [
            "router/channel/link.py:2 imports router.config",
            "router/channel/queue.py:1 imports router.control.view",
        ],
        "router.front": ["router/front/server.py:3 imports router.decide.spread"],
        "router.envoy": ["router/envoy/servicer.py:1 imports router.channel.link"],
        "router.errors": ["router/errors.py:2 imports router.requests"],
        "node.errors": ["node/errors.py:1 imports node.state"],
        "node.store": ["node/store/counter_store.py:4 imports node.topology.ownership"],
    }


PRODUCT = ("cluster", "router", "node")


def import_graph(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Each product module's imports of product modules: {module: {imported: where}}
    (an imported name resolves to the longest module it names, `a.b.Name` to `a.b`)."""
    paths = [path for package in PRODUCT for path in modules(package, root)]
    known = {module_name(path, root) for path in paths}
    graph: dict[str, dict[str, str]] = {}
    for path in paths:
        edges = graph.setdefault(module_name(path, root), {})
        for line, name in imports_of(path, root):
            parts = name.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts:
                edges.setdefault(".".join(parts), f"{path.relative_to(root)}:{line}")
    return graph


def cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """One cycle (its modules in import order, the first repeated at the end) through
    each group of modules that import each other (Tarjan's strongly connected
    components, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                elif target in on_stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1 or module in graph.get(module, {}):
                    groups.append(sorted(group))
    return [_cycle_in(graph, group) for group in groups]


def _cycle_in(graph: dict[str, dict[str, str]], group: Iterable[str]) -> list[str]:
    """The shortest cycle from the group's first module back to itself."""
    members = set(group)
    first = min(members)
    paths = {first: [first]}
    queue = [first]
    for module in queue:
        for target in sorted(graph.get(module, {})):
            if target == first:
                return [*paths[module], first]
            if target in members and target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise AssertionError(f"no cycle through {first}")  # a strongly connected group has one


def named(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    """A cycle as `a (a.py:3) -> b (b.py:7) -> a`: each import and where it is."""
    steps = [f"{a} ({graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_no_import_cycle_among_product_modules() -> None:
    graph = import_graph()
    assert [named(graph, cycle) for cycle in cycles(graph)] == []


def test_the_checker_sees_import_cycles(tmp_path: Path) -> None:
    """A cycle through a `TYPE_CHECKING` import and a relative one, a self-import, and
    modules that do not import each other (no cycle)."""
    _write(
        tmp_path,
        {
            "node/__init__.py": "",
            "node/state.py": "from node.holds import keeper\n",
            "node/holds/__init__.py": "",
            "node/holds/keeper.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from ..topology.kept import Kept\n",
            "node/topology/kept.py": "from node.state import NodeState\n",
            "router/app.py": "import router.app\nfrom router.service import Router\n",
            "router/service.py": "from cluster.wire import Op\n",
            "cluster/wire.py": "import msgspec\n",
        },
    )
    graph = import_graph(tmp_path)
    assert [named(graph, cycle) for cycle in cycles(graph)] == [
        "node.holds.keeper (node/holds/keeper.py:3) -> node.topology.kept "
        "(node/topology/kept.py:1) -> node.state (node/state.py:1) -> node.holds.keeper",
        "router.app (router/app.py:1) -> router.app",
    ]


@pytest.mark.parametrize("service", ["router", "node"])
def test_service_holds_at_most_ten_modules_directly(service: str) -> None:
    direct = sorted(p.name for p in (ROOT / service).glob("*.py"))
    assert len(direct) <= 10, direct


MAX_MODULE_LINES = 450
MAX_CLASS_LINES = 250


def oversized(package: str, root: Path = ROOT) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and classes over MAX_CLASS_LINES."""
    found = []
    for path in modules(package, root):
        text = path.read_text()
        where = path.relative_to(root)
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{where}:{node.lineno} class {node.name}: {size} lines")
    return found


@pytest.mark.parametrize("package", PRODUCT)
def test_no_module_over_450_lines_and_no_class_over_250(package: str) -> None:
    assert oversized(package) == []


def test_the_checker_sees_oversized_code(tmp_path: Path) -> None:
    body = "".join(f"    a{i} = {i}\n" for i in range(250))
    _write(
        tmp_path,
        {
            "router/big.py": "x = 1\n" * 451,
            "router/rooms/fits.py": "x = 1\n" * 450,
            "router/rooms/wide.py": f"class Wide:\n{body}",
            "router/rooms/narrow.py": "class Narrow:\n" + body.split("\n", 1)[1],
        },
    )
    assert oversized("router", tmp_path) == [
        "router/big.py: 451 lines",
        "router/rooms/wide.py:1 class Wide: 251 lines",
    ]
