"""Where requests reach a node: the hot-path channel server and the HTTP app's error
boundary."""
