"""Envoy's rate-limit service on gRPC (envoy.service.ratelimit.v3): the descriptors
config in envoyproxy/ratelimit's format, its settings, answers and stats. Reaches
decisions only through `router.service`. Imported by `router.app` only, and only when
the `envoy` extra is installed."""
