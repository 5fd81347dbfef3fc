"""A node's settings, in one place (the node's counterpart of router/config.py)."""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeConfig:
    node_id: str
    # redis:// or rediss:// (TLS: ?ssl_ca_certs=...), user:password@ for AUTH, or
    # redis+sentinel:// (node/store/connect.py)
    redis_url: str
    cluster_token: str | None = None  # what routers and peer nodes must present
    host: str = "127.0.0.1"  # the address the node serves on; its side ports bind there too
    # The side ports: the hot-path channel (node/edge/channel_server.py) and liveness
    # (node/health/liveness.py). 0: an ephemeral port; either way the node announces them
    # to the routers. Fixed ones are for firewalls and NetworkPolicies that list ports.
    channel_port: int = 0
    liveness_port: int = 0
    # The listener's context (cluster/web/tls.py), which the liveness and channel ports
    # use too; None: plain TCP.
    server_ssl: ssl.SSLContext | None = None
    # Calls to peer nodes (migration); None: the system's CAs, no client certificate.
    client_ssl: ssl.SSLContext | None = None
    # How long a batch's decision record lasts once no hold needs it
    # (None: node/store/counter_store.py's).
    decision_ttl_ms: int | None = None
    test_mode: bool = False  # the test clock endpoint answers
