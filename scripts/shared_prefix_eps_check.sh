#!/usr/bin/env bash
# docs/decisions/shared-prefix-epsilon.md (issue 20): the default gate with and without shared-prefix exploration
# on the workloads gate_issue20.sh does not run: the trace under memory pressure, the mixed
# H100/A100 pool, shared-prefix presets B, C and D. Prints one table per workload (means over
# the seeds; the ratio is with / without).
# Usage: scripts/shared_prefix_eps_check.sh OUT_DIR   (KVGATE=path to a release kvgate)
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
kvgate=${KVGATE:-target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
seeds=${SEEDS:-1,2,3}
on=${ON:-'{}'}
off=${OFF:-'{"shared_prefix_epsilon":0}'}
mkdir -p "$out"
declare -A workloads=(
  [mc-6000-blocks]="--trace $trace --pods 8 --kv-blocks 6000 --sweep rate-scale=1"
  [mixed]="--trace $trace --pod-profiles llama3-8b-h100:4,llama3-8b-a100:4 --sweep rate-scale=0.4,0.7"
  [sp-B]="--workload shared-prefix --preset B --max-requests 6000 --pods 8 --sweep rate-scale=1,2"
  [sp-C]="--workload shared-prefix --preset C --max-requests 10000 --pods 8 --sweep rate-scale=0.5,2"
  [sp-D]="--workload shared-prefix --preset D --max-requests 3000 --pods 8 --sweep rate-scale=0.25"
)
for w in "${!workloads[@]}"; do
  # shellcheck disable=SC2086
  "$kvgate" sim ${workloads[$w]} --seed "$seeds" --quiet --policy affinity-gate \
    --router-config "$on" --json "$out/$w-on.json" >/dev/null
  # shellcheck disable=SC2086
  "$kvgate" sim ${workloads[$w]} --seed "$seeds" --quiet --policy affinity-gate \
    --router-config "$off" --json "$out/$w-off.json" >/dev/null
done
python3 - "$out" "${!workloads[@]}" <<'PY'
import json, sys
from collections import defaultdict
out, names = sys.argv[1], sorted(sys.argv[2:])
def load(path):
    by = defaultdict(list)
    for r in json.load(open(path))["runs"]:
        by[r["rate_scale"]].append(r)
    return by
def mean(rs, key):
    return sum(r["ttft_ms"][key] if key in ("mean", "p99") else r[key] for r in rs) / len(rs)
print("| workload | rate | TTFT mean ms off → on | ratio | p99 ms off → on | ratio | hit % off → on |")
print("|---|---:|---|---:|---|---:|---|")
for w in names:
    off, on = load(f"{out}/{w}-off.json"), load(f"{out}/{w}-on.json")
    for rate in sorted(off):
        a, b = off[rate], on[rate]
        m0, m1 = mean(a, "mean"), mean(b, "mean")
        p0, p1 = mean(a, "p99"), mean(b, "p99")
        h0, h1 = mean(a, "prefix_hit_rate"), mean(b, "prefix_hit_rate")
        print(f"| {w} | {rate:g} | {m0:.1f} → {m1:.1f} | {m1 / m0:.3f} | {p0:.1f} → {p1:.1f} | {p1 / p0:.3f} | {100 * h0:.1f} → {100 * h1:.1f} |")
PY
