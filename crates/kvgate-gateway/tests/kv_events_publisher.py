"""A vLLM-format KV-event publisher for tests/kv_events.rs (pyzmq + msgpack).

Binds an XPUB (PUB frames, but it sees subscriptions) and a ROUTER replay socket on
127.0.0.1, prints "ports PUB REPLAY", then "subscribed" once a subscriber joined. Reads one
JSON command per stdin line and answers "ok" after each:
  {"op":"send","seq":N,"events":[...],"enc":"map"|"array","batch":"map"|"array"}
  {"op":"drop", ...same...}   buffered for replay but not published (lost in flight)
  {"op":"raw","frames":["hex",...]}
  {"op":"forget"}             empties the replay buffer
Events: {"type":"BlockStored","block_hashes":[..],"parent_block_hash":h|null,
"token_ids":[..],"block_size":16} | {"type":"BlockRemoved","block_hashes":[..]} |
{"type":"AllBlocksCleared"}. Replay follows vLLM 0.32 as observed (reference/real-vllm.md):
[identity, empty, start_seq] in, [identity, empty, topic, seq, payload]* then the end marker
[identity, empty, empty, seq = -1, empty] out.

argv[1], if given: a JSON list of "drop" commands applied before anyone subscribes (batches
the engine produced before the router started: only a replay can tell of them).
"""
import json
import struct
import sys
import threading
import time

import msgpack
import zmq

ctx = zmq.Context()
pub = ctx.socket(zmq.XPUB)
pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
router = ctx.socket(zmq.ROUTER)
replay_port = router.bind_to_random_port("tcp://127.0.0.1")
buffer = {}
lock = threading.Lock()
TOPIC = b"kv-events"


def serve_replay():
    while True:
        ident, _empty, start = router.recv_multipart()
        (start,) = struct.unpack(">Q", start)
        with lock:
            items = sorted((s, p) for s, p in buffer.items() if s >= start)
        for seq, payload in items:
            router.send_multipart([ident, b"", TOPIC, struct.pack(">Q", seq), payload])
        router.send_multipart([ident, b"", b"", b"\xff" * 8, b""])


def event(e, enc):
    t = e["type"]
    if t == "BlockStored":
        fields = [("type", t), ("block_hashes", e["block_hashes"]),
                  ("parent_block_hash", e.get("parent_block_hash")),
                  ("token_ids", e["token_ids"]), ("block_size", e.get("block_size", 16)),
                  ("lora_id", None), ("medium", "GPU"), ("lora_name", None),
                  ("extra_keys", None), ("group_idx", 0)]
    elif t == "BlockRemoved":
        fields = [("type", t), ("block_hashes", e["block_hashes"]), ("medium", "GPU")]
    else:
        fields = [("type", t)]
    if enc == "map":
        return dict(fields)
    return [v for _, v in fields]


def payload(cmd):
    events = [event(e, cmd.get("enc", "map")) for e in cmd["events"]]
    if cmd.get("batch", "array") == "map":
        batch = {"ts": time.time(), "events": events, "data_parallel_rank": 0}
    else:
        batch = [time.time(), events, 0]
    return msgpack.packb(batch, use_bin_type=True)


for cmd in json.loads(sys.argv[1]) if len(sys.argv) > 1 else []:
    buffer[cmd["seq"]] = payload(cmd)
threading.Thread(target=serve_replay, daemon=True).start()
print("ports", pub_port, replay_port, flush=True)
pub.recv()  # the subscription message
print("subscribed", flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    op = cmd["op"]
    if op in ("send", "drop"):
        p = payload(cmd)
        with lock:
            if cmd["seq"] == 0:
                buffer.clear()  # a restarted engine starts a new buffer
            buffer[cmd["seq"]] = p
        if op == "send":
            pub.send_multipart([TOPIC, struct.pack(">Q", cmd["seq"]), p])
    elif op == "raw":
        pub.send_multipart([bytes.fromhex(f) for f in cmd["frames"]])
    elif op == "forget":
        with lock:
            buffer.clear()
    print("ok", flush=True)
