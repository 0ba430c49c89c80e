#!/usr/bin/env python3
"""Hostile clients for `bench/soak.sh --hostile`: runs alongside the normal load against the
gateway's traffic port for DURATION seconds, then writes what they saw to OUT (JSON).

- slow-body: SLOW connections, each sends the headers of a POST claiming a 10 MB body and a
  few bytes of it, then one byte every 5 s, held open until the gateway answers or closes;
  then reconnects.
- never-read: NEVER_READ connections, each sends a valid streamed chat request (128 output
  tokens) with a 4 KiB receive buffer and never reads the answer; held 20 s, then reconnects.
- bad JSON: BAD_JSON_RATE requests a second whose bodies are not JSON (or not a request).
- oversized: one request every 2 s claiming (and sending) a 40 MB body, over the gateway's
  32 MiB `max_body_bytes`.

Python standard library only (asyncio). Usage: soak_hostile.py HOST PORT DURATION OUT
"""
import asyncio
import json
import random
import socket
import sys
import time

SLOW = 32
NEVER_READ = 16
BAD_JSON_RATE = 50
OVERSIZED_EVERY_S = 2.0

host, port, duration, out = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
stats = {
    "slow_body": {"connections": 0, "answered": {}, "closed_without_answer": 0, "held_s_max": 0.0},
    "never_read": {"connections": 0, "closed_by_gateway": 0},
    "bad_json": {"sent": 0, "answered": {}, "errors": 0},
    "oversized": {"sent": 0, "answered": {}, "errors": 0, "bytes_sent_max": 0},
}
deadline = time.monotonic() + duration


def count(d, key):
    d[key] = d.get(key, 0) + 1


async def status_of(reader, timeout):
    line = await asyncio.wait_for(reader.readline(), timeout)
    parts = line.split()
    return parts[1].decode() if len(parts) >= 2 else "eof"


async def slow_body():
    while time.monotonic() < deadline:
        stats["slow_body"]["connections"] += 1
        t0 = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                         b"content-type: application/json\r\ncontent-length: 10000000\r\n\r\n"
                         b'{"model":')
            await writer.drain()
            answered = None
            while time.monotonic() < deadline and answered is None:
                try:
                    answered = await status_of(reader, 5.0)
                except asyncio.TimeoutError:
                    writer.write(b" ")
                    await writer.drain()
            if answered is None:
                pass
            elif answered == "eof":
                stats["slow_body"]["closed_without_answer"] += 1
            else:
                count(stats["slow_body"]["answered"], answered)
            writer.close()
        except (OSError, asyncio.IncompleteReadError):
            stats["slow_body"]["closed_without_answer"] += 1
        held = time.monotonic() - t0
        stats["slow_body"]["held_s_max"] = max(stats["slow_body"]["held_s_max"], round(held, 1))
        await asyncio.sleep(0.1)


async def never_read(i):
    body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "stream": True, "max_tokens": 128,
                       "messages": [{"role": "user", "content": f"never read {i} " * 50}]}).encode()
    while time.monotonic() < deadline:
        stats["never_read"]["connections"] += 1
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(s, (host, port))
            await loop.sock_sendall(s, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                                    b"content-type: application/json\r\n"
                                    + f"content-length: {len(body)}\r\n\r\n".encode() + body)
        except OSError:
            stats["never_read"]["closed_by_gateway"] += 1
        await asyncio.sleep(min(20.0, max(0.0, deadline - time.monotonic())))
        s.close()


async def one_request(kind, body, claimed=None, chunk=65536):
    st = stats[kind]
    st["sent"] += 1
    try:
        reader, writer = await asyncio.open_connection(host, port)
        length = claimed if claimed is not None else len(body)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                     b"content-type: application/json\r\n"
                     + f"content-length: {length}\r\nconnection: close\r\n\r\n".encode())
        sent = 0
        answer = asyncio.ensure_future(status_of(reader, 30.0))
        while sent < length and not answer.done():
            piece = body[:min(chunk, length - sent)]
            writer.write(piece)
            try:
                await writer.drain()
            except OSError:
                break
            sent += len(piece)
        if kind == "oversized":
            st["bytes_sent_max"] = max(st["bytes_sent_max"], sent)
        count(st["answered"], await answer)
        writer.close()
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        st["errors"] += 1


async def bad_json():
    bodies = [b'{"model": "m", "messages": [', b"not json at all", b'{"model": 17}',
              b'{"messages": "x"}', b"\xff\xfe\x00garbage", b"[]", b'{"model":"m","prompt":{}}']
    tasks = set()
    while time.monotonic() < deadline:
        t = asyncio.ensure_future(one_request("bad_json", random.choice(bodies)))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
        await asyncio.sleep(1.0 / BAD_JSON_RATE)
    await asyncio.gather(*tasks)


async def oversized():
    chunk = b"x" * 65536
    while time.monotonic() < deadline:
        await one_request("oversized", chunk, claimed=40_000_000)
        await asyncio.sleep(OVERSIZED_EVERY_S)


async def main():
    random.seed(11)
    await asyncio.gather(*[slow_body() for _ in range(SLOW)],
                         *[never_read(i) for i in range(NEVER_READ)],
                         bad_json(), oversized())
    with open(out, "w") as f:
        json.dump(stats, f, indent=1, sort_keys=True)


asyncio.run(main())
