#!/usr/bin/env bash
# kvgate and the peer routers side by side on two real vLLM CPU pods, in one run.
#   scripts/real-vllm/peers.sh [OUT_DIR]
# Env: REQUESTS (100: the first N requests of the Mooncake conversation trace that fit the pods'
# context as text), RATE_SCALE (1.0: arrivals × F), RUNS (3 rounds; each round runs every router
# once, in a rotated order), ROUTERS (comma list; default all below), KVGATE_BIN.
#
# Routers (each started fresh per run, in front of the same two pods; the pods' prefix caches
# are reset before every run, so each starts cold):
#   kvgate-routed   kvgate serve (affinity-gate, routed index: what kvgate itself sent where)
#   kvgate-engine   kvgate serve --index engine (the pods' KV events + the model's tokenizer)
#   sglang-cache    sglang-router 0.3.2 --policy cache_aware
#   vllm-cache      vllm-router 0.1.17 --policy cache_aware
#   vllm-kv         vllm-router 0.1.17 --policy kv_aware, fed by the pods' KV events (ZMQ; it takes
#                   only tcp:// endpoints, so zmq_forward.py republishes each pod's ipc stream on
#                   127.0.0.1)
#   round-robin     kvgate serve --policy round-robin
# Pods b0 and b1 (scripts/real-vllm/pod.sh): 128-token blocks, 1 GiB of KV, `--enable-scale-out`
# (vllm-router asks /v1/completions/render for token ids), cores 0 and 1; started here and
# stopped at the end. `kvgate loadgen --stream` sends the trace as text (the synthetic words of
# crates/kvgate-loadgen/src/prompt.rs: ~1.66 tokens per word with the tiny model's tokenizer),
# so text-matching routers see the sharing as users' prompts show it. The hit rate is the pods'
# own (Σ prefix_cache_hits / Σ queries over the run). Prints every run, then each router's median
# over the rounds (a median: one disturbed run must not decide) with its ratio to kvgate-routed,
# and beside them the CPU model, the pods' dtype and their measured speed (speed.py, at start;
# also in OUT_DIR/machine.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out=${1:-/tmp/kvgate-peers}
mkdir -p "$out"
requests=${REQUESTS:-100} rate=${RATE_SCALE:-1.0} runs=${RUNS:-3}
routers=${ROUTERS:-kvgate-routed,kvgate-engine,sglang-cache,vllm-cache,vllm-kv,round-robin}
kvgate=${KVGATE_BIN:-$root/target/release/kvgate}
[ -x "$kvgate" ] || cargo build --release -p kvgate
py=${KVGATE_PYTHON:-$root/.venv/bin/python}
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
model="$run/tiny-model"
scripts/real-vllm/install.sh
[ -f "$model/config.json" ] || .venv-vllm/bin/python scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
bench="$root/.venv-bench"
if [ ! -x "$bench/bin/vllm-router" ] || ! "$bench/bin/python" -c 'import sglang_router' 2>/dev/null; then
  python3 -m venv "$bench"
  "$bench/bin/pip" install -q --disable-pip-version-check sglang-router==0.3.2 vllm-router==0.1.17
fi
port=${KVGATE_BENCH_PORT:-18200}
gw=18280
pid= fwd=()
stop_router() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; } || true
  for f in "${fwd[@]}"; do kill "$f" 2>/dev/null || true; done
  pid= fwd=()
}
cleanup() {
  stop_router
  scripts/real-vllm/pod.sh stop b0 || true
  scripts/real-vllm/pod.sh stop b1 || true
}
trap cleanup EXIT
scripts/real-vllm/pod.sh stop b0 || true
scripts/real-vllm/pod.sh stop b1 || true
scripts/real-vllm/pod.sh start b0 "$model" "$port" $((port + 50)) 0 --enable-scale-out &
a=$!
scripts/real-vllm/pod.sh start b1 "$model" $((port + 1)) $((port + 51)) 1 --enable-scale-out &
b=$!
wait $a
wait $b
p0="http://127.0.0.1:$port" p1="http://127.0.0.1:$((port + 1))"
# The machine and the pods' speed, printed beside the tables (a slow CPU overloads the pods
# with the same trace: the figures are only comparable between machines of similar speed).
.venv-vllm/bin/python scripts/real-vllm/speed.py --summary --dtype "$(cat "$run/b0.dtype")" "$p0" "$p1" \
  > "$out/machine.txt" 2>&1 || echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) (pod speed not measured)" > "$out/machine.txt"
