"""Every call from the router to a node: the hot-path binary channel (cluster/wire.py),
the per-node queue and batcher, breaker, liveness probe and recovery, and the one
control-plane client. Imports no other room of the router."""
