"""One rules truth, with real processes: three Redis, three nodes, two routers (each with
its own config, data dir and rules file).

- A router serves exactly the cluster's rules: an edit of its file that was not
  published is not served, and no router ever writes its rules file.
- A version from a wiped cluster's past (a router still running on it, a restarted
  router's stale data dir, a file naming `version: 9`) neither blocks nor forks
  publication: the cluster begins again at version 1 and every router follows it.
- Rules writes keep working while any majority of the nodes is up (the lowest-id node
  down included), and refuse with 503, changing nothing, without a majority.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis as sync_redis
import yaml

from cluster.local.cluster import node_process, router_process
from cluster.local.procs import ChildProcess
from cluster.local.redis_proc import RedisProcess, free_port
from tests.conftest import eventually

pytestmark = pytest.mark.timeout(120)

ADMIN = "rules-truth-admin"
CLUSTER_TOKEN = "rules-truth-cluster"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN}"}
NODE_HEADERS = {"Authorization": f"Bearer {CLUSTER_TOKEN}"}

RULES_FILE = """# the declarative source: comments stay
rules:
  basic:            # a plain rate limit
    limits:
      - {algorithm: fixed_window, limit: 100, window: 1m}
  login:
    limits:
      - {algorithm: sliding_log, limit: 5, window: 15m}
