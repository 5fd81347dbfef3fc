"""The public HTTP API: handlers, request parsing into typed checks, answers and
problem+json mapping, OpenAPI and the /ui page. Imported by `router.app` and
`router.front`."""
