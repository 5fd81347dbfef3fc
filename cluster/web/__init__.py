"""Service plumbing shared by the router and the nodes: problem+json errors, bearer
tokens, TLS contexts, Prometheus collectors, log set-up and the process runner.

Imported by `router`, `node` and `cluster.cli`; it imports only `cluster.model` and
`cluster.wire` from this project.
"""
