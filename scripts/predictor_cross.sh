#!/usr/bin/env bash
# Cross-workload predictor evaluation (docs/decisions/predictor-rls-variants.md): `kvgate sim --policy affinity-gate`
# on the fit workload (chat: where the predictor's parameters were chosen) and on the held-out
# ones (Mooncake conversation trace at rates 1/2/4, shared-prefix presets A–D, the mixed 4 H100
# + 4 A100 pool), SEEDS seeds each; then prints one table (scripts/sim_tables.py predictor-cross):
# TTFT MAPE and the predictor's own p90 coverage per workload and rate, and a summary against
# the aims of issue 20. (Its rls-rel / rls-split / rls-split-rel columns measured variants
# removed on 2026-12-07.)
# Request caps (shared-prefix 3000/2000/2000/1000 for A/B/C/D; the trace's first TRACE_REQUESTS,
# default 4000; chat CHAT_REQUESTS, default 3000) were sized for 3 seeds × 4 models within ~20
# min on the shared 2-core VM.
# SEEDS (default 1,2,3), WORKLOADS
# (default: all below), OUT_DIR as $1 (default predictor-cross-out/), BIN (default
# ./target/release/kvgate), SIM_ARGS (extra `kvgate sim` options for every run, e.g.
# "--learn-ttft-at-first-token --predictor-min-samples 8", docs/decisions/predictor-ttft-at-first-token.md). Build first: cargo build
# --release -p kvgate.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-predictor-cross-out}
bin=${BIN:-./target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
seeds=${SEEDS:-1,2,3}
models=rls
declare -A workloads=(
  [chat]="--workload chat --pods 8 --max-requests ${CHAT_REQUESTS:-3000} --sweep rate-scale=2,10"
  [mooncake]="--trace $trace --pods 8 --max-requests ${TRACE_REQUESTS:-4000} --sweep rate-scale=1,2,4"
  [sp-A]="--workload shared-prefix --preset A --max-requests 3000 --pods 8 --sweep rate-scale=1,4"
  [sp-B]="--workload shared-prefix --preset B --max-requests 2000 --pods 8 --sweep rate-scale=1"
  [sp-C]="--workload shared-prefix --preset C --max-requests 2000 --pods 8 --sweep rate-scale=0.5"
  [sp-D]="--workload shared-prefix --preset D --max-requests 1000 --pods 8 --sweep rate-scale=0.25"
  [mixed]="--trace $trace --pod-profiles llama3-8b-h100:4,llama3-8b-a100:4 --max-requests ${TRACE_REQUESTS:-4000} --sweep rate-scale=0.4,0.7"
)
names=${WORKLOADS:-chat mooncake sp-A sp-B sp-C sp-D mixed}
for name in $names; do
  mkdir -p "$out/$name"
  # shellcheck disable=SC2086
  $bin sim ${workloads[$name]} --policy affinity-gate \
    --seed "$seeds" ${SIM_ARGS:-} --quiet --json "$out/$name/$models.json" > /dev/null
done
args=()
for name in $names; do
  for model in $models; do args+=("$name:$model=$out/$name/$model.json"); done
done
scripts/sim_tables.py predictor-cross --fit chat "${args[@]}"
