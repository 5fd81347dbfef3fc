"""The `shardlimit` command: serve, up, status, node add/remove, reshard, rules, quota,
compare, bench.

The only part of `cluster` allowed to import `router` or `node` (it runs them in
this process for `shardlimit serve`). Nothing imports the CLI but tests.
"""
