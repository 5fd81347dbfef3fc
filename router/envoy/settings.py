"""The Envoy service's settings, read from the router's environment under the names
envoyproxy/ratelimit gives them (its src/settings/settings.go), so a deployment that
swaps the binary keeps its environment (docs/envoy.md has the table)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from router.errors import SettingsError

_TRUE = ("1", "t", "true", "y", "yes", "on")
# Go's time.ParseDuration units, in milliseconds
_GO_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6}
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|ms|s|m|h)")
_FALSE = ("0", "f", "false", "n", "no", "off", "")


@dataclass(frozen=True)
class EnvoySettings:
    # Upstream's default counts every hit, denied or not; true: a denied hit consumes
    # nothing (shardlimit's exact fixed window).
    stop_increment_when_over_limit: bool = False
    response_headers: bool = False
    limit_header: str = "RateLimit-Limit"
    remaining_header: str = "RateLimit-Remaining"
    reset_header: str = "RateLimit-Reset"
    global_shadow_mode: bool = False
    global_quota_mode: bool = False
    near_limit_ratio: float = 0.8
    # > 0: over-limit keys are answered by the router until their window ends
    # (shardlimit's cache_denials); the size itself is not used.
    local_cache_bytes: int = 0
    merge_domains: bool = False
    dynamic_metadata: bool = False  # RESPONSE_DYNAMIC_METADATA
    # Health says NOT_SERVING while the descriptors file holds no domain.
    healthy_with_config: bool = False
    # gRPC connections are closed (GOAWAY) after this long, then forced after the grace.
    max_connection_age_ms: int = 24 * 3_600_000
    max_connection_age_grace_ms: int = 3_600_000
    # TLS on the gRPC port beyond the router's own tls_cert / tls_key / tls_ca.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    client_ca: Path | None = None
    # Which server answers gRPC in plaintext: "lean" (router/envoy/lean_server.py) or
    # "grpcio" (its asyncio server, which TLS always uses). SHARDLIMIT_GRPC_SERVER.
    grpc_server: str = "lean"

    @property
    def cache_denials(self) -> bool:
        return self.local_cache_bytes > 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EnvoySettings:
        """Raises SettingsError naming the variable that does not parse."""
        source = os.environ if env is None else env
        ratio = _float(source, "NEAR_LIMIT_RATIO", 0.8)
        if not 0 <= ratio <= 1:
            raise SettingsError("NEAR_LIMIT_RATIO: must be from 0 to 1")
        return cls(
            stop_increment_when_over_limit=_bool(source, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT"),
            response_headers=_bool(source, "LIMIT_RESPONSE_HEADERS_ENABLED"),
            limit_header=_header(source, "LIMIT_LIMIT_HEADER", "RateLimit-Limit"),
            remaining_header=_header(source, "LIMIT_REMAINING_HEADER", "RateLimit-Remaining"),
            reset_header=_header(source, "LIMIT_RESET_HEADER", "RateLimit-Reset"),
            global_shadow_mode=_bool(source, "SHADOW_MODE"),
            global_quota_mode=_bool(source, "QUOTA_MODE"),
            near_limit_ratio=ratio,
            local_cache_bytes=_int(source, "LOCAL_CACHE_SIZE_IN_BYTES"),
            merge_domains=_bool(source, "MERGE_DOMAIN_CONFIG"),
            dynamic_metadata=_bool(source, "RESPONSE_DYNAMIC_METADATA"),
            healthy_with_config=_bool(source, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"),
            max_connection_age_ms=_duration(source, "GRPC_MAX_CONNECTION_AGE", 24 * 3_600_000),
            max_connection_age_grace_ms=_duration(
                source, "GRPC_MAX_CONNECTION_AGE_GRACE", 3_600_000
            ),
            tls_cert=_path(source, "GRPC_SERVER_TLS_CERT"),
            tls_key=_path(source, "GRPC_SERVER_TLS_KEY"),
            client_ca=_path(source, "GRPC_CLIENT_TLS_CACERT"),
            grpc_server=_choice(source, "SHARDLIMIT_GRPC_SERVER", ("lean", "grpcio")),
        )


def _bool(env: Mapping[str, str], name: str) -> bool:
    text = env.get(name, "").strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise SettingsError(f"{name}: must be true or false, not {env[name]!r}")


def _int(env: Mapping[str, str], name: str) -> int:
    text = env.get(name, "").strip() or "0"
    if not text.isdigit() or len(text) > 18:
        raise SettingsError(f"{name}: must be a non-negative integer, not {env[name]!r}")
    return int(text)


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    text = env.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        raise SettingsError(f"{name}: must be a number, not {text!r}") from None
    if value != value:  # NaN
        raise SettingsError(f"{name}: must be a number, not {text!r}")
    return value


def _duration(env: Mapping[str, str], name: str, default_ms: int) -> int:
    """A Go duration (`24h`, `1h30m`, `500ms`) in whole milliseconds."""
    text = env.get(name, "").strip()
    if not text:
        return default_ms
    parts = _GO_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise SettingsError(f"{name}: must be a duration such as 24h, 90m or 500ms, not {text!r}")
    return int(sum(float(n) * _GO_UNITS[u] for n, u in parts))


def _header(env: Mapping[str, str], name: str, default: str) -> str:
    text = env.get(name, "").strip() or default
    if not all(c.isascii() and (c.isalnum() or c in "-_") for c in text):
        raise SettingsError(f"{name}: must be a header name (letters, digits, - and _)")
    return text


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (the first when unset)."""
    text = env.get(name, "").strip().lower() or choices[0]
    if text not in choices:
        raise SettingsError(f"{name}: must be one of {', '.join(choices)}, not {env[name]!r}")
    return text


def _path(env: Mapping[str, str], name: str) -> Path | None:
    text = env.get(name, "").strip()
    return Path(text) if text else None
