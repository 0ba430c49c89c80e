#!/usr/bin/env bash
# Produces the predictor tables (docs/decisions/predictor-model-rls.md, predictor-class-aware.md):
# `affinity-gate` driven by the predictor (rls; the gbdt, gbdt-p90 and analytic models were
# removed on 2026-12-07, docs/decisions/predictor-tree-and-analytic-models.md) on the
# Mooncake conversation trace and the chat workload at four loads, against every baseline policy
# (only `latency` among them uses a predictor); then the mixed pool (4 H100 + 4 A100) with
# class-aware and class-blind prediction. Writes JSON into OUT_DIR (default
# predictor-out/) and prints the tables (scripts/sim_tables.py predictor).
# WORKLOADS (default "mooncake chat mixed") picks workloads; BASELINES (default: every baseline)
# the baseline policies, comma-separated; SEEDS (default 1) the seeds.
# Build first: cargo build --release -p kvgate. Mooncake alone takes ~15 min on 2 loaded cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-predictor-out}
bin=${BIN:-./target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
seeds=${SEEDS:-1}
baselines=${BASELINES:-round-robin,random,least-request,least-kv,prefix,weighted,sglang-cache-aware,dynamo-kv,latency}
declare -A workloads=(
  [mooncake]="--trace $trace --pods 8 --sweep rate-scale=0.3,0.55,1,2"
  [chat]="--workload chat --pods 8 --sweep rate-scale=1,2,5,10"
  [mixed]="--trace $trace --pod-profiles llama3-8b-h100:4,llama3-8b-a100:4 --sweep rate-scale=0.4,0.7"
)
for name in ${WORKLOADS:-mooncake chat mixed}; do
  mkdir -p "$out/$name"
  # shellcheck disable=SC2086
  $bin sim ${workloads[$name]} --policy $baselines --seed "$seeds" --quiet --json "$out/$name/baselines.json" > /dev/null
  # shellcheck disable=SC2086
  $bin sim ${workloads[$name]} --policy affinity-gate --seed "$seeds" --quiet \
    --json "$out/$name/rls.json" > /dev/null
  if [ "$name" = mixed ]; then
    # shellcheck disable=SC2086
    $bin sim ${workloads[$name]} --policy affinity-gate --class-blind-predictor \
      --seed "$seeds" --quiet --json "$out/$name/rls-blind.json" > /dev/null
  fi
  echo "### $name"
  echo
  if [ "$name" = mixed ]; then
    scripts/sim_tables.py predictor "$out/$name/baselines.json" \
      "rls=$out/$name/rls.json" "rls class-blind=$out/$name/rls-blind.json"
  else
    scripts/sim_tables.py predictor "$out/$name/baselines.json" "$out/$name/rls.json"
  fi
done
