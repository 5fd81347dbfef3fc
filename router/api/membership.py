"""Admin handlers that change the cluster's membership: add a node (checked before
anything changes), remove one, resume or abort the migration in progress. The migration
itself is router/control/resharding.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
from aiohttp import web

from cluster import wire
from cluster.model.errors import FieldError
from cluster.model.keys import RULE_NAME
from cluster.model.nodes import NodeSpec
from cluster.web.problem import PROBLEM_TYPE, Problem, invalid, json_body, json_response
from router.api.handler_tools import admin_only, query_flag, query_of, router_of
from router.api.node_body import new_node
from router.channel.control_client import get_once
from router.control.cluster_view import ClusterView
from router.control.resharding import Change
from router.errors import JoinRefused, MigrationBlocked, NodeUnavailable, ReshardError
from router.service import Router

NODE_PROBE_S = 2.0  # how long a node being added has to answer each probe


@admin_only
async def add_node(request: web.Request) -> web.Response:
    router = router_of(request)
    body = await json_body(request)
    shards = {n.id: n for n in router.view.topology.nodes}
    named = body.get("id") if isinstance(body, dict) else None
    shard = shards.get(named) if isinstance(named, str) else None
    if shard is not None:
        return await _add_endpoint(router, shard, body)
    spec, dry_run = new_node(body, set(shards))
    _require_https(router, spec)
    refused: JoinRefused | None = None  # a plan's: what applying it now would meet
    try:
        await _require_reachable(router.view, spec)
        stats = await authenticated_stats(router.view, spec)
        if named is None:  # no id given: the one the node was started with
            spec = _as_started(spec, stats, set(shards))
        members = await router.view.node_stats()
        versions = [str(m.get("redis_version") or "") for m in members.values()]
        check_joinable(router.view, spec, stats, versions)
    except JoinRefused as exc:
        refused = _only_in_a_plan(exc, dry_run)

    def add(current: list[NodeSpec]) -> list[NodeSpec]:
        if spec.id in {n.id for n in current}:
            raise ReshardError(f"node {spec.id} already exists")
        return [*current, spec]

    return await _reshard(router, add, dry_run, refused)


def _as_started(spec: NodeSpec, stats: dict[str, Any], taken: set[str]) -> NodeSpec:
    """`spec` under the id its node reports, when that id is valid and free (a member's
    id is left to check_joinable to refuse, naming that member)."""
    started_as = stats.get("node")
    if isinstance(started_as, str) and RULE_NAME.match(started_as) and started_as not in taken:
        return replace(spec, id=started_as)
    return spec


def _require_https(router: Router, spec: NodeSpec) -> None:
    if router.config.tls_ca is not None and not spec.url.startswith("https://"):
        message = "must be https://: this router verifies nodes' certificates (router.tls_ca)"
        raise invalid([FieldError("url", message)])


async def _add_endpoint(router: Router, shard: NodeSpec, body: dict[str, Any]) -> web.Response:
    """Another endpoint of the shard `shard`: a node process started with the shard's id
    on the shard's Redis (its kept topology names this cluster). No key moves."""
    spec, dry_run = new_node({"weight": shard.weight, **body}, set())
    _require_https(router, spec)
    if spec.url in shard.urls:
        raise Problem(
            409, "endpoint-already-member", f"{spec.url} is already an endpoint of {shard.id}"
        )
    if spec.weight != shard.weight:
        raise invalid(
            [FieldError("weight", f"an endpoint serves {shard.id} at its weight, {shard.weight}")]
        )
    refused: JoinRefused | None = None
    try:
        await _require_reachable(router.view, spec)
        stats = await authenticated_stats(router.view, spec)
        if (
            stats.get("node") != shard.id
            or stats.get("cluster_id") != router.view.topology.cluster_id
        ):
            raise JoinRefused(
                "endpoint-not-of-shard",
                409,
                f"the node at {spec.url} is not an endpoint of {shard.id}: it was started as "
                f"{stats.get('node')!r} on a Redis holding cluster {stats.get('cluster_id')}, "
                f"not on {shard.id}'s Redis (give it {shard.id}'s Sentinel URL and id)",
            )
    except JoinRefused as exc:
        refused = _only_in_a_plan(exc, dry_run)

    def add(current: list[NodeSpec]) -> list[NodeSpec]:
        return [
            replace(n, more_urls=(*n.more_urls, spec.url)) if n.id == shard.id else n
            for n in current
        ]

    return await _reshard(router, add, dry_run, refused)


