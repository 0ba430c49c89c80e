#!/usr/bin/env bash
# Several router replicas behind round-robin in the simulator, with and without sharing routing
# state (`kvgate sim --replicas R [--share --share-delay-ms D --share-loss P]`, the model of
# `kvgate serve --cluster`), on the Mooncake conversation trace and the chat workload, 8 pods,
# affinity-gate. Prints one markdown table per workload and rate: R = 1, 2, 4, 8, shared vs not,
# each as the mean over the seeds, with the ratio to one replica.
#
#   scripts/sim_replicas.sh [OUT_DIR] [--seeds 1,2,3] [--delay-ms 1] [--loss 0] [--rates-mooncake 1,4] [--rates-chat 1,4]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-target/sim-replicas}; shift || true
seeds=1,2,3 delay=1 loss=0 rates_m=1,4 rates_c=1,4
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --delay-ms) delay=$2; shift 2 ;;
    --loss) loss=$2; shift 2 ;;
    --rates-mooncake) rates_m=$2; shift 2 ;;
    --rates-chat) rates_c=$2; shift 2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
kvgate="${CARGO_TARGET_DIR:-$root/target}/release/kvgate"
[ -x "$kvgate" ] || cargo build --release -q -p kvgate
mkdir -p "$out"
trace="$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl"
for w in mooncake chat; do
  if [ $w = mooncake ]; then src=(--trace "$trace"); rates=$rates_m; else src=(--workload chat); rates=$rates_c; fi
  for r in 1 2 4 8; do
    for share in no yes; do
      [ $r = 1 ] && [ $share = yes ] && continue
      flags=()
      [ $share = yes ] && flags=(--share --share-delay-ms "$delay" --share-loss "$loss")
      "$kvgate" sim "${src[@]}" --pods 8 --policy affinity-gate --sweep "rate-scale=$rates" \
        --seed "$seeds" --replicas $r "${flags[@]}" --quiet --json "$out/$w-r$r-$share.json" >/dev/null
    done
  done
done
python3 - "$out" "$delay" "$loss" <<'EOF'
import json, sys, statistics as st
out, delay, loss = sys.argv[1], sys.argv[2], sys.argv[3]
for w in ("mooncake", "chat"):
    runs = {}
    for r in (1, 2, 4, 8):
        for share in ("no", "yes"):
            if r == 1 and share == "yes":
                continue
            for m in json.load(open(f"{out}/{w}-r{r}-{share}.json"))["runs"]:
                runs.setdefault(m["rate_scale"], {}).setdefault((r, share), []).append(m)
    for rate in sorted(runs):
        rows = runs[rate]
        def mean(key, sub=None, r=None):
            ms = rows[r]
            return st.mean((m[key][sub] if sub else m[key]) for m in ms)
        base = {k: mean(*k, r=(1, "no")) for k in (("prefix_hit_rate",), ("ttft_ms", "mean"), ("ttft_ms", "p99"))}
        print(f"\n#### {w}, rate scale {rate} (8 pods, affinity-gate, mean of {len(rows[(1, 'no')])} seeds; sharing delay {delay} ms, loss {loss})\n")
        print("| replicas | shared | hit % | TTFT mean ms | p99 ms | hit / 1 replica | mean / 1 | p99 / 1 |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for (r, share) in sorted(rows):
            h, t, p = mean("prefix_hit_rate", r=(r, share)), mean("ttft_ms", "mean", r=(r, share)), mean("ttft_ms", "p99", r=(r, share))
            print(f"| {r} | {share} | {100*h:.1f} | {t:.1f} | {p:.1f} | {h/base[('prefix_hit_rate',)]:.3f} | {t/base[('ttft_ms','mean')]:.3f} | {p/base[('ttft_ms','p99')]:.3f} |")
EOF
