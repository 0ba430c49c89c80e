"""The helper of scripts/real-vllm/chaos_soak.sh. Python standard library only.

    chaos_soak.py proxy LISTEN_PORT UPSTREAM_PORT DELAY_FILE LOG
        An HTTP/1.1 proxy on 127.0.0.1:LISTEN_PORT in front of a pod on 127.0.0.1:UPSTREAM_PORT,
        one upstream connection per request (`Connection: close` both ways; the response is
        passed through as the pod sends it, so a stream stays a stream and a pod that dies
        mid-body cuts it). A GET /metrics waits DELAY_FILE's number of seconds first (no file,
        or 0: none): the pod's `/metrics` made slow on demand.
    chaos_soak.py load OUT --targets URL[,URL] --schedule 'SECONDS:RATE,...' --max-requests N
                       [--seed S] [--timeout-s T]
        Open-loop streamed (7 in 8) and whole-body completions of the tiny model, unique prompts
        of ~150-2,000 tokens (half of them behind one of 8 shared ~580-token prefixes), 16-48
        output tokens with ignore_eos, alternating between the targets (kvgate replicas); one
        thread and one connection per request. Writes OUT/requests.jsonl (one line per
        request) and OUT/load_start, OUT/load_end (unix ms).
    chaos_soak.py monitor OUT --admins URL[,URL] --pids PID[,PID] --pods URL[,URL]
        Every second until OUT/stop exists: each kvgate's /metrics (pods healthy, requests
        active/queued, in flight), its VmRSS, the pods' own queues (vllm:num_requests_*), the
        load average and whether a rustc runs. Writes OUT/monitor.jsonl.
    chaos_soak.py report OUT
        The table of a run in OUT (README of the checks: chaos_soak.sh) and its verdict; exit
        status 1 when a check failed.
"""
import argparse
import http.client
import json
import os
import random
import socket
import socketserver
import sys
import threading
import time
import urllib.parse


def now_ms():
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------
# proxy


def read_head(f):
    lines = []
    while True:
        line = f.readline(65536)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            return lines
        lines.append(line)


def proxy(args):
    upstream = ("127.0.0.1", args.upstream_port)
    log = open(args.log, "a", buffering=1)
    counts = {"requests": 0, "delayed": 0}

    class Handler(socketserver.StreamRequestHandler):
        def handle(self):
            head = read_head(self.rfile)
            if not head:
                return
            request_line = head[0].decode("latin-1").strip()
            method, target = request_line.split(" ")[:2]
            headers = []
            length = 0
            chunked = False
            for h in head[1:]:
                name, _, value = h.decode("latin-1").partition(":")
                lname = name.strip().lower()
                if lname in ("connection", "keep-alive", "proxy-connection"):
                    continue
                if lname == "content-length":
                    length = int(value.strip())
                if lname == "transfer-encoding" and "chunked" in value.lower():
                    chunked = True
                headers.append(h)
            if chunked:
                body = b""
                while True:
                    size_line = self.rfile.readline()
                    body += size_line
                    size = int(size_line.split(b";")[0].strip() or b"0", 16)
                    chunk = self.rfile.read(size + 2)
                    body += chunk
                    if size == 0:
                        break
            else:
                body = self.rfile.read(length) if length else b""
            counts["requests"] += 1
            if target.startswith("/metrics"):
                delay = 0.0
                try:
                    with open(args.delay_file) as f:
                        delay = float(f.read().strip() or 0)
                except (OSError, ValueError):
                    pass
                if delay > 0:
                    counts["delayed"] += 1
                    time.sleep(delay)
            try:
                up = socket.create_connection(upstream, timeout=10)
            except OSError as e:
                log.write(f"{now_ms()} connect {upstream}: {e}\n")
                return  # closed without an answer: as a pod that resets
            up.settimeout(None)
            try:
                up.sendall(head[0] + b"".join(headers) + b"Connection: close\r\n\r\n" + body)
                uf = up.makefile("rb")
                rhead = read_head(uf)
                if rhead is None:
                    return
                out = [rhead[0]]
                for h in rhead[1:]:
                    name = h.split(b":", 1)[0].strip().lower()
                    if name in (b"connection", b"keep-alive"):
                        continue
                    out.append(h)
                self.connection.sendall(b"".join(out) + b"Connection: close\r\n\r\n")
                while True:
                    data = uf.read1(65536)
                    if not data:
                        break
                    self.connection.sendall(data)
            except OSError as e:
                log.write(f"{now_ms()} {method} {target}: {e}\n")
            finally:
                up.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 512

    srv = Server(("127.0.0.1", args.listen_port), Handler)
    log.write(f"{now_ms()} proxy 127.0.0.1:{args.listen_port} -> {upstream}\n")

    def report():
        while True:
            time.sleep(10)
            log.write(f"{now_ms()} counts {json.dumps(counts)}\n")

    threading.Thread(target=report, daemon=True).start()
    srv.serve_forever()


