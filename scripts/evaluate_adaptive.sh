#!/usr/bin/env bash
# Produces the SLO goodput tables (docs/decisions/slo-routing.md): the affinity gate (default
# profile) with and without SLO routing. (Its part against "auto" τ / ε went with the "auto"
# values on 2026-12-07: docs/decisions/tau-epsilon-auto.md.) Writes JSON into OUT_DIR (default eval-adaptive/); then
#   scripts/sim_tables.py variant OUT_DIR/slo/<workload>/no-slo-routing.json OUT_DIR/slo/<workload>/slo-routing.json
# Build first: cargo build --release -p kvgate. SEEDS (default 1) and THREADS (default 2) apply.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-eval-adaptive}
bin=${BIN:-./target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
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
