"""envoyproxy/ratelimit's README Examples 1-11 against `shardlimit up --grpc-port` (real
processes), through a grpcio client; prints each example's answers (docs/envoy.md).

    .venv/bin/python -m bench.envoy_readme_examples
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc  # type: ignore[import-untyped]

from cluster.local.ports import free_port_run
from cluster.local.redis_proc import free_port

# The README's configurations (Example 9's three documents and Example 4's second one
# renamed, Example 8 and 10's one domain each), one document per domain.
CONFIG = """
domain: mongo_cps
descriptors:
  - {key: database, value: users, rate_limit: {unit: second, requests_per_unit: 500}}
  - {key: database, value: default, rate_limit: {unit: second, requests_per_unit: 500}}
---
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - {key: to_number, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: to_number, rate_limit: {unit: day, requests_per_unit: 100}}
---
domain: edge_proxy_per_ip
descriptors:
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: remote_address, value: 50.0.0.5, rate_limit: {unit: second, requests_per_unit: 0}}
---
domain: example4
descriptors:
  - {key: key, value: value, rate_limit: {requests_per_unit: 300, unit: second}}
---
domain: example4_nested
descriptors:
  - key: key
    value: value
    descriptors:
      - {key: subkey, rate_limit: {requests_per_unit: 300, unit: second}}
---
domain: internal
descriptors:
  - {key: ldap, rate_limit: {unlimited: true}}
  - {key: azure, rate_limit: {unit: minute, requests_per_unit: 100}}
---
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
      - {key: user, value: user-b, rate_limit: {requests_per_unit: 20, unit: second}}
---
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
---
domain: example8
descriptors:
  - {key: key1, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: key1, value: value1, rate_limit: {unit: minute, requests_per_unit: 20}}
---
domain: example9
descriptors:
  - {key: key1, value: value*, rate_limit: {unit: minute, requests_per_unit: 20}}
