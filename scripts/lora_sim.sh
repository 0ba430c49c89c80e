#!/usr/bin/env bash
# LoRA adapters in the simulator (docs/decisions/lora-aware.md): the chat workload with 8 adapters (tenant t
# names adapter-t) on 4 pods with 2 adapter slots each (load 25 ms), 3,000 requests, workload
# seeds 1-3 at rate scales 2, 4 and 8 (MAX_LORAS=1: 4 slots for 8 adapters), routed by
#   aware  affinity-gate (lora_aware = true, the default)
#   blind  affinity-gate with lora_aware = false (the prefix index still keyed by adapter)
#   peer   lora-affinity (llm-d weighted scorers + GIE's lora-affinity-scorer)
# Prints one markdown table (means over the seeds, min-max in brackets).
# Usage: scripts/lora_sim.sh [KVGATE_BINARY]   (default target/release/kvgate)
set -euo pipefail
cd "$(dirname "$0")/.."
kvgate=${1:-target/release/kvgate}
out=$(mktemp -d)
common=(sim --workload chat --chat-adapters 8 --pods 4 --max-loras "${MAX_LORAS:-2}" --lora-load-ms 25
        --max-requests 3000 --sweep rate-scale=2,4,8 --seed 1 --quiet)
for ws in 1 2 3; do
  "$kvgate" "${common[@]}" --workload-seed "$ws" --policy affinity-gate --json "$out/aware-$ws.json" > /dev/null
  "$kvgate" "${common[@]}" --workload-seed "$ws" --policy affinity-gate \
    --router-config '{"lora_aware": false}' --json "$out/blind-$ws.json" > /dev/null
  "$kvgate" "${common[@]}" --workload-seed "$ws" --policy lora-affinity --json "$out/peer-$ws.json" > /dev/null
done
python3 - "$out" <<'PY'
import json, sys, glob, collections
out = sys.argv[1]
rows = collections.defaultdict(list)
for variant in ["aware", "blind", "peer"]:
    for path in sorted(glob.glob(f"{out}/{variant}-*.json")):
        for r in json.load(open(path))["runs"]:
            rows[(r["rate_scale"], variant)].append(r)
def cell(runs, f, fmt="{:.0f}"):
    v = [f(r) for r in runs]
    return f"{fmt.format(sum(v) / len(v))} [{fmt.format(min(v))}–{fmt.format(max(v))}]"
print("| rate | router | TTFT mean ms | TTFT p50 ms | TTFT p99 ms | prefix hit % | adapter loads |")
print("|---|---|---|---|---|---|---|")
for (rate, variant), runs in sorted(rows.items()):
    name = {"aware": "affinity-gate, lora_aware (default)", "blind": "affinity-gate, adapter-blind",
            "peer": "lora-affinity (peer)"}[variant]
    print(f"| {rate:g} | {name} | {cell(runs, lambda r: r['ttft_ms']['mean'])} | "
          f"{cell(runs, lambda r: r['ttft_ms']['p50'], '{:.1f}')} | {cell(runs, lambda r: r['ttft_ms']['p99'])} | "
          f"{cell(runs, lambda r: 100 * r['prefix_hit_rate'], '{:.1f}')} | {cell(runs, lambda r: r.get('lora_loads', 0))} |")
PY
rm -rf "$out"
