#!/usr/bin/env bash
# Runs the same simulator configurations with two kvgate binaries and says, per configuration,
# whether their --json output is identical (wall times and keys only NEW knows are ignored).
# For refactors that must not change what the simulator measures.
# Usage: scripts/sim_regression.sh OLD_KVGATE NEW_KVGATE [OUT_DIR]
set -euo pipefail
old=$1 new=$2 out=${3:-$(mktemp -d)}
traces="$(cd "$(dirname "$0")/.." && pwd)/../shared/traces"
mkdir -p "$out"
policies=affinity-gate,latency,sglang-cache-aware,least-request,round-robin,weighted,dynamo-kv
compare() {
  local name=$1; shift
  "$old" sim "$@" --quiet --threads 1 --json "$out/$name.old.json" >/dev/null
  "$new" sim "$@" --quiet --threads 1 --json "$out/$name.new.json" >/dev/null
  python3 - "$out/$name.old.json" "$out/$name.new.json" "$name" <<'PY'
import json, sys
old, new, name = (json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3])
def strip(x, other):
    if isinstance(x, dict):
        return {k: strip(v, other.get(k, {}) if isinstance(other, dict) else {})
                for k, v in x.items() if k not in ("sim_wall_s", "wall_s")
                and (not isinstance(other, dict) or k in other)}
    if isinstance(x, list):
        return [strip(v, o) for v, o in zip(x, other if isinstance(other, list) else [{}] * len(x))]
    return x
print(f"{name:18} {'identical' if strip(new, old) == strip(old, new) else 'DIFFERENT'}")
PY
}
mooncake="$traces/mooncake_fast25_conversation_trace.jsonl"
compare mooncake --trace "$mooncake" --max-requests 3000 --policy "$policies" --rate-scale 2
compare mooncake-seed --trace "$mooncake" --max-requests 3000 --policy affinity-gate --router-config '{"gate_profile":"seed"}'
compare chat --workload chat --max-requests 3000 --policy "$policies" --rate-scale 4
compare chat-engine --workload chat --max-requests 3000 --policy affinity-gate,sglang-cache-aware --index routed,engine --kv-blocks 800 --event-delay-ms 0,50 --event-loss 0,0.05
compare chat-engine-stale --workload chat --max-requests 3000 --policy affinity-gate --index engine --kv-blocks 800 --event-loss 0.05 --event-loss-recovery stale
compare shared-prefix --workload shared-prefix --max-requests 2000 --policy "$policies" --rate-scale 2
compare balance --workload chat --max-requests 2000 --policy affinity-gate --router-config '{"balance_window_rel":0.5}'
compare mixed --workload chat --max-requests 2000 --policy affinity-gate,latency --pod-profiles llama3-8b-h100:4,llama3-8b-a100:4
compare faults --workload chat --max-requests 3000 --policy affinity-gate,least-request --faults every=20,down=5
compare tau-eps --workload chat --max-requests 2000 --policy affinity-gate --router-config '{"affinity_gate_tau":0.5,"epsilon_explore_sticky":0.05}'
echo "outputs in $out"
