#!/usr/bin/env bash
# The simulator against a real engine: the same Mooncake trace slice through `kvgate serve` in
# front of two real vLLM CPU pods (`kvgate loadgen`) and in `kvgate sim` with the profile
# measured on those pods (calibrate.py), for several policies; prints one table, sim vs real.
#   scripts/real-vllm/sim_vs_real.sh [OUT_DIR]
# Env: REQUESTS (200), RATE_SCALE (arrival rate × F; 1.5: the slice's 0.82 req/s × 1.5), POLICIES (comma list),
# PODS (2; 1 runs one pod with the other core left to its engine-core and API processes, the
# gateway and loadgen — the one setup where the rig gives a pod what the simulator assumes), MAX_LEN
# (input + output ≤ this many tokens; 3800: the pods' max_model_len is 4096), PROFILE (an
# existing profile JSON; else calibrate.py measures one first, ~2 min).
# Pods b0 and b1: 128-token blocks, 1 GiB of KV cache (65,536 tokens), cores 0 and 1, started
# here and stopped at the end; their prefix caches are reset before every policy's run.
# Prompts are sent as token ids (loadgen --token-prompts), so pods and simulator see the same
# lengths. Needs scripts/real-vllm/install.sh's venv and a release build (built if missing).
# Beside the table: the CPU model, the pods' dtype and their measured speed (speed.py, at start).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out=${1:-/tmp/kvgate-sim-vs-real}
mkdir -p "$out"
requests=${REQUESTS:-200} rate=${RATE_SCALE:-1.5} max_len=${MAX_LEN:-3800}
policies=${POLICIES:-affinity-gate,latency,sglang-cache-aware,least-request,round-robin}
kvgate=${KVGATE_BIN:-$root/target/release/kvgate}
[ -x "$kvgate" ] || cargo build --release -p kvgate
py=${KVGATE_PYTHON:-$root/.venv/bin/python}
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
model="$run/tiny-model"
scripts/real-vllm/install.sh
[ -f "$model/config.json" ] || .venv-vllm/bin/python scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
port=${KVGATE_BENCH_PORT:-18200}
cleanup() {
  scripts/real-vllm/pod.sh stop b0 || true
  scripts/real-vllm/pod.sh stop b1 || true
  [ -n "${gw_pid:-}" ] && kill "$gw_pid" 2>/dev/null || true
}
trap cleanup EXIT
scripts/real-vllm/pod.sh start b0 "$model" "$port" $((port + 50)) 0 &
a=$!
npods=${PODS:-2}
pods=("http://127.0.0.1:$port")
if [ "$npods" = 2 ]; then
  scripts/real-vllm/pod.sh start b1 "$model" $((port + 1)) $((port + 51)) 1 &
  wait $!
  pods+=("http://127.0.0.1:$((port + 1))")
else
  scripts/real-vllm/pod.sh stop b1 || true
fi
wait $a
# The machine and the pods' speed, printed beside the table (also in OUT_DIR/machine.txt).
.venv-vllm/bin/python scripts/real-vllm/speed.py --summary --dtype "$(cat "$run/b0.dtype")" "${pods[@]}" \
  > "$out/machine.txt" 2>&1 || echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) (pod speed not measured)" > "$out/machine.txt"
cat "$out/machine.txt"

# The trace slice: the first $requests requests that fit the pods' context.
"$py" - "$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl" "$out/slice.jsonl" \
  "$requests" "$max_len" <<'PY'
import json, sys
src, dst, n, max_len = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
kept = []
for line in open(src):
    r = json.loads(line)
    if r["input_length"] + r["output_length"] <= max_len:
        kept.append(line)
    if len(kept) == n:
        break
open(dst, "w").writelines(kept)
print(f"slice: {len(kept)} requests")
PY

profile=${PROFILE:-$out/profile.json}
if [ ! -f "$profile" ]; then
  "$py" scripts/real-vllm/calibrate.py "${pods[0]}" --profile-out "$profile" --name tiny-llama-cpu \
    | tee "$out/calibrate.txt"
fi

IFS=, read -ra list <<< "$policies"
for policy in "${list[@]}"; do
  for p in "${pods[@]}"; do curl -sf -X POST "$p/reset_prefix_cache" > /dev/null; done
  "$kvgate" serve --listen 127.0.0.1:18280 --admin-listen 127.0.0.1:18290 --policy "$policy" \
    "${pods[@]/#/--pod=}" 2> "$out/serve-$policy.log" &
  gw_pid=$!
  until curl -sf http://127.0.0.1:18290/readyz > /dev/null; do sleep 0.2; done
  "$kvgate" loadgen --target http://127.0.0.1:18280 --trace "$out/slice.jsonl" --rate-scale "$rate" \
    --stream --token-prompts --model tiny --max-concurrency 256 --timeout-s 600 --quiet \
    "${pods[@]/#/--pod-metrics=}" --json "$out/real-$policy.json"
  kill "$gw_pid"; wait "$gw_pid" 2>/dev/null || true; gw_pid=
  echo "real: $policy done"
done
"$kvgate" sim --trace "$out/slice.jsonl" --rate-scale "$rate" --pods "$npods" --profile "$profile" \
  --policy "$policies" --json "$out/sim.json" > "$out/sim.txt"
"$py" - "$out" "$policies" <<'PY'
import json, sys
out, policies = sys.argv[1], sys.argv[2].split(",")
sim = {r["policy"]: r for r in json.load(open(f"{out}/sim.json"))["runs"]}
print("| policy | TTFT mean real / sim ms | p50 real / sim | p90 real / sim | p99 real / sim | hit % real / sim | sim/real mean | sim/real p90 |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for p in policies:
    real = json.load(open(f"{out}/real-{p}.json"))
    r, s = real["ttft_ms"], sim[p]["ttft_ms"]
    hit_r = real.get("prefix_hit_rate")
    hit = f"{100 * hit_r:.1f}" if hit_r is not None else "n/a"
    errors = sum(real.get("errors", {}).values())
    print(f"| {p}{' (' + str(errors) + ' errors)' if errors else ''} | {r['mean']:.0f} / {s['mean']:.0f} | {r['p50']:.0f} / {s['p50']:.0f} "
          f"| {r['p90']:.0f} / {s['p90']:.0f} | {r['p99']:.0f} / {s['p99']:.0f} "
          f"| {hit} / {100 * sim[p]['prefix_hit_rate']:.1f} | {s['mean'] / r['mean']:.2f} | {s['p90'] / r['p90']:.2f} |")
rank = lambda d: [p for p, _ in sorted(d.items(), key=lambda kv: kv[1])]
real_mean = {p: json.load(open(f"{out}/real-{p}.json"))["ttft_ms"]["mean"] for p in policies}
sim_mean = {p: sim[p]["ttft_ms"]["mean"] for p in policies}
print(f"\nranking by mean TTFT, real: {', '.join(rank(real_mean))}")
print(f"ranking by mean TTFT, sim:  {', '.join(rank(sim_mean))}")
PY
echo
cat "$out/machine.txt"
