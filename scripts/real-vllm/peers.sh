#!/usr/bin/env bash
# kvgate and the peer routers side by side on two real vLLM CPU pods: interleaved rounds, kept
# raw, resumable, on a machine checked to be quiet; then the table with bootstrap intervals.
#   scripts/real-vllm/peers.sh [OUT_DIR]          (default $OUT_DIR, else /var/tmp/kvgate-peers)
#
# Env:
#   WORKLOAD   mooncake (default) | chat | shared-prefix | agent | burst, or a comma list of them:
#              mooncake: the first REQUESTS requests of the Mooncake conversation trace whose text
#              prompt fits the pods (max_model_len 4096); the others: `kvgate loadgen --workload W`
#              (--workload-seed WORKLOAD_SEED, 1, or `round`: round k replays seed k, so the rounds
#              sample placements of several workloads, not one workload's noise; --max-requests
#              REQUESTS; chat and agent:
#              --max-context-tokens MAX_CONTEXT_TOKENS, 1700 planned tokens ≈ 2,900 text tokens;
#              shared-prefix: --preset PRESET, A: B–D do not fit 4096 tokens as text; agent:
#              AGENT_COMPACT_EVERY N > 0 compacts each session's history every N steps and
#              sends each request's session in `x-session-id`). Every round replays the same
#              requests (every router of a round the same ones with WORKLOAD_SEED=round).
#   ROUNDS     5 (RUNS is read too): rounds 1..ROUNDS; each round runs every router once per
#              workload, in an order rotated by the round. Raise it in a later sitting to add rounds.
#   REQUESTS   100; RATE_SCALE 1.0 (arrivals × F). Per workload: REQUESTS_CHAT, RATE_SCALE_AGENT,
#              RATE_SCALE_SHARED_PREFIX, … override them.
#   ROUTERS    comma list (default: all below; with PODS=mock kvgate-routed,round-robin).
#   LAYOUT     uni-pin (default) | mp: the real pods' process layout. uni-pin: vLLM's in-process
#              `uni` executor (VLLM_ENABLE_V1_MULTIPROCESSING=0) and each pod held on its core
#              (taskset): two pods then serve as two machines (scripts/real-vllm/layout.sh: each
#              pod's throughput with both busy 0.95 of its own alone, against 0.59-0.64 with
#              vLLM's default `mp`, whose engine busy-waits on a second core). Recorded in
#              params.json: sittings of one layout only are merged.
#   NPODS      2 (default) | 1: one pod (b0 on core 0, the other core left to its API process, the
#              router and loadgen; every policy then routes the same way: issue 42's one-pod check).
#              kvgate-engine and vllm-kv need 2. Recorded in params.json.
#   TOKEN_PROMPTS  0 (default) | 1: loadgen sends each prompt as token ids (--token-prompts), so
#              the pods see exactly the lengths and the sharing that `kvgate sim` replays from the
#              same workload (sim_check.py). Text-matching peer routers then see token ids as text.
#              Recorded in params.json.
#   CALIBRATE  0 (default) | 1: at the first sitting, before any run, `kvgate calibrate --probe`
#              fits the simulator's profile on pod b0 (b1 idle) into OUT_DIR/profile.json
#              (its report: OUT_DIR/calibrate.txt); kept for later sittings. sim_check.py reads it.
#   TOKENS_DETAILS  0 (default) | 1: vLLM pods started with --enable-prompt-tokens-details, so
#              the capture records each request's cached tokens (calibrate --from-capture).
#   PODS       vllm (default) | mock: `kvgate mock-pod` pods (the tiny model's profile,
#              MOCK_TIME_SCALE 1), restarted before every run: a dry run of the harness, not a
#              measurement (no kvgate-engine, no vllm-kv).
#   QUIET_PCT  5: the most % of one CPU a process outside the harness may use (quiet.py); `off`
#              skips the checks. Before each run the machine is sampled for QUIET_SECONDS (5); when
#              it is not quiet, QUIET_TRIES (10) more tries QUIET_WAIT_S (30) apart, then the run
#              is skipped (a later sitting runs it). During the run quiet.py watches (every 2 s);
#              a violation marks the run "disturbed" in its record (the table leaves its pair out).
#   KVGATE_BIN, KVGATE_PYTHON (zmq_forward.py's Python, with pyzmq: default .venv/bin/python;
#   .venv-vllm/bin/python has it too), KVGATE_VLLM_RUN, KVGATE_BENCH_PORT (the
#   pods: PORT, PORT + 1; replay PORT + 50, + 51), KVGATE_BENCH_GW_PORT (the router: 18280, + 10…21).
#
# Resumable: each run (workload, round, router) writes OUT_DIR/<workload>/round-<k>/<router>.*:
#   .json           kvgate loadgen --json (the report)
#   .requests.jsonl kvgate loadgen --requests-jsonl (one record per request: the raw data)
#   .pods-before.json, .pods-after.json  the pods' prefix-cache counters around the run
#   .quiet.json     quiet.py's watch of the run; .quiet-pre.txt the check before it
#   .router.log, .loadgen.log
#   .decisions.jsonl (kvgate routers) kvgate serve --decisions-log: every decision with each pod's
#                   prediction and load, and the TTFT observed (scripts/real-vllm/decisions_table.py)
#   .capture.jsonl  (kvgate routers) kvgate serve --capture: one Mooncake line per request with its
#                   timing keys, the input of `kvgate calibrate --from-capture` (issue 42)
#   .meta.json      written last: the run is complete (a rerun skips it). Its sitting, order in
#                   the round, times, disturbed or not, the hit rate.
# OUT_DIR/<workload>/params.json holds the workload's parameters: a rerun with other parameters
# is refused (use another OUT_DIR). OUT_DIR/sittings/<time>/{machine,kvgate}.txt: each sitting's
# CPU, pods' dtype and measured speed (speed.py), and kvgate binary. Interrupt it at any time;
# rerun the same command to go on. The tables (scripts/real-vllm/peers_table.py OUT_DIR, at any
# time) are computed from the raw records of every complete run of every sitting.
#
# Routers (each started fresh per run, in front of the same two pods; the pods' prefix caches
# are reset before every run, so each starts cold):
#   kvgate-routed   kvgate serve (affinity-gate, routed index: what kvgate itself sent where)
#   kvgate-base     kvgate-routed's command with the binary $KVGATE_BASE_BIN: a change measured
#                   against the binary before it, side by side in the same rounds; with
#                   KVGATE_BASE_CONFIG=FILE also `--config FILE` (a setting measured against the
#                   default: KVGATE_BASE_BIN may be the same binary)
#   kvgate-engine   kvgate serve --index engine (the pods' KV events + the model's tokenizer)
#   kvgate-engine-base  kvgate-engine's command with $KVGATE_BASE_BIN and, with
#                   KVGATE_BASE_CONFIG, `--config FILE` (as kvgate-base for the routed index)
#   sglang-cache    sglang-router 0.3.2 --policy cache_aware
#   vllm-cache      vllm-router 0.1.17 --policy cache_aware
#   vllm-kv         vllm-router 0.1.17 --policy kv_aware, fed by the pods' KV events (ZMQ; it takes
#                   only tcp:// endpoints, so zmq_forward.py republishes each pod's ipc stream on
#                   127.0.0.1)
#   round-robin     kvgate serve --policy round-robin
#   latency, least-request, sglang-cache-aware
#                   kvgate serve --policy NAME: kvgate's other policies (sglang-cache-aware is
#                   kvgate's model of sglang-router's rule), issue 42's five with affinity-gate
#                   (kvgate-routed) and round-robin, each of which `kvgate sim` runs too
#   llmd-chain      kvgate serve --policy llmd-chain (llm-d's current scorer pipeline, as kvgate
#                   models it: crates/kvgate-core/src/policy/llmd_chain.rs)
# Pods b0 and b1 (scripts/real-vllm/pod.sh): 128-token blocks, 1 GiB of KV, `--enable-scale-out`
# (vllm-router asks /v1/completions/render for token ids), cores 0 and 1; started here and
# stopped at the end. `kvgate loadgen --stream` sends the prompts as text (the synthetic words of
# crates/kvgate-loadgen/src/prompt.rs: ~1.66 tokens per word with the tiny model's tokenizer),
# so text-matching routers see the sharing as users' prompts show it. The hit rate is the pods'
# own (Σ prefix_cache_hits / Σ queries over the run).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
out=${1:-${OUT_DIR:-/var/tmp/kvgate-peers}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
workloads=${WORKLOAD:-mooncake}
rounds=${ROUNDS:-${RUNS:-5}}
pods_kind=${PODS:-vllm}
case "$pods_kind" in
  vllm) default_routers=kvgate-routed,kvgate-engine,sglang-cache,vllm-cache,vllm-kv,round-robin ;;
  mock) default_routers=kvgate-routed,round-robin ;;
  *) echo "PODS must be vllm or mock, not $pods_kind" >&2; exit 2 ;;
