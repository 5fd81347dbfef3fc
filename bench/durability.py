"""`durability`: what `durability: replica` costs, and what a failover keeps.

One scratch cluster whose shards are each a Redis primary with replicas watched by Redis
Sentinel (`redis+sentinel://`, `down-after-milliseconds` 1200). Rules are put through the
admin API (an inline check carries no `durability`).

1. Throughput, side by side: single `/v1/check` (wrk, as the `single` piece: 64
   connections, one random key of 100,000 per request) and `/v1/check/batch` (as the
   `batch` piece: 16 connections, batches of 100) with a rule of `durability: replica` and
   the same rule with `durability: primary` (fixed_window 10^9 per 1h). Twice `rounds`
   rounds of half `seconds` each alternate which rule goes first; the ratio replica ÷
   primary is the median over rounds of each round's back-to-back pair.
2. Host loss: each shard spans 1 + replicas hosts, each running one of its Redis and one
   of its node processes (endpoints). While `bench.durability_load` (its own process,
   paced closed loop: 16 connections, at most 1,000 checks/s) checks 20 keys of one shard
   under a `replica` and 20 under a `primary` quota rule (interleaved), the host of the
   shard's current primary (Sentinel's answer, mapped to its process by port) is lost
   `--kills` times: the primary and the endpoint beside it SIGKILLed together (when that
   endpoint is the one the router sends to, the router moves to another). Once every
   Sentinel names the promoted replica, both are started again (as a supervisor would)
   and the Redis awaited until it is a replica with its link up and every Sentinel counts
   it, so the next kill has a replica to promote. Per kill and rule: from
   the SIGKILL to the first normal (not degraded) answer to a check sent after it; the
   shard's figure is the earlier of the two (its first normal answer), and Sentinel's
   own log gives when it promoted (`promoted_after_s`). Two replicas by default: with
   one, the promoted primary has no replica to WAIT for until the killed one is back,
   so `replica` checks stay degraded until then (`--replicas 1` shows it).
3. Acknowledged decisions lost: after the kills and with the load stopped, each key's
   counter is read back (cost-0 checks) and compared with the admitted answers (allowed,
   not degraded) the load received: lost = admitted - held, key by key (a key holding
   more than it admitted, a degraded answer that consumed, shows in
   `held_over_admitted`, not as a negative loss).

    python -m bench.durability [--seconds 10] [--rounds 2] [--kills 5] [--replicas 2]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from statistics import mean, median
from typing import Any
from urllib.parse import quote

from bench.compare import Settings, ratio, with_cpu
from bench.env import python_env
from bench.http import request
from bench.progress import note
from bench.wrk import LIMITS_JSON, batch_script, check_script, run_wrk
from cluster.local.cluster import LocalCluster, scratch_cluster
from cluster.local.procs import ChildProcess, child_preexec
from cluster.local.redis_proc import RedisProcess
from cluster.local.sentinel_proc import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, ask, sentinel_master

ADMIN = "durability-bench-admin"
THROUGHPUT_LIMITS = [{"algorithm": "fixed_window", "limit": 1_000_000_000, "window": "1h"}]
QUOTA = 10**12  # never runs out
FAILOVER_LIMITS = [{"algorithm": "quota", "limit": QUOTA}]
SIDES = ("primary", "replica")
RECOVERY_WITHIN_S = 60.0  # a rule whose keys answer degraded longer than this: None
REJOIN_WITHIN_S = 90.0  # Sentinel demotes a returning primary after its INFO period + grace


def _poll(condition: Callable[[], bool], within: float, what: str, every: float = 0.1) -> None:
    """sentinel_proc.wait_for, polling less often: each poll of the shard asks every
    Sentinel and Redis over new connections, and the kills are timed on the same cores."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {within:.0f} s")
        time.sleep(every)


def _rule(kind: str, durability: str) -> str:
    return f"dur-{kind}-{durability}"


