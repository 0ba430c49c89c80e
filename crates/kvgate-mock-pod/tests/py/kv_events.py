"""A pyzmq + msgpack subscriber decodes a mock pod's KV events (either encoding):
BlockStored after a request (token ids = the prompt's tokens), BlockRemoved after eviction
(the pod runs with a small --kv-blocks), and replay returns the batches a late subscriber
missed. Usage: kv_events.py BASE_URL MODEL PUB_ENDPOINT REPLAY_ENDPOINT ENCODING"""
import json
import sys
import time
import urllib.request

import msgpack
import zmq

base_url, model, pub_ep, replay_ep, encoding = sys.argv[1:6]
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.setsockopt(zmq.SUBSCRIBE, b"")
sub.setsockopt(zmq.RCVTIMEO, 5000)
sub.connect(pub_ep)
time.sleep(0.5)  # slow joiner


def post(path, body):
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def field(event, name, index):
    """A field of an event in map form ("type" key) or array form (tag first)."""
    if isinstance(event, dict):
        return event.get(name)
    return event[index] if index < len(event) else None


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    if isinstance(batch, dict):
        events = batch["events"]
    else:
        events = batch[1]
    for e in events:
        if encoding == "map":
            assert isinstance(e, dict) and "type" in e, e
        else:
            assert isinstance(e, list) and isinstance(e[0], str), e
    return events


def kind(e):
    return e["type"] if isinstance(e, dict) else e[0]


received = []  # (seq, payload)


def recv_until(pred, what):
    deadline = time.time() + 10
    while time.time() < deadline:
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"", topic
        seq = int.from_bytes(seq, "big")
        if received:
            assert seq == received[-1][0] + 1, (seq, received[-1][0])
        received.append((seq, payload))
        for e in decode(payload):
            if pred(e):
                return e
    raise AssertionError("no " + what)


prompt = " ".join(f"alpha{i}" for i in range(40))
tokens = post("/tokenize", {"prompt": prompt})["tokens"]
post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 2})
stored = recv_until(lambda e: kind(e) == "BlockStored", "BlockStored")
hashes = field(stored, "block_hashes", 1)
token_ids = field(stored, "token_ids", 3)
assert field(stored, "block_size", 4) == 16
assert field(stored, "parent_block_hash", 2) is None, stored
assert len(token_ids) == 16 * len(hashes), stored
assert token_ids == tokens[: len(token_ids)], (token_ids, tokens)
assert all(isinstance(h, int) for h in hashes)

# Fill the small cache with other prompts until a block is evicted.
sub.setsockopt(zmq.RCVTIMEO, 500)
removed = None
for doc in range(1, 40):
    other = " ".join(f"doc{doc}x{i}" for i in range(60))
    post("/v1/completions", {"model": model, "prompt": other, "max_tokens": 1})
    try:
        removed = recv_until(lambda e: kind(e) == "BlockRemoved", "BlockRemoved")
        break
    except zmq.Again:
        continue
    except AssertionError:
        continue
assert removed is not None, "no BlockRemoved"
assert all(isinstance(h, int) for h in field(removed, "block_hashes", 1))

# Replay from the first batch we saw: the same payloads, then the end marker.
dealer = ctx.socket(zmq.DEALER)
dealer.setsockopt(zmq.RCVTIMEO, 5000)
dealer.connect(replay_ep)
start = received[0][0]
dealer.send_multipart([b"", start.to_bytes(8, "big")])
replayed = {}
while True:
    # vLLM 0.32's framing: [empty, topic, seq, payload]; end marker [empty, empty, -1, empty].
    empty, topic, seq, payload = dealer.recv_multipart()
    assert empty == b""
    if seq == b"\xff" * 8:
        assert topic == b"" and payload == b""
        break
    replayed[int.from_bytes(seq, "big")] = payload
for seq, payload in received:
    assert replayed.get(seq) == payload, f"batch {seq} not replayed identically"
print("ok", len(received), "batches")
