"""The node's Redis: `CounterStore`, the RESP pipe, scripts and the Lua files under
lua/. Imports nothing else of the node."""