esac
routers=${ROUTERS:-$default_routers}
npods=${NPODS:-2}
case "$npods" in 1|2) ;; *) echo "NPODS must be 1 or 2, not $npods" >&2; exit 2 ;; esac
token_prompts=${TOKEN_PROMPTS:-0}
layout=${LAYOUT:-uni-pin}
case "$layout" in
  uni-pin) layout_env=(VLLM_ENABLE_V1_MULTIPROCESSING=0 KVGATE_VLLM_PIN=1)
           layout_args=(--distributed-executor-backend uni) ;;
  mp) layout_env=() layout_args=() ;;
  *) echo "LAYOUT must be uni-pin or mp, not $layout" >&2; exit 2 ;;
esac
# The pods report each request's cached tokens (usage.prompt_tokens_details), which kvgate's
# capture then records: the input `kvgate calibrate --from-capture` needs for prefills.
[ "${TOKENS_DETAILS:-0}" = 1 ] && layout_args+=(--enable-prompt-tokens-details)
quiet_pct=${QUIET_PCT:-5} quiet_s=${QUIET_SECONDS:-5}
quiet_tries=${QUIET_TRIES:-10} quiet_wait=${QUIET_WAIT_S:-30}
kvgate=${KVGATE_BIN:-$root/target/release/kvgate}
py=${KVGATE_PYTHON:-$root/.venv/bin/python}
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
mkdir -p "$run"
model="$run/tiny-model"
bench="$root/.venv-bench"
port=${KVGATE_BENCH_PORT:-18200}
gw=${KVGATE_BENCH_GW_PORT:-18280}
here=scripts/real-vllm
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ROUNDS must be a positive integer" >&2; exit 2; }
[ "$rounds" -ge 5 ] || echo "note: ROUNDS=$rounds; the table wants at least 5 rounds (a later sitting can add them)"

