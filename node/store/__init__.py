"""The node's Redis: `CounterStore` (counter_store.py) runs ops as script calls, which
script_calls.py builds (limit_args.py packs the limits) and replies.py reads back; they go
through the lean RESP pipe (resp.py, its error replies from reply_errors.py) or redis-py's
(redispy_pipe.py, over TLS); scripts.py assembles and registers lua/. Imports nothing else
of the node: an op is read through the StoreOp protocol (store_op.py)."""
