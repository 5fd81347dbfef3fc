"""The router's view of the cluster (topology, one node client per node, routing), how
it keeps that topology in step with the nodes', and the orchestration of live
resharding. Reaches nodes only through router/channel/."""