def put_rules(router: str) -> None:
    for durability in SIDES:
        for kind, limits in (("thr", THROUGHPUT_LIMITS), ("fo", FAILOVER_LIMITS)):
            doc = {"limits": limits, "durability": durability}
            request(f"{router}/v1/rules/{_rule(kind, durability)}", "PUT", doc, ADMIN)


# --------------------------------------------------------------------------- Sentinel


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(entry: Any) -> dict[str, str]:
    """One entry of SENTINEL REPLICAS: a mapping (redis-py parses it) or a flat list."""
    if isinstance(entry, dict):
        return {_text(k): _text(v) for k, v in entry.items()}
    items = [_text(x) for x in entry]
    return dict(zip(items[::2], items[1::2], strict=False))


def _healthy_replicas(local: LocalCluster, shard: str) -> list[int]:
    """Ports of the replicas every Sentinel counts as up and linked (the fewest seen)."""
    assert local.replication is not None
    seen: list[list[int]] = []
    for sentinel in local.replication.sentinels:
        found = ask(sentinel.host, sentinel.port, "SENTINEL", "REPLICAS", shard) or []
        ports = []
        for entry in found:
            info = _fields(entry)
            if set(info.get("flags", "").split(",")) == {"slave"} and (
                info.get("master-link-status") == "ok"
            ):
                ports.append(int(info["port"]))
        seen.append(sorted(ports))
    return min(seen, key=len) if seen else []


def _agreed_primary(local: LocalCluster, shard: str) -> tuple[str, int] | None:
    """The primary every Sentinel names, or None while they differ."""
    assert local.replication is not None
    named = {sentinel_master([s], shard) for s in local.replication.sentinels}
    return named.pop() if len(named) == 1 else None


def switches(local: LocalCluster, shard: str) -> list[list[tuple[float, int, int]]]:
    """Every promotion of `shard` each Sentinel logged (`+switch-master`): (wall time,
    old port, new port). The leader logs it as it promotes, the others as they learn."""
    assert local.replication is not None
    seen: list[list[tuple[float, int, int]]] = []
    for sentinel in local.replication.sentinels:
        try:
            text = (sentinel.data_dir / "sentinel.log").read_text(errors="replace")
        except OSError:
            continue
        found = []
        for line in text.splitlines():
            head, mark, tail = line.partition(" # +switch-master ")
            words = tail.split()
            if not mark or len(words) != 5 or words[0] != shard:
                continue
            # "<pid>:X 27 Nov 2026 05:00:01.123": the machine's local time
            stamp = " ".join(head.split()[1:5])
            when = dt.datetime.strptime(stamp, "%d %b %Y %H:%M:%S.%f").timestamp()
            found.append((when, int(words[2]), int(words[4])))
        seen.append(found)
    return seen


def _role(process: RedisProcess) -> list[Any] | None:
    found = ask(process.host, process.port, "ROLE")
    return None if found is None else list(found)


def _online_replicas(primary: RedisProcess) -> int:
    """Replicas the primary itself streams to (ROLE: connected replicas)."""
    role = _role(primary)
    if not role or role[0] != b"master":
        return 0
    return len(role[2])


def shard_ready(
    local: LocalCluster, shard: str, replicas: int, by_port: dict[int, RedisProcess]
) -> bool:
    """Every Sentinel names one primary, which streams to every replica, all of which
    every Sentinel counts as up: a kill now has a replica to promote."""
    primary = _agreed_primary(local, shard)
    if primary is None or primary[1] not in by_port:
        return False
    if _online_replicas(by_port[primary[1]]) < replicas:
        return False
    assert local.replication is not None
    for sentinel in local.replication.sentinels:
        if len(ask(sentinel.host, sentinel.port, "SENTINEL", "SENTINELS", shard) or []) < 2:
            return False
    return len(_healthy_replicas(local, shard)) >= replicas


# --------------------------------------------------------------------------- 1. throughput