async def _require_reachable(view: ClusterView, spec: NodeSpec) -> None:
    """Refuse a node about to be added that cannot serve, before any lease or topology
    change: a refused connection, a failed TLS handshake (a certificate not from the
    cluster's CA, a client certificate refused), no answer, something other than a
    shardlimit node (a router, say), or a node whose Redis does not answer. All are the
    caller's input: 422. Raises Problem (a URL that is not one) or JoinRefused."""
    try:
        client = view.client_for(spec)  # a client of its own: not a member yet
    except ValueError as exc:
        raise invalid([FieldError("url", str(exc))]) from None
    try:
        status, raw = await _probe(view, spec, wire.HEALTH_PATH, None)  # open on nodes
        health = _json_object(raw) if status == 200 else None
        if health is None or not isinstance(health.get("node"), str):  # a node names itself
            why = _answered(wire.HEALTH_PATH, status, health, "no node id")
            raise JoinRefused("not-a-node", 422, await _not_a_node(view, spec, why))
        await client.get(wire.READY_PATH, timeout_s=NODE_PROBE_S)
    except NodeUnavailable as exc:
        raise JoinRefused(
            "node-unreachable",
            422,
            f"node {spec.id} at {spec.url} did not answer {wire.READY_PATH}: {exc}",
        ) from None
    finally:
        await client.close()


def _answered(path: str, status: int, body: dict[str, Any] | None, lacking: str) -> str:
    """What GET `path` answered that is not a node's answer."""
    if status != 200:
        return f"GET {path} answered HTTP {status}"
    return f"GET {path} answered " + (lacking if body is not None else "no JSON object")


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


async def _not_a_node(view: ClusterView, spec: NodeSpec, why: str) -> str:
    """Why `spec.url`, which answers HTTP, is not a node (`why`: what it answered); a
    shardlimit router, which answers GET /v1/cluster with its layout, is named."""
    try:
        status, raw = await _probe(view, spec, "/v1/cluster", None)
    except JoinRefused:
        status, raw = 0, b""
    layout = _json_object(raw) if status == 200 else None
    said = f"not a node: {spec.url} does not serve a shardlimit node's stats"
    if layout is not None and "partitioner" in layout and isinstance(layout.get("nodes"), list):
        return f"{said}: it is a shardlimit router; give the URL of a `shardlimit serve node`"
    return f"{said} ({why})"


async def _probe(
    view: ClusterView, spec: NodeSpec, path: str, token: str | None
) -> tuple[int, bytes]:
    try:
        return await get_once(spec.url, path, token, view.ssl_context, NODE_PROBE_S)
    except (TimeoutError, OSError) as exc:
        raise JoinRefused(
            "node-unreachable",
            422,
            f"node {spec.id} at {spec.url} did not answer {path}: {type(exc).__name__} {exc}",
        ) from exc


