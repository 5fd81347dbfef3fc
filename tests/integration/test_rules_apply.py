"""Refuse what would destroy: a rules document without `rules:` is a one-line error that
changes nothing (CLI, API, a router's own rules file); `shardlimit rules apply` that would
delete rules lists them and refuses unless `--prune`, or asks y/N on a terminal."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import sys
from pathlib import Path
from typing import Any

import pytest

from router.rules import cluster_rules
from tests.conftest import ADMIN, Cluster, eventually

RULE_NAMES = ["basic", "login", "pair", "payments", "stock"]


async def _cli(
    cluster: Cluster, *args: str, terminal: tuple[int, int] | None = None, answer: bytes = b""
) -> tuple[int, str, str]:
    """Run the CLI; with `terminal` (a pty's controller and terminal fds) as its stdin,
    typing `answer`."""
    env = dict(os.environ, SHARDLIMIT_ROUTER=cluster.router_url, SHARDLIMIT_ADMIN_TOKEN=ADMIN)
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "cluster.cli", *args),
        stdin=terminal[1] if terminal is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    if terminal is not None:
        os.write(terminal[0], answer)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _rules(cluster: Cluster) -> tuple[int, list[str]]:
    status, body = await cluster.get("/v1/rules")
    assert status == 200
    return body["version"], [rule["name"] for rule in body["rules"]]


def _without(cluster: Cluster, tmp_path: Path, *dropped: str) -> Path:
    """A copy of the cluster's rules file lacking the rules `dropped`."""
    import yaml

    assert cluster.rules_file is not None
    doc = yaml.safe_load(cluster.rules_file.read_text())
    for name in dropped:
        del doc["rules"][name]
    path = tmp_path / "wanted.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_a_file_without_rules_key_is_a_one_line_error(
    cluster: Cluster, tmp_path: Path
) -> None:
    before = await _rules(cluster)
    assert before[1] == RULE_NAMES
    for text in ("basic:\n  limits: 5/minute\n", "", "version: 3\n"):
        path = tmp_path / "flat.yaml"
        path.write_text(text)
        code, out, err = await _cli(cluster, "rules", "apply", "-f", str(path))
        assert code == 2, (out, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert "top-level 'rules:'" in err, err
    async with cluster.http.put(
        cluster.router_url + "/v1/rules",
        json={"basic": {"limits": "5/minute"}},
        headers={"Authorization": f"Bearer {ADMIN}"},
    ) as resp:
        assert resp.status == 400
        problem = await resp.json(content_type=None)
    assert "\n" not in problem["detail"] and problem["errors"][0]["field"] == "rules"
    assert await _rules(cluster) == before


async def test_a_rules_file_that_lost_its_rules_key_is_not_published(cluster: Cluster) -> None:
    assert cluster.rules_file is not None
    before = await _rules(cluster)
    errors = cluster.router.rules.reload_errors
    cluster.rules_file.write_text("basic:\n  limits: [{algorithm: fixed_window, limit: 1}]\n")

    async def rejected() -> bool:
        return cluster.router.rules.reload_errors == errors + 1

    await eventually(rejected)
    assert await _rules(cluster) == before
    status, _ = await cluster.check({"key": "k", "rule": "payments", "amount": "1"})
    assert status == 200


async def test_apply_that_deletes_rules_needs_prune(cluster: Cluster, tmp_path: Path) -> None:
    version, names = await _rules(cluster)
    wanted = _without(cluster, tmp_path, "login", "stock")
    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(wanted))
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1
    assert "would delete 2 rule(s) the cluster holds: login, stock" in err
    assert "--prune" in err
    assert await _rules(cluster) == (version, names)

    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(wanted), "--json")
    assert code == 2 and "login, stock" in err
    assert await _rules(cluster) == (version, names)

    code, out, err = await _cli(cluster, "rules", "apply", "-f", str(wanted), "--prune")
    assert code == 0, err
    assert await _rules(cluster) == (version + 1, ["basic", "pair", "payments"])


async def test_apply_on_a_terminal_asks_before_deleting(cluster: Cluster, tmp_path: Path) -> None:
    version, names = await _rules(cluster)
    wanted = _without(cluster, tmp_path, "pair")
    controller, terminal = pty.openpty()
    try:
        code, out, err = await _cli(
            cluster,
            "rules",
            "apply",
            "-f",
            str(wanted),
            terminal=(controller, terminal),
            answer=b"n\n",
        )
        assert code == 2 and "nothing applied" in err, (out, err)
        assert "delete 1 rule(s) (pair)? [y/N]" in out
        assert await _rules(cluster) == (version, names)
        code, out, err = await _cli(
            cluster,
            "rules",
            "apply",
            "-f",
            str(wanted),
            terminal=(controller, terminal),
            answer=b"y\n",
        )
        assert code == 0, (out, err)
    finally:
        os.close(controller)
        os.close(terminal)
    assert await _rules(cluster) == (version + 1, ["basic", "login", "payments", "stock"])


