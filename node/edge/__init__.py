"""Where requests reach a node: the hot-path channel server, the HTTP endpoints by
concern (`*_api`, each behind `internal`: the cluster token and the body's control
message), and the HTTP app's Redis-error boundary."""
