#!/usr/bin/env bash
# Produces the tables of EVALUATION.md §8 (SLO goodput) and §9 (adaptive τ and ε): the
# affinity gate (default profile) with and without SLO routing, and with fixed vs "auto" τ / ε,
# on every workload the simulator has. Writes JSON into OUT_DIR (default eval-adaptive/); then
#   scripts/variant_table.py OUT_DIR/slo/<workload>/no-slo-routing.json OUT_DIR/slo/<workload>/slo-routing.json
#   scripts/variant_table.py OUT_DIR/adaptive/<workload>/default.json OUT_DIR/adaptive/<workload>/{tau-auto,epsilon-auto,both-auto}.json
# Build first: cargo build --release -p kvgate. SEEDS (default 1) and THREADS (default 2) apply.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-eval-adaptive}
bin=${BIN:-./target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
azure=${AZURE:-../shared/traces/azure_llm_2023_conv.csv}
seeds=${SEEDS:-1}
threads=${THREADS:-2}
run() { # out.json args...
  local json=$1; shift
  # shellcheck disable=SC2068
  $bin sim $@ --policy affinity-gate --seed "$seeds" --threads "$threads" --quiet --json "$json" > "${json%.json}.txt"
}

# SLO goodput: every request carries the SLOs; routed with them, or measured only.
declare -A slo_workloads=(
  [mooncake]="--trace $trace --pods 8 --sweep rate-scale=2,4,5 --slo-ttft-ms ${MOONCAKE_TTFT_SLO:-500} --slo-tpot-ms ${MOONCAKE_TPOT_SLO:-30}"
  [chat]="--workload chat --pods 8 --sweep rate-scale=4,8 --slo-ttft-ms ${CHAT_TTFT_SLO:-25} --slo-tpot-ms ${CHAT_TPOT_SLO:-30}"
)
for name in mooncake chat; do
  mkdir -p "$out/slo/$name"
  run "$out/slo/$name/no-slo-routing.json" ${slo_workloads[$name]}
  run "$out/slo/$name/slo-routing.json" ${slo_workloads[$name]} --slo-routing
  echo "slo $name done"
done

# Adaptive τ / ε against the fixed defaults.
declare -A workloads=(
  [mooncake]="--trace $trace --pods 8 --sweep rate-scale=${MOONCAKE_RATES:-4}"
  [chat]="--workload chat --pods 8 --sweep rate-scale=${CHAT_RATES:-4}"
  [shared-prefix-a]="--workload shared-prefix --preset A --max-requests 6000 --pods 8 --sweep rate-scale=${SP_RATES:-2}"
  [shared-prefix-b]="--workload shared-prefix --preset B --max-requests 6000 --pods 8 --sweep rate-scale=${SP_RATES:-2}"
  [shared-prefix-c]="--workload shared-prefix --preset C --pods 8 --sweep rate-scale=${SP_RATES:-2}"
  [shared-prefix-d]="--workload shared-prefix --preset D --pods 8 --sweep rate-scale=${SP_RATES:-2}"
  [azure-conv]="--trace $azure --pods 8 --max-requests 10000 --sweep rate-scale=1"
)
declare -A variants=(
  [default]='{}'
  [tau-auto]='{"affinity_gate_tau":"auto"}'
  [epsilon-auto]='{"epsilon_explore_sticky":"auto"}'
  [both-auto]='{"affinity_gate_tau":"auto","epsilon_explore_sticky":"auto"}'
)
for name in ${WORKLOADS:-mooncake chat shared-prefix-a shared-prefix-b shared-prefix-c shared-prefix-d azure-conv}; do
  mkdir -p "$out/adaptive/$name"
  for v in default tau-auto epsilon-auto both-auto; do
    run "$out/adaptive/$name/$v.json" ${workloads[$name]} --router-config "${variants[$v]}"
  done
  echo "adaptive $name done"
done