"""
OCR_PRO = {"limits": [{"algorithm": "fixed_window", "limit": 1000, "window": "1d"}]}


def _env() -> dict[str, str]:
    return dict(os.environ, SHARDLIMIT_ADMIN_TOKEN=ADMIN, SHARDLIMIT_CLUSTER_TOKEN=CLUSTER_TOKEN)


@dataclass
class Stack:
    workdir: Path
    http: aiohttp.ClientSession
    redis: list[RedisProcess] = field(default_factory=list)
    nodes: list[ChildProcess] = field(default_factory=list)
    node_urls: list[str] = field(default_factory=list)
    routers: dict[str, ChildProcess] = field(default_factory=dict)
    router_urls: dict[str, str] = field(default_factory=dict)

    def rules_file(self, name: str) -> Path:
        return self.workdir / f"{name}-rules.yaml"

    async def start_router(self, name: str) -> str:
        """Router `name` (again, if it ran before: same config, data dir and file)."""
        if name not in self.routers:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            rules = self.rules_file(name)
            if not rules.exists():
                rules.write_text(RULES_FILE)
            router = {
                "host": "127.0.0.1",
                "port": port,
                "rules_poll": "100ms",
                "data_dir": str(self.workdir / f"{name}-data"),
                "rules_file": str(rules),
            }
            nodes = [{"id": f"n{i + 1}", "url": u} for i, u in enumerate(self.node_urls)]
            config = {"router": router, "cluster": {"partitioner": "ring", "nodes": nodes}}
            path = self.workdir / f"{name}.yaml"
            path.write_text(yaml.safe_dump(config))
            self.router_urls[name] = url
            self.routers[name] = router_process(
                name, path, url, log=self.workdir / f"{name}.log", env=_env()
            )
        await self.routers[name].start_async()
        return self.router_urls[name]

    async def request(
        self, method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        async with self.http.request(method, url, json=body, headers=headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def served(self, name: str) -> tuple[int, dict[str, Any]]:
        """The version and rules (by name, public form) router `name` serves."""
        status, body = await self.request("GET", self.router_urls[name] + "/v1/rules")
        assert status == 200, body
        rules = {rule.pop("name"): rule for rule in body["rules"]}
        return body["version"], rules

    async def node_versions(self) -> list[int]:
        versions = []
        for url in self.node_urls:
            status, body = await self.request("GET", url + "/node/v1/rules", None, NODE_HEADERS)
            assert status == 200, body
            versions.append(body["version"])
        return versions

    async def put_rule(
        self, router: str, name: str, body: dict[str, Any], if_match: int | None = None
    ) -> tuple[int, Any]:
        headers = dict(ADMIN_HEADERS)
        if if_match is not None:
            headers["If-Match"] = f'"{if_match}"'
        url = f"{self.router_urls[router]}/v1/rules/{name}"
        return await self.request("PUT", url, body, headers)

    async def all_serve(self, version: int, names: list[str]) -> bool:
        for router in self.router_urls:
            if not self.routers[router].alive:
                continue
            served_version, rules = await self.served(router)
            if served_version != version or sorted(rules) != sorted(names):
                return False
        return True


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    http = aiohttp.ClientSession()
    started = Stack(tmp_path, http)
    try:
        for i in range(3):
            redis = RedisProcess(port=free_port(), data_dir=tmp_path / f"redis-n{i + 1}", aof=False)
            await redis.start_async()
            started.redis.append(redis)
            port = free_port()
            log = tmp_path / f"n{i + 1}.log"
            node = node_process(f"n{i + 1}", port, redis.url, log=log, env=_env())
            started.nodes.append(node)
            started.node_urls.append(f"http://127.0.0.1:{port}")
        for node in started.nodes:
            await node.start_async()
        await started.start_router("a")
        await started.start_router("b")
        yield started
    finally:
        await http.close()
        for child in [*started.routers.values(), *started.nodes]:
            child.stop()
        for redis in started.redis:
            redis.stop()


def _limit(rules: dict[str, Any], name: str) -> int:
    limit: int = rules[name]["limits"][0]["limit"]
    return limit


async def test_a_router_serves_only_published_rules_and_never_writes_its_file(
    stack: Stack,
) -> None:
    assert await stack.all_serve(1, ["basic", "login"])
    files = {name: stack.rules_file(name).read_bytes() for name in ("a", "b")}

    status, body = await stack.put_rule("a", "ocr-pro", OCR_PRO)
    assert status == 201, body
    await eventually(lambda: stack.all_serve(2, ["basic", "login", "ocr-pro"]), within=10)
    # No router rewrote its file (comments kept, no `version:` added).
    assert {name: stack.rules_file(name).read_bytes() for name in ("a", "b")} == files

    # An edit of a's file that would delete ocr-pro (it lacks it) and lowers basic to 50
    # is not published, and so served nowhere, a included.
    edited = RULES_FILE.replace("limit: 100", "limit: 50")
    reloads = await _reloads(stack, "a")
    stack.rules_file("a").write_text(edited)
    await eventually(lambda: _reloaded(stack, "a", reloads), within=10)
    for router in ("a", "b"):
        version, rules = await stack.served(router)
        assert (version, _limit(rules, "basic")) == (2, 100)
    status, decision = await stack.request(
        "POST", stack.router_urls["a"] + "/v1/check", {"key": "u", "rule": "basic"}
    )
    assert status == 200 and decision["limits"][0]["limit"] == 100

    # The same edit that keeps every rule is published, and served everywhere.
    stack.rules_file("a").write_text(
        edited + "  ocr-pro:\n    limits: [{algorithm: fixed_window, limit: 1000, window: 1d}]\n"
    )
    await eventually(lambda: stack.all_serve(3, ["basic", "login", "ocr-pro"]), within=10)
    for router in ("a", "b"):
        assert _limit((await stack.served(router))[1], "basic") == 50
    assert await stack.node_versions() == [3, 3, 3]


async def _reloads(stack: Stack, router: str) -> float:
    async with stack.http.get(stack.router_urls[router] + "/metrics") as resp:
        text = await resp.text()
    name = 'shardlimit_rules_reloads_total{result="ok"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _reloaded(stack: Stack, router: str, before: float) -> bool:
    return await _reloads(stack, router) > before


async def test_a_wiped_clusters_past_neither_blocks_nor_forks_publication(
    stack: Stack,
) -> None:
    for i in range(3):  # versions 2, 3, 4
        status, body = await stack.put_rule("a", f"old-{i}", OCR_PRO)
        assert status == 201, body
    await eventually(lambda: stack.all_serve(4, ["basic", "login", "old-0", "old-1", "old-2"]))

    # Both files now name `version: 9` and lower basic to 70; b reads its edit, which
    # would delete the old-* rules: not published, not served.
    edited = "version: 9\n" + RULES_FILE.replace("100", "70")
    reloads = await _reloads(stack, "b")
    stack.rules_file("b").write_text(edited)
    await eventually(lambda: _reloaded(stack, "b", reloads), within=10)
    assert _limit((await stack.served("b"))[1], "basic") == 100

    # The cluster is wiped (every node's Redis emptied) while router b keeps running on
    # version 4; router a restarts on its stale data dir, its file naming `version: 9`.
    stack.routers["a"].stop()
    stack.rules_file("a").write_text(edited)
    for redis in stack.redis:
        client = sync_redis.Redis(port=redis.port)
        client.flushall()
        client.close()
    await stack.start_router("a")

    # The first router to see the empty cluster seeds it with its file as version 1
    # (`version: 9` blocks nothing); the other follows, b down from its version 4.
    await eventually(lambda: stack.all_serve(1, ["basic", "login"]), within=10)
    for router in ("a", "b"):
        assert _limit((await stack.served(router))[1], "basic") == 70
    assert await stack.node_versions() == [1, 1, 1]

    # Publication goes on from there through either router, If-Match included.
    status, body = await stack.put_rule("b", "new", OCR_PRO, if_match=1)
    assert status == 201, body
    await eventually(lambda: stack.all_serve(2, ["basic", "login", "new"]), within=10)
    status, body = await stack.put_rule("a", "stale", OCR_PRO, if_match=4)
    assert status == 409 and body["type"].endswith("/version-conflict"), body
    assert await stack.node_versions() == [2, 2, 2]


async def test_rules_writes_keep_working_while_a_majority_of_nodes_is_up(
    stack: Stack,
) -> None:
    stack.nodes[0].stop()  # n1: the lowest id, which used to hold the rules lease
    status, body = await stack.put_rule("a", "while-n1-down", OCR_PRO, if_match=1)
    assert status == 201, body
    await eventually(lambda: stack.all_serve(2, ["basic", "login", "while-n1-down"]))
    status, body = await stack.request(
        "DELETE", stack.router_urls["b"] + "/v1/rules/while-n1-down", None, ADMIN_HEADERS
    )
    assert status == 204, body
    await eventually(lambda: stack.all_serve(3, ["basic", "login"]))

    # Without a majority, a write is refused and changes nothing.
    stack.nodes[1].stop()
    status, body = await stack.put_rule("b", "minority", OCR_PRO)
    assert status == 503 and body["type"].endswith("/rules-not-saved"), body
    for router in ("a", "b"):
        assert (await stack.served(router))[0] == 3
    status, _ = await stack.request("GET", stack.router_urls["a"] + "/v1/rules/minority")
    assert status == 404

    # The nodes back: n1 missed two versions and n2 none; a write lands everywhere, and
    # every node holds it.
    for node in stack.nodes[:2]:
        await node.start_async()
    status, body = await stack.put_rule("a", "back", OCR_PRO, if_match=3)
    assert status == 201, body

    async def every_node_at_4() -> bool:
        return await stack.node_versions() == [4, 4, 4]

    await eventually(every_node_at_4, within=10)
    await eventually(lambda: stack.all_serve(4, ["back", "basic", "login"]))


async def test_a_file_without_rules_or_an_apply_that_deletes_changes_nothing(
    stack: Stack,
) -> None:
    """Scenario: a rules file that lost its top-level `rules:` key was read as "no rules"
    and `rules apply` removed every rule without asking."""
    flat = "\n".join(line[2:] for line in RULES_FILE.splitlines()[2:]) + "\n"
    assert flat.startswith("basic:")
    reloads = await _reload_errors(stack, "a")  # before the edit: a poll may come at once
    stack.rules_file("a").write_text(flat)
    stack.rules_file("b").write_text(flat)
    await eventually(lambda: _errored(stack, "a", reloads), within=10)

    env = dict(_env(), SHARDLIMIT_ROUTER=stack.router_urls["b"])
    applied = await _cli(env, "rules", "apply", "-f", str(stack.rules_file("b")))
    assert applied.returncode == 2 and "top-level 'rules:'" in applied.stderr
    assert len(applied.stderr.splitlines()) == 1, applied.stderr

    only_basic = stack.workdir / "only-basic.yaml"
    only_basic.write_text(RULES_FILE.split("  login:")[0])
    applied = await _cli(env, "rules", "apply", "-f", str(only_basic))
    assert applied.returncode == 2
    assert "would delete 1 rule(s) the cluster holds: login" in applied.stderr
    for router in ("a", "b"):
        version, rules = await stack.served(router)
        assert (version, sorted(rules), _limit(rules, "basic")) == (1, ["basic", "login"], 100)
    assert await stack.node_versions() == [1, 1, 1]

    applied = await _cli(env, "rules", "apply", "-f", str(only_basic), "--prune")
    assert applied.returncode == 0, applied.stderr
    await eventually(lambda: stack.all_serve(2, ["basic"]))


async def _reload_errors(stack: Stack, router: str) -> float:
    async with stack.http.get(stack.router_urls[router] + "/metrics") as resp:
        text = await resp.text()
    name = 'shardlimit_rules_reloads_total{result="error"}'
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def _errored(stack: Stack, router: str, before: float) -> bool:
    return await _reload_errors(stack, router) > before


async def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cluster.cli", *args),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return subprocess.CompletedProcess(list(args), process.returncode, out.decode(), err.decode())
