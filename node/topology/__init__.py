"""What the node owns: ownership under the current topology, the topology kept in its
Redis, and the gate that lets a new epoch be acknowledged once older work drained."""