async def test_apply_that_only_adds_needs_no_prune(cluster: Cluster, tmp_path: Path) -> None:
    version, names = await _rules(cluster)
    assert cluster.rules_file is not None
    wanted = tmp_path / "more.yaml"
    wanted.write_text(cluster.rules_file.read_text() + "  extra:\n    limits: 3/minute\n")
    code, _out, err = await _cli(cluster, "rules", "apply", "-f", str(wanted))
    assert code == 0, err
    assert await _rules(cluster) == (version + 1, sorted([*names, "extra"]))


async def test_a_router_started_on_a_broken_rules_file_says_so_in_one_line(
    tmp_path: Path,
) -> None:
    from cluster.local.redis_proc import free_port

    config = tmp_path / "router.yaml"
    rules = tmp_path / "rules.yaml"
    config.write_text(
        f"router: {{host: 127.0.0.1, port: {free_port()}, data_dir: {tmp_path / 'data'},"
        f" rules_file: {rules}}}\n"
        f"cluster: {{nodes: [{{id: n1, url: 'http://127.0.0.1:{free_port()}'}}]}}\n"
    )
    for text, expected in (
        (
            "rules: [broken\n",
            f"rules_file: {rules}:2:1: not YAML: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence)",
        ),
        ("basic:\n  limits: 5/minute\n", "top-level 'rules:'"),
    ):
        rules.write_text(text)
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "cluster.cli", "serve", "router", "--config", str(config)),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        lines = err.decode().splitlines()
        assert process.returncode == 2, (out, err)
        assert "Traceback" not in err.decode()
        assert lines[-1].startswith("shardlimit router: rules file rejected: "), lines
        assert expected in lines[-1], lines


async def test_rule_writes_at_once_through_one_router_lose_nothing(cluster: Cluster) -> None:
    """Eight new rules written at once are all kept, one version each; four writes at once
    on the same If-Match version: exactly one applies, three get 409."""
    before, names = await _rules(cluster)
    headers = {"Authorization": f"Bearer {ADMIN}"}

    async def put(name: str, extra: dict[str, str], limit: int = 5) -> int:
        url = f"{cluster.router_url}/v1/rules/{name}"
        body = {"limits": [{"algorithm": "fixed_window", "limit": limit, "window": "1m"}]}
        async with cluster.http.put(url, json=body, headers={**headers, **extra}) as resp:
            await resp.read()
            return resp.status

    new = [f"at-once-{i}" for i in range(8)]
    assert await asyncio.gather(*(put(name, {}) for name in new)) == [201] * 8
    version, now = await _rules(cluster)
    assert version == before + 8 and set(now) == set(names) | set(new)
    condition = {"If-Match": f'"{version}"'}
    statuses = await asyncio.gather(*(put("at-once-0", condition, 6 + i) for i in range(4)))
    assert sorted(statuses) == [200, 409, 409, 409]
    assert (await _rules(cluster))[0] == version + 1


async def test_preconditions_on_rule_writes(cluster: Cluster) -> None:
    """If-Match: * writes only a rule that exists, If-None-Match: * only a new one (412
    otherwise, and nothing changes); If-Match may list versions, any one of which will do."""
    headers = {"Authorization": f"Bearer {ADMIN}"}

    async def write(method: str, name: str, extra: dict[str, str], limit: int = 5) -> Any:
        url = f"{cluster.router_url}/v1/rules/{name}"
        sent = {"limits": [{"algorithm": "fixed_window", "limit": limit, "window": "1m"}]}
        async with cluster.http.request(
            method, url, json=sent if method == "PUT" else None, headers={**headers, **extra}
        ) as resp:
            raw = await resp.read()
            return resp.status, json.loads(raw) if raw else None

    version, _ = await _rules(cluster)
    status, problem = await write("PUT", "cond-new", {"If-Match": "*"})
    assert (status, problem["type"].rsplit("/", 1)[1]) == (412, "precondition-failed"), problem
    assert "no rule named 'cond-new'" in problem["detail"]
    assert (await write("DELETE", "cond-new", {"If-Match": "*"}))[0] == 412
    assert (await _rules(cluster))[0] == version  # nothing written
    assert (await write("PUT", "cond-new", {"If-None-Match": "*"}))[0] == 201
    status, problem = await write("PUT", "cond-new", {"If-None-Match": "*"}, 6)
    assert status == 412 and "rule 'cond-new' exists" in problem["detail"], problem
    assert (await write("PUT", "cond-new", {"If-Match": "*"}, 7))[0] == 200
    version, _ = await _rules(cluster)
    listed = {"If-Match": f'"{version - 1}", W/"{version}" ,"{version + 5}"'}
    assert (await write("PUT", "cond-new", listed, 8))[0] == 200
    stale = {"If-Match": f'"{version - 1}", "{version}"'}
    assert (await write("PUT", "cond-new", stale, 9))[0] == 409
    assert (await write("PUT", "cond-new", {"If-None-Match": f'"{version + 1}"'}, 9))[0] == 409
    assert (await write("DELETE", "cond-new", {"If-Match": "*"}))[0] == 204
    for bad in ("**", '"1",', '*, "1"', "x"):
        status, problem = await write("PUT", "cond-new", {"If-None-Match": bad})
        assert status == 400 and "If-None-Match" in problem["detail"], (bad, problem)
    async with cluster.http.put(
        f"{cluster.router_url}/v1/rules",
        json={"rules": {}},
        headers={**headers, "If-None-Match": "*"},
    ) as resp:
        assert resp.status == 412, await resp.text()
    assert (await _rules(cluster))[0] == version + 2  # the listed write and the delete


