#!/usr/bin/env bash
# Runs the affinity gate with each option of issue 12 alone (on top of the seed's gate), and the
# default profile, on one workload at the given rate scales and seeds; one JSON per variant.
# (The explore-least-loaded and explore-if-no-sticky variants measured explore modes removed on
# 2026-12-07, docs/decisions/explore-modes-removed.md; they are no longer run.)
# Usage: scripts/gate_options.sh OUT_DIR "sim args..." (e.g. "--trace T --pods 8 --sweep rate-scale=0.55,1,2,4")
set -euo pipefail
out=$1; shift
args=$1
mkdir -p "$out"
bin=${BIN:-./target/release/kvgate}
seed='"gate_profile":"seed"'
declare -A variants=(
  [seed]="{$seed}"
  [explore-random]="{$seed,\"explore_mode\":\"random-non-sticky\"}"
  [explore-bounded-25]="{$seed,\"explore_mode\":\"random-non-sticky\",\"explore_max_extra_ms\":25}"
  [cold-spread-20]="{$seed,\"cold_spread_window_ms\":20}"
  [relative-1.5x-100ms]="{$seed,\"affinity_relative_penalty\":1.5,\"affinity_relative_slack_ms\":100}"
  [relative-1.25x-5ms]="{$seed,\"affinity_relative_penalty\":1.25,\"affinity_relative_slack_ms\":5}"
  [default]='{"gate_profile":"default"}'
)
for name in "${!variants[@]}"; do
  # shellcheck disable=SC2086
  $bin sim $args --policy affinity-gate --seed 1,2,3 --quiet --router-config "${variants[$name]}" \
    --json "$out/$name.json" > "$out/$name.txt"
done
# The predictor's KV-shortfall feature, ablated under the default gate.
# shellcheck disable=SC2086
$bin sim $args --policy affinity-gate --seed 1,2,3 --quiet --no-kv-shortfall \
  --json "$out/default-no-kv-shortfall.json" > "$out/default-no-kv-shortfall.txt"
# The same ablation for the `latency` policy, which uses the predictor alone.
# shellcheck disable=SC2086
$bin sim $args --policy latency --seed 1 --quiet --no-kv-shortfall \
  --json "$out/latency-no-kv-shortfall.json" > "$out/latency-no-kv-shortfall.txt"