def _by_rule(script: str, rule: str) -> str:
    """One of bench.wrk's scripts, naming a rule instead of carrying the inline limits."""
    inline = f'"limits":{LIMITS_JSON}'
    if inline not in script:
        raise RuntimeError("bench.wrk's scripts changed: no inline limits to replace")
    return script.replace(inline, f'"rule":"{rule}"')


def throughput(router: str, s: Settings, what: str) -> dict[str, Any]:
    """`what` is single or batch: each rule's decisions/s in alternating rounds."""
    if what == "single":
        url, wrk = router + "/v1/check", s.wrk_single()
        scripts = {d: _by_rule(check_script(s.keys), _rule("thr", d)) for d in SIDES}
    else:
        url, wrk = router + "/v1/check/batch", s.wrk_batch()
        scripts = {d: _by_rule(batch_script(s.keys, s.batch_size), _rule("thr", d)) for d in SIDES}
    for side in SIDES:
        note(f"durability: {what}: warming up {side} ({s.warmup_seconds:g} s)")
        run_wrk(url, scripts[side], replace(wrk, seconds=s.warmup_seconds))
    # Twice the rounds at half the seconds: the same time, twice the alternations.
    rounds = 2 * max(1, s.rounds)
    wrk = replace(wrk, seconds=max(1.0, s.seconds / 2))
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    for r in range(rounds):
        for side in SIDES if r % 2 == 0 else SIDES[::-1]:
            result = with_cpu(partial(run_wrk, url, scripts[side], wrk))
            note(
                f"durability: {what} round {r + 1} {side}: "
                f"{result['served_decisions_per_s']:,.0f} decisions/s "
                f"({result['degraded']} degraded, {result['other_status']} other status)"
            )
            runs[side].append({"round": r + 1, **result})
    best = {side: max(x["served_decisions_per_s"] for x in runs[side]) for side in SIDES}
    means = {side: mean(x["served_decisions_per_s"] for x in runs[side]) for side in SIDES}
    # Each round's two runs are back to back: their ratio sees the same moment of the
    # shared machine, and the median of those ratios is not moved by one lucky run.
    paired = [
        round(r["served_decisions_per_s"] / p["served_decisions_per_s"], 3)
        for p, r in zip(runs["primary"], runs["replica"], strict=True)
        if p["served_decisions_per_s"]
    ]
    return {
        "load_generator": {"tool": "wrk", **wrk.to_dict(), "keys": s.keys}
        | ({"batch": s.batch_size} if what == "batch" else {}),
        "primary_decisions_per_s": best["primary"],
        "replica_decisions_per_s": best["replica"],
        "ratio": median(paired) if paired else None,
        "round_ratios": paired,
        "ratio_of_best": ratio(best["replica"], best["primary"]),
        "ratio_of_means": ratio(means["replica"], means["primary"]),
        "degraded": {side: sum(x["degraded"] for x in runs[side]) for side in SIDES},
        "runs": runs,
    }


# --------------------------------------------------------------------------- 2. failover


