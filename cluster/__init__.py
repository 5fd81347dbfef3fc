"""shardlimit's shared package, in rooms (each sub-package's docstring says who may import
it):

    wire/     the router<->node contract: ops and results, frames, control messages, paths
    model/    pure model: partitioners, topology, limits, algorithms, calendar, keys
    sdk/      what applications import: clients, decorator, ASGI/aiohttp middleware
    web/      problem+json, auth, TLS, metrics, logs, the process runner
    local/    child processes for `up`, tests and bench; the load generator
    cli/      the `shardlimit` command (the only code that imports router/node)
"""

from cluster import _moved

_moved.install()
