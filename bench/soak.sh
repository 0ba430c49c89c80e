#!/usr/bin/env bash
# Bounded soak test of `kvgate serve`, loopback only: 8 mock pods (one process each), the
# gateway in front of them, and `kvgate loadgen` sending streamed completions at a steady rate
# through the gateway, while one pod is killed (SIGKILL) and restarted on the same port every
# minute. Reports requests sent / succeeded / failed by kind, p99 TTFT in steady state vs in
# failure windows (kill → restart + 5 s), and the gateway's RSS (from /proc) at start and end.
#
# With --hostile, hostile clients (bench/soak_hostile.py) run alongside the normal load for
# its whole length: slow-body clients, clients that never read their response, a flood of bad
# JSON, oversized bodies; the report adds what they got back.
#
# Usage: bench/soak.sh [--minutes N] [--rate R] [--down S] [--out DIR] [--debug] [--hostile]
#   --minutes N  length of the load, 1..15 (env SOAK_MINUTES)             [default: 10]
#   --rate R     requests per second, steady (env SOAK_RATE)               [default: 10]
#   --down S     seconds a killed pod stays down (env SOAK_DOWN_S)         [default: 10]
#   --out DIR    where logs, the trace and per-request records go          [default: target/soak]
#   --debug      use a debug build (quicker to build; slower to run) instead of release
#   --hostile    hostile clients alongside the load (see above)
#   --analyze-only  print the report of the run already in --out, without running
# Ports: 127.0.0.1:$SOAK_PORT_BASE+0..7 (pods), +80 (gateway), +90 (admin); base 18100.
# Needs: cargo, curl, python3 (standard library only). Builds `kvgate` first.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=${SOAK_MINUTES:-10}
rate=${SOAK_RATE:-10}
down_s=${SOAK_DOWN_S:-10}
out=${SOAK_OUT:-target/soak}
base=${SOAK_PORT_BASE:-18100}
profile=release
analyze_only=0
hostile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --down) down_s=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --debug) profile=debug; shift ;;
    --hostile) hostile=1; shift ;;
    --analyze-only) analyze_only=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if ! [[ "$minutes" =~ ^[0-9]+$ ]] || [ "$minutes" -lt 1 ] || [ "$minutes" -gt 15 ]; then
  echo "--minutes must be 1..15 (the soak is bounded), got $minutes" >&2
  exit 2
fi
if ! [[ "$rate" =~ ^[0-9]+([.][0-9]+)?$ ]] || [ "$rate" = 0 ]; then
  echo "--rate must be a positive number, got $rate" >&2
  exit 2
fi
if ! [[ "$down_s" =~ ^[0-9]+$ ]] || [ "$down_s" -lt 1 ] || [ "$down_s" -ge 50 ]; then
  echo "--down must be 1..49 seconds, got $down_s" >&2
  exit 2
fi

pods=8
gw_port=$((base + 80))
admin_port=$((base + 90))

# The report, from the files of a run in $out.
analyze() {
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
run = dict(l.split("=", 1) for l in open(f"{out}/run.txt").read().split())
rss_start, rss_end = int(run["rss_start_kib"]), int(run["rss_end_kib"])
minutes, rate, down_s, profile = run["minutes"], run["rate"], run["down_s"], run["profile"]
RECOVER_MS = 5000
reqs = [json.loads(l) for l in open(f"{out}/requests.jsonl") if l.strip()]
faults = [tuple(int(x) for x in l.split()) for l in open(f"{out}/faults.tsv") if l.strip()]
windows = [(k, r + RECOVER_MS) for _, k, r in faults]
def in_window(r):
    # The request's life [sent, sent + e2e] overlaps a failure window.
    t0 = r["sent_unix_ms"]
    t1 = t0 + r["e2e_ms"]
    return any(t0 <= b and t1 >= a for a, b in windows)
def p99(xs):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]
def p50(xs):
    return sorted(xs)[len(xs) // 2] if xs else float("nan")
ok = [r for r in reqs if r["error"] is None]
failed = [r for r in reqs if r["error"] is not None]
kinds = {}
for r in failed:
    kinds[r["error"]] = kinds.get(r["error"], 0) + 1
steady = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None and not in_window(r)]
during = [r["ttft_ms"] for r in ok if r["ttft_ms"] is not None and in_window(r)]
sent_in = sum(1 for r in reqs if in_window(r))
fail_in = sum(1 for r in failed if in_window(r))
rss = [int(l.split()[1]) for l in open(f"{out}/rss.tsv") if len(l.split()) == 2]
status = {}
for line in open(f"{out}/gateway_metrics.txt"):
    if line.startswith("kvgate_requests_total{"):
        s = line.split('status="')[1].split('"')[0]
        status[s] = status.get(s, 0) + float(line.rsplit(" ", 1)[1])