---
domain: example9
descriptors:
  - {key: path, value: /api/*/action, rate_limit: {unit: minute, requests_per_unit: 20}}
---
domain: example9
descriptors:
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 20}
---
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}
---
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
"""

Code = rls_pb2.RateLimitResponse.Code


def entries(*pairs: tuple[str, str], hits: int | None = None) -> Any:
    out = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in pairs]
    )
    if hits is not None:
        out.hits_addend.value = hits
    return out


class Client:
    def __init__(self, stub: Any) -> None:
        self.stub = stub

    def call(self, domain: str, *descriptors: Any) -> Any:
        request = rls_pb2.RateLimitRequest(domain=domain, descriptors=list(descriptors))
        return self.stub.ShouldRateLimit(request, timeout=5)

    def show(self, label: str, domain: str, *descriptors: Any, times: int = 1) -> None:
        """`times` calls; runs of equal answers printed once with their count."""
        runs: list[list[Any]] = []
        for _ in range(times):
            r = self.call(domain, *descriptors)
            answer = (
                Code.Name(r.overall_code),
                [
                    (Code.Name(s.code), s.limit_remaining)
                    if s.HasField("current_limit") or s.limit_remaining
                    else (Code.Name(s.code), "no limit")
                    for s in r.statuses
                ],
            )
            if runs and runs[-1][0] == answer:
                runs[-1][1] += 1
            else:
                runs.append([answer, 1])
        text = ", ".join(f"{n}x {a[0]} {a[1]}" for a, n in runs)
        print(f"  {label}: {text}")


def next_second() -> None:
    """Per-second examples start at a second's beginning, so one window holds them."""
    time.sleep(1.05 - time.time() % 1)


def run(client: Client) -> None:
    print("Example 1 (500/second per database): 500 hits at once, then 1")
    next_second()
    client.show(
        "database=users hits_addend 500", "mongo_cps", entries(("database", "users"), hits=500)
    )
    client.show("database=users", "mongo_cps", entries(("database", "users")))
    client.show("database=other", "mongo_cps", entries(("database", "other")))
    print("Example 2 (5 marketing messages a day per number, 100 messages a day per number)")
    marketing = entries(("message_type", "marketing"), ("to_number", "2061111111"))
    number = entries(("to_number", "2061111111"))
    client.show("marketing + number", "messaging", marketing, number, times=6)
    print("Example 3 (10/second per IP, 50.0.0.5 blocked)")
    next_second()
    client.show("50.0.0.1", "edge_proxy_per_ip", entries(("remote_address", "50.0.0.1")), times=11)
    client.show("50.0.0.5", "edge_proxy_per_ip", entries(("remote_address", "50.0.0.5")))
    print("Example 4 (a limit applies at its depth only)")
    deep = entries(("key", "value"), ("subkey", "subvalue"))
    client.show("flat config", "example4", deep)
    client.show("nested config", "example4_nested", deep)
    print("Example 5 (unlimited)")
    client.show("ldap", "internal", entries(("ldap", "x")))
    client.show("azure", "internal", entries(("azure", "x")))
    print("Example 6 (shadow_mode for user-a, 10/second; user-b 20/second)")
    next_second()
    user_a = entries(("service", "auth-service"), ("user", "user-a"))
    user_b = entries(("service", "auth-service"), ("user", "user-b"))
    client.show("user-a", "example6", user_a, times=12)
    client.show("user-b", "example6", user_b, times=21)
    print("Example 7 (replaces: specific_limit 5/second replaced by 10/second)")
    next_second()
    first = entries(("key_1", "value_1"), ("user", "bkthomps"))
    second = entries(("key_2", "value_2"), ("user", "bkthomps"))
    client.show("both", "example7", first, second, times=11)
    next_second()
    client.show("key_1 alone", "example7", first, times=6)
    print("Example 8 (key1 10/minute per value, key1=value1 20/minute)")
    client.show(
        "key1=unspecified_value", "example8", entries(("key1", "unspecified_value")), times=11
    )
    client.show("key1=value1", "example8", entries(("key1", "value1")))
    print("Example 9 (wildcards)")
    for domain_key, value in (
        ("key1", "valueXYZ"),
        ("key1", "other"),
        ("path", "/api/123/action"),
        ("path", "/api/123/other"),
        ("route", "/api/v1/resource/123/action"),
    ):
        client.show(f"{domain_key}={value}", "example9", entries((domain_key, value)))
    print("Example 10 (value_to_metric)")
    request = entries(("route", "api"), ("http_method", "GET"), ("subject_id", "123"))
    client.show("route=api GET 123", "example10", request)
    print("Example 11 (share_threshold)")
    client.show("files/a.pdf", "example11", entries(("files", "files/a.pdf")), times=5)
    client.show("files/b.csv", "example11", entries(("files", "files/b.csv")), times=5)
    client.show("files/c.txt", "example11", entries(("files", "files/c.txt")))
    alone = entries(("files_no_share", "files_no_share/a.pdf"))
    client.show("files_no_share/a.pdf", "example11", alone, times=11)
    client.show(
        "files_no_share/b.csv", "example11", entries(("files_no_share", "files_no_share/b.csv"))
    )


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "up"
        config = Path(tmp) / "ratelimit.yaml"
        config.write_text(CONFIG)
        port, grpc_port, base = free_port(), free_port(), free_port_run(3)
        env = dict(os.environ, MERGE_DOMAIN_CONFIG="true")  # Example 9's three documents
        command = [
            sys.executable,
            "-m",
            "cluster.cli",
            "up",
            "--json",
            "--port",
            str(port),
            "--base-port",
            str(base),
            "--data-dir",
            str(data_dir),
            "--grpc-port",
            str(grpc_port),
            "--envoy-config",
            str(config),
        ]
        print("$ shardlimit up --grpc-port", grpc_port, "--envoy-config ratelimit.yaml")
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                print("shardlimit up failed", file=sys.stderr)
                return 1
            print("routers:", json.loads(line)["routers"])
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                run(Client(rls_pb2_grpc.RateLimitServiceStub(channel)))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
