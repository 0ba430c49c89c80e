"""Forwards a ZMQ PUB stream to a loopback TCP PUB socket, unchanged (every frame of every
message): `python zmq_forward.py ipc:///tmp/kvgate-vllm/b0-events.ipc tcp://127.0.0.1:18260`.

vLLM binds its KV-event PUB socket only on `ipc://…` or a wildcard `tcp://*:P` (which would
listen beyond loopback); vllm-router's kv_aware mode accepts only `tcp://HOST:PORT`. This
subscribes to the pod's socket and republishes on 127.0.0.1, so the router gets the pod's own
events without the pod listening on every interface. Runs until killed.
"""
import sys

import zmq

ctx = zmq.Context()
upstream = ctx.socket(zmq.XSUB)
upstream.connect(sys.argv[1])
downstream = ctx.socket(zmq.XPUB)
downstream.bind(sys.argv[2])
zmq.proxy(downstream, upstream)
