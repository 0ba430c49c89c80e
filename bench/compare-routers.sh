#!/usr/bin/env bash
# Side-by-side comparison of kvgate with the SGLang and vLLM routers, on one machine, in one run.
#
#   bench/compare-routers.sh [--pods N] [--requests N] [--rate-scale F] [--time-scale X]
#                            [--trace FILE] [--mode replay|overhead|both] [--out DIR]
#                            [--overhead-rate R] [--overhead-concurrency C]
#
# replay (default): starts N mock pods (`kvgate mock-pod`), then replays the same trace through
#   kvgate (affinity-gate), sglang-router (cache_aware), vllm-router (cache_aware) and kvgate
#   round-robin — one after another, each against FRESH pods (restarted, cold caches) — with
#   `kvgate loadgen --stream --json`, and prints one table.
#   Then `kvgate sim` replays the same slice with the same pods at the equivalent model-time
#   rate (--rate-scale / --time-scale), for the sim-vs-live ranking.
# overhead: ONE fast pod (time-scale 1000, 64-token prompts, 1-token outputs) behind each router
#   and directly, fresh per path, at most --overhead-concurrency (32) in flight: added latency
#   (e2e p50/p99 minus direct's) at a paced --overhead-rate (200 req/s), and max requests/s
#   with all arrivals at once.
#
# The routers come from PyPI into .venv-bench (not the test venv). A router that cannot be
# installed or started is reported and skipped; the others still run. Needs: cargo, python3.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

pods=4
requests=600
rate_scale=10
time_scale=5
trace="$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl"
mode=replay
out="$root/target/bench-compare"
base_port=18100
model=meta-llama/Llama-3.1-8B-Instruct
router_port=18300
over_rate=200
over_conc=32
while [ $# -gt 0 ]; do
  case "$1" in
    --pods) pods=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --rate-scale) rate_scale=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --mode) mode=$2; shift 2 ;;
    --overhead-rate) over_rate=$2; shift 2 ;;
    --overhead-concurrency) over_conc=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
log="$out/log"; mkdir -p "$log"

echo "== building kvgate (release)"
cargo build --release -q -p kvgate || exit 1
kvgate="$root/target/release/kvgate"

venv="$root/.venv-bench"
echo "== routers from PyPI into $venv"
if [ ! -x "$venv/bin/python" ]; then python3 -m venv "$venv" || echo "!! cannot create $venv"; fi
have_sglang=0; have_vllm=0
if [ -x "$venv/bin/pip" ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check sglang-router >"$log/pip-sglang.log" 2>&1 \
    && "$venv/bin/python" -c 'import sglang_router' 2>/dev/null && have_sglang=1
  "$venv/bin/pip" install -q --disable-pip-version-check vllm-router >"$log/pip-vllm.log" 2>&1 \
    && { [ -x "$venv/bin/vllm-router" ] || "$venv/bin/python" -c 'import vllm_router' 2>/dev/null; } && have_vllm=1
fi
[ $have_sglang = 1 ] || echo "!! sglang-router could not be installed (see $log/pip-sglang.log); skipped"
[ $have_vllm = 1 ] || echo "!! vllm-router could not be installed (see $log/pip-vllm.log); skipped"

. bench/lib.sh  # pids, cleanup (on exit too), wait_http (the script has cd-ed to the repo root)


active_pods=$pods
start_pods() { # time_scale [count]
  active_pods=${2:-$pods}
  "$kvgate" mock-pod --count "$active_pods" --listen "127.0.0.1:$base_port" --time-scale "$1" \
    --model "$model" >"$log/pods.log" 2>&1 &
  pids+=($!)
  local i
  for ((i = 0; i < active_pods; i++)); do
    wait_http "http://127.0.0.1:$((base_port + i))/health" 20 || { echo "!! pod $i did not start"; return 1; }
  done
}

pod_urls() { local i; for ((i = 0; i < active_pods; i++)); do printf 'http://127.0.0.1:%d ' $((base_port + i)); done; }
pod_flags() { local f="$1" u; for u in $(pod_urls); do printf -- '%s %s ' "$f" "$u"; done; }

# start_router NAME: starts it on $router_port; returns 1 if it is unavailable.
start_router() {
  local name=$1 url="http://127.0.0.1:$router_port"
  case "$name" in
    kvgate-affinity-gate | kvgate-round-robin)
      local policy=${name#kvgate-}
      "$kvgate" serve --listen "127.0.0.1:$router_port" --admin-listen "127.0.0.1:$((router_port + 1))" \
        --policy "$policy" --shutdown-drain-ms 0 $(pod_flags --pod) >"$log/$name.log" 2>&1 &
      ;;
    sglang-cache-aware)
      [ $have_sglang = 1 ] || return 1
      "$venv/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$router_port" \
        --worker-urls $(pod_urls) --policy cache_aware \
        --prometheus-port $((router_port + 2)) >"$log/$name.log" 2>&1 &
      ;;
    vllm-cache-aware)
      [ $have_vllm = 1 ] || return 1
      "$venv/bin/vllm-router" --host 127.0.0.1 --port "$router_port" \
        --worker-urls $(pod_urls) --policy cache_aware \
        --prometheus-port $((router_port + 3)) >"$log/$name.log" 2>&1 &
      ;;
  esac
  pids+=($!)
  # A router is up when it serves /v1/models (the routers check their workers first).
  wait_http "$url/v1/models" 60 || { echo "!! $name did not come up (see $log/$name.log)"; return 1; }
}