async def authenticated_stats(view: ClusterView, spec: NodeSpec) -> dict[str, Any]:
    """The node's stats, asked with the cluster token and this router's TLS settings;
    a node that answers without the token is refused too. Raises JoinRefused."""
    status, raw = await _probe(view, spec, wire.STATS_PATH, view.cluster_token)
    if status == 401:
        raise JoinRefused(
            "node-token-rejected",
            409,
            f"token rejected: node {spec.id} at {spec.url} refused this cluster's token "
            "(start it with the cluster's SHARDLIMIT_CLUSTER_TOKEN)",
        )
    if status >= 500:  # a node (its /healthz said so) that cannot answer now
        raise JoinRefused(
            "node-unreachable",
            422,
            f"node {spec.id} at {spec.url} answered GET {wire.STATS_PATH} with HTTP {status}",
        )
    stats = _json_object(raw) if status == 200 else None
    if stats is None:
        why = _answered(wire.STATS_PATH, status, stats, "")
        raise JoinRefused("not-a-node", 422, await _not_a_node(view, spec, why))
    if view.cluster_token and (await _probe(view, spec, wire.STATS_PATH, None))[0] == 200:
        raise JoinRefused(
            "node-token-rejected",
            409,
            f"token not checked: node {spec.id} at {spec.url} answers without the cluster "
            "token (start it with the cluster's SHARDLIMIT_CLUSTER_TOKEN)",
        )
    return stats


def _version(text: Any) -> tuple[int, ...]:
    """ "7.0.15" -> (7, 0) (RESTORE payloads change with major.minor); () if unknown."""
    try:
        return tuple(int(part) for part in str(text).split(".")[:2])
    except ValueError:
        return ()


def check_joinable(
    view: ClusterView, spec: NodeSpec, stats: dict[str, Any], members_redis: list[str]
) -> None:
    """A node may join if it is empty or already of this cluster, under its id, with
    this cluster's partitioner, and a Redis no older than the members' (`members_redis`:
    their versions). Raises JoinRefused."""
    topology = view.topology
    theirs, ours = stats.get("cluster_id"), topology.cluster_id
    members = {n.id: n for n in topology.nodes}
    started_as = stats.get("node")
    if started_as != spec.id and started_as in members:
        # `--id` with its own id would be refused too: that id is taken.
        member, slug = members[str(started_as)], "node-already-member"
        if theirs == ours:  # holds this cluster's layout under a member's id: that member
            detail = f"the node at {spec.url} is already a member, as {member.id}"
            if member.url != spec.url:
                detail += f" (listed at {member.url})"
        else:
            slug = "node-id-taken"
            detail = (
                f"the node at {spec.url} was started as {member.id!r}, the id of the member "
                f"at {member.url}: start it with an id of its own (`shardlimit serve node "
                f"--id {spec.id}`)"
            )
        raise JoinRefused(slug, 409, detail)
    if started_as != spec.id:
        raise JoinRefused(
            "node-id-mismatch",
            409,
            f"the node at {spec.url} was started as {stats.get('node')!r}, not {spec.id!r} "
            f"(add it with --id {stats.get('node')})",
        )
    if theirs is not None and theirs != ours:
        raise JoinRefused(
            "node-of-another-cluster",
            409,
            f"a node of another cluster: {spec.id} at {spec.url} belongs to cluster {theirs}, "
            f"this is cluster {ours}",
        )
    kind = stats.get("partitioner")
    if kind is not None and kind != topology.partitioner.kind:
        raise JoinRefused(
            "wrong-partitioner",
            409,
            f"wrong partitioner: node {spec.id} holds a {kind} topology, this cluster "
            f"uses {topology.partitioner.kind}",
        )
    joining = _version(stats.get("redis_version"))
    newest = max(members_redis, key=_version, default="")
    if joining and _version(newest) > joining:
        raise JoinRefused(
            "redis-too-old",
            409,
            f"Redis too old: node {spec.id}'s Redis is {stats.get('redis_version')}, older "
            f"than the cluster's {newest}: keys dumped there cannot be restored on it",
        )
    keys = stats.get("keys")
    if theirs is None and isinstance(keys, int) and keys > 0:
        raise JoinRefused(
            "node-not-empty",
            409,
            f"not empty: node {spec.id} holds {keys} keys of no known cluster "
            "(give it an empty Redis)",
        )


