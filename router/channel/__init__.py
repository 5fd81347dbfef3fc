"""Every call from the router to a node, and nothing else: the router's client of each
node (`node_client.NodeClient`) and its pieces: the channel, one long-lived binary
connection for batches (`link`, cluster/wire/channel.py); the node's queue and batcher
(`node_queue`); the reading of batch outcomes (`outcomes`); the breaker, liveness probe
and watchdog (`breaker`, `liveness`, `watchdog`); the take-back of late answers
(`late_undo`); control calls (`node_control`) over the one HTTP/1.1 client
(`control_client`). Imports no other room of the router (only router.errors)."""
