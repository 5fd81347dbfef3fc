"""Child processes on this machine: a local cluster for `shardlimit up`, tests and
benchmarks (Redis, nodes, routers on free ports) and the load generator, which always
runs in a process of its own.

Imported by `cluster.cli`, tests and bench. It starts the router and the nodes as
`python -m cluster.cli serve ...` processes and never imports them.
"""
