"""What `shardlimit up` (and a scratch cluster) is asked to start: `UpOptions`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The Sentinels' down-after-milliseconds. A Sentinel pings, and reconnects to, each
# instance at most once a second; right after a failover its first ping of the new
# primary can go out a second after it started watching it, and with a down-after of
# 1000 ms that primary is then judged down before it could answer. The Sentinels that
# agreed the old primary was down still count as agreeing, so one such Sentinel fails
# the shard over a second time (1 in 12 failovers on Redis 6.2, 1 in 30 on 7.0; none in
# 30 on either at 1200 ms). The 200 ms over that second cover the Sentinel's timer period.
DOWN_AFTER_MS = 1200


@dataclass
class UpOptions:
    nodes: int = 3
    partitioner: str = "ring"
    port: int = 8080
    base_port: int = 7001
    host: str = "127.0.0.1"
    data_dir: Path = Path("data")
    config: Path | None = None
    appendfsync: str = "everysec"
    test_clock: bool = False
    routers: int = 1  # on consecutive ports from `port`, sharing nodes, rules and topology
    grpc_port: int | None = None  # Envoy's rate-limit service on the first router
    envoy_config: Path | None = None  # its descriptors (default: <data dir>/ratelimit.yaml)
    router_settings: dict[str, Any] = field(default_factory=dict)  # over --config's router:
    log_level: str | None = None  # the children's SHARDLIMIT_LOG_LEVEL (default: inherited)
    json_logs: bool = False  # children log JSON objects, one a line
    replicas: int = 0  # replica redis-servers per node, with 3 Sentinels (0: one Redis each)
    # Node processes per shard (its endpoints), as if each ran on a host of its own beside
    # one of the shard's Redis: a shard survives the loss of a whole host.
    endpoints: int = 1
    down_after_ms: int = DOWN_AFTER_MS