stop_all() { cleanup; sleep 0.5; }

routers=(kvgate-affinity-gate sglang-cache-aware vllm-cache-aware kvgate-round-robin)

row() { # name json
  python3 - "$1" "$2" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
r = json.load(open(path))
hit = r.get("prefix_hit_rate")
errs = sum(r.get("errors", {}).values())
print(f"| {name} | {r['completed']}/{r['requests']} | {r['ttft_ms']['p50']:.0f} | {r['ttft_ms']['p99']:.0f} | "
      f"{r['tpot_ms']['p50']:.1f} | {r['tpot_ms']['p99']:.1f} | {r['output_tok_per_s']:.0f} | "
      f"{'n/a' if hit is None else f'{100*hit:.1f}%'} | {errs} |")
PY
}

if [ "$mode" = replay ] || [ "$mode" = both ]; then
  sub="$out/trace.jsonl"
  head -n "$requests" "$trace" >"$sub"
  echo "== replay: first $requests requests of $(basename "$trace") × rate $rate_scale, $pods mock pods at time-scale $time_scale"
  table="$out/replay.md"
  {
    echo "| router | done | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | out tok/s | pods' hit rate | errors |"
    echo "|---|---|---|---|---|---|---|---|---|"
  } >"$table"
  for name in "${routers[@]}"; do
    stop_all
    start_pods "$time_scale" || { stop_all; continue; }
    if ! start_router "$name"; then echo "| $name | not run | | | | | | | |" >>"$table"; continue; fi
    echo "-- $name"
    "$kvgate" loadgen --target "http://127.0.0.1:$router_port" --model "$model" --trace "$sub" --rate-scale "$rate_scale" \
      --stream --max-concurrency 512 $(pod_flags --pod-metrics) --json "$out/$name.json" --quiet \
      >"$log/loadgen-$name.log" 2>&1 || echo "!! loadgen failed for $name (see $log/loadgen-$name.log)"
    [ -f "$out/$name.json" ] && row "$name" "$out/$name.json" >>"$table"
  done
  stop_all
  echo; cat "$table"
  # The same slice in the simulator, same pods and profile. The mock pods run model time
  # $time_scale× faster than wall time, so wall arrivals × $rate_scale are model-time arrivals
  # × $rate_scale / $time_scale. sglang-cache-aware is kvgate's re-implementation of sglang's
  # policy; the simulator has no vllm-router model. Its latencies are model ms: divide by
  # $time_scale to compare with the table above (or compare the rankings).
  sim_rate=$(python3 -c "import sys; print(float(sys.argv[1]) / float(sys.argv[2]))" "$rate_scale" "$time_scale")
  echo; echo "== simulator: same slice, $pods pods, --rate-scale $sim_rate (= $rate_scale / time-scale $time_scale)"
  "$kvgate" sim --trace "$sub" --pods "$pods" --max-requests "$requests" --rate-scale "$sim_rate" \
    --policy affinity-gate,round-robin,sglang-cache-aware --json "$out/sim.json" --quiet \
    | tee "$out/sim.txt" || echo "!! kvgate sim failed"