# ---------------------------------------------------------------------------------------------
# load


def prompt_lines(tag, n, start=0):
    return "".join(f"def f{i}_{tag}(x): return x + {i}\n" for i in range(start, start + n))


def make_request(i, rng, run):
    stream = i % 8 != 7
    n = rng.randint(5, 55)
    if i % 2 == 0:
        conv = f"{run}c{i % 16 // 2}"
        text = f"# {conv}\n" + prompt_lines(conv, 20) + f"# {run}r{i}\n" + prompt_lines(f"{run}r{i}", n, 20)
    else:
        text = f"# {run}r{i}\n" + prompt_lines(f"{run}r{i}", n + 10)
    return stream, {
        "model": "tiny",
        "prompt": text,
        "max_tokens": rng.choice([16, 32, 48]),
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": stream,
    }


def one_request(i, target, stream, body, timeout_s, out, lock):
    rec = {"i": i, "target": target, "stream": stream, "sent_ms": now_ms(), "status": None,
           "pod": None, "code": None, "message": None, "first_ms": None, "end_ms": None,
           "done": False, "error_event": None, "data_after_error": False, "finish": None,
           "exc": None, "tokens": 0}
    u = urllib.parse.urlparse(target)
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
        c.request("POST", "/v1/completions", json.dumps(body),
                  {"content-type": "application/json"})
        r = c.getresponse()
        rec["status"] = r.status
        rec["pod"] = r.getheader("x-kvgate-pod")
        if r.status != 200 or not stream:
            data = r.read()
            rec["end_ms"] = now_ms()
            rec["first_ms"] = rec["end_ms"]
            try:
                j = json.loads(data)
            except ValueError:
                j = {}
            if r.status != 200:
                err = j.get("error") or {}
                rec["code"] = err.get("code")
                rec["message"] = (err.get("message") or data[:200].decode("latin-1"))
            else:
                ch = (j.get("choices") or [{}])[0]
                rec["finish"] = ch.get("finish_reason")
                rec["tokens"] = (j.get("usage") or {}).get("completion_tokens", 0)
        else:
            while True:
                line = r.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    rec["done"] = True
                    continue
                if rec["done"]:
                    rec["data_after_error"] = True
                try:
                    j = json.loads(payload)
                except ValueError:
                    continue
                if "error" in j:
                    rec["error_event"] = (j["error"] or {}).get("code") or "?"
                    rec["message"] = (j["error"] or {}).get("message")
                    continue
                if rec["error_event"]:
                    rec["data_after_error"] = True
                for ch in j.get("choices") or []:
                    if "text" in ch:
                        rec["tokens"] += 1
                        if rec["first_ms"] is None:
                            rec["first_ms"] = now_ms()
                    if ch.get("finish_reason"):
                        rec["finish"] = ch["finish_reason"]
            rec["end_ms"] = now_ms()
        c.close()
    except Exception as e:  # noqa: BLE001 - every failure is recorded
        rec["exc"] = f"{type(e).__name__}: {e}"
        rec["end_ms"] = now_ms()
    with lock:
        out.write(json.dumps(rec) + "\n")
        out.flush()