IFS=, read -ra wl <<< "$workloads"
IFS=, read -ra list <<< "$routers"
for w in "${wl[@]}"; do
  case "$w" in mooncake|chat|shared-prefix|agent|burst) ;; *) echo "unknown WORKLOAD $w (mooncake|chat|shared-prefix|agent|burst)" >&2; exit 2 ;; esac
done
for name in "${list[@]}"; do
  case "$name" in
    kvgate-routed|round-robin|llmd-chain|latency|least-request|sglang-cache-aware|sglang-cache|vllm-cache) ;;
    kvgate-base) [ -x "${KVGATE_BASE_BIN:-}" ] || { echo "router kvgate-base needs KVGATE_BASE_BIN (an executable kvgate)" >&2; exit 2; } ;;
    kvgate-engine|vllm-kv)
      [ "$pods_kind" = vllm ] || { echo "router $name needs real vLLM pods (PODS=vllm)" >&2; exit 2; }
      [ "$npods" = 2 ] || { echo "router $name needs NPODS=2" >&2; exit 2; } ;;
    kvgate-engine-base)
      [ "$pods_kind" = vllm ] || { echo "router $name needs real vLLM pods (PODS=vllm)" >&2; exit 2; }
      [ -x "${KVGATE_BASE_BIN:-}" ] || { echo "router $name needs KVGATE_BASE_BIN (an executable kvgate)" >&2; exit 2; } ;;
    *) echo "unknown router $name" >&2; exit 2 ;;
  esac
