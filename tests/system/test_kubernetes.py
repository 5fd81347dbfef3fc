"""compose/kubernetes/ holds valid Kubernetes objects that run what the code really reads.

There is no cluster on the build machines: every manifest is validated offline against
the Kubernetes OpenAPI schemas that kubernetes-validate ships (strict: unknown fields are
errors), then cross-checked against the code: the command lines parse with the real
`shardlimit` parser, every environment variable is one the code reads, every port is
the one the command line binds, every HTTP probe path is a registered route, and the
ConfigMap's cluster.yaml and rules.yaml load with the project's own loaders. The
replicated shards are checked the same way: each node's redis+sentinel:// URL names its
own id as the master and the Sentinel pods as the Sentinels, the Sentinels monitor every
node's shard (quorum 2) at its Redis StatefulSet's pod 0, each shard has two replicas, and
the start scripts are the ones compose/redis/ holds (tests/unit/test_compose_sentinel.py
runs them). Each shard is served by at least two node processes (endpoints), the pods
of its own node StatefulSet, which a required pod anti-affinity keeps on different hosts:
every pod runs with the shard's --id and --redis, and every URL cluster.yaml lists for
the shard resolves, through the headless Service, to one of those pods and its port.
"""

from __future__ import annotations

import argparse
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
from cluster.model.sentinel_url import parse_sentinel_url
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
CLUSTER_DOMAIN = "svc.cluster.local"
REDIS_SCRIPTS = ROOT / "compose" / "redis"

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


def sentinels() -> Doc:
    return one("StatefulSet", "shardlimit-sentinel")


