"""How a check becomes a decision beyond one node's script: public answers, all-or-
nothing batches over several nodes, hot keys spread over sub-counters, the denial
cache, quota adjustment and request-id replay. Used by `router.service`."""