class LoadChild:
    """`bench.durability_load` in its own process; lines in over stdin, out over stdout."""

    def __init__(self, router: str, spec: Path, connections: int, rate: float) -> None:
        args = [sys.executable, "-m", "bench.durability_load", "--router", router]
        args += ["--spec", str(spec), "--connections", str(connections), "--rate", f"{rate:g}"]
        self.errors = spec.with_suffix(".err")  # a file, not a pipe nobody drains
        with self.errors.open("wb") as stderr:
            self.proc = subprocess.Popen(
                args,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                env=python_env(),
                preexec_fn=child_preexec,
            )
        self.buffer = b""

    def say(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def line(self, within: float) -> str | None:
        """The next line it printed, or None after `within` seconds (or at its exit)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + within
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()

    def stop(self) -> dict[str, Any]:
        self.say("stop")
        while (line := self.line(60)) is not None:
            if line.startswith("result "):
                self.proc.wait(30)
                result: dict[str, Any] = json.loads(line.removeprefix("result "))
                return result
        self.kill()
        err = self.errors.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"bench.durability_load gave no result: {err}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def keys_on(router: str, node: str, prefix: str, count: int) -> list[str]:
    found: list[str] = []
    for i in range(100 * count):
        key = f"{prefix}:{i}"
        if request(f"{router}/v1/locate?key={quote(key)}")["node"] == node:
            found.append(key)
            if len(found) == count:
                return found
    raise RuntimeError(f"fewer than {count} keys of {prefix}:* on {node}")


def _await_recovery(
    load: LoadChild, number: int, recovered: dict[str, float], until: float
) -> None:
    """Read the load's lines until every rule recovered from kill `number` (or `until`)."""
    while not set(SIDES) <= set(recovered):
        line = load.line(max(0.0, until - time.monotonic()))
        if line is None:
            return
        words = line.split()
        if words[:1] == ["recovered"] and int(words[1]) == number:
            recovered[words[2]] = float(words[3])


def one_kill(
    local: LocalCluster,
    load: LoadChild,
    shard: str,
    number: int,
    replicas: int,
    by_port: dict[int, RedisProcess],
) -> dict[str, Any]:
    _poll(lambda: shard_ready(local, shard, replicas, by_port), REJOIN_WITHIN_S, "shard ready")
    primary = _agreed_primary(local, shard)
    assert primary is not None
    victim = by_port[primary[1]]
    beside = host_endpoint(local, shard, victim)
    was_active = endpoint_active(local.router_url, shard, beside.url)
    victim.kill()
    beside.process.kill()
    killed = time.monotonic()
    killed_wall = time.time()
    load.say(f"kill {killed!r}")
    # Started again as a supervisor would, once every Sentinel names the promoted
    # replica (one still seeing the old primary down would fail over to it again).
    _poll(
        lambda: (p := _agreed_primary(local, shard)) is not None and p[1] != victim.port,
        RECOVERY_WITHIN_S,
        "every Sentinel names the promoted replica",
    )
    promoted = _agreed_primary(local, shard)
    assert local.replication is not None
    local.replication.respawn(shard, victim)  # as `shardlimit up` does: a replica now
    beside.process.start(30)
    victim.wait_ready(10)
    restarted = time.monotonic()
    _poll(
        lambda: (
            (role := _role(victim)) is not None and role[0] == b"slave" and role[3] == b"connected"
        ),
        REJOIN_WITHIN_S,
        "the killed primary rejoins as a replica",
    )
    rejoined = time.monotonic() - restarted
    recovered: dict[str, float] = {}
    _await_recovery(load, number, recovered, killed + RECOVERY_WITHIN_S)
    # The shard is back at its first normal answer, whichever rule it was for.
    seconds = [x for x in (recovered.get(side) for side in SIDES) if x is not None]
    kill = {
        "kill": number + 1,
        "killed_at_unix": round(killed_wall, 3),
        "killed_port": victim.port,
        "killed_endpoint": beside.url,
        "killed_endpoint_was_active": was_active,
        "promoted_port": None if promoted is None else promoted[1],
        "first_normal_s": {side: recovered.get(side) for side in SIDES},
        "seconds": min(seconds) if seconds else None,
        "restarted_after_s": round(restarted - killed, 3),
        "rejoined_as_replica_after_s": round(restarted - killed + rejoined, 3),
    }
    note(
        f"durability: kill {number + 1}: :{victim.port} and {beside.url}"
        f"{' (active)' if was_active else ''} -> :{kill['promoted_port']}, "
        f"first normal answer after {kill['first_normal_s']} s, the killed one "
        f"restarted after {kill['restarted_after_s']} s and a replica again after "
        f"{kill['rejoined_as_replica_after_s']} s"
    )
    return kill


@dataclass
class Endpoint:
    url: str
    process: ChildProcess


def host_endpoint(local: LocalCluster, shard: str, redis: RedisProcess) -> Endpoint:
    """The node process on the host of `redis`: host 0 runs the shard's first Redis and
    first endpoint, host k its k-th replica and (k+1)-th endpoint."""
    index = [spec.id for spec in local.members].index(shard)
    assert local.replication is not None
    hosts = [local.redis[index], *local.replication.shards[shard]]
    host = next(i for i, process in enumerate(hosts) if process is redis)
    return Endpoint(local.members[index].urls[host], local.endpoints[index][host])


def endpoint_active(router: str, shard: str, url: str) -> bool:
    """Whether the router sends `shard`'s checks to the endpoint at `url`."""
    nodes = request(f"{router}/v1/cluster")["nodes"]
    endpoints = next(n["endpoints"] for n in nodes if n["id"] == shard)
    return any(e["url"] == url and e["active"] for e in endpoints)


def read_held(router: str, rule: str, keys: list[str], within: float = 15.0) -> dict[str, int]:
    """{key: units its counter holds} from cost-0 checks; degraded reads are retried."""
    held: dict[str, int] = {}
    deadline = time.monotonic() + within
    pending = list(keys)
    while pending and time.monotonic() < deadline:
        checks = [{"key": key, "rule": rule, "cost": 0} for key in pending]
        answer = request(f"{router}/v1/check/batch", "POST", {"checks": checks})
        left = []
        for key, result in zip(pending, answer["results"], strict=True):
            remaining = (result.get("limits") or [{}])[0].get("remaining")
            if result.get("degraded") or remaining is None:
                left.append(key)
            else:
                held[key] = QUOTA - int(remaining)
        pending = left
        if pending:
            time.sleep(0.5)
    return held


def _worst(seconds: list[float | None]) -> float | None:
    """The longest; None when any kill did not recover (or there were none)."""
    known = [x for x in seconds if x is not None]
    return max(known) if known and len(known) == len(seconds) else None


def losses(load: dict[str, Any], held: dict[str, int], keys: list[str]) -> dict[str, Any]:
    admitted = {key: int(load["admitted"].get(key, 0)) for key in keys}
    unknown = sum(int(load["unknown"].get(key, 0)) for key in keys)
    lost = sum(max(0, admitted[k] - held[k]) for k in keys if k in held)
    return {
        "keys": len(keys),
        "admitted": sum(admitted.values()),
        "held": sum(held.values()),
        "lost": lost if len(held) == len(keys) else None,
        "lost_keys": sum(1 for k in keys if k in held and admitted[k] > held[k]),
        "held_over_admitted": sum(max(0, held[k] - admitted[k]) for k in keys if k in held),
        "degraded_answers": sum(int(load["degraded"].get(key, 0)) for key in keys),
        "unknown_answers": unknown,
        "unreadable_keys": len(keys) - len(held),
    }


def failover(
    local: LocalCluster,
    kills: int,
    replicas: int,
    keys: int,
    connections: int,
    rate: float,
    work: Path,
) -> dict[str, Any]:
    assert local.replication is not None
    router, shard = local.router_url, local.node_id(0)
    by_port = {p.port: p for p in local.redis}
    for shard_replicas in local.replication.shards.values():
        by_port |= {p.port: p for p in shard_replicas}
    spec_keys = {side: keys_on(router, shard, f"fo-{side}", keys) for side in SIDES}
    spec = work / "durability-load.json"
    spec.write_text(
        json.dumps({side: {"rule": _rule("fo", side), "keys": spec_keys[side]} for side in SIDES})
    )
    _poll(lambda: shard_ready(local, shard, replicas, by_port), 60, "the shard is ready")
    note(f"durability: failover: {kills} kills of {shard}'s primary under load")
    load = LoadChild(router, spec, connections, rate)
    try:
        time.sleep(2.0)  # traffic on every key before the first kill
        runs: list[dict[str, Any]] = []
        for n in range(kills):
            if n:  # Sentinel's rule, not a condition to poll: no failover of a shard
                # within twice its failover-timeout of the last one
                time.sleep(2 * FAILOVER_TIMEOUT_MS / 1000)
            runs.append(one_kill(local, load, shard, n, replicas, by_port))
        result = load.stop()
    finally:
        load.kill()
    for run, watch in zip(runs, result["kills"], strict=False):
        run["degraded_before_recovery"] = watch["degraded_before_recovery"]
    seconds = [run["seconds"] for run in runs]
    logged = switches(local, shard)
    promotions = max(logged, key=len, default=[])
    for run in runs:
        after = [
            t
            for found in logged
            for t, old, _ in found
            if old == run["killed_port"] and t >= run["killed_at_unix"] - 0.05
        ]
        run["promoted_after_s"] = round(min(after) - run["killed_at_unix"], 3) if after else None
    held = {side: read_held(router, _rule("fo", side), spec_keys[side]) for side in SIDES}
    return {
        "failover": {
            "shard": shard,
            "replicas_per_shard": replicas,
            "down_after_ms": DOWN_AFTER_MS,
            "kills": runs,
            "promotions_logged": [[old, new] for _, old, new in promotions],
            "promotions_not_ours": len(promotions) - len(runs),
            "seconds": seconds,
            "max_s": _worst(seconds),
            "max_s_by_rule": {
                side: _worst([r["first_normal_s"][side] for r in runs]) for side in SIDES
            },
        },
        "lost": {side: losses(result, held[side], spec_keys[side]) for side in SIDES},
        "load": {
            "generator": "bench.durability_load (own process, paced closed loop, keep-alive)",
            "connections": connections,
            "rate_cap_per_s": rate,
            "keys_per_rule": keys,
            "rules": {side: {"limits": FAILOVER_LIMITS, "durability": side} for side in SIDES},
            "answered": result["answered"],
            "elapsed_s": result["elapsed_s"],
            "error_samples": result["error_samples"][:3],
            "degraded_reasons": result["degraded_reasons"],
        },
    }


# --------------------------------------------------------------------------- the piece


def durability(
    s: Settings,
    nodes: int = 3,
    replicas: int = 2,
    kills: int = 5,
    keys: int = 20,
    connections: int = 16,
    rate: float = 1000.0,
    data_dir: Path | None = None,
) -> dict[str, Any]:
    """The piece; `data_dir` (kept) holds the cluster's files and logs, else a temporary one."""
    with contextlib.ExitStack() as stack:
        root = data_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sl-dur-")))
        local = stack.enter_context(
            scratch_cluster(
                nodes,
                admin_token=ADMIN,
                data_dir=root / "cluster",
                replicas=replicas,
                endpoints=1 + replicas,
                log_level="WARNING",
            )
        )
        note(
            f"durability: {nodes} nodes, {replicas} replica(s) and {1 + replicas} endpoints "
            "each, 3 Sentinels"
        )
        put_rules(local.router_url)
        out: dict[str, Any] = {
            "cluster": {
                "nodes": nodes,
                "replicas_per_node": replicas,
                "endpoints_per_node": 1 + replicas,
                "sentinels": 3,
            },
            "rules": {
                _rule(kind, d): {"limits": limits, "durability": d}
                for kind, limits in (("thr", THROUGHPUT_LIMITS), ("fo", FAILOVER_LIMITS))
                for d in SIDES
            },
            "single": throughput(local.router_url, s, "single"),
            "batch": throughput(local.router_url, s, "batch"),
        }
        out |= failover(local, kills, replicas, keys, connections, rate, root)
    lost = out["lost"]
    note(
        f"durability: single {out['single']['ratio']}, batch {out['batch']['ratio']}, "
        f"failover max {out['failover']['max_s']} s, lost replica {lost['replica']['lost']} "
        f"/ primary {lost['primary']['lost']}"
    )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.durability", description=__doc__)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, help="keep the cluster's files and logs here")
    args = parser.parse_args(argv)
    settings = Settings(seconds=args.seconds, rounds=args.rounds)
    result = durability(settings, args.nodes, args.replicas, args.kills, data_dir=args.data_dir)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
