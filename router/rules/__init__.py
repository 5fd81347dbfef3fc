"""Rules: named sets of limits, their YAML documents and file watch, and the rules as
versioned cluster state held by the nodes."""
