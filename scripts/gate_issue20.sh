#!/usr/bin/env bash
# Issue 20 (docs/decisions/relative-gate-queue-rule.md, balance-window.md, shared-prefix-epsilon.md;
# the peers table in affinity-gate.md): the gate's admission-aware load gate, balance window and
# exploration rate against the peers on shared-prefix A, chat and the Mooncake trace.
#
# Usage: scripts/gate_issue20.sh OUT_DIR   (release build of `kvgate` first; KVGATE=path overrides)
# Then:  scripts/sim_tables.py peer-ratio OUT_DIR/W/all.json OUT_DIR/W/*-*.json   for W in sp chat mc
set -euo pipefail
out=${1:?usage: $0 OUT_DIR}
kvgate=${KVGATE:-target/release/kvgate}
trace=${TRACE:-../shared/traces/mooncake_fast25_conversation_trace.jsonl}
seeds=${SEEDS:-1,2,3}
mkdir -p "$out"/{sp,chat,mc}

# Relative to the default profile (which has relative_gate_queue_rule = every since issue 20).
declare -A variants=(
  [queue-off]='{"relative_gate_queue_rule":"off"}'
  [queue-target]='{"relative_gate_queue_rule":"target"}'
  [balance-4ms]='{"balance_window_ms":4}'
  [balance-2ms]='{"balance_window_ms":2}'
  [balance-rel-0.3]='{"balance_window_rel":0.3}'
  [eps-0.1]='{"epsilon_explore_sticky":0.1}'
  [balance-4ms-eps-0.1]='{"balance_window_ms":4,"epsilon_explore_sticky":0.1}'
  [shared-eps-0.1]='{"shared_prefix_epsilon":0.1}'
  [shared-eps-0.2]='{"shared_prefix_epsilon":0.2}'
  [shared-eps-0.1-n32]='{"shared_prefix_epsilon":0.1,"shared_prefix_min_requests":32}'
  [default-new]='{}'
  [exr-0]='{"explore_max_extra_rel":0}'
  [pcp-off]='{"predict_computed_prefix":false}'
  [lbp-off]='{"load_break_pays_prefill":false}'
  [ms32]='{"predictor_min_samples":32}'
  [ttft-end]='{"predictor_ttft_at_first_token":false}'
)
# Which variants each workload runs (the Mooncake runs are the slow ones).
# VARIANTS="a b" runs only those on shared-prefix A and chat, MC_VARIANTS on the trace;
# PEERS=0 skips the peers' runs.
sp_v=${VARIANTS:-"queue-off balance-4ms balance-rel-0.3 eps-0.1 balance-4ms-eps-0.1 shared-eps-0.1 shared-eps-0.2 shared-eps-0.1-n32"}
chat_v=${VARIANTS:-"queue-off balance-4ms balance-rel-0.3 eps-0.1 shared-eps-0.1 shared-eps-0.2 shared-eps-0.1-n32"}
mc_v=${MC_VARIANTS:-"queue-off queue-target balance-4ms shared-eps-0.1"}

run() { # dir, workload args..., then policy/config args
  "$kvgate" sim "$@" --seed "$seeds" --quiet
}
sp=(--workload shared-prefix --preset A --max-requests 6000 --pods 8 --sweep rate-scale=1,2,4)
chat=(--workload chat --pods 8 --sweep rate-scale=1,4,8)
# `prefix` (one pod gets the whole trace: hours of model time, slow to simulate) and `random`
# are left out on the trace; neither is ever the best peer there (docs/decisions/affinity-gate.md).
mc=(--trace "$trace" --pods 8 --sweep rate-scale=1,4,6)
mc_peers=round-robin,least-request,least-kv,weighted,sglang-cache-aware,dynamo-kv,llmd-chain,latency,affinity-gate

if [ "${PEERS:-1}" != 0 ]; then
  run "${sp[@]}" --policy all --json "$out/sp/all.json"
  run "${chat[@]}" --policy all --json "$out/chat/all.json"
  run "${mc[@]}" --policy "$mc_peers" --json "$out/mc/all.json"
fi
for w in sp chat mc; do
  list=${w}_v
  for v in ${!list}; do
    args=${w}[@]
    run "${!args}" --policy affinity-gate --router-config "${variants[$v]}" --json "$out/$w/$v.json"
  done
done
