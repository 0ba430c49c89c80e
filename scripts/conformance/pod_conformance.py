#!/usr/bin/env python3
"""One conformance suite for a vLLM pod, run against both kvgate's mock pod and a real vLLM 0.32,
so that the mock cannot drift from what a router sees of vLLM (facts in
shared/reference/real-vllm.md).

    pod_conformance.py BASE_URL --events ENDPOINT --replay ENDPOINT --model NAME [--block-size N]

Tokenizer-agnostic: the mock tokenizes with cl100k, a real pod with its model's BPE, so every
expectation about tokens is taken from the pod's own /tokenize (or usage), never from a
tokenizer here. Prompts start with a random nonce so that a re-run on the same pod starts cold.
Prints one line per check (PASS/FAIL) and exits 1 listing the failed checks.

Needs Python 3.11 with `openai`, `pyzmq` and `msgpack` (the venv that scripts/test creates).
"""
import argparse
import json
import random
import re
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import msgpack
import openai
import zmq

END_SEQ = b"\xff" * 8
RESULTS: list[tuple[str, bool, str]] = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))
    print(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok or not detail else ': ' + detail}",
          flush=True)
    return bool(ok)


def run(name, fn):
    """Runs a group of checks; an exception fails the group with its message."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a suite reports, it does not crash
        check(name, False, f"{type(e).__name__}: {e}")


# ---------------------------------------------------------------- HTTP helpers

def http(method, path, body=None, headers=None, raw=None, timeout=60):
    """(status, headers, body bytes) of one request; never raises on an HTTP status."""
    timeout *= ARGS.time_scale
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    h = {"content-type": "application/json"} if data is not None else {}
    h.update(headers or {})
    req = urllib.request.Request(ARGS.base_url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def post_json(path, body, headers=None):
    status, _, data = http("POST", path, body, headers)
    return status, json.loads(data) if data else None


def tokenize(prompt):
    status, v = post_json("/tokenize", {"model": ARGS.model, "prompt": prompt})
    assert status == 200, f"/tokenize answered {status}: {v}"
    return v["tokens"]


def nonce():
    return f"{random.getrandbits(48):012x}"


def long_prompt(min_tokens):
    """A prompt of at least `min_tokens` tokens by the pod's own tokenizer, unique per call."""
    n = nonce()
    words = max(16, min_tokens // 2)
    while True:
        text = f"nonce {n}: " + " ".join(f"item{i} of list {n[:4]}" for i in range(words))
        tokens = tokenize(text)
        if len(tokens) >= min_tokens:
            return text, tokens
        words = words * 3 // 2


# ---------------------------------------------------------------- metrics

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape():
    """(types {name: kind}, samples [(name, {labels}, value)])."""
    status, _, data = http("GET", "/metrics")
    assert status == 200, f"/metrics answered {status}"
    types, samples = {}, []
    for line in data.decode().splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind.strip()
        elif line and not line.startswith("#"):
            m = SAMPLE.match(line)
            if m:
                samples.append((m.group(1), dict(LABEL.findall(m.group(3) or "")),
                                float(m.group(4))))
    return types, samples


def value(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (None when there is none)."""
    vals = [v for n, l, v in samples if n == name and all(l.get(k) == x for k, x in labels.items())]
    return sum(vals) if vals else None


# ---------------------------------------------------------------- checks

def check_health_and_models():
    status, _, body = http("GET", "/health")
    check("health: 200 with an empty body", status == 200 and body == b"",
          f"{status} {body[:80]!r}")
    status, _, body = http("GET", "/v1/models")
    v = json.loads(body)
    ids = [m.get("id") for m in v.get("data", [])]
    check("models: a list naming the served model", status == 200 and v.get("object") == "list"
          and ARGS.model in ids, f"{status} {ids}")
    m = next((m for m in v.get("data", []) if m.get("id") == ARGS.model), {})
    check("models: max_model_len and owned_by vllm",
          isinstance(m.get("max_model_len"), int) and m.get("owned_by") == "vllm", str(m)[:200])


def check_usage_details(name, usage):
    # A real pod answers prompt_tokens_details null unless --enable-prompt-tokens-details; the
    # mock always reports {cached_tokens} (as with that flag): accept both.
    d = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    check(f"{name}: prompt_tokens_details null or {{cached_tokens: int}}",
          d is None or isinstance(d.get("cached_tokens"), int), str(d))


def check_completions(client):
    prompt = f"nonce {nonce()}: the quick brown fox"
    n_prompt = len(tokenize(prompt))
    rid = f"conf-{nonce()}"
    # ignore_eos: a real model may sample its end-of-sequence token before max_tokens.
    r = client.completions.create(model=ARGS.model, prompt=prompt, max_tokens=4,
                                  extra_body={"ignore_eos": True},
                                  extra_headers={"x-request-id": rid})
    check("completions: object text_completion, one choice of text",
          r.object == "text_completion" and len(r.choices) == 1
          and isinstance(r.choices[0].text, str), str(r)[:200])
    check("completions: finish_reason length after max_tokens", r.choices[0].finish_reason == "length",
          str(r.choices[0].finish_reason))
    u = r.usage
    check("completions: usage counts the prompt as /tokenize does and max_tokens outputs",
          u.prompt_tokens == n_prompt and u.completion_tokens == 4
          and u.total_tokens == n_prompt + 4, f"{u} vs /tokenize {n_prompt}")
    check_usage_details("completions", r.model_dump()["usage"])
    check("completions: x-request-id is the id as cmpl-<x-request-id>", r.id == f"cmpl-{rid}",
          r.id)
    check("completions: model echoed", r.model == ARGS.model, r.model)

    rid = f"conf-{nonce()}"
    chunks = list(client.completions.create(
        model=ARGS.model, prompt=prompt, max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": rid}))
    last = chunks[-1] if chunks else None
    text_chunks = [c for c in chunks if c.choices]
    check("completions stream: include_usage ends with choices [] and usage",
          last is not None and last.choices == [] and last.usage is not None
          and last.usage.completion_tokens == 4 and last.usage.prompt_tokens == n_prompt,
          str(last)[:200])
    # At most one text chunk per token, not exactly one: vLLM's front end merges the
    # deltas of tokens its stream has not sent yet into one chunk when the client (or a
    # busy machine) lags behind the engine; CI saw 3 chunks for 4 tokens.
    check("completions stream: 1 to 4 text chunks for 4 tokens, the last with finish_reason length",
          1 <= len(text_chunks) <= 4 and text_chunks[-1].choices[0].finish_reason == "length"
          and all(c.choices[0].finish_reason is None for c in text_chunks[:-1]),
          f"{len(text_chunks)} chunks")
    check("completions stream: every chunk has id cmpl-<x-request-id>",
          all(c.id == f"cmpl-{rid}" for c in chunks), str({c.id for c in chunks}))

    status, _, body = http("POST", "/v1/completions",
                           {"model": ARGS.model, "prompt": prompt, "max_tokens": 2,
                            "stream": True, "ignore_eos": True})
    events = [e for e in body.decode().split("\n\n") if e.strip()]
    payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
    check("completions stream: without stream_options no usage chunk, ends with [DONE]",
          status == 200 and events[-1] == "data: [DONE]"
          and all(p.get("choices") for p in payloads) and not any(p.get("usage") for p in payloads),
          body[-200:].decode(errors="replace"))


def check_chat(client):
    messages = [{"role": "user", "content": f"nonce {nonce()}: hello there"}]
    status, tok = post_json("/tokenize", {"model": ARGS.model, "messages": messages})
    n_prompt = tok.get("count") if status == 200 else None
    check("tokenize: messages -> count, max_model_len, tokens",
          status == 200 and n_prompt == len(tok.get("tokens", []))
          and isinstance(tok.get("max_model_len"), int), str(tok)[:200])
    rid = f"conf-{nonce()}"
    r = client.chat.completions.create(model=ARGS.model, messages=messages, max_tokens=3,
                                       extra_body={"ignore_eos": True},
                                       extra_headers={"x-request-id": rid})
    check("chat: object chat.completion, assistant message",
          r.object == "chat.completion" and r.choices[0].message.role == "assistant"
          and isinstance(r.choices[0].message.content, str), str(r)[:200])
    check("chat: usage as /tokenize of the messages and max_tokens outputs",
          r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == 3
          and r.choices[0].finish_reason == "length", f"{r.usage} vs /tokenize {n_prompt}")
    check_usage_details("chat", r.model_dump()["usage"])
    check("chat: x-request-id is the id as chatcmpl-<x-request-id>", r.id == f"chatcmpl-{rid}",
          r.id)
    rid = f"conf-{nonce()}"
    chunks = list(client.chat.completions.create(
        model=ARGS.model, messages=messages, max_tokens=3, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        extra_headers={"x-request-id": rid}))
    check("chat stream: the first chunk carries role assistant",
          bool(chunks) and chunks[0].choices and chunks[0].choices[0].delta.role == "assistant",
          str(chunks[:1])[:200])
    last = chunks[-1] if chunks else None
    check("chat stream: include_usage ends with choices [] and usage",
          last is not None and last.choices == [] and last.usage is not None
          and last.usage.completion_tokens == 3, str(last)[:200])
    check("chat stream: object chat.completion.chunk and id chatcmpl-<x-request-id>",
          all(c.object == "chat.completion.chunk" and c.id == f"chatcmpl-{rid}" for c in chunks),
          str({(c.object, c.id) for c in chunks}))


def check_errors():
    status, v = post_json("/v1/completions", {"model": "no-such-model", "prompt": "hi",
                                              "max_tokens": 1})
    e = (v or {}).get("error", {})
    check("errors: unknown model is 404 NotFoundError with param model",
          status == 404 and e.get("type") == "NotFoundError" and e.get("code") == 404
          and e.get("param") == "model"
          and str(e.get("message", "")).startswith("The model `no-such-model` does not exist."),
          f"{status} {v}")
    status, v = post_json("/v1/chat/completions",
                          {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    check("errors: unknown model on chat is 404 too",
          status == 404 and (v or {}).get("error", {}).get("type") == "NotFoundError",
          f"{status} {v}")
    for name, raw in [("invalid JSON", b"{not json"),
                      ("max_tokens of the wrong type",
                       json.dumps({"model": ARGS.model, "prompt": "hi",
                                   "max_tokens": "x"}).encode())]:
        status, _, body = http("POST", "/v1/completions", raw=raw)
        try:
            e = json.loads(body).get("error", {})
        except ValueError:
            e = {}
        # The type is vLLM's "Bad Request" for schema errors; the message text is pydantic's on
        # a real pod and the mock's own: only its presence is checked.
        check(f"errors: {name} is 400 with an OpenAI error body",
              status == 400 and e.get("code") == 400 and isinstance(e.get("message"), str)
              and isinstance(e.get("type"), str) and "param" in e, f"{status} {body[:200]!r}")


def check_event_sources():
    status, _, body = http("GET", "/kv_event_sources")
    v = json.loads(body) if status == 200 else {}
    rank0 = v.get("0", {})
    check("kv_event_sources: rank 0 with the events config",
          status == 200 and rank0.get("enable_kv_cache_events") is True
          and rank0.get("publisher") == "zmq"
          and all(k in rank0 for k in ("buffer_steps", "hwm", "max_queue_size", "topic")),
          str(v)[:300])
    check("kv_event_sources: endpoint and replay_endpoint as configured",
          rank0.get("endpoint") == ARGS.events and rank0.get("replay_endpoint") == ARGS.replay,
          f"{rank0.get('endpoint')} {rank0.get('replay_endpoint')}")


def check_render_disabled():
    for path, body in [("/v1/completions/render", {"model": ARGS.model, "prompt": "hi"}),
                       ("/v1/chat/completions/render",
                        {"model": ARGS.model, "messages": [{"role": "user", "content": "hi"}]})]:
        status, v = post_json(path, body)
        e = (v or {}).get("error", {})
        check(f"render: {path} is 403 without --enable-scale-out",
              status == 403 and e.get("type") == "PermissionDeniedError"
              and "--enable-scale-out" in str(e.get("message")), f"{status} {v}")


# The series a router reads (reference/real-vllm.md), with their types.
ROUTER_SERIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:num_requests_waiting_by_reason": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries_total": "counter",
    "vllm:prefix_cache_hits_total": "counter",
    "vllm:prompt_tokens_cached_total": "counter",
    "vllm:prompt_tokens_total": "counter",
    "vllm:generation_tokens_total": "counter",
    "vllm:num_preemptions_total": "counter",
    "vllm:request_success_total": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:cache_config_info": "gauge",
}
CREATED = ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens_cached",
           "vllm:generation_tokens", "vllm:request_success"]


def check_metrics():
    types, samples = scrape()
    wrong = {n: types.get(n) for n, k in ROUTER_SERIES.items() if types.get(n) != k}
    check("metrics: names and types a router reads", not wrong, f"wrong or missing: {wrong}")
    check("metrics: vllm:gpu_cache_usage_perc is absent (as in vLLM 0.32)",
          "vllm:gpu_cache_usage_perc" not in types)
    bad = []
    for name, kind in ROUTER_SERIES.items():
        if name == "vllm:cache_config_info":
            continue
        sample_name = name + ("_count" if kind == "histogram" else "")
        rows = [l for n, l, _ in samples if n == sample_name]
        if not rows or any(l.get("engine") != "0" or l.get("model_name") != ARGS.model
                           for l in rows):
            bad.append(sample_name)
    check('metrics: every series carries engine="0" and model_name', not bad, str(bad))
    reasons = {l.get("reason") for n, l, _ in samples if n == "vllm:num_requests_waiting_by_reason"}
    check("metrics: num_requests_waiting_by_reason has capacity and deferred",
          {"capacity", "deferred"} <= reasons, str(reasons))
    missing = []
    now = time.time()
    for base in CREATED:
        ok = types.get(base + "_created") == "gauge" and any(
            n == base + "_created" and 1e9 < v <= now + 60 for n, _, v in samples)
        if not ok:
            missing.append(base + "_created")
    check("metrics: counters have _created samples (TYPE gauge, a Unix time)", not missing,
          str(missing))
    info = [l for n, l, _ in samples if n == "vllm:cache_config_info"]
    labels = info[0] if info else {}
    need = ["block_size", "num_gpu_blocks", "enable_prefix_caching", "prefix_caching_hash_algo",
            "sliding_window", "kv_cache_size_tokens", "engine"]
    check("metrics: cache_config_info = 1 with vLLM's labels and no model_name",
          len(info) == 1 and value(samples, "vllm:cache_config_info") == 1.0
          and all(k in labels for k in need) and "model_name" not in labels,
          f"missing {[k for k in need if k not in labels]} in {labels}")
    check(f"metrics: cache_config_info block_size is {ARGS.block_size}",
          labels.get("block_size") == str(ARGS.block_size)
          and labels.get("num_gpu_blocks", "").isdigit()
          and labels.get("enable_prefix_caching") == "True", str(labels)[:300])


def decode_batch(payload):
    batch = msgpack.unpackb(payload, raw=False)
    assert isinstance(batch, list) and len(batch) == 3, f"batch {str(batch)[:200]}"
    ts, events, rank = batch
    assert isinstance(ts, float) and isinstance(events, list) and isinstance(rank, int), \
        f"batch {str(batch)[:200]}"
    return ts, events, rank


def check_kv_events_and_prefix_hits():
    bs = ARGS.block_size
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 200)
    sub.connect(ARGS.events)
    time.sleep(0.7)  # ZeroMQ's slow joiner: the subscription must reach the publisher
    while True:  # drop what was in flight before this check
        try:
            sub.recv_multipart()
        except zmq.Again:
            break

    # At least 4 whole blocks and a part of one, so that the hit is several blocks, not all.
    text, tokens = long_prompt(4 * bs + bs // 2)
    n = len(tokens)
    full_hit = (n - 1) // bs * bs  # vLLM: at most (n − 1) // bs blocks hit
    _, before = scrape()
    q0 = value(before, "vllm:prefix_cache_queries_total")
    h0 = value(before, "vllm:prefix_cache_hits_total")
    c0 = value(before, "vllm:prompt_tokens_cached_total")
    hits = []
    queries = []
    for _ in range(3):
        status, r = post_json("/v1/completions", {"model": ARGS.model, "prompt": text,
                                                   "max_tokens": 2, "ignore_eos": True})
        assert status == 200, f"completion answered {status}: {r}"
        _, s = scrape()
        hits.append(value(s, "vllm:prefix_cache_hits_total") - h0)
        queries.append(value(s, "vllm:prefix_cache_queries_total") - q0)
        cached = value(s, "vllm:prompt_tokens_cached_total") - c0
    check(f"prefix hits: the same {n}-token prompt 3 times moves hits by whole blocks "
          f"(0, {full_hit}, {2 * full_hit})",
          hits == [0, full_hit, 2 * full_hit] and all(h % bs == 0 for h in hits), str(hits))
    check("prefix hits: queries move by the prompt's tokens per request",
          queries == [n, 2 * n, 3 * n], str(queries))
    check("prefix hits: prompt_tokens_cached_total equals the hits", cached == hits[-1],
          f"{cached} vs {hits[-1]}")

    msgs = []
    deadline = time.time() + 3 * ARGS.time_scale
    while time.time() < deadline:
        try:
            msgs.append(sub.recv_multipart())
        except zmq.Again:
            if msgs:
                break
    sub.close(0)
    check("kv events: PUB messages of 3 frames [topic, seq (8 bytes), payload]",
          bool(msgs) and all(len(m) == 3 and len(m[1]) == 8 for m in msgs),
          f"{len(msgs)} messages, frames {[len(m) for m in msgs][:5]}")
    if not msgs:
        return
    seqs = [int.from_bytes(m[1], "big") for m in msgs]
    check("kv events: seq increases by 1 per batch", seqs == list(range(seqs[0], seqs[0] + len(seqs))),
          str(seqs[:10]))
    batches = [decode_batch(m[2]) for m in msgs]
    events = [e for _, evs, _ in batches for e in evs]
    check("kv events: payload [ts, [events], dp_rank 0] of maps tagged type",
          all(rank == 0 for _, _, rank in batches)
          and all(isinstance(e, dict) and isinstance(e.get("type"), str) for e in events),
          str(events[:1])[:300])
    stored = [e for e in events if e.get("type") == "BlockStored"]
    bad = [e for e in stored if not (
        isinstance(e.get("block_hashes"), list) and e["block_hashes"]
        and all(isinstance(h, int) for h in e["block_hashes"])
        and (e.get("parent_block_hash") is None or isinstance(e.get("parent_block_hash"), int))
        and e.get("block_size") == bs
        and len(e.get("token_ids", [])) == bs * len(e["block_hashes"])
        and isinstance(e.get("medium"), str))]
    check(f"kv events: BlockStored has block_hashes, parent_block_hash, token_ids = blocks × "
          f"{bs}, block_size {bs}, medium", bool(stored) and not bad,
          f"{len(stored)} stored, bad: {str(bad[:1])[:300]}")
    first = next((e for e in stored if e.get("parent_block_hash") is None
                  and e["token_ids"] == tokens[:len(e["token_ids"])]), None)
    check("kv events: the prompt's first blocks are stored with parent None and the prompt's "
          "token ids (as /tokenize)", first is not None,
          f"{len(stored)} BlockStored, none starts with the prompt's tokens")
    chain, chain_tokens = [], []
    if first is not None:
        # Follow the chain from the first block. A partial block is never stored (token_ids =
        # blocks × block_size above); a real pod may store one more block filled in decode.
        chain, chain_tokens = list(first["block_hashes"]), list(first["token_ids"])
        for e in stored:
            if e is not first and e.get("parent_block_hash") == chain[-1]:
                chain.extend(e["block_hashes"])
                chain_tokens.extend(e["token_ids"])
    full = n // bs
    check(f"kv events: the prompt's {full} full blocks are stored as one chain of its tokens",
          len(chain) >= full and chain_tokens[:full * bs] == tokens[:full * bs],
          f"chain of {len(chain)} blocks")

    # Replay: from the first seq seen live, the same payloads, 4 frames each, then the end.
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 3000)
    dealer.connect(ARGS.replay)
    dealer.send_multipart([b"", seqs[0].to_bytes(8, "big")])
    replayed = []
    end = None
    while True:
        frames = dealer.recv_multipart()
        if len(frames) == 4 and frames[2] == END_SEQ:
            end = frames
            break
        replayed.append(frames)
        if len(replayed) > 100_000:
            break
    check("replay: 4 frames [empty, topic, seq, payload] per batch",
          bool(replayed) and all(len(f) == 4 and f[0] == b"" and len(f[2]) == 8 for f in replayed),
          str([len(f) for f in replayed][:5]))
    live = {int.from_bytes(m[1], "big"): m[2] for m in msgs}
    rseqs = [int.from_bytes(f[2], "big") for f in replayed]
    check("replay: consecutive seqs from start_seq with the payloads published live",
          rseqs[:len(seqs)] == seqs and all(live[s] == f[3] for s, f in zip(rseqs, replayed)
                                            if s in live)
          and rseqs == list(range(seqs[0], seqs[0] + len(rseqs))), str(rseqs[:10]))
    check("replay: end marker [empty, empty, 0xffffffffffffffff, empty]",
          end == [b"", b"", END_SEQ, b""], str(end))
    dealer.send_multipart([b"", (0).to_bytes(8, "big")])
    frames = dealer.recv_multipart()
    # The buffer keeps the last buffer_steps (10 000) batches: seq 0 is still there unless the
    # pod has published more since its engine started.
    first_seq = int.from_bytes(frames[2], "big")
    check("replay: seq starts at 0 at engine start (replay from 0 begins at 0)",
          first_seq == 0 or (frames[2] != END_SEQ and seqs[-1] >= 10_000), str(first_seq))
    while frames[2] != END_SEQ:
        frames = dealer.recv_multipart()
    dealer.close(0)


def check_cancel_on_disconnect():
    prompt = f"nonce {nonce()}: count to a large number"
    max_tokens = 3000
    _, s = scrape()
    g0 = value(s, "vllm:generation_tokens_total")
    done0 = value(s, "vllm:request_success_total")
    running0 = value(s, "vllm:num_requests_running")
    url = urllib.parse.urlsplit(ARGS.base_url)
    body = json.dumps({"model": ARGS.model, "prompt": prompt, "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()
    sock = socket.create_connection((url.hostname, url.port or 80), timeout=30 * ARGS.time_scale)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json"
                 b"\r\nContent-Length: %d\r\n\r\n" % (url.netloc.encode(), len(body)) + body)
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    _, s = scrape()
    check("cancel: a streaming request runs (num_requests_running went up)",
          b"data: " in got and value(s, "vllm:num_requests_running") == running0 + 1,
          f"running {value(s, 'vllm:num_requests_running')}")
    sock.close()
    within = 5 * ARGS.time_scale
    deadline = time.time() + within
    running = None
    while time.time() < deadline:
        _, s = scrape()
        running = value(s, "vllm:num_requests_running")
        if running == running0:
            break
        time.sleep(0.1)
    generated = value(s, "vllm:generation_tokens_total") - g0
    check(f"cancel: the client disconnecting takes it out of the engine within {within:g} s",
          running == running0 and generated < max_tokens,
          f"running {running}, {generated} of {max_tokens} tokens generated")
    # vLLM 0.32 counts a client's disconnect under no finished_reason (its "abort" label counts
    # engine-side aborts only).
    check("cancel: the cancelled request is not counted in request_success_total",
          value(s, "vllm:request_success_total") == done0,
          f"{done0} -> {value(s, 'vllm:request_success_total')}")


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base_url")
    p.add_argument("--events", required=True, help="the KV events PUB endpoint")
    p.add_argument("--replay", required=True, help="the KV events replay endpoint")
    p.add_argument("--model", required=True)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="stretches every time limit (a real pod slower than the machine they "
                        "were tuned on: the real-vLLM tests pass its measured slowness)")
    ARGS = p.parse_args()
    ARGS.base_url = ARGS.base_url.rstrip("/")
    client = openai.OpenAI(base_url=ARGS.base_url + "/v1", api_key="none", max_retries=0,
                           timeout=60 * ARGS.time_scale)
    run("health and models", check_health_and_models)
    run("completions", lambda: check_completions(client))
    run("chat", lambda: check_chat(client))
    run("errors", check_errors)
    run("kv_event_sources", check_event_sources)
    run("render", check_render_disabled)
    run("metrics", check_metrics)
    run("kv events and prefix hits", check_kv_events_and_prefix_hits)
    run("cancel", check_cancel_on_disconnect)
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed")
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
        sys.exit(1)


ARGS = None
if __name__ == "__main__":
    main()
