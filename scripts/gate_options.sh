#!/usr/bin/env bash
# Runs the affinity gate with each option of issue 12 alone and combined, on one workload, at the
# given rate scales and seeds; writes one JSON per variant into OUT_DIR.
# Usage: scripts/gate_options.sh OUT_DIR "sim args..." (e.g. "--trace T --pods 8 --sweep rate-scale=0.55,1,2,4")
set -euo pipefail
out=$1; shift
args=$1
mkdir -p "$out"
bin=${BIN:-./target/release/kvgate}
declare -A variants=(
  [seed]='{"gate_profile":"seed"}'
  [explore-random]='{"gate_profile":"seed","explore_mode":"random-non-sticky"}'
  [explore-least-loaded]='{"gate_profile":"seed","explore_mode":"least-loaded-non-sticky"}'
  [cold-spread-20]='{"gate_profile":"seed","cold_spread_window_ms":20}'
  [relative-gate]='{"gate_profile":"seed","affinity_relative_penalty":1.5,"affinity_relative_slack_ms":100}'
  [default]='{"gate_profile":"default"}'
)
for name in "${!variants[@]}"; do
  # shellcheck disable=SC2086
  $bin sim $args --policy affinity-gate --seed 1,2,3 --quiet --router-config "${variants[$name]}" \
    --json "$out/$name.json" > "$out/$name.txt"
  echo "$name done"
done
