"""One batch of ops, from wire frames to results: parsing ops, placing them by
ownership and running them in the node's store."""
