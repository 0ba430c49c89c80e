#!/usr/bin/env bash
# Several gateway replicas in front of the same pods: does the prefix-cache hit rate survive?
#
#   bench/replicas.sh [--requests N] [--rate-scale F] [--time-scale X] [--trace FILE]
#                     [--kv-blocks N] [--out DIR]
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
pod_port=18500
events_port=18600
replay_port=18700
gw_port=18800
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    --rate-scale) rate_scale=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --kv-blocks) kv_blocks=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/log"

echo "== building kvgate (release)"
cargo build --release -q -p kvgate || exit 1
kvgate="$root/target/release/kvgate"

# The two halves of the first N requests, timestamps kept.
python3 - "$trace" "$requests" "$out" <<'EOF'
import sys
trace, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
halves = [open(f"{out}/half{i}.jsonl", "w") for i in range(2)]
with open(trace) as f:
    for i, line in enumerate(f):
        if i >= n:
            break
        halves[i % 2].write(line)
EOF

pids=()
cleanup() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap cleanup EXIT

wait_http() { # url, seconds
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    curl -fsS -o /dev/null "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

start_pods() {
  local extra=()
  [ -n "$kv_blocks" ] && extra=(--kv-blocks "$kv_blocks")
  "$kvgate" mock-pod --count 4 --listen "127.0.0.1:$pod_port" --time-scale "$time_scale" \
    --kv-events "tcp://127.0.0.1:$events_port" --kv-events-replay "tcp://127.0.0.1:$replay_port" \
    "${extra[@]}" >"$log_dir/pods.log" 2>&1 &
  pids+=($!)
  local i
  for ((i = 0; i < 4; i++)); do
    wait_http "http://127.0.0.1:$((pod_port + i))/health" 30 || { echo "!! pod $i did not start"; return 1; }
  done
}

# start_replica INDEX(routed|engine) N: replica N on gw_port+N, admin gw_port+10+N.
start_replica() {
  local index=$1 n=$2 flags=() i
  for ((i = 0; i < 4; i++)); do
    flags+=(--pod "http://127.0.0.1:$((pod_port + i)),events=tcp://127.0.0.1:$((events_port + i)),replay=tcp://127.0.0.1:$((replay_port + i))")
  done
  "$kvgate" serve --listen "127.0.0.1:$((gw_port + n))" --admin-listen "127.0.0.1:$((gw_port + 10 + n))" \
    --index "$index" --seed "$n" "${flags[@]}" >"$log_dir/replica$n.log" 2>&1 &
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
run_scenario() { # name replicas index
  local name=$1 replicas=$2 index=$3
  log_dir="$out/log/$name"; mkdir -p "$log_dir"
  echo "== $name"
  start_pods || { cleanup; return 1; }
  start_replica "$index" 0 || { cleanup; return 1; }
  [ "$replicas" = 2 ] && { start_replica "$index" 1 || { cleanup; return 1; }; }
  # Engine index: wait until every replica follows every pod's events (registered after the
  # first scrape, subscribed within ~100 ms); the pods publish nothing before the first request.
  sleep 1
  local lg=() h target
  for h in 0 1; do
    target="http://127.0.0.1:$((gw_port + (replicas == 2 ? h : 0)))"
    "$kvgate" loadgen --target "$target" --trace "$out/half$h.jsonl" --rate-scale "$rate_scale" \
      --stream --quiet --json "$log_dir/loadgen$h.json" >"$log_dir/loadgen$h.log" 2>&1 &
    lg+=($!)
  done
  for h in "${lg[@]}"; do wait "$h"; done
  local hits queries
  hits=$(pods_sum 'vllm:prefix_cache_hits_total')
  queries=$(pods_sum 'vllm:prefix_cache_queries_total')
  rows+=("$(python3 - "$name" "$hits" "$queries" "$log_dir" <<'EOF'
import json, sys
name, hits, queries, d = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
reps = [json.load(open(f"{d}/loadgen{h}.json")) for h in (0, 1)]
done = sum(r["completed"] for r in reps)
sent = sum(r["requests"] for r in reps)
errors = sum(sum(r["errors"].values()) for r in reps)
# Mean TTFT over both halves, weighted by completed requests.
ttft = sum(r["ttft_ms"]["mean"] * r["completed"] for r in reps) / max(done, 1)
p99 = max(r["ttft_ms"]["p99"] for r in reps)
print(f"| {name} | {done}/{sent} | {100 * hits / max(queries, 1):.1f} % | {ttft:.0f} | {p99:.0f} | {errors} |")
EOF
)")
  cleanup
}

run_scenario "1 replica, routed" 1 routed
run_scenario "1 replica, engine" 1 engine
run_scenario "2 replicas, routed" 2 routed
run_scenario "2 replicas, engine" 2 engine

echo
echo "first $requests requests of $(basename "$trace"), halves by request parity, rate × $rate_scale, pods time-scale $time_scale${kv_blocks:+, kv-blocks $kv_blocks}"
echo "| scenario | done | pods' hit rate | TTFT mean ms | TTFT p99 ms (worse half) | errors |"
echo "|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "$r"; done
