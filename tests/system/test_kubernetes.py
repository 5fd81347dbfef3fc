"""compose/kubernetes/ holds valid Kubernetes objects that run what the code really reads.

There is no cluster on the build machines: every manifest is validated offline against
the Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: unknown fields are
errors), then cross-checked against the code: the command lines parse with the real
`shardlimit` parser, every environment variable is one the code reads, every port is
the one the command line binds, every HTTP probe path is a registered route, and the
ConfigMap's cluster.yaml and rules.yaml load with the project's own loaders.
"""

from __future__ import annotations

import ast
import importlib
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from cluster import wire
from cluster.cli.parser import build_parser
from cluster.web.auth import ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV
from router.config import RouterConfig, load_config
from router.rules.book import parse_rules_document

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "compose" / "kubernetes"
NAMESPACE = "shardlimit"
# An older release still widely run, and the newest the installed package has schemas for.
KUBE_VERSIONS = ("1.30.0", "1.37.0")
MANIFESTS = sorted(p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
LOG_LEVEL_ENV = "SHARDLIMIT_LOG_LEVEL"
HTTP_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"})
VAR_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")

Doc = dict[str, Any]


# ---------------------------------------------------------------- helpers


def _dict(value: object) -> Doc:
    assert isinstance(value, dict), value
    return value


def _list(value: object) -> list[Any]:
    assert isinstance(value, list), value
    return value


def _docs(name: str) -> list[Doc]:
    return [_dict(d) for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]


def all_docs() -> list[Doc]:
    return [doc for name in MANIFESTS for doc in _docs(name)]


def one(kind: str, name: str) -> Doc:
    found = [d for d in all_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} documents"
    return found[0]


def deployment() -> Doc:
    return one("Deployment", "shardlimit-router")


def statefulset() -> Doc:
    return one("StatefulSet", "shardlimit-node")


def pod_spec(workload: Doc) -> Doc:
    return _dict(workload["spec"]["template"]["spec"])


def pod_labels(workload: Doc) -> dict[str, str]:
    return _dict(workload["spec"]["template"]["metadata"]["labels"])


def container(workload: Doc, name: str) -> Doc:
    found = [c for c in _list(pod_spec(workload)["containers"]) if c["name"] == name]
    assert len(found) == 1, f"container {name}: {len(found)}"
    return _dict(found[0])


def config_data() -> dict[str, str]:
    return _dict(one("ConfigMap", "shardlimit-config")["data"])


def env_of(c: Doc) -> dict[str, Doc]:
    return {e["name"]: _dict(e) for e in c.get("env", [])}


def expanded_args(c: Doc, pod_name: str) -> list[str]:
    """The container's args as the kubelet hands them over: `$(VAR)` from its env."""
    env = env_of(c)

    def value(match: re.Match[str]) -> str:
        entry = env[match.group(1)]
        if "value" in entry:
            return str(entry["value"])
        assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        return pod_name

    return [VAR_REF.sub(value, str(arg)) for arg in _list(c["args"])]


def flag(args: list[str], name: str) -> str:
    assert args.count(name) == 1, f"{name} in {args}"
    return args[args.index(name) + 1]


def named_port(c: Doc, port: int | str) -> int:
    if isinstance(port, int):
        return port
    found = [p["containerPort"] for p in c.get("ports", []) if p.get("name") == port]
    assert len(found) == 1, f"port {port!r} of container {c['name']}"
    return int(found[0])


def mount_for(workload: Doc, c: Doc, path: str) -> tuple[Doc, Doc]:
    """The volume mount holding `path` in container `c`, and its pod volume."""
    mounts = [
        m
        for m in c.get("volumeMounts", [])
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
    ]
    assert len(mounts) == 1, f"{path} in {c['name']}: mounts {mounts}"
    mount = _dict(mounts[0])
    volumes = [v for v in pod_spec(workload).get("volumes", []) if v["name"] == mount["name"]]
    templates = [
        {"name": t["metadata"]["name"], "persistentVolumeClaim": t}
        for t in workload["spec"].get("volumeClaimTemplates", [])
        if t["metadata"]["name"] == mount["name"]
    ]
    assert len(volumes) + len(templates) == 1, f"volume {mount['name']}"
    return mount, _dict((volumes or templates)[0])


def router_config(tmp_path: Path) -> RouterConfig:
    path = tmp_path / "cluster.yaml"
    path.write_text(config_data()["cluster.yaml"])
    return load_config(path)


def walk(value: object) -> Iterator[str]:
    """Every key and string value of a YAML document, recursively."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)
    elif isinstance(value, str):
        yield value


def _sources(*packages: str) -> Iterator[tuple[Path, ast.Module]]:
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(), str(path))


def _is_os_environ(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _is_env_reader(func: ast.expr) -> bool:
    """os.environ.get, os.getenv, or cluster.web.auth.token_from (a file or an env var)."""
    if isinstance(func, ast.Name):
        return func.id == "token_from"
    if not isinstance(func, ast.Attribute):
        return False
    if func.attr == "token_from":
        return True
    if func.attr == "get":
        return _is_os_environ(func.value)
    return func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os"


def env_names_read_by_code() -> set[str]:
    """Names of the environment variables cluster/, router/ and node/ read."""
    constants: dict[str, str] = {}
    read: list[ast.expr] = []
    for _path, tree in _sources("cluster", "router", "node"):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                constants[node.targets[0].id] = node.value.value
            elif isinstance(node, ast.Call) and node.args and _is_env_reader(node.func):
                read.append(node.args[0])
            elif isinstance(node, ast.Subscript) and _is_os_environ(node.value):
                read.append(node.slice)
    names: set[str] = set()
    for arg in read:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
        elif isinstance(arg, ast.Name) and arg.id in constants:
            names.add(constants[arg.id])
        elif isinstance(arg, ast.Attribute) and arg.attr in constants:
            names.add(constants[arg.attr])
    return names


def registered_routes(app_file: Path) -> set[tuple[str, str]]:
    """(method, path) of every `app.router.add_<method>(path, ...)` in an app module;
    paths are literals, module constants, constants imported by name or `wire.<NAME>`."""
    tree = ast.parse(app_file.read_text(), str(app_file))
    constants = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }

    imported = {
        alias.asname or alias.name: (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }

    def resolve(expr: ast.expr) -> str:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.Name) and expr.id in constants:
            return constants[expr.id]
        if isinstance(expr, ast.Name) and expr.id in imported:
            module, name = imported[expr.id]
            return str(getattr(importlib.import_module(module), name))
        if (
            isinstance(expr, ast.Attribute)
            and isinstance(expr.value, ast.Name)
            and expr.value.id == "wire"
        ):
            return str(getattr(wire, expr.attr))
        raise AssertionError(f"{app_file.name}: cannot resolve route path {ast.dump(expr)}")

    routes: set[tuple[str, str]] = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "router"
            and node.func.attr.startswith("add_")
        ):
            continue
        if node.func.attr == "add_route":
            method_expr, path_expr = node.args[0], node.args[1]
            method = resolve(method_expr).upper()
        else:
            method = node.func.attr.removeprefix("add_").upper()
            if method not in HTTP_METHODS:
                continue
            path_expr = node.args[0]
        routes.add((method, resolve(path_expr)))
    return routes


def http_probe_paths(c: Doc) -> dict[str, str]:
    return {p: str(c[p]["httpGet"]["path"]) for p in PROBES if p in c and "httpGet" in c[p]}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def image_version() -> str:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return str(project["version"])


# ---------------------------------------------------------------- schema validation


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("manifest", MANIFESTS)
def test_manifest_is_valid_kubernetes(manifest: str, version: str) -> None:
    docs = _docs(manifest)
    assert docs, f"{manifest} holds no document"
    for doc in docs:
        checked = kubernetes_validate.validate(doc, version, strict=True)
        # The schema of exactly this release was used, not an older fallback.
        assert checked == version.rsplit(".", 1)[0]


def test_strict_validation_refuses_an_unknown_field() -> None:
    doc = deployment()
    spec = pod_spec(doc)
    spec["containers"][0]["readinesProbe"] = spec["containers"][0].pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(doc, KUBE_VERSIONS[0], strict=True)


def test_inventory_namespace_and_kustomization() -> None:
    docs = all_docs()
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ConfigMap", "shardlimit-config"),
        ("Deployment", "shardlimit-router"),
        ("HorizontalPodAutoscaler", "shardlimit-router"),
        ("Namespace", NAMESPACE),
        ("PodDisruptionBudget", "shardlimit-node"),
        ("PodDisruptionBudget", "shardlimit-router"),
        ("Secret", "shardlimit-tokens"),
        ("Service", "shardlimit-nodes"),
        ("Service", "shardlimit-router"),
        ("StatefulSet", "shardlimit-node"),
    ]
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == NAMESPACE, doc["metadata"]["name"]
    kustomization = _dict(yaml.safe_load((K8S / "kustomization.yaml").read_text()))
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == MANIFESTS
    assert kustomization["resources"][0] == "namespace.yaml"


def test_no_tls_settings_are_referenced() -> None:
    # These manifests run plain HTTP inside the cluster network (TLS is opt-in); the
    # Secret's comment tells how to turn it on with the settings the code reads.
    for doc in all_docs():
        assert not [s for s in walk(doc) if "tls" in s.lower()], doc["metadata"]["name"]
    assert "tls_cert" in (K8S / "secret.yaml").read_text()


# ---------------------------------------------------------------- command lines, images


def test_shardlimit_containers_run_the_image_entrypoint() -> None:
    dockerfile = (ROOT / "compose" / "Dockerfile").read_text()
    assert re.search(r'^ENTRYPOINT \["shardlimit"\]$', dockerfile, re.MULTILINE)
    for c in (container(deployment(), "router"), container(statefulset(), "node")):
        assert "command" not in c, "args go to the image's `shardlimit` entrypoint"
        assert c["image"] == f"shardlimit:{image_version()}"
    assert [c["name"] for c in pod_spec(deployment())["containers"]] == ["router"]
    assert [c["name"] for c in pod_spec(statefulset())["containers"]] == ["node", "redis"]


def test_router_command_line_and_ports(tmp_path: Path) -> None:
    router = container(deployment(), "router")
    args = build_parser().parse_args(expanded_args(router, "shardlimit-router-x"))
    assert (args.command, args.service) == ("serve", "router")
    assert args.config == Path("/config/cluster.yaml")
    assert args.cluster_token_file is None and args.admin_token_file is None
    # cmd_router: --host/--port override the config file's.
    config = router_config(tmp_path)
    host = args.host or config.host
    port = config.port if args.port is None else args.port
    assert (host, port) == ("0.0.0.0", 8080)
    assert [(p["name"], p["containerPort"]) for p in router["ports"]] == [("http", port)]
    probe_ports = {named_port(router, router[p]["httpGet"]["port"]) for p in PROBES}
    assert probe_ports == {port}
    service = one("Service", "shardlimit-router")
    assert [named_port(router, p["targetPort"]) for p in service["spec"]["ports"]] == [port]
    assert selects(service["spec"]["selector"], pod_labels(deployment()))
    assert not selects(service["spec"]["selector"], pod_labels(statefulset()))


def test_node_command_line_ports_and_redis() -> None:
    sts = statefulset()
    node = container(sts, "node")
    args = build_parser().parse_args(expanded_args(node, "shardlimit-node-1"))
    assert (args.command, args.service) == ("serve", "node")
    assert args.id == "shardlimit-node-1"  # the pod name: stable, as in cluster.yaml
    assert (args.host, args.port) == ("0.0.0.0", 7001)
    assert not args.test_clock and args.cluster_token_file is None
    assert [(p["name"], p["containerPort"]) for p in node["ports"]] == [("http", args.port)]
    probe_ports = {named_port(node, node[p]["httpGet"]["port"]) for p in PROBES}
    assert probe_ports == {args.port}
    service = one("Service", "shardlimit-nodes")
    assert [named_port(node, p["targetPort"]) for p in service["spec"]["ports"]] == [args.port]
    assert [p["port"] for p in service["spec"]["ports"]] == [args.port]

    # The node's Redis is the pod's redis container, over localhost.
    redis = container(sts, "redis")
    redis_args = [str(a) for a in redis["args"]]
    assert redis_args[0] == "redis-server"
    redis_url = urlsplit(args.redis)
    assert (redis_url.scheme, redis_url.hostname, redis_url.path) == ("redis", "127.0.0.1", "/0")
    assert flag(redis_args, "--bind") == "127.0.0.1"
    assert redis_url.port == int(flag(redis_args, "--port")) == 6379
    assert "ports" not in redis  # loopback only: nothing to expose
    assert flag(redis_args, "--appendonly") == "yes"
    assert flag(redis_args, "--appendfsync") == "everysec"
    assert flag(redis_args, "--maxmemory-policy") == "noeviction"
    for probe in ("readinessProbe", "livenessProbe"):
        command = " ".join(redis[probe]["exec"]["command"])
        assert f"redis-cli -h 127.0.0.1 -p {redis_url.port} ping" in command


def test_redis_data_is_on_the_volume_claim_template() -> None:
    sts = statefulset()
    redis = container(sts, "redis")
    data_dir = flag([str(a) for a in redis["args"]], "--dir")
    mount, volume = mount_for(sts, redis, data_dir)
    assert mount["mountPath"] == data_dir == "/data"
    assert "persistentVolumeClaim" in volume
    claim = volume["persistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["redis-data"]
    assert "redis-data" not in {v["name"] for v in pod_spec(sts).get("volumes", [])}
    assert pod_spec(sts)["securityContext"]["fsGroup"] == 1000


# ---------------------------------------------------------------- environment, Secret


def test_every_env_variable_is_read_by_the_code() -> None:
    read = env_names_read_by_code()
    assert {ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV} <= read
    expected = {
        "router": (deployment(), {ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV}, set()),
        # POD_NAME only feeds `$(POD_NAME)` in the args (Kubernetes expands it): --id.
        "node": (statefulset(), {CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV}, {"POD_NAME"}),
    }
    for name, (workload, for_the_code, for_args) in expected.items():
        c = container(workload, name)
        env = env_of(c)
        assert len(env) == len(c.get("env", [])), f"{name}: duplicate env names"
        assert {n for n in env if n in read} == for_the_code
        assert set(env) - for_the_code == for_args
        referenced = {m for arg in c["args"] for m in VAR_REF.findall(str(arg))}
        assert referenced == for_args
        for helper in for_args:
            assert env[helper]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
            assert helper not in read
    assert "env" not in container(statefulset(), "redis")


def test_tokens_come_from_the_secret() -> None:
    secret = one("Secret", "shardlimit-tokens")
    assert set(secret["stringData"]) == {"admin-token", "cluster-token"}
    assert "data" not in secret
    text = (K8S / "secret.yaml").read_text()
    assert "openssl rand -hex 32" in text
    wanted = {
        ("router", ADMIN_TOKEN_ENV): "admin-token",
        ("router", CLUSTER_TOKEN_ENV): "cluster-token",
        ("node", CLUSTER_TOKEN_ENV): "cluster-token",
    }
    found: dict[tuple[str, str], str] = {}
    for workload, name in ((deployment(), "router"), (statefulset(), "node")):
        for env_name, entry in env_of(container(workload, name)).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == "shardlimit-tokens"
                found[(name, env_name)] = ref["key"]
    assert found == wanted


# ---------------------------------------------------------------- probes


def test_probe_paths_are_registered_get_routes() -> None:
    router_routes = registered_routes(ROOT / "router" / "app.py")
    node_routes = registered_routes(ROOT / "node" / "app.py")
    router_probes = http_probe_paths(container(deployment(), "router"))
    node_probes = http_probe_paths(container(statefulset(), "node"))
    # The router's /readyz is cluster-wide (503 while any node is down): not a pod signal.
    assert router_probes == {p: "/healthz" for p in PROBES}
    assert node_probes == {
        "startupProbe": wire.HEALTH_PATH,
        "readinessProbe": wire.READY_PATH,
        "livenessProbe": wire.HEALTH_PATH,
    }
    assert {("GET", p) for p in router_probes.values()} <= router_routes
    assert {("GET", p) for p in node_probes.values()} <= node_routes
    assert ("GET", "/readyz") in router_routes  # it exists, deliberately unused
    redis = container(statefulset(), "redis")
    assert {p for p in PROBES if p in redis} == {"readinessProbe", "livenessProbe"}
    assert http_probe_paths(redis) == {}


# ---------------------------------------------------------------- ConfigMap


def test_cluster_yaml_loads_and_names_the_statefulset_pods(tmp_path: Path) -> None:
    config = router_config(tmp_path)
    sts = statefulset()
    service = one("Service", "shardlimit-nodes")
    node_args = build_parser().parse_args(expanded_args(container(sts, "node"), "x"))
    replicas = sts["spec"]["replicas"]
    assert replicas == 3
    assert sts["spec"]["serviceName"] == service["metadata"]["name"] == "shardlimit-nodes"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert selects(service["spec"]["selector"], pod_labels(sts))
    assert not selects(service["spec"]["selector"], pod_labels(deployment()))
    assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels(sts))
    pods = [f"{sts['metadata']['name']}-{i}" for i in range(replicas)]
    domain = f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    assert [(n.id, n.url, n.weight) for n in config.nodes] == [
        (pod, f"http://{pod}.{domain}:{node_args.port}", 1) for pod in pods
    ]
    assert config.partitioner == "ring"
    assert config.rules_file == Path("/config/rules.yaml")
    assert config.data_dir == Path("/data/router")


def test_router_mounts_the_config_and_a_writable_data_dir(tmp_path: Path) -> None:
    workload = deployment()
    router = container(workload, "router")
    config = router_config(tmp_path)
    for path, key in (
        ("/config/cluster.yaml", "cluster.yaml"),
        (str(config.rules_file), "rules.yaml"),
    ):
        mount, volume = mount_for(workload, router, path)
        # A directory mount (no subPath): ConfigMap updates reach the pod (rules hot reload).
        assert "subPath" not in mount and mount["readOnly"] is True
        assert volume["configMap"]["name"] == "shardlimit-config"
        assert path.removeprefix(mount["mountPath"].rstrip("/") + "/") == key
        assert key in config_data()
    mount, volume = mount_for(workload, router, str(config.data_dir / "topology.json"))
    assert volume.get("emptyDir") == {} and not mount.get("readOnly", False)


def test_rules_yaml_parses_with_the_rules_parser() -> None:
    rules = parse_rules_document(yaml.safe_load(config_data()["rules.yaml"]))
    assert set(rules) == {"api", "ocr", "payments", "login", "search", "uploads", "basic"}
    assert rules["payments"].on_failure == "deny"
    assert [s.algorithm for s in rules["ocr"].limits] == ["calendar", "calendar"]


# ---------------------------------------------------------------- scaling, disruption


def test_router_scaling_and_resources() -> None:
    workload = deployment()
    assert workload["spec"]["replicas"] == 2
    router = container(workload, "router")
    assert router["resources"]["requests"]["cpu"] == "500m"
    assert router["resources"]["limits"]["cpu"] == "1"
    hpa = one("HorizontalPodAutoscaler", "shardlimit-router")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": workload["apiVersion"],
        "kind": "Deployment",
        "name": workload["metadata"]["name"],
    }
    assert hpa["spec"]["minReplicas"] == workload["spec"]["replicas"]
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    assert [(m["type"], m["resource"]["name"]) for m in hpa["spec"]["metrics"]] == [
        ("Resource", "cpu")
    ]
    for c in pod_spec(statefulset())["containers"]:
        assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
        assert {"cpu", "memory"} <= set(c["resources"]["limits"]), c["name"]


def test_disruption_budgets_cover_routers_and_nodes() -> None:
    for name, workload, other in (
        ("shardlimit-node", statefulset(), deployment()),
        ("shardlimit-router", deployment(), statefulset()),
    ):
        pdb = one("PodDisruptionBudget", name)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in pdb["spec"]
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert selects(selector, pod_labels(workload))
        assert not selects(selector, pod_labels(other))
