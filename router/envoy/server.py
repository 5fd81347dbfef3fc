"""The gRPC server of the Envoy service: the rate-limit servicer, grpc.health.v1.Health,
and TLS when the router has a certificate.

Health answers for "" and, as envoyproxy/ratelimit, for "ratelimit" (and for the
rate-limit service's full name): SERVING while the router runs, NOT_SERVING while it
stops; with HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED the named ones are SERVING only
while the descriptors file holds at least one domain.

TLS uses the router's `tls_cert` / `tls_key`, or envoyproxy/ratelimit's
GRPC_SERVER_TLS_CERT / GRPC_SERVER_TLS_KEY; with GRPC_CLIENT_TLS_CACERT every client
must present a certificate chained to that CA (mutual TLS).

In plaintext the port is served by the lean HTTP/2 server of router/envoy/lean_server.py
(a fraction of grpcio's CPU per call), with the same handlers; with TLS, or with
SHARDLIMIT_GRPC_SERVER=grpcio, by grpcio's asyncio server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
from envoy.service.ratelimit.v3 import rls_pb2_grpc  # type: ignore[import-untyped]
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # type: ignore[import-untyped]

from cluster.web import tls
from cluster.web.serve import CannotListenError
from router.config import RouterConfig
from router.envoy.lean_server import LeanGrpcServer
from router.envoy.settings import EnvoySettings
from router.errors import SettingsError

SERVICE_NAME = "envoy.service.ratelimit.v3.RateLimitService"
HEALTH_NAMES = ("ratelimit", SERVICE_NAME)  # "ratelimit": envoyproxy/ratelimit's
GRACE_S = 1.0  # calls in flight get this long to finish when the router stops


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SettingsError(
            f"envoy gRPC TLS: cannot read {setting} {path}: {exc.strerror}"
        ) from exc


class GrpcServer:
    def __init__(self, config: RouterConfig, settings: EnvoySettings, servicer: Any) -> None:
        self.config = config
        self.settings = settings
        self.servicer = servicer
        self.health = health.aio.HealthServicer()
        self.cert = settings.tls_cert or config.tls_cert
        self.key = settings.tls_key or config.tls_key
        self._server: Any = None

    def credentials(self) -> Any:
        """Server credentials, or None for plaintext. SettingsError naming what is wrong
        (grpcio would only say it failed to bind)."""
        if self.cert is None and self.key is None:
            if self.settings.client_ca is not None:
                raise SettingsError("envoy gRPC TLS: GRPC_CLIENT_TLS_CACERT needs a certificate")
            return None
        if self.cert is None or self.key is None:
            raise SettingsError("envoy gRPC TLS: give both a certificate and its key")
        pair = (_read(self.key, "key"), _read(self.cert, "certificate"))
        try:
            tls.server_context(self.cert, self.key)  # the refusals the HTTP listener makes
        except tls.TlsError as exc:
            raise SettingsError(f"envoy gRPC TLS: {exc}") from exc
        ca = self.settings.client_ca
        return grpc.ssl_server_credentials(
            [pair],
            root_certificates=None if ca is None else _read(ca, "GRPC_CLIENT_TLS_CACERT"),
            require_client_auth=ca is not None,
        )

    def options(self) -> list[tuple[str, int]]:
        """grpcio's channel arguments for GRPC_MAX_CONNECTION_AGE(_GRACE). SO_REUSEPORT
        (grpcio's default) is off: a second router on the port would take a share of
        Envoy's calls, not be refused."""
        return [
            ("grpc.so_reuseport", 0),
            ("grpc.max_connection_age_ms", self.settings.max_connection_age_ms),
            ("grpc.max_connection_age_grace_ms", self.settings.max_connection_age_grace_ms),
        ]

    def describe(self) -> str:
        if self.cert is None:
            return " (plaintext)"
        return " (TLS, client certificates required)" if self.settings.client_ca else " (TLS)"

    async def config_loaded(self, domains: int) -> None:
        """The descriptors file (re)loaded with `domains` domains."""
        serving = domains > 0 or not self.settings.healthy_with_config
        status = health_pb2.HealthCheckResponse.SERVING
        if not serving:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

    def lean(self) -> bool:
        """Served by the lean server: plaintext, unless SHARDLIMIT_GRPC_SERVER=grpcio."""
        return self.cert is None and self.key is None and self.settings.grpc_server == "lean"

    async def start(self, domains: int) -> int:
        if self.lean():
            self.credentials()  # the same refusals as below (a CA without a certificate)
            lean = LeanGrpcServer(
                self.config.host,
                self.config.grpc_port,
                self.servicer,
                self.health,
                self.settings.max_connection_age_ms,
                self.settings.max_connection_age_grace_ms,
            )
            port = await lean.start()
            self._server = lean
        else:
            port = await self._start_grpcio()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        await self.config_loaded(domains)
        return port

    async def _start_grpcio(self) -> int:
        server = grpc.aio.server(options=self.options())
        rls_pb2_grpc.add_RateLimitServiceServicer_to_server(self.servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        address = f"{self.config.host}:{self.config.grpc_port}"
        credentials = self.credentials()
        try:
            if credentials is None:
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, credentials)
        except RuntimeError as exc:  # grpcio says no more than that it failed to bind
            raise CannotListenError(f"cannot listen on {address} (gRPC): {exc}") from exc
        await server.start()
        self._server = server
        return int(port)

    async def stop(self) -> None:
        if self._server is None:
            return
        await self.health.enter_graceful_shutdown()
        await self._server.stop(GRACE_S)
        self._server = None
