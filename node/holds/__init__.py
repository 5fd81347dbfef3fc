"""All-or-nothing holds on a node and the coordinator's decision records."""
