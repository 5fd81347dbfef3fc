"""Liveness (the probe port) and the node's Prometheus metrics."""
