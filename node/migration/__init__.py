"""Moving keys between nodes: the copy step (Redis to Redis), pulls on first touch,
and calls to peer nodes."""