def load(args):
    targets = args.targets.split(",")
    schedule = [tuple(float(x) for x in p.split(":")) for p in args.schedule.split(",")]
    rng = random.Random(args.seed)
    run = f"soak{time.time_ns()}"
    lock = threading.Lock()
    out = open(os.path.join(args.out, "requests.jsonl"), "w")
    threads = []
    t0 = time.time()
    with open(os.path.join(args.out, "load_start"), "w") as f:
        f.write(str(int(t0 * 1000)))
    # Arrival times: a Poisson process at each phase's rate.
    at, i, phase_start = 0.0, 0, 0.0
    arrivals = []
    for dur, rate in schedule:
        at = max(at, phase_start)
        while rate > 0 and i < args.max_requests:
            at += rng.expovariate(rate)
            if at >= phase_start + dur:
                break
            arrivals.append(at)
            i += 1
        phase_start += dur
    for i, a in enumerate(arrivals):
        delay = t0 + a - time.time()
        if delay > 0:
            time.sleep(delay)
        stream, body = make_request(i, rng, run)
        th = threading.Thread(target=one_request,
                              args=(i, targets[i % len(targets)], stream, body, args.timeout_s,
                                    out, lock), daemon=True)
        th.start()
        threads.append(th)
    with open(os.path.join(args.out, "load_sent"), "w") as f:
        f.write(str(now_ms()))
    for th in threads:
        th.join()
    with open(os.path.join(args.out, "load_end"), "w") as f:
        f.write(str(now_ms()))
    print(f"load: {len(threads)} requests sent, all answered", flush=True)


# ---------------------------------------------------------------------------------------------
# monitor


def get(url, timeout=5):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    c.request("GET", u.path or "/")
    r = c.getresponse()
    data = r.read().decode("utf-8", "replace")
    c.close()
    return data


def series(text, prefix):
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                total += float(line.rsplit(" ", 1)[1])
                found = True
            except ValueError:
                pass
    return total if found else None