def gauge(name):
    return sum(float(l.rsplit(" ", 1)[1]) for l in open(f"{out}/gateway_metrics.txt")
               if l.startswith(name + " "))
retries = sum(float(l.rsplit(" ", 1)[1]) for l in open(f"{out}/gateway_metrics.txt")
              if l.startswith("kvgate_retries_total"))
print(f"soak ({profile} build{', hostile clients' if run.get('hostile') == '1' else ''}): {minutes} min at {rate} req/s, 8 pods, {len(faults)} pod kills ({down_s} s down each)")
print(f"requests sent {len(reqs)}, succeeded {len(ok)}, failed {len(failed)}"
      + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) + ")" if kinds else ""))
print(f"requests alive during a failure window (kill → restart + {RECOVER_MS // 1000} s): {sent_in}, failed {fail_in}")
print(f"TTFT ms  steady: p50 {p50(steady):.1f} p99 {p99(steady):.1f} (n={len(steady)})"
      f"  |  failure windows: p50 {p50(during):.1f} p99 {p99(during):.1f} (n={len(during)})")
print(f"gateway RSS KiB: start {rss_start}, end {rss_end}, max sampled {max(rss) if rss else rss_end}"
      f"; routed index at the end {int(gauge('kvgate_index_blocks'))} blocks,"
      f" {gauge('kvgate_index_bytes') / 1024:.0f} KiB (bounded, ARCHITECTURE.md)")
import os
if run.get("hostile") == "1" and os.path.exists(f"{out}/hostile.json"):
    h = json.load(open(f"{out}/hostile.json"))
    print("hostile clients: " + json.dumps(h, sort_keys=True))
rejected = {}
for line in open(f"{out}/gateway_metrics.txt"):
    if line.startswith("kvgate_rejected_requests_total{"):
        k = line.split('reason="')[1].split('"')[0]
        rejected[k] = rejected.get(k, 0) + float(line.rsplit(" ", 1)[1])
print("gateway kvgate_rejected_requests_total by reason: "
      + ", ".join(f"{k} {int(v)}" for k, v in sorted(rejected.items())))
print("gateway kvgate_requests_total by status: "
      + ", ".join(f"{k} {int(v)}" for k, v in sorted(status.items()))
      + f"; retries {int(retries)}")
EOF
}
if [ "$analyze_only" = 1 ]; then
  analyze
  exit 0