done

# A setting for workload W: NAME_W (upper case, - as _), else NAME, else the default.
wopt() { # NAME WORKLOAD DEFAULT
  local v="$1_$(tr 'a-z-' 'A-Z_' <<< "$2")"
  if [ -n "${!v:-}" ]; then echo "${!v}"; elif [ -n "${!1:-}" ]; then echo "${!1}"; else echo "$3"; fi
}

# The workload's loadgen arguments; its parameters recorded (or checked) in params.json.
declare -A wargs
for w in "${wl[@]}"; do
  mkdir -p "$out/$w"
  n=$(wopt REQUESTS "$w" 100) rate=$(wopt RATE_SCALE "$w" 1.0)
  params=(workload="$w" requests="$n" rate_scale="$rate" pods="$pods_kind")
  # Older sittings recorded neither key: they are only written when not the default.
  [ "$npods" = 2 ] || params+=(npods="$npods")
  [ "$token_prompts" = 0 ] || params+=(token_prompts="$token_prompts")
  [ "$pods_kind" = vllm ] && params+=(layout="$layout")
  case "$w" in
    mooncake)
      trace=${MOONCAKE_TRACE:-$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl}
      [ -f "$out/$w/slice.jsonl" ] || python3 $here/peers_run.py slice "$trace" "$out/$w/slice.jsonl" "$n"
      params+=(trace="$(basename "$trace")")
      wargs[$w]="--trace $out/$w/slice.jsonl"
      ;;
    burst)
      seed=$(wopt WORKLOAD_SEED "$w" 1)
      params+=(workload_seed="$seed")
      wargs[$w]="--workload burst --workload-seed $seed --max-requests $n"
      ;;
    shared-prefix)
      preset=$(wopt PRESET "$w" A) seed=$(wopt WORKLOAD_SEED "$w" 1)
      params+=(preset="$preset" workload_seed="$seed")
      wargs[$w]="--workload shared-prefix --preset $preset --workload-seed $seed --max-requests $n"
      ;;
    chat|agent)
      seed=$(wopt WORKLOAD_SEED "$w" 1) ctx=$(wopt MAX_CONTEXT_TOKENS "$w" 1700)
      params+=(workload_seed="$seed" max_context_tokens="$ctx")
      wargs[$w]="--workload $w --workload-seed $seed --max-requests $n --max-context-tokens $ctx"
      compact=$(wopt AGENT_COMPACT_EVERY "$w" 0)
      if [ "$w" = agent ] && [ "$compact" != 0 ]; then
        # Compacted sessions, each request naming its session (issue 43's session affinity).
        params+=(agent_compact_every="$compact")
        wargs[$w]+=" --agent-compact-every $compact --session-header x-session-id"
      fi
      ;;
  esac
  wargs[$w]+=" --rate-scale $rate"
  [ "$token_prompts" = 0 ] || wargs[$w]+=" --token-prompts"
  if ! python3 $here/peers_run.py params "$out/$w/params.json" "${params[@]}"; then
    echo "!! $out/$w was measured with other parameters (above): its rounds cannot be merged" \
      "with these. Use another OUT_DIR, or the same settings." >&2
    exit 2
  fi
done