def labelled(text, name):
    """{label value: sample} of a one-label series."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            label = line.split('"', 2)[1]
            out[label] = float(line.rsplit(" ", 1)[1])
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None


def rustc_running():
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() == "rustc":
                        n += 1
            except OSError:
                pass
    return n


def monitor(args):
    admins = args.admins.split(",")
    pids = [int(p) for p in args.pids.split(",")]
    pods = args.pods.split(",")
    out = open(os.path.join(args.out, "monitor.jsonl"), "a")
    stop = os.path.join(args.out, "stop")
    while not os.path.exists(stop):
        t = now_ms()
        rec = {"t": t, "gw": [], "pods": {}, "rustc": rustc_running(),
               "load": open("/proc/loadavg").read().split()[0]}
        for admin, pid in zip(admins, pids):
            g = {"rss_kib": rss_kib(pid)}
            try:
                m = get(admin + "/metrics", timeout=3)
                g["healthy"] = labelled(m, "kvgate_pod_healthy")
                g["active"] = series(m, "kvgate_active_requests ")
                g["queued"] = series(m, "kvgate_queued_requests ")
                g["in_flight"] = series(m, "kvgate_in_flight_requests{")
                g["remote"] = series(m, "kvgate_cluster_remote_requests ")
                g["connected"] = series(m, "kvgate_cluster_connected ")
                g["tau"] = series(m, "kvgate_affinity_gate_tau ")
            except Exception as e:  # noqa: BLE001
                g["error"] = str(e)
            rec["gw"].append(g)
        for pod in pods:
            try:
                m = get(pod + "/metrics", timeout=3)
                rec["pods"][pod] = [series(m, "vllm:num_requests_running{"),
                                    series(m, "vllm:num_requests_waiting{")]
            except Exception:  # noqa: BLE001
                rec["pods"][pod] = None
        out.write(json.dumps(rec) + "\n")
        out.flush()
        time.sleep(max(0.0, 1.0 - (now_ms() - t) / 1000))


# ---------------------------------------------------------------------------------------------
# report


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def report(args):
    out = args.out
    run = json.load(open(os.path.join(out, "run.json")))
    reqs = [json.loads(line) for line in open(os.path.join(out, "requests.jsonl")) if line.strip()]
    events = []
    for line in open(os.path.join(out, "events.tsv")):
        parts = line.split("\t")
        if len(parts) >= 2:
            events.append((parts[0], int(parts[1]), parts[2].strip() if len(parts) > 2 else ""))
    mon = [json.loads(line) for line in open(os.path.join(out, "monitor.jsonl")) if line.strip()]
    t0 = int(open(os.path.join(out, "load_start")).read())
    ev = {name: t for name, t, _ in events}
    killed_pod = run["killed_pod"]
    kill_t = ev.get("pod_kill")
    up_t = ev.get("pod_up")

    def on_killed_pod(r):
        # In flight on the killed pod when it was killed: answered by it (its header, or the
        # error naming it) and alive across the kill.
        if kill_t is None:
            return False
        names = killed_pod in (r["pod"] or "") or killed_pod in (r["message"] or "")
        return names and r["sent_ms"] <= kill_t + 1000 and (r["end_ms"] or 0) >= kill_t

    ok, cut_clean, cut_bad, rejected, lost = [], [], [], {}, []
    for r in reqs:
        clean = (r["status"] == 200 and r["exc"] is None and r["finish"] == "length"
                 and r["error_event"] is None
                 and (not r["stream"] or r["done"]))
        if clean:
            ok.append(r)
        elif r["status"] in (429, 503) and r["code"] != "no_healthy_pod":
            rejected[f"{r['status']} {r['code']}"] = rejected.get(f"{r['status']} {r['code']}", 0) + 1
        elif r["stream"] and r["status"] == 200 and on_killed_pod(r):
            if r["error_event"] and r["done"] and not r["data_after_error"] and r["exc"] is None:
                cut_clean.append(r)
            else:
                cut_bad.append(r)
        else:
            lost.append(r)
    no_healthy = [r for r in reqs if r["code"] == "no_healthy_pod"]
    ttft = [r["first_ms"] - r["sent_ms"] for r in ok if r["first_ms"]]
    # Metrics at the end, per replica.
    ends = []
    for k in range(run["replicas"]):
        text = open(os.path.join(out, f"metrics_end_{k}.txt")).read()
        ends.append(text)

    def total(name):
        return sum(series(t, name) or 0.0 for t in ends)

    def by_label(name):
        d = {}
        for t in ends:
            for line in t.splitlines():
                if line.startswith(name + "{"):
                    lab = line[len(name) + 1:].split("}")[0]
                    d[lab] = d.get(lab, 0) + float(line.rsplit(" ", 1)[1])
        return d

    ledgers = {}
    for k, t in enumerate(ends):
        for name in ("kvgate_active_requests ", "kvgate_queued_requests ",
                     "kvgate_in_flight_requests{", "kvgate_in_flight_prefill_tokens{",
                     "kvgate_in_flight_decode_tokens{", "kvgate_flow_queued",
                     "kvgate_cluster_remote_requests ", "kvgate_open_connections "):
            v = series(t, name)
            if v is not None:
                ledgers[f"{name.strip(' {')}[{k}]"] = v
    ledger_nonzero = {k: v for k, v in ledgers.items() if v != 0}
    pods_end = json.load(open(os.path.join(out, "pods_end.json")))
    pods_busy_end = {p: v for p, v in pods_end.items() if v and (v[0] or v[1])}
    # RSS
    rss = [[g.get("rss_kib") for g in m["gw"]] for m in mon]
    rss_by = list(zip(*rss)) if rss else []
    rss_txt = []
    rss_ok = True
    for k, col in enumerate(rss_by):
        col = [x for x in col if x]
        if not col:
            continue
        rss_txt.append(f"replica {k}: start {col[0]:,}, max {max(col):,}, end {col[-1]:,} KiB")
        if max(col) > run["rss_limit_kib"]:
            rss_ok = False
    # The pods' queues, the surviving pod's health as each replica saw it.
    most_waiting = 0
    for m in mon:
        w = sum((v[1] or 0) for v in m["pods"].values() if v)
        most_waiting = max(most_waiting, w)
    serving = run["serving_pod"]
    unhealthy_samples = sum(1 for m in mon for g in m["gw"]
                            if g.get("healthy", {}).get(serving) == 0)
    taus = [g.get("tau") for m in mon for g in m["gw"] if g.get("tau") is not None]
    rustc_samples = sum(1 for m in mon if m["rustc"])
    loads = [float(m["load"]) for m in mon]

    def rel(t):
        return f"{(t - t0) / 1000:.0f} s"

    lines = []
    lines.append(f"chaos soak on real vLLM: {run['label']}")
    lines.append(f"machine: {run['machine']}")
    lines.append(f"pods: {run['speed']}")
    lines.append(f"load average during the run: {min(loads):.2f}–{max(loads):.2f}; rustc running in "
                 f"{rustc_samples} of {len(mon)} one-second samples"
                 + (" (NOT a quiet machine)" if rustc_samples else " (quiet: no compile)"))
    lines.append("events: " + "; ".join(f"{n} at {rel(t)}" + (f" ({d})" if d else "")
                                        for n, t, d in events))
    lines.append("")
    lines.append("| check | figure |")
    lines.append("|---|---|")
    lines.append(f"| requests sent | {len(reqs):,} ({sum(r['stream'] for r in reqs):,} streamed) |")
    lines.append(f"| completed cleanly (finish `length`, `[DONE]`, no error event) | {len(ok):,} |")
    lines.append(f"| streams in flight on the killed pod, ended with an SSE error event + `[DONE]` | {len(cut_clean)} |")
    lines.append(f"| streams in flight on the killed pod, ended otherwise | {len(cut_bad)} |")
    causes = {}
    for r in lost:
        why = r["exc"] or r["error_event"] or f"{r['status']} {r['code']}"
        if "retry budget" in (r["message"] or ""):
            why += " (retry budget spent)"
        if on_killed_pod(r):
            why += ", in flight on the killed pod"
        causes[why] = causes.get(why, 0) + 1
    lost_txt = ", ".join(f"{v} × {k}" for k, v in sorted(causes.items()))
    lines.append(f"| other requests lost (any error, any status) | {len(lost)}"
                 + (f": {lost_txt}" if lost else "") + " |")
    lines.append(f"| `no_healthy_pod` answers (client / kvgate's counter) | {len(no_healthy)} / "
                 f"{int(sum(v for k, v in by_label('kvgate_rejected_requests_total').items() if 'no_healthy_pod' in k))} |")
    lines.append(f"| flow control / admission 429 / 503 by cause | "
                 f"{', '.join(f'{k}: {v}' for k, v in sorted(rejected.items())) or 'none'} |")
    lines.append(f"| TTFT of completed requests p50 / p90 / max | {pct(ttft, .5) / 1000:.1f} / "
                 f"{pct(ttft, .9) / 1000:.1f} / {max(ttft or [0]) / 1000:.1f} s |")
    lines.append(f"| most requests waiting in the pods at once | {most_waiting:.0f} |")
    busy = by_label("kvgate_busy_waits_total")
    busy_fb = busy.get('kind="first_byte"', 0)
    busy_ic = busy.get('kind="idle_chunk"', 0)
    lines.append(f"| kvgate busy waits (first_byte / idle_chunk) | {busy_fb:.0f} / {busy_ic:.0f} |")
    lines.append(f"| retries / refused by the budget | {total('kvgate_retries_total'):.0f} / "
                 f"{total('kvgate_retries_refused_total'):.0f} |")
    lines.append(f"| upstream timeouts | {total('kvgate_upstream_timeouts_total'):.0f} |")
    lines.append(f"| breaker cooldowns (by pod) / withheld / panic routes | "
                 f"{json.dumps(by_label('kvgate_pod_cooldowns_total'))} / "
                 f"{total('kvgate_pod_cooldowns_withheld_total'):.0f} / "
                 f"{total('kvgate_panic_routes_total'):.0f} |")
    lines.append(f"| scrape errors (by pod) | {json.dumps({k: int(v) for k, v in by_label('kvgate_scrape_errors_total').items()})} |")
    lines.append(f"| seconds the serving pod was seen unhealthy (replica-samples) | {unhealthy_samples} |")
    tau_seq = []
    for x in taus:
        if not tau_seq or tau_seq[-1] != f"{x:.2f}":
            tau_seq.append(f"{x:.2f}")
    lines.append(f"| config reloads: τ seen | {' → '.join(tau_seq)}; "
                 f"reload errors {total('kvgate_config_reload_errors_total'):.0f} |")
    if run["replicas"] > 1:
        lines.append(f"| cluster: reconnects / connected at the end / remote charges at the end | "
                     f"{total('kvgate_cluster_reconnects_total'):.0f} / "
                     f"{total('kvgate_cluster_connected '):.0f} of {run['replicas']} / "
                     f"{total('kvgate_cluster_remote_requests '):.0f} |")
    lines.append(f"| kvgate RSS (VmRSS, sampled each second) | {'; '.join(rss_txt)} |")
    lines.append(f"| ledgers at the end (active, queued, in flight, tokens, connections) | "
                 f"{'all 0' if not ledger_nonzero else json.dumps(ledger_nonzero)} |")
    lines.append(f"| pods' own queues at the end | {'empty' if not pods_busy_end else json.dumps(pods_busy_end)} |")
    failures = []
    if cut_bad:
        failures.append(f"{len(cut_bad)} streams on the killed pod did not end with an SSE error + [DONE]")
    if lost:
        failures.append(f"{len(lost)} requests lost")
    if no_healthy:
        failures.append(f"{len(no_healthy)} no_healthy_pod answers while {serving} served")
    if not rss_ok:
        failures.append(f"RSS above {run['rss_limit_kib']} KiB")
    if ledger_nonzero:
        failures.append(f"ledgers not back to zero: {ledger_nonzero}")
    if pods_busy_end:
        failures.append(f"pods still busy at the end: {pods_busy_end}")
    if kill_t is None or up_t is None:
        failures.append("the pod was not killed and restarted")
    if "reload_1" not in ev:
        failures.append("no config reload")
    if len(set(f"{x:.2f}" for x in taus)) < 2:
        failures.append("the config reload never showed (kvgate_affinity_gate_tau unchanged)")
    if run["replicas"] > 1 and "nats_restart" not in ev:
        failures.append("NATS was not killed and restarted")
    lines.append("")
    lines.append("verdict: " + ("PASS" if not failures else "FAIL: " + "; ".join(failures)))
    for r in (cut_bad + lost)[:20]:
        lines.append("  " + json.dumps({k: r[k] for k in ("i", "target", "stream", "status", "pod",
                                                         "code", "message", "error_event", "done",
                                                         "finish", "exc", "tokens")}
                                       | {"sent": rel(r["sent_ms"]), "end": rel(r["end_ms"] or 0)}))
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text + "\n")
    return 0 if not failures else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("proxy")
    p.add_argument("listen_port", type=int)
    p.add_argument("upstream_port", type=int)
    p.add_argument("delay_file")
    p.add_argument("log")
    p = sub.add_parser("load")
    p.add_argument("out")
    p.add_argument("--targets", required=True)
    p.add_argument("--schedule", required=True)
    p.add_argument("--max-requests", type=int, default=1500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout-s", type=float, default=600)
    p = sub.add_parser("monitor")
    p.add_argument("out")
    p.add_argument("--admins", required=True)
    p.add_argument("--pids", required=True)
    p.add_argument("--pods", required=True)
    p = sub.add_parser("report")
    p.add_argument("out")
    args = ap.parse_args()
    if args.cmd == "proxy":
        proxy(args)
    elif args.cmd == "load":
        load(args)
    elif args.cmd == "monitor":
        monitor(args)
    else:
        sys.exit(report(args))


if __name__ == "__main__":
    main()
