#!/usr/bin/env bash
# Two vLLM CPU pods on one machine: how much does one slow the other, under each process layout
# vLLM offers (issue 40, "two CPU pods that do not slow each other")?
#   scripts/real-vllm/layout.sh [OUT_DIR]     (default /var/tmp/kvgate-layout)
# For each layout, pods la (core 0) and lb (core 1) of the tiny model are started with
# scripts/real-vllm/pod.sh (as the fleet's and peers.sh's pods: 1 GiB of KV, prefix caching, KV
# events), and layout.py measures la's prefill and decode speed on an idle machine, then each
# pod's throughput alone and with the other busy (1.0: as two machines), and each pod's CPU. Layouts (LAYOUTS, comma list, default mp,uni):
#   mp   vLLM's default on CPU: API server + engine-core process (multiprocess executor, whose
#        shared-memory queue busy-waits up to 1 s after each read)
#   uni  VLLM_ENABLE_V1_MULTIPROCESSING=0 and --distributed-executor-backend uni (vLLM's CPU
#        platform turns `uni` back into `mp` unless multiprocessing is off)
#   uni-pin, mp-pin  the same, each pod's every process and thread held on its core
#        (KVGATE_VLLM_PIN=1: pod.sh starts it under `taskset -c CORE`)
# Needs a quiet machine (no build, no other pods: stop the test fleet first, fleet.sh down) and
# the vLLM venv and model of fleet.sh. Writes OUT_DIR/<layout>.json and prints a line per probe.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-/var/tmp/kvgate-layout}
mkdir -p "$out"
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
model="$run/tiny-model"
here=scripts/real-vllm
port=${KVGATE_LAYOUT_PORT:-18300}
[ -f "$model/config.json" ] || .venv-vllm/bin/python $here/make_model.py "$model" --layers 8 --hidden 512
stop() { $here/pod.sh stop la || true; $here/pod.sh stop lb || true; }
trap stop EXIT
IFS=, read -ra layouts <<< "${LAYOUTS:-mp,uni}"
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for layout in "${layouts[@]}"; do
  case "$layout" in
    mp) env=() extra=() ;;
    uni) env=(VLLM_ENABLE_V1_MULTIPROCESSING=0) extra=(--distributed-executor-backend uni) ;;
    mp-pin) env=(KVGATE_VLLM_PIN=1) extra=() ;;
    uni-pin) env=(VLLM_ENABLE_V1_MULTIPROCESSING=0 KVGATE_VLLM_PIN=1) extra=(--distributed-executor-backend uni) ;;
    *) echo "unknown layout $layout (mp|uni|mp-pin|uni-pin)" >&2; exit 2 ;;
  esac
  stop
  env "${env[@]}" $here/pod.sh start la "$model" "$port" $((port + 50)) 0 "${extra[@]}" &
  a=$!
  env "${env[@]}" $here/pod.sh start lb "$model" $((port + 1)) $((port + 51)) 1 "${extra[@]}" &
  b=$!
  wait $a
  wait $b
  python3 $here/layout.py "http://127.0.0.1:$port" "http://127.0.0.1:$((port + 1))" \
    --pgid-a "$(cat "$run/la.pid")" --pgid-b "$(cat "$run/lb.pid")" --label "$layout" \
    --json "$out/$layout.json"
done
