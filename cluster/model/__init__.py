"""The pure model: partitioners, topology, limits, algorithms, calendar periods, Redis key
names and RateLimit header values.

No I/O lives here: no aiohttp, no redis, no sockets, no files beyond the time-zone
database. Anything may import the model; the model imports nothing outside itself
(checked by tests/unit/test_import_rules.py).
"""