order_of() { # ROUND: the routers in this round's order (rotated, so no router is always first)
  local off=$(((${1} - 1) % ${#list[@]}))
  echo "${list[@]:$off}" "${list[@]:0:$off}"
}
todo=0
for ((k = 1; k <= rounds; k++)); do
  for w in "${wl[@]}"; do
    for name in $(order_of $k); do
      [ -f "$out/$w/round-$k/$name.meta.json" ] || todo=$((todo + 1))
    done
  done
done

pid= fwd=() qpid= pod_pids=()
stop_router() {
  [ -n "$pid" ] && { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; } || true
  for f in "${fwd[@]}"; do kill "$f" 2>/dev/null || true; done
  pid= fwd=()
}
stop_watch() {
  [ -n "$qpid" ] && { kill -TERM "$qpid" 2>/dev/null; wait "$qpid" 2>/dev/null; } || true
  qpid=
}
start_pods() {
  pod_pids=()
  if [ "$pods_kind" = mock ]; then
    local i
    for ((i = 0; i < npods; i++)); do
      setsid "$kvgate" mock-pod --listen "127.0.0.1:$((port + i))" --model tiny --block-size 128 \
        --profile "${MOCK_PROFILE:-$here/tiny-llama-cpu-profile.json}" --max-model-len 4096 \
        --enable-scale-out --time-scale "${MOCK_TIME_SCALE:-1}" > "$run/mock-b$i.log" 2>&1 < /dev/null &
      pod_pids+=($!)
    done
    for ((i = 0; i < npods; i++)); do
      for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$((port + i))/health" > /dev/null && continue 2
        sleep 0.1
      done
      echo "!! mock pod $i did not start ($run/mock-b$i.log)" >&2; return 1
    done
  else
    $here/pod.sh stop b0 || true
    $here/pod.sh stop b1 || true
    env "${layout_env[@]}" $here/pod.sh start b0 "$model" "$port" $((port + 50)) 0 --enable-scale-out "${layout_args[@]}" &
    local a=$!
    if [ "$npods" = 2 ]; then
      env "${layout_env[@]}" $here/pod.sh start b1 "$model" $((port + 1)) $((port + 51)) 1 --enable-scale-out "${layout_args[@]}" &
      wait $!
    fi
    wait $a
    pod_pids=("$(cat "$run/b0.pid")")
    [ "$npods" = 1 ] || pod_pids+=("$(cat "$run/b1.pid")")
  fi
}
stop_pods() {
  if [ "$pods_kind" = mock ]; then
    local p
    for p in "${pod_pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pod_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  else
    $here/pod.sh stop b0 || true
    $here/pod.sh stop b1 || true
  fi
  pod_pids=()
}
# Cold caches for the next run: real pods reset their prefix caches, mock pods restart.
fresh_pods() {
  if [ "$pods_kind" = mock ]; then
    stop_pods
    start_pods
  else
    for p in "${urls[@]}"; do curl -sf -X POST "$p/reset_prefix_cache" > /dev/null; done
    # vLLM publishes the reset's AllBlocksCleared only at its next engine step: one token of
    # work each, so an engine-mode router's replay does not bring back the last run's blocks.
    for p in "${urls[@]}"; do
      curl -sf "$p/v1/completions" -H 'content-type: application/json' \
        -d '{"model": "tiny", "prompt": "reset", "max_tokens": 1}' > /dev/null || true
    done
    sleep 1
  fi
}
cleanup() {
  stop_watch
  stop_router
  [ "$todo" -eq 0 ] || stop_pods
}
trap cleanup EXIT

p0="http://127.0.0.1:$port" p1="http://127.0.0.1:$((port + 1))"
urls=("$p0")
[ "$npods" = 1 ] || urls+=("$p1")
pod_flags=("${urls[@]/#/--pod=}") metric_flags=("${urls[@]/#/--pod-metrics=}")
if [ "$todo" -gt 0 ]; then
  echo "$todo run(s) to do in $out"
  needs_bench=0
  for name in "${list[@]}"; do
    case "$name" in sglang-cache|vllm-cache|vllm-kv) needs_bench=1 ;; esac
  done
  [ -x "$kvgate" ] || cargo build --release -p kvgate
  # vllm-kv's forwarders need pyzmq: refuse now rather than run it without the pods' events.
  if [[ ",$routers," == *",vllm-kv,"* ]] && ! "$py" -c 'import zmq' 2>/dev/null; then
    echo "router vllm-kv needs pyzmq in $py (KVGATE_PYTHON; scripts/test makes .venv)" >&2; exit 2
  fi
  if [ "$pods_kind" = vllm ]; then
    $here/install.sh
    [ -f "$model/config.json" ] || .venv-vllm/bin/python $here/make_model.py "$model" --layers 8 --hidden 512
  fi
  if [ "$needs_bench" = 1 ] && { [ ! -x "$bench/bin/vllm-router" ] || ! "$bench/bin/python" -c 'import sglang_router' 2>/dev/null; }; then
    python3 -m venv "$bench"
    "$bench/bin/pip" install -q --disable-pip-version-check sglang-router==0.3.2 vllm-router==0.1.17
  fi
  sitting=$(date -u +%Y%m%dT%H%M%SZ)
  sit="$out/sittings/$sitting"
  mkdir -p "$sit"
  start_pods
  # The machine and the pods' speed, printed beside the tables (a slow CPU overloads the pods
  # with the same workload: the figures are only comparable between machines of similar speed).
  cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs"
  if [ "$pods_kind" = mock ]; then
    echo "machine: $cpu; pods: 2 kvgate mock-pods (profile ${MOCK_PROFILE:-tiny-llama-cpu-profile.json}, time scale ${MOCK_TIME_SCALE:-1}), not real vLLM: a dry run" > "$sit/machine.txt"
  else
    .venv-vllm/bin/python $here/speed.py --summary --dtype "$(cat "$run/b0.dtype")" "${urls[@]}" \
      > "$sit/machine.txt" 2>&1 || echo "machine: $cpu (pod speed not measured)" > "$sit/machine.txt"
  fi
  sha=$(sha256sum "$kvgate" | cut -c1-16)
  {
    echo "kvgate: $("$kvgate" --version 2>/dev/null || echo '?'), binary sha256 $sha…, built $(date -u -r "$kvgate" +%FT%TZ)"
    echo "checkout: $(git rev-parse --short HEAD 2>/dev/null || echo '?') ($(git status --porcelain 2>/dev/null | wc -l) files changed)"
    if [ -n "${KVGATE_BASE_BIN:-}" ]; then
      echo "kvgate-base: $KVGATE_BASE_BIN, binary sha256 $(sha256sum "$KVGATE_BASE_BIN" | cut -c1-16)…, built $(date -u -r "$KVGATE_BASE_BIN" +%FT%TZ)"
      [ -z "${KVGATE_BASE_CONFIG:-}" ] || { echo "kvgate-base config ($KVGATE_BASE_CONFIG):"; sed "s/^/  /" "$KVGATE_BASE_CONFIG"; }
    fi
  } > "$sit/kvgate.txt"
  cp "$sit/machine.txt" "$out/machine.txt"
  cat "$sit/machine.txt" "$sit/kvgate.txt"
  for f in "$out"/sittings/*/kvgate.txt; do
    [ "$f" = "$sit/kvgate.txt" ] || grep -q "$sha" "$f" \
      || echo "!! the kvgate binary differs from sitting $(basename "$(dirname "$f")")'s: the table merges both"
  done
  if [ "${CALIBRATE:-0}" = 1 ] && [ ! -s "$out/profile.json" ]; then
    # The simulator's profile, fitted on pod b0 while nothing else runs (the CPU pods' step
    # budget and sequence limit are vLLM's CPU defaults; prompts up to the pods' longest).
    echo "calibrating the simulator's profile on $p0 (kvgate calibrate --probe)"
    "$kvgate" calibrate --probe "$p0" --profile-out "$out/profile.json.tmp" --name tiny-llama-cpu-calibrated \
      --max-prompt-tokens "${CALIBRATE_MAX_PROMPT:-3584}" --max-batch "${CALIBRATE_MAX_BATCH:-32}" \
      --max-num-batched-tokens 2048 --max-num-seqs 128 --max-seconds "${CALIBRATE_SECONDS:-180}" --observations-out "$out/calibrate-observations.jsonl" \
      2>&1 | tee "$out/calibrate.txt"
    mv "$out/profile.json.tmp" "$out/profile.json"
  fi
fi
ev0="ipc://$run/b0-events.ipc" ev1="ipc://$run/b1-events.ipc"
rp0="tcp://127.0.0.1:$((port + 50))" rp1="tcp://127.0.0.1:$((port + 51))"

start_router() { # name log
  local name=$1 log=$2
  local decisions="${log%.router.log}.decisions.jsonl" capture="${log%.router.log}.capture.jsonl"
  case "$name" in
    kvgate-routed|kvgate-base)
      local bin=$kvgate extra=()
      if [ "$name" = kvgate-base ]; then
        bin=$KVGATE_BASE_BIN
        [ -z "${KVGATE_BASE_CONFIG:-}" ] || extra=(--config "$KVGATE_BASE_CONFIG")
      fi
      "$bin" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy affinity-gate "${pod_flags[@]}" --decisions-log "$decisions" \
        --capture "$capture" "${extra[@]}" 2> "$log" &
      ;;
    kvgate-engine|kvgate-engine-base)
      local bin=$kvgate extra=()
      if [ "$name" = kvgate-engine-base ]; then
        bin=$KVGATE_BASE_BIN
        [ -z "${KVGATE_BASE_CONFIG:-}" ] || extra=(--config "$KVGATE_BASE_CONFIG")
      fi
      "$bin" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy affinity-gate --index engine --tokenizer "$model/tokenizer.json" \
        --pod "$p0,events=$ev0,replay=$rp0,model=tiny" \
        --pod "$p1,events=$ev1,replay=$rp1,model=tiny" --decisions-log "$decisions" \
        --capture "$capture" "${extra[@]}" 2> "$log" &
      ;;
    round-robin|llmd-chain|latency|least-request|sglang-cache-aware)
      "$kvgate" serve --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$((gw + 10))" \
        --policy "$name" "${pod_flags[@]}" --decisions-log "$decisions" \
        --capture "$capture" 2> "$log" &
      ;;
    sglang-cache)
      "$bench/bin/python" -m sglang_router.launch_router --host 127.0.0.1 --port "$gw" \
        --worker-urls "${urls[@]}" --policy cache_aware --prometheus-port $((gw + 11)) > "$log" 2>&1 &
      ;;
    vllm-cache)
      "$bench/bin/vllm-router" --host 127.0.0.1 --port "$gw" --worker-urls "${urls[@]}" \
        --policy cache_aware --prometheus-port $((gw + 12)) > "$log" 2>&1 &
      ;;
    vllm-kv)
      "$py" $here/zmq_forward.py "$ev0" "tcp://127.0.0.1:$((gw + 20))" & fwd+=($!)
      "$py" $here/zmq_forward.py "$ev1" "tcp://127.0.0.1:$((gw + 21))" & fwd+=($!)
      "$bench/bin/vllm-router" --host 127.0.0.1 --port "$gw" --worker-urls "$p0" "$p1" \
        --policy kv_aware --kv-event-source "$p0=tcp://127.0.0.1:$((gw + 20))" \
        --kv-event-source "$p1=tcp://127.0.0.1:$((gw + 21))" \
        --kv-event-replay-source "$p0=$rp0" --kv-event-replay-source "$p1=$rp1" \
        --kv-event-block-size 128 --kv-event-model tiny \
        --prometheus-port $((gw + 13)) > "$log" 2>&1 &
      ;;
  esac
  pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$gw/v1/models" > /dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "!! $name did not come up (see $log)"; stop_router; return 1
}

# The harness, for quiet.py: this script and its descendants (routers, loadgen, forwarders,
# quiet.py itself), and the pods' sessions (started with setsid, so no longer our descendants).
exclusions() {
  local p
  echo --pid $$
  for p in "${pod_pids[@]}"; do echo --session "$p" --pid "$p"; done
}

skipped=() failed=()
run_cell() { # WORKLOAD ROUND ROUTER POSITION
  local w=$1 k=$2 name=$3 position=$4
  local cell="$out/$w/round-$k/$name"
  mkdir -p "$out/$w/round-$k"
  rm -f "$cell".{json,requests.jsonl,decisions.jsonl,pods-before.json,pods-after.json,quiet.json,quiet-pre.txt}
  fresh_pods
  # shellcheck disable=SC2046
  if [ "$quiet_pct" != off ]; then
    local tries=0
    until python3 $here/quiet.py check --threshold "$quiet_pct" --seconds "$quiet_s" $(exclusions) \
        > "$cell.quiet-pre.txt"; do
      tries=$((tries + 1))
      if [ "$tries" -gt "$quiet_tries" ]; then
        echo "!! $w round $k $name skipped: the machine is not quiet (processes over $quiet_pct % of a CPU):"
        sed 's/^/     /' "$cell.quiet-pre.txt" | head -5
        skipped+=("$w/round-$k/$name")
        return 0
      fi
      echo "   not quiet: $(head -1 "$cell.quiet-pre.txt")$([ "$(wc -l < "$cell.quiet-pre.txt")" -gt 1 ] && echo ' …'); try $tries of $quiet_tries in ${quiet_wait} s"
      sleep "$quiet_wait"
    done
  fi
  start_router "$name" "$cell.router.log" || { failed+=("$w/round-$k/$name"); return 0; }
  python3 $here/peers_run.py counters "$cell.pods-before.json" "${urls[@]}"
  if [ "$quiet_pct" != off ]; then
    # shellcheck disable=SC2046
    python3 $here/quiet.py watch --threshold "$quiet_pct" --interval 2 --out "$cell.quiet.json" \
      $(exclusions) & qpid=$!
  fi
  local started rc=0
  started=$(date +%s.%3N)
  # shellcheck disable=SC2086
  "$kvgate" loadgen --target "http://127.0.0.1:$gw" ${wargs[$w]//--workload-seed round/--workload-seed $k} \
    --stream --model tiny --max-concurrency 256 --timeout-s 600 --quiet \
    "${metric_flags[@]}" --json "$cell.json" --requests-jsonl "$cell.requests.jsonl" \
    > "$cell.loadgen.log" 2>&1 || rc=$?
  local ended
  ended=$(date +%s.%3N)
  stop_watch
  python3 $here/peers_run.py counters "$cell.pods-after.json" "${urls[@]}"
  stop_router
  if [ "$rc" -ne 0 ] || [ ! -s "$cell.requests.jsonl" ] || [ ! -s "$cell.json" ]; then
    echo "!! $w round $k $name: loadgen failed (rc $rc; $cell.loadgen.log)"
    failed+=("$w/round-$k/$name")
    return 0
  fi
  python3 $here/peers_run.py finish "$cell" workload="$w" round="$k" router="$name" \
    position="$position" sitting="$sitting" started_unix_s="$started" ended_unix_s="$ended" \
    quiet_threshold_pct="$([ "$quiet_pct" = off ] && echo null || echo "$quiet_pct")" \
    pods="$pods_kind"
  python3 - "$cell.meta.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
hit = m.get("pods_hit_rate")
hit = "n/a" if hit is None else f"{100 * hit:.1f} %"
print(f"{m['workload']} round {m['round']}: {m['router']} done (errors {m['errors']}, pods' hit {hit})"
      + ("  DISTURBED: " + "; ".join(m.get("violations", [])[:2]) if m["disturbed"] else ""))
PY
}

if [ "$todo" -gt 0 ]; then
  for ((k = 1; k <= rounds; k++)); do
    for w in "${wl[@]}"; do
      position=0
      for name in $(order_of $k); do
        position=$((position + 1))
        [ -f "$out/$w/round-$k/$name.meta.json" ] && continue
        run_cell "$w" "$k" "$name" "$position"
      done
    done
  done
fi

for w in "${wl[@]}"; do
  python3 $here/peers_table.py "$out" --workload "$w" --routers "$routers"
done
if [ ${#skipped[@]} -gt 0 ] || [ ${#failed[@]} -gt 0 ]; then
  echo
  [ ${#skipped[@]} -eq 0 ] || echo "Skipped (machine not quiet): ${skipped[*]}"
  [ ${#failed[@]} -eq 0 ] || echo "Failed (see their logs): ${failed[*]}"
  echo "Rerun the same command to run them (the complete runs are kept)."
fi