fi

if [ "$mode" = overhead ] || [ "$mode" = both ]; then
  # What the router itself costs: ONE fast pod (time-scale 1000, 64-token prompts, 1-token
  # outputs) behind each router, and the same pod directly. Two runs per path, both with at
  # most $over_conc requests in flight:
  #   paced:     $over_rate req/s (well below saturation): e2e p50/p99, and those minus direct's;
  #   saturated: arrivals all at once: completed requests/s (the path's max).
  over="$out/overhead.jsonl"
  n_paced=$((over_rate * 5)); n_sat=$((n_paced > 10000 ? n_paced : 10000))
  python3 - "$over" "$n_sat" "$over_rate" <<'PY'
import json, sys
path, n, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(path, "w") as f:
    for i in range(n):  # 1/rate apart; 64-token prompts, 16 distinct 512-token-span ids
        f.write(json.dumps({"timestamp": int(1000 * i / rate), "input_length": 64,
                            "output_length": 1, "hash_ids": [i % 16]}) + "\n")
PY
  echo "== overhead: 1 pod at time-scale 1000; paced $n_paced requests at $over_rate req/s, then $n_sat at once; ≤ $over_conc in flight"
  table="$out/overhead.md"
  {
    echo "| path | e2e p50 ms | e2e p99 ms | added p50 ms | added p99 ms | max req/s | vs direct |"
    echo "|---|---|---|---|---|---|---|"
  } >"$table"
  direct_p50=""; direct_p99=""; direct_rps=""
  for name in direct "${routers[@]}"; do
    stop_all
    start_pods 1000 1 || continue
    target="http://127.0.0.1:$base_port"
    if [ "$name" != direct ]; then
      start_router "$name" || { echo "| $name | not run | | | | | |" >>"$table"; continue; }
      target="http://127.0.0.1:$router_port"
    fi
    echo "-- $name"
    "$kvgate" loadgen --target "$target" --model "$model" --trace "$over" --max-requests "$n_paced" \
      --max-concurrency "$over_conc" --json "$out/overhead-$name-paced.json" --quiet \
      >"$log/overhead-$name-paced.log" 2>&1 || echo "!! loadgen failed for $name (see $log/overhead-$name-paced.log)"
    "$kvgate" loadgen --target "$target" --model "$model" --trace "$over" --rate-scale 1000000 \
      --max-concurrency "$over_conc" --json "$out/overhead-$name-sat.json" --quiet \
      >"$log/overhead-$name-sat.log" 2>&1 || echo "!! loadgen failed for $name (see $log/overhead-$name-sat.log)"
    [ -f "$out/overhead-$name-paced.json" ] && [ -f "$out/overhead-$name-sat.json" ] || continue
    read -r p50 p99 rps errs < <(python3 -c "import json,sys; a=json.load(open(sys.argv[1])); b=json.load(open(sys.argv[2])); print(a['e2e_ms']['p50'], a['e2e_ms']['p99'], b['requests_per_s'], sum(a.get('errors',{}).values())+sum(b.get('errors',{}).values()))" \
      "$out/overhead-$name-paced.json" "$out/overhead-$name-sat.json")
    [ "$errs" = 0 ] || echo "!! $name: $errs failed requests (see the JSON in $out)"
    if [ "$name" = direct ]; then direct_p50=$p50; direct_p99=$p99; direct_rps=$rps; fi
    python3 -c "import sys; n,a,b,c,d,rps,drps=sys.argv[1],*map(float,sys.argv[2:]); print(f'| {n} | {a:.2f} | {b:.2f} | {a-c:+.2f} | {b-d:+.2f} | {rps:.0f} | {rps/drps:.2f}x |')" \
      "$name" "$p50" "$p99" "$direct_p50" "$direct_p99" "$rps" "$direct_rps" >>"$table"
  done
  stop_all
  echo; cat "$table"
fi
echo; echo "results and logs in $out"