fi
mkdir -p "$out"
rm -f "$out"/hostile.json "$out"/*.log "$out"/run.txt "$out"/faults.tsv "$out"/rss.tsv "$out"/requests.jsonl "$out"/report.json

echo "== building kvgate ($profile)"
if [ "$profile" = release ]; then
  cargo build --release -p kvgate --quiet
else
  cargo build -p kvgate --quiet
fi
bin=${CARGO_TARGET_DIR:-target}/$profile/kvgate

declare -a pod_pid
gw_pid=""
sampler_pid=""
lg_pid=""
hostile_pid=""
cleanup() {
  for p in "${pod_pid[@]}" "$gw_pid" "$sampler_pid" "$lg_pid" "$hostile_pid"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

start_pod() {
  local i=$1
  "$bin" mock-pod --listen "127.0.0.1:$((base + i))" >>"$out/pod$i.log" 2>&1 &
  pod_pid[$i]=$!
}

wait_http() {
  local url=$1 what=$2
  for _ in $(seq 1 300); do
    if curl -fsS -o /dev/null "$url" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$what did not come up ($url)" >&2
  exit 1
}

now_ms() { date +%s%3N; }

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }

echo "== starting $pods mock pods on 127.0.0.1:$base..$((base + pods - 1))"
pod_args=()
for i in $(seq 0 $((pods - 1))); do
  start_pod "$i"
  pod_args+=(--pod "http://127.0.0.1:$((base + i))")
done
for i in $(seq 0 $((pods - 1))); do wait_http "http://127.0.0.1:$((base + i))/health" "pod $i"; done

echo "== starting the gateway on 127.0.0.1:$gw_port (admin $admin_port)"
"$bin" serve --listen "127.0.0.1:$gw_port" --admin-listen "127.0.0.1:$admin_port" \
  "${pod_args[@]}" --shutdown-drain-ms 0 >"$out/gateway.log" 2>&1 &
gw_pid=$!
wait_http "http://127.0.0.1:$admin_port/readyz" "the gateway"

# A steady-rate Mooncake trace: one request every 1000/rate ms, 512–2047 prompt tokens in 16
# conversations (shared leading hash ids, so prefix affinity has something to do), 128-token
# outputs (a stream lasts long enough that killing a pod cuts some mid-way).
total=$((minutes * 60 * rate))
python3 - "$out/trace.jsonl" "$total" "$rate" <<'EOF'
import random, sys
path, total, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(7)
with open(path, "w") as f:
    for i in range(total):
        conv = rng.randrange(16)
        n_in = rng.randrange(512, 2048)
        blocks = (n_in + 511) // 512
        ids = [conv * 100 + b for b in range(blocks - 1)] + [100_000 + i]
        ts = int(i * 1000 / rate)
        f.write('{"timestamp": %d, "input_length": %d, "output_length": 128, "hash_ids": %s}\n'
                % (ts, n_in, ids))
EOF

rss_start=$(rss_kib "$gw_pid")
(
  while kill -0 "$gw_pid" 2>/dev/null; do
    echo "$(now_ms) $(rss_kib "$gw_pid")" >>"$out/rss.tsv"
    sleep 5
  done
) &
sampler_pid=$!

echo "== loadgen: $total requests at $rate/s for $minutes min; a pod killed every minute for ${down_s}s"
"$bin" loadgen --target "http://127.0.0.1:$gw_port" --trace "$out/trace.jsonl" --stream \
  --timeout-s 60 --max-concurrency 512 --quiet \
  --json "$out/report.json" --requests-jsonl "$out/requests.jsonl" >"$out/loadgen.log" 2>&1 &
lg_pid=$!
t0=$(now_ms)
if [ "$hostile" = 1 ]; then
  echo "== hostile clients for $minutes min (bench/soak_hostile.py)"
  python3 bench/soak_hostile.py 127.0.0.1 "$gw_port" "$((minutes * 60))" "$out/hostile.json" \
    >"$out/hostile.log" 2>&1 &
  hostile_pid=$!
fi

for m in $(seq 1 $((minutes - 1))); do
  target=$((t0 + m * 60000))
  while [ "$(now_ms)" -lt "$target" ]; do sleep 0.2; done
  kill -0 "$lg_pid" 2>/dev/null || break
  victim=$(( (m - 1) % pods ))
  killed=$(now_ms)
  kill -KILL "${pod_pid[$victim]}" 2>/dev/null || true
  wait "${pod_pid[$victim]}" 2>/dev/null || true
  sleep "$down_s"
  start_pod "$victim"
  wait_http "http://127.0.0.1:$((base + victim))/health" "pod $victim (restarted)"
  restarted=$(now_ms)
  echo "$victim $killed $restarted" >>"$out/faults.tsv"
  echo "   minute $m: pod $victim killed, back after $(( (restarted - killed) / 1000 )) s"
done
touch "$out/faults.tsv"

wait "$lg_pid"
lg_pid=""
if [ -n "$hostile_pid" ]; then
  wait "$hostile_pid" || echo "hostile clients exited with an error (see $out/hostile.log)" >&2
  hostile_pid=""
fi
rss_end=$(rss_kib "$gw_pid")
curl -fsS "http://127.0.0.1:$admin_port/metrics" >"$out/gateway_metrics.txt"
cat >"$out/run.txt" <<RUN
minutes=$minutes rate=$rate down_s=$down_s profile=$profile hostile=$hostile rss_start_kib=$rss_start rss_end_kib=$rss_end
RUN
analyze