def shard_statefulsets(component: str) -> dict[str, Doc]:
    """The StatefulSet of each shard of a component, by the node id it serves (its label)."""
    found = [
        d
        for d in all_docs()
        if d["kind"] == "StatefulSet"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    by_shard = {d["metadata"]["labels"]["shardlimit/shard"]: d for d in found}
    assert len(by_shard) == len(found), f"one {component} StatefulSet per shard"
    return by_shard


def redis_statefulsets() -> dict[str, Doc]:
    """The Redis StatefulSet of each shard, by the node id it serves."""
    return shard_statefulsets("redis")


def node_statefulsets() -> dict[str, Doc]:
    """The node StatefulSet of each shard (its pods are the shard's endpoints), by node id."""
    return shard_statefulsets("node")


def node_workloads() -> list[Doc]:
    return list(node_statefulsets().values())


def node_args(sts: Doc, pod: str) -> argparse.Namespace:
    """The command line a node pod runs, parsed by the real `shardlimit` parser."""
    return build_parser().parse_args(expanded_args(container(sts, "node"), pod))


def pod_dns() -> dict[str, tuple[Doc, str]]:
    """Every StatefulSet pod's stable DNS name: (its StatefulSet, the pod name)."""
    names: dict[str, tuple[Doc, str]] = {}
    for sts in statefulsets():
        for pod in pod_names(sts):
            host = pod_host(sts, pod)
            assert host not in names, f"two pods named {host}"
            names[host] = (sts, pod)
    return names


def statefulsets() -> list[Doc]:
    return [d for d in all_docs() if d["kind"] == "StatefulSet"]


def pod_names(sts: Doc) -> list[str]:
    return [f"{sts['metadata']['name']}-{i}" for i in range(sts["spec"]["replicas"])]


def pod_host(sts: Doc, pod: str) -> str:
    """A StatefulSet pod's stable DNS name through its headless Service."""
    service = one("Service", sts["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert selects(service["spec"]["selector"], pod_labels(sts))
    return f"{pod}.{service['metadata']['name']}.{NAMESPACE}.{CLUSTER_DOMAIN}"


def redis_data() -> dict[str, str]:
    return _dict(one("ConfigMap", "shardlimit-redis")["data"])


def sentinel_conf() -> list[list[str]]:
    """The Sentinels' configuration template, one list of words per directive."""
    return [
        line.split()
        for line in redis_data()["sentinel.conf"].splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def expanded_env(c: Doc, pod_name: str) -> dict[str, str]:
    """The container's plain environment values, `$(VAR)` expanded as the kubelet does."""
    values: dict[str, str] = {}
    for entry in c.get("env", []):
        if "value" in entry:
            values[entry["name"]] = VAR_REF.sub(lambda m: values[m.group(1)], str(entry["value"]))
        elif entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}:
            values[entry["name"]] = pod_name
    return values


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
        ("ConfigMap", "shardlimit-redis"),
        ("Deployment", "shardlimit-router"),
        ("HorizontalPodAutoscaler", "shardlimit-router"),
        ("Namespace", NAMESPACE),
        ("PodDisruptionBudget", "shardlimit-node"),
        ("PodDisruptionBudget", "shardlimit-redis"),
        ("PodDisruptionBudget", "shardlimit-router"),
        ("PodDisruptionBudget", "shardlimit-sentinel"),
        ("Secret", "shardlimit-tokens"),
        ("Service", "shardlimit-nodes"),
        ("Service", "shardlimit-redis"),
        ("Service", "shardlimit-router"),
        ("Service", "shardlimit-sentinel"),
        ("StatefulSet", "shardlimit-node-0"),
        ("StatefulSet", "shardlimit-node-0-redis"),
        ("StatefulSet", "shardlimit-node-1"),
        ("StatefulSet", "shardlimit-node-1-redis"),
        ("StatefulSet", "shardlimit-node-2"),
        ("StatefulSet", "shardlimit-node-2-redis"),
        ("StatefulSet", "shardlimit-sentinel"),
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
    nodes = node_workloads()
    for c in (container(deployment(), "router"), *(container(n, "node") for n in nodes)):
        assert "command" not in c, "args go to the image's `shardlimit` entrypoint"
        assert c["image"] == f"shardlimit:{image_version()}"
    assert [c["name"] for c in pod_spec(deployment())["containers"]] == ["router"]
    for sts in nodes:
        assert [c["name"] for c in pod_spec(sts)["containers"]] == ["node"]
        # A node pod holds no data: its shard's counters are in the Redis StatefulSets.
        assert "volumeClaimTemplates" not in sts["spec"]


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
    for sts in node_workloads():
        assert not selects(service["spec"]["selector"], pod_labels(sts))


def test_node_command_line_ports_and_redis() -> None:
    service = one("Service", "shardlimit-nodes")
    for shard, sts in node_statefulsets().items():
        node = container(sts, "node")
        for pod in pod_names(sts):
            args = node_args(sts, pod)
            assert (args.command, args.service) == ("serve", "node")
            # Every endpoint runs as the shard: the id the topology gives its keys to.
            assert args.id == shard == sts["metadata"]["name"]
            assert (args.host, args.port) == ("0.0.0.0", 7001)
            assert not args.test_clock and args.cluster_token_file is None
            # Fixed side ports, declared (for a NetworkPolicy that lists ports).
            assert (args.channel_port, args.liveness_port) == (7002, 7003)
            assert [(p["name"], p["containerPort"]) for p in node["ports"]] == [
                ("http", args.port),
                ("channel", args.channel_port),
                ("liveness", args.liveness_port),
            ]
            probe_ports = {named_port(node, node[p]["httpGet"]["port"]) for p in PROBES}
            assert probe_ports == {args.port}
            assert [named_port(node, p["targetPort"]) for p in service["spec"]["ports"]] == [
                args.port
            ]
            assert [p["port"] for p in service["spec"]["ports"]] == [args.port]
            # The node's Redis is its shard's primary, found through the Sentinels.
            assert parse_sentinel_url(args.redis).master == args.id


def test_each_node_finds_its_own_shard_through_the_sentinel_pods() -> None:
    sentinel_sts = sentinels()
    sentinel = container(sentinel_sts, "sentinel")
    sentinel_port = named_port(sentinel, "sentinel")
    conf_port = [int(d[1]) for d in sentinel_conf() if d[0] == "port"]
    assert conf_port == [sentinel_port] == [26379]
    service = one("Service", "shardlimit-sentinel")
    assert [named_port(sentinel, p["targetPort"]) for p in service["spec"]["ports"]] == [
        sentinel_port
    ]
    assert [p["port"] for p in service["spec"]["ports"]] == [sentinel_port]
    expected = tuple(
        (pod_host(sentinel_sts, pod), sentinel_port) for pod in pod_names(sentinel_sts)
    )
    assert len(expected) == 3
    shards = node_statefulsets()
    assert sorted(shards) == sorted(redis_statefulsets())
    for shard, sts in shards.items():
        for pod in pod_names(sts):
            args = node_args(sts, pod)
            url = parse_sentinel_url(args.redis)
            assert args.id == url.master == shard
            assert url.sentinels == expected
            assert (url.db, url.username, url.password) == (0, None, None)


def test_each_shard_has_two_endpoints_on_different_hosts() -> None:
    shards = node_statefulsets()
    assert len(shards) == 3
    others = [*redis_statefulsets().values(), sentinels(), deployment()]
    for shard, sts in shards.items():
        assert sts["metadata"]["name"] == shard
        assert sts["spec"]["replicas"] >= 2, f"{shard}: one lost host must leave an endpoint"
        assert sts["spec"]["serviceName"] == "shardlimit-nodes"
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        labels = pod_labels(sts)
        assert labels["shardlimit/shard"] == shard
        assert selects(sts["spec"]["selector"]["matchLabels"], labels)
        for other in [*shards.values(), *others]:
            if other is not sts:
                assert not selects(sts["spec"]["selector"]["matchLabels"], pod_labels(other))
        # Required, on the host: no two endpoints of the shard are ever placed together.
        affinity = pod_spec(sts)["affinity"]
        assert set(affinity) == {"podAntiAffinity"}
        anti = affinity["podAntiAffinity"]
        assert set(anti) == {"requiredDuringSchedulingIgnoredDuringExecution"}
        terms = _list(anti["requiredDuringSchedulingIgnoredDuringExecution"])
        assert len(terms) == 1
        # No namespaces / namespaceSelector: the term applies in the pod's own namespace.
        assert set(terms[0]) == {"topologyKey", "labelSelector"}
        assert terms[0]["topologyKey"] == "kubernetes.io/hostname"
        assert set(terms[0]["labelSelector"]) == {"matchLabels"}
        repelled = terms[0]["labelSelector"]["matchLabels"]
        assert selects(repelled, labels)
        # Only its own shard's endpoints: 3 shards of 2 fit on 2 hosts.
        for other in [*shards.values(), *others]:
            if other is not sts:
                assert not selects(repelled, pod_labels(other))


def test_the_sentinels_watch_every_shard_with_quorum_2(tmp_path: Path) -> None:
    sentinel_sts = sentinels()
    assert sentinel_sts["spec"]["replicas"] == 3
    conf = sentinel_conf()
    assert ["sentinel", "resolve-hostnames", "yes"] in conf
    assert ["sentinel", "announce-hostnames", "yes"] in conf
    # Hostnames must be allowed before the first monitor line names one.
    first_monitor = next(i for i, d in enumerate(conf) if d[:2] == ["sentinel", "monitor"])
    assert conf.index(["sentinel", "resolve-hostnames", "yes"]) < first_monitor
    node_ids = [n.id for n in router_config(tmp_path).nodes]
    shards = redis_statefulsets()
    assert sorted(shards) == sorted(node_ids)
    monitors = {d[2]: d[3:] for d in conf if d[:2] == ["sentinel", "monitor"]}
    assert len(monitors) == len([d for d in conf if d[:2] == ["sentinel", "monitor"]])
    expected = {}
    for node_id in node_ids:
        redis_sts = shards[node_id]
        port = named_port(container(redis_sts, "redis"), "redis")
        expected[node_id] = [pod_host(redis_sts, pod_names(redis_sts)[0]), str(port), "2"]
    assert monitors == expected
    for node_id in node_ids:
        settings = {
            tuple(d[1:2]): d[3:] for d in conf if d[0] == "sentinel" and d[2:3] == [node_id]
        }
        assert settings[("down-after-milliseconds",)] == ["1200"]
        assert settings[("parallel-syncs",)] == ["1"]
        assert int(settings[("failover-timeout",)][0]) >= 2 * 1000


def test_the_sentinel_config_is_written_where_the_sentinel_reads_it() -> None:
    sts = sentinels()
    init = _list(pod_spec(sts)["initContainers"])
    assert [c["name"] for c in init] == ["sentinel-config"]
    sentinel = container(sts, "sentinel")
    assert sentinel["args"][0] == "redis-server" and sentinel["args"][2:] == ["--sentinel"]
    conf_path = sentinel["args"][1]
    script, template, output = init[0]["command"][1:]
    assert init[0]["command"][0] == "sh" and output == conf_path
    # Sentinel rewrites its file: a writable emptyDir, the same in both containers.
    mount, volume = mount_for(sts, sentinel, conf_path)
    assert volume.get("emptyDir") == {} and not mount.get("readOnly", False)
    assert mount_for(sts, init[0], output)[1] == volume
    for path, key in ((script, "sentinel-config.sh"), (template, "sentinel.conf")):
        mount, volume = mount_for(sts, init[0], path)
        assert mount["readOnly"] is True and volume["configMap"]["name"] == "shardlimit-redis"
        assert path.removeprefix(mount["mountPath"].rstrip("/") + "/") == key
    for pod in pod_names(sts):
        env = expanded_env(init[0], pod)
        assert env["SELF"] == pod_host(sts, pod)
        assert env["SENTINELS"].split() == [
            f"{pod_host(sts, p)}:{named_port(sentinel, 'sentinel')}" for p in pod_names(sts)
        ]
    assert {c["image"] for c in (sentinel, init[0])} == {"redis:7.2-alpine"}


def test_each_shard_has_a_primary_and_two_replicas() -> None:
    sentinel_sts = sentinels()
    sentinel_addresses = [
        f"{pod_host(sentinel_sts, p)}:{named_port(container(sentinel_sts, 'sentinel'), 'sentinel')}"
        for p in pod_names(sentinel_sts)
    ]
    for node_id, sts in redis_statefulsets().items():
        assert sts["metadata"]["name"] == f"{node_id}-redis"
        # A primary and two replicas: one host lost, the promoted replica still has a
        # replica to acknowledge `durability: replica` checks.
        assert sts["spec"]["replicas"] >= 3
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        assert sts["spec"]["serviceName"] == "shardlimit-redis"
        assert selects(sts["spec"]["selector"]["matchLabels"], pod_labels(sts))
        for other_id, other in redis_statefulsets().items():
            if other_id != node_id:
                assert not selects(sts["spec"]["selector"]["matchLabels"], pod_labels(other))
        redis = container(sts, "redis")
        assert redis["command"] == ["sh", "/scripts/redis-start.sh"]
        mount, volume = mount_for(sts, redis, "/scripts/redis-start.sh")
        assert mount["readOnly"] is True and volume["configMap"]["name"] == "shardlimit-redis"
        args = [str(a) for a in redis["args"]]
        assert args[0] == "redis-server"
        port = named_port(redis, "redis")
        assert int(flag(args, "--port")) == port == 6379
        assert "--bind" not in args  # every interface: nodes, replicas and Sentinels connect
        assert flag(args, "--protected-mode") == "no"
        assert "--replicaof" not in args and "--replica-announce-ip" not in args  # the script's
        assert flag(args, "--appendonly") == "yes"
        assert flag(args, "--appendfsync") == "everysec"
        assert flag(args, "--maxmemory-policy") == "noeviction"
        assert flag(args, "--repl-diskless-sync-delay") == "0"
        pods = pod_names(sts)
        for pod in pods:
            assert expanded_env(redis, pod) == {
                "POD_NAME": pod,
                "SHARD": node_id,
                "SELF": pod_host(sts, pod),
                "FIRST_PRIMARY": pod_host(sts, pods[0]),
                "SENTINELS": " ".join(sentinel_addresses),
            }
        service = one("Service", "shardlimit-redis")
        assert [named_port(redis, p["targetPort"]) for p in service["spec"]["ports"]] == [port]
        for probe in ("readinessProbe", "livenessProbe"):
            command = " ".join(redis[probe]["exec"]["command"])
            assert f"redis-cli -h 127.0.0.1 -p {port} ping" in command


def test_the_scripts_are_the_ones_compose_uses() -> None:
    data = redis_data()
    assert set(data) == {"redis-start.sh", "sentinel-config.sh", "sentinel.conf"}
    for name in ("redis-start.sh", "sentinel-config.sh"):
        assert data[name] == (REDIS_SCRIPTS / name).read_text(), name


def test_redis_data_is_on_the_volume_claim_template() -> None:
    for sts in redis_statefulsets().values():
        redis = container(sts, "redis")
        data_dir = flag([str(a) for a in redis["args"]], "--dir")
        mount, volume = mount_for(sts, redis, data_dir)
        assert mount["mountPath"] == data_dir == "/data"
        assert "persistentVolumeClaim" in volume
        claim = volume["persistentVolumeClaim"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"
        templates = [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]]
        assert templates == ["redis-data"]
        assert "redis-data" not in {v["name"] for v in pod_spec(sts).get("volumes", [])}
        assert pod_spec(sts)["securityContext"]["fsGroup"] == 1000


# ---------------------------------------------------------------- environment, Secret


def test_every_env_variable_is_read_by_the_code() -> None:
    read = env_names_read_by_code()
    assert {ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV} <= read
    expected: list[tuple[str, Doc, set[str], set[str]]] = [
        ("router", deployment(), {ADMIN_TOKEN_ENV, CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV}, set()),
        # The shard's id is spelled in each node StatefulSet's args: nothing to expand.
        *(("node", sts, {CLUSTER_TOKEN_ENV, LOG_LEVEL_ENV}, set()) for sts in node_workloads()),
    ]
    for name, workload, for_the_code, for_args in expected:
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
    # The Redis and Sentinel pods' environment is for their scripts only (checked above).
    for sts in [*redis_statefulsets().values(), sentinels()]:
        for c in [*pod_spec(sts)["containers"], *pod_spec(sts).get("initContainers", [])]:
            assert not set(env_of(c)) & read, c["name"]


def test_tokens_come_from_the_secret() -> None:
    secret = one("Secret", "shardlimit-tokens")
    assert set(secret["stringData"]) == {"admin-token", "cluster-token"}
    assert "data" not in secret
    text = (K8S / "secret.yaml").read_text()
    assert "openssl rand -hex 32" in text
    wanted = {
        ("shardlimit-router", ADMIN_TOKEN_ENV): "admin-token",
        ("shardlimit-router", CLUSTER_TOKEN_ENV): "cluster-token",
        **{
            (sts["metadata"]["name"], CLUSTER_TOKEN_ENV): "cluster-token"
            for sts in node_workloads()
        },
    }
    found: dict[tuple[str, str], str] = {}
    workloads = [(deployment(), "router"), *((sts, "node") for sts in node_workloads())]
    for workload, name in workloads:
        for env_name, entry in env_of(container(workload, name)).items():
            ref = entry.get("valueFrom", {}).get("secretKeyRef")
            if ref is not None:
                assert ref["name"] == "shardlimit-tokens"
                found[(workload["metadata"]["name"], env_name)] = ref["key"]
    assert found == wanted


# ---------------------------------------------------------------- probes


def test_probe_paths_are_registered_get_routes() -> None:
    router_routes = registered_routes(ROOT / "router" / "app.py")
    node_routes = registered_routes(ROOT / "node" / "app.py")
    router_probes = http_probe_paths(container(deployment(), "router"))
    # The router's /readyz is cluster-wide (503 while any node is down): not a pod signal.
    assert router_probes == {p: "/healthz" for p in PROBES}
    assert {("GET", p) for p in router_probes.values()} <= router_routes
    for sts in node_workloads():
        node_probes = http_probe_paths(container(sts, "node"))
        assert node_probes == {
            "startupProbe": wire.HEALTH_PATH,
            "readinessProbe": wire.READY_PATH,
            "livenessProbe": wire.HEALTH_PATH,
        }
        assert {("GET", p) for p in node_probes.values()} <= node_routes
    assert ("GET", "/readyz") in router_routes  # it exists, deliberately unused
    for sts, name in [
        *((s, "redis") for s in redis_statefulsets().values()),
        (sentinels(), "sentinel"),
    ]:
        c = container(sts, name)
        assert {p for p in PROBES if p in c} == {"readinessProbe", "livenessProbe"}
        assert http_probe_paths(c) == {}


# ---------------------------------------------------------------- ConfigMap


def test_cluster_yaml_lists_every_endpoint_of_every_shard(tmp_path: Path) -> None:
    config = router_config(tmp_path)
    shards = node_statefulsets()
    service = one("Service", "shardlimit-nodes")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert not selects(service["spec"]["selector"], pod_labels(deployment()))
    # Written with `urls`, the form that lists several endpoints.
    raw = yaml.safe_load(config_data()["cluster.yaml"])["cluster"]["nodes"]
    assert [set(n) for n in raw] == [{"id", "urls", "weight"}] * len(raw)
    assert [n.id for n in config.nodes] == sorted(shards) == sorted(redis_statefulsets())
    dns = pod_dns()
    for node in config.nodes:
        sts = shards[node.id]
        assert sts["spec"]["serviceName"] == service["metadata"]["name"]
        assert selects(service["spec"]["selector"], pod_labels(sts))
        assert node.weight == 1
        # Every endpoint of the shard is listed, pod 0 first, and nothing else.
        assert len(node.urls) == len(pod_names(sts)) >= 2
        for url, pod in zip(node.urls, pod_names(sts), strict=True):
            parts = urlsplit(url)
            assert parts.scheme == "http" and parts.path == "" and not parts.query, url
            assert parts.hostname is not None and parts.hostname in dns, f"{url}: no such pod"
            owner, resolved = dns[parts.hostname]
            assert owner["metadata"]["name"] == node.id and resolved == pod, (
                f"{url}: a pod of {owner['metadata']['name']}"
            )
            args = node_args(sts, pod)
            assert args.id == node.id and parse_sentinel_url(args.redis).master == node.id
            # The Service port the URL names reaches the port the node binds.
            node_port = [p for p in service["spec"]["ports"] if p["port"] == parts.port]
            assert len(node_port) == 1, url
            assert named_port(container(sts, "node"), node_port[0]["targetPort"]) == args.port
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


def test_rules_yaml_is_the_example_rules_the_readme_uses() -> None:
    """The README's recipes run against configs/rules.yaml: the ConfigMap holds the same
    rules (its comments may differ)."""
    rules = parse_rules_document(yaml.safe_load(config_data()["rules.yaml"]))
    examples = parse_rules_document(yaml.safe_load((ROOT / "configs" / "rules.yaml").read_text()))
    assert rules == examples
    assert set(rules) == {
        "api",
        "ocr",
        "payments",
        "login",
        "search",
        "uploads",
        "basic",
        "exports",
        "settle",
    }
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
    for sts in statefulsets():
        spec = pod_spec(sts)
        for c in [*spec["containers"], *spec.get("initContainers", [])]:
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), c["name"]
            assert {"cpu", "memory"} <= set(c["resources"]["limits"]), c["name"]


def test_disruption_budgets_cover_every_workload() -> None:
    workloads = {
        # One budget over every shard's node pods: a drain never takes both of a shard.
        "shardlimit-node": node_workloads(),
        "shardlimit-router": [deployment()],
        "shardlimit-sentinel": [sentinels()],
        # One budget over every shard's Redis pods: a drain never takes both of a shard.
        "shardlimit-redis": list(redis_statefulsets().values()),
    }
    for name, covered in workloads.items():
        pdb = one("PodDisruptionBudget", name)
        assert pdb["spec"]["maxUnavailable"] == 1
        assert "minAvailable" not in pdb["spec"]
        selector = pdb["spec"]["selector"]["matchLabels"]
        for workload in [*statefulsets(), deployment()]:
            assert selects(selector, pod_labels(workload)) == (workload in covered), name
