"""The lean HTTP/1.1 front: parses client connections with httptools and answers the
hot endpoints itself, with the same bytes aiohttp would write; everything else is handed
to the aiohttp app. Reaches decisions only through `router.service` (via `router.api`'s
check handling): nothing of `router.decide`, `router.channel` or `router.control`
(tests/unit/test_import_rules.py). Imported by the CLI only (`front_for`, which serves
the router's app through it)."""
