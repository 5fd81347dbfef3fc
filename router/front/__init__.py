"""The lean HTTP/1.1 front: parses client connections with httptools and answers the
hot endpoints itself, with the same bytes aiohttp would write; everything else is handed
to the aiohttp app. Reaches decisions only through `router.service` (via `router.api`'s
check handling). Imported by `router.app` only."""