@admin_only
async def remove_node(request: web.Request) -> web.Response:
    router = router_of(request)
    node_id = request.match_info["id"]
    nodes = list(router.view.topology.nodes)
    if node_id not in {n.id for n in nodes}:
        raise Problem(404, "unknown-node", f"no node {node_id} in the topology")
    dry_run = query_flag(request, "dry_run")
    url = query_of(request).get("url")
    if url is not None:  # one endpoint of a shard: the shard stays, even the only one
        return await _remove_endpoint(router, node_id, url.rstrip("/"), dry_run)
    if len(nodes) == 1:
        raise Problem(409, "last-node", "cannot remove the last node")

    def remove(current: list[NodeSpec]) -> list[NodeSpec]:
        if node_id not in {n.id for n in current}:
            raise ReshardError(f"no node {node_id} in the topology", "unknown-node")
        if len(current) == 1:
            raise ReshardError("cannot remove the last node", "last-node")
        return [n for n in current if n.id != node_id]

    return await _reshard(router, remove, dry_run)


async def _remove_endpoint(router: Router, node_id: str, url: str, dry_run: bool) -> web.Response:
    """One endpoint of a shard leaves it; the shard and its keys stay."""

    def remove(current: list[NodeSpec]) -> list[NodeSpec]:
        shard = next((n for n in current if n.id == node_id), None)
        if shard is None:
            raise ReshardError(f"no node {node_id} in the topology", "unknown-node")
        if url not in shard.urls:
            raise ReshardError(f"{url} is not an endpoint of {node_id}", "unknown-endpoint")
        urls = [u for u in shard.urls if u != url]
        if not urls:
            raise ReshardError(
                f"{url} is {node_id}'s last endpoint: remove the node instead", "last-endpoint"
            )
        kept = NodeSpec(node_id, urls[0], shard.weight, tuple(urls[1:]))
        return [kept if n.id == node_id else n for n in current]

    try:
        remove(list(router.view.topology.nodes))
    except ReshardError as exc:
        status = 404 if exc.slug in ("unknown-node", "unknown-endpoint") else 409
        raise Problem(status, exc.slug, str(exc)) from None
    return await _reshard(router, remove, dry_run)


async def _reshard(
    router: Router, change: Change, dry_run: bool, refused: JoinRefused | None = None
) -> web.Response:
    """Plan (`dry_run`) or start the migration to `change(the current nodes)`. A plan
    says whether applying it now would be refused, and why (`refused`: a node to add
    that is not up yet still gets its plan)."""
    try:
        new, moves = router.resharder.plan(change(list(router.view.topology.nodes)))
    except ValueError as exc:
        raise Problem(400, "bad-layout", str(exc)) from None
    if dry_run:
        body: dict[str, Any] = {
            "dry_run": True,
            "moves": moves,
            "shares": new.shares(),
            "partitioner": new.kind,
            "refused": None if refused is None else _refusal(refused),
        }
        return json_response(body)
    try:
        started = await router.resharder.start(change)
    except MigrationBlocked as exc:
        hint = " or `shardlimit reshard abort` to return to the previous one"
        raise _blocked(exc, hint) from None
    return json_response(started, status=202)


def _only_in_a_plan(exc: JoinRefused, dry_run: bool) -> JoinRefused:
    """A refused addition: answered as a problem, or kept for its plan to report."""
    if not dry_run:
        raise Problem(exc.status, exc.kind, f"{exc}; nothing was changed") from None
    return exc


def _refusal(exc: JoinRefused) -> dict[str, Any]:
    """The problem applying a plan would answer now (as the change itself words it)."""
    return {"status": exc.status, "type": PROBLEM_TYPE + exc.kind, "detail": str(exc)}


def _blocked(exc: MigrationBlocked, abort_hint: str = "") -> Problem:
    return Problem(
        503,
        "migration-blocked",
        f"{exc}; the migration is paused: `shardlimit reshard resume` once the cause is "
        f"fixed{abort_hint}",
    )


@admin_only
async def resume_migration(request: web.Request) -> web.Response:
    return json_response(await router_of(request).resharder.resume(), status=202)


@admin_only
async def abort_migration(request: web.Request) -> web.Response:
    try:
        return json_response(await router_of(request).resharder.abort(), status=202)
    except MigrationBlocked as exc:
        raise _blocked(exc) from None