cat "$out/machine.txt"
ev0="ipc://$run/b0-events.ipc" ev1="ipc://$run/b1-events.ipc"
rp0="tcp://127.0.0.1:$((port + 50))" rp1="tcp://127.0.0.1:$((port + 51))"

# The slice: the first $requests requests whose text prompt (1.7 tokens per trace token, with a
# margin) plus output fit max_model_len 4096.
"$py" - "$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl" "$out/slice.jsonl" "$requests" <<'PY'
import json, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
kept = []
for line in open(src):
    r = json.loads(line)
    if 1.7 * r["input_length"] + r["output_length"] <= 3900:
        kept.append(line)
    if len(kept) == n:
        break
open(dst, "w").writelines(kept)
print(f"slice: {len(kept)} requests")
PY

start_router() { # name log
  local name=$1 log=$2
  case "$name" in
    kvgate-routed)
      "$kvgate" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy affinity-gate --pod "$p0" --pod "$p1" 2> "$log" &
      ;;
    kvgate-engine)
      "$kvgate" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy affinity-gate --index engine --tokenizer "$model/tokenizer.json" \
        --pod "$p0,events=$ev0,replay=$rp0,model=tiny" \
        --pod "$p1,events=$ev1,replay=$rp1,model=tiny" 2> "$log" &
      ;;
    round-robin)
      "$kvgate" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy round-robin --pod "$p0" --pod "$p1" 2> "$log" &
      ;;
    sglang-cache)
      "$bench/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$gw" \
        --worker-urls "$p0" "$p1" --policy cache_aware --prometheus-port $((gw + 11)) > "$log" 2>&1 &
      ;;
    vllm-cache)
      "$bench/bin/vllm-router" --host 127.0.0.1 --port "$gw" --worker-urls "$p0" "$p1" \
        --policy cache_aware --prometheus-port $((gw + 12)) > "$log" 2>&1 &
      ;;
    vllm-kv)
      "$py" scripts/real-vllm/zmq_forward.py "$ev0" "tcp://127.0.0.1:$((gw + 20))" & fwd+=($!)
      "$py" scripts/real-vllm/zmq_forward.py "$ev1" "tcp://127.0.0.1:$((gw + 21))" & fwd+=($!)
      "$bench/bin/vllm-router" --host 127.0.0.1 --port "$gw" --worker-urls "$p0" "$p1" \
        --policy kv_aware --kv-event-source "$p0=tcp://127.0.0.1:$((gw + 20))" \
        --kv-event-source "$p1=tcp://127.0.0.1:$((gw + 21))" \
        --kv-event-replay-source "$p0=$rp0" --kv-event-replay-source "$p1=$rp1" \
        --kv-event-block-size 128 --kv-event-model tiny \
        --prometheus-port $((gw + 13)) > "$log" 2>&1 &
      ;;
    *) echo "unknown router $name" >&2; return 1 ;;
  esac
  pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$gw/v1/models" > /dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "!! $name did not come up (see $log)"; stop_router; return 1
}

IFS=, read -ra list <<< "$routers"
for ((r = 1; r <= runs; r++)); do
  # Rotate the order each round so that no router always runs first (or last).
  order=("${list[@]:$(((r - 1) % ${#list[@]}))}" "${list[@]:0:$(((r - 1) % ${#list[@]}))}")
  for name in "${order[@]}"; do
    for p in "$p0" "$p1"; do curl -sf -X POST "$p/reset_prefix_cache" > /dev/null; done
    sleep 1
    start_router "$name" "$out/$name-$r.log" || continue
    "$kvgate" loadgen --target "http://127.0.0.1:$gw" --trace "$out/slice.jsonl" --rate-scale "$rate" \
      --stream --model tiny --max-concurrency 256 --timeout-s 600 --quiet \
      --pod-metrics "$p0" --pod-metrics "$p1" --json "$out/$name-$r.json" \
      > "$out/loadgen-$name-$r.log" 2>&1 || echo "!! loadgen failed for $name run $r"
    stop_router
    echo "run $r: $name done"
  done
done

"$py" scripts/real-vllm/peers_table.py "$out" "$routers" "$runs"
echo
cat "$out/machine.txt"
