"""The router's view of the cluster (topology, one node client per node, routing) and
the orchestration of live resharding."""
