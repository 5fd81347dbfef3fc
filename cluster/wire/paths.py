"""The node's HTTP endpoints, as the router and the tools call them, and the batch
endpoint's content type."""

from __future__ import annotations

from typing import Final

BATCH_PATH: Final = "/node/v1/batch"
DECISION_PATH: Final = "/node/v1/decision"  # an all-or-nothing batch's decision record
DECISIONS_HANDOVER_PATH: Final = "/node/v1/decisions/handover"  # a leaving coordinator's
DECISIONS_ADOPT_PATH: Final = "/node/v1/decisions/adopt"  # ... records, to its successor
# Control endpoints (JSON bodies): topology, migration, the topology-change lease, stats.
TOPOLOGY_PATH: Final = "/node/v1/topology"  # PUT: adopt a topology; GET: the node's
STATS_PATH: Final = "/node/v1/stats"  # epoch, liveness port, key counts
# The same, brief: epoch, liveness port, cluster id and rules version, without reading
# Redis' INFO (the routers' epoch poll, twice a second). A node that predates it answers
# the whole stats, which hold the same fields.
EPOCH_STATS_PATH: Final = f"{STATS_PATH}?brief=1"
EXPORT_PATH: Final = "/node/v1/export"  # a migration source hands out moving keys
IMPORT_PATH: Final = "/node/v1/import"  # a target takes keys in
LANDED_PATH: Final = "/node/v1/landed"  # which MIGRATEd keys a target holds (and a replica)
HOLDS_SETTLE_PATH: Final = "/node/v1/holds/settle"  # settle holds whose key moved here
HOLDS_ADOPT_PATH: Final = "/node/v1/holds/adopt"  # a source hands over holds of moved keys
MIGRATE_PATH: Final = "/node/v1/migrate"  # one copy step of a migration
MIGRATION_CLEANUP_PATH: Final = "/node/v1/migration/cleanup"  # drop migration markers
LEASE_PATH: Final = "/node/v1/lease"  # acquire / renew / release a change lease
RULES_PATH: Final = "/node/v1/rules"  # GET / PUT the cluster's versioned rules document
TEST_CLOCK_PATH: Final = "/node/v1/test/clock"  # test mode only: offset the scripts' clock
HEALTH_PATH: Final = "/healthz"  # the node process answers
READY_PATH: Final = "/readyz"  # the node and its Redis answer
METRICS_PATH: Final = "/metrics"  # Prometheus exposition, no token (no label holds a key)
CONTENT_TYPE: Final = "application/msgpack"
