"""Envoy's rate-limit service on gRPC (envoy.service.ratelimit.v3): the descriptors
config in envoyproxy/ratelimit's format, its settings, answers and stats. Reaches
decisions only through `router.service`: nothing of `router.decide`, `router.channel`
or `router.control` (tests/unit/test_import_rules.py). Imported by `router.app` only,
and only when the `envoy` extra is installed."""