async def test_a_rule_named_otherwise_or_a_document_with_more_than_rules_is_refused(
    cluster: Cluster,
) -> None:
    """A rule's `name` may be left out or null, or be its own: GET's answer put back."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    limits = [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]
    version, _ = await _rules(cluster)
    url = f"{cluster.router_url}/v1/rules/named"
    for name, field in (("other", "body.name"), ({}, "body.name")):
        async with cluster.http.put(
            url, json={"name": name, "limits": limits}, headers=headers
        ) as resp:
            problem = await resp.json()
            assert resp.status == 400, problem
            assert [e["field"] for e in problem["errors"]] == [field], problem
    async with cluster.http.put(
        url, json={"name": "named", "limits": limits}, headers=headers
    ) as resp:
        assert resp.status == 201, await resp.text()
    _, listed = await cluster.get("/v1/rules")
    document = {"rules": {rule["name"]: rule for rule in listed["rules"]}}
    for bad, field in (
        ({"rules": {**document["rules"], "x": {"name": "y", "limits": limits}}}, "rules.x.name"),
        ({**document, "version": listed["version"]}, "version"),
    ):
        async with cluster.http.put(
            f"{cluster.router_url}/v1/rules", json=bad, headers=headers
        ) as resp:
            problem = await resp.json()
            assert resp.status == 400, problem
            assert [e["field"] for e in problem["errors"]] == [field], problem
    async with cluster.http.put(
        f"{cluster.router_url}/v1/rules", json=document, headers=headers
    ) as resp:
        assert resp.status == 200, await resp.text()  # GET's rules, put back as they are
    assert (await _rules(cluster))[0] == version + 1


async def test_rules_past_the_cluster_bound_are_refused_and_shrinking_is_not(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every node keeps every rule: a change that would make the rules larger than the
    bound is a 400 that changes nothing; one that makes them smaller goes through."""
    headers = {"Authorization": f"Bearer {ADMIN}"}
    limits = [{"algorithm": "fixed_window", "limit": 5, "window": "1m"}]
    for name in ("bound-a", "bound-b"):
        async with cluster.http.put(
            f"{cluster.router_url}/v1/rules/{name}", json={"limits": limits}, headers=headers
        ) as resp:
            assert resp.status == 201, await resp.text()
    version, names = await _rules(cluster)
    monkeypatch.setattr(cluster_rules, "MAX_RULES_BYTES", 10)  # already past it
    async with cluster.http.put(
        f"{cluster.router_url}/v1/rules/bound-c", json={"limits": limits}, headers=headers
    ) as resp:
        problem = await resp.json()
    assert resp.status == 400, problem
    assert [e["field"] for e in problem["errors"]] == ["rules"], problem
    assert "a cluster keeps at most 10" in problem["errors"][0]["message"], problem
    assert await _rules(cluster) == (version, names)
    async with cluster.http.delete(
        f"{cluster.router_url}/v1/rules/bound-a", headers=headers
    ) as resp:
        assert resp.status == 204, await resp.text()
    assert await _rules(cluster) == (version + 1, [n for n in names if n != "bound-a"])
    async with cluster.http.put(  # the same size: not larger
        f"{cluster.router_url}/v1/rules/bound-b",
        json={"limits": [{**limits[0], "limit": 6}]},
        headers=headers,
    ) as resp:
        assert resp.status == 200, await resp.text()


async def test_a_rules_file_past_the_cluster_bound_is_not_published(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    assert cluster.rules_file is not None
    before = await _rules(cluster)
    monkeypatch.setattr(cluster_rules, "MAX_RULES_BYTES", 10)
    doc = yaml.safe_load(cluster.rules_file.read_text())
    doc["rules"]["bound-file"] = {
        "limits": [{"algorithm": "fixed_window", "limit": 1, "window": "1m"}]
    }
    cluster.rules_file.write_text(yaml.safe_dump(doc))  # it only adds

    async def rejected() -> bool:
        rejection = cluster.router.rules.rejected
        return rejection is not None and "a cluster keeps at most 10" in rejection.cause

    await eventually(rejected)
    assert await _rules(cluster) == before
