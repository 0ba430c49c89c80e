#!/usr/bin/env bash
# Produces the all-policy and gate-option tables (docs/decisions/affinity-gate.md and the gate
# options' records): all policies, then each affinity-gate option, on the
# Mooncake conversation trace (several loads, and under memory pressure), the chat workload and
# shared-prefix preset A. Writes JSON into OUT_DIR (default eval-out/); then run
#   scripts/sim_tables.py sim OUT_DIR/<workload>/all.json
#   scripts/sim_tables.py gate OUT_DIR/<workload>/all.json OUT_DIR/<workload>/*variant*.json
# Build first: cargo build --release. Takes ~15 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-eval-out}
bin=${BIN:-./target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
declare -A workloads=(
  [mooncake]="--trace $trace --pods 8 --sweep rate-scale=0.55,1,2,4,6"
  [mooncake-kv6000]="--trace $trace --pods 8 --kv-blocks 6000 --sweep rate-scale=1"
  [chat]="--workload chat --pods 8 --sweep rate-scale=1,4,8"
  [shared-prefix-a]="--workload shared-prefix --preset A --max-requests 6000 --pods 8 --sweep rate-scale=1,2,4"
)
for name in mooncake mooncake-kv6000 chat shared-prefix-a; do
  mkdir -p "$out/$name"
  # shellcheck disable=SC2086
  $bin sim ${workloads[$name]} --policy all --seed 1,2,3 --quiet --json "$out/$name/all.json" > "$out/$name/all.txt"
  BIN=$bin scripts/gate_options.sh "$out/$name/variants" "${workloads[$name]}"
  echo "$name done"
done
