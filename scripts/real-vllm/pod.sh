#!/usr/bin/env bash
# Starts or stops one real vLLM CPU pod (facts in ../shared/reference/real-vllm.md).
#   scripts/real-vllm/pod.sh start NAME MODEL_DIR PORT REPLAY_PORT CORE [vllm args…]
#   scripts/real-vllm/pod.sh stop NAME        (SIGTERM to its process group, SIGKILL after 20 s)
#   scripts/real-vllm/pod.sh kill NAME        (SIGKILL to its process group: a crash; both wait
#                                             until the group's processes are gone, ≤ 30 s)
#   scripts/real-vllm/pod.sh restart NAME     (kill, then start again with the same arguments)
#   scripts/real-vllm/pod.sh dtype            (prints the dtype `start` gives a pod on this machine)
# The pod runs in its own session (setsid), pinned to CORE (or cores: '0|1', one per engine of a
# data-parallel server), with prefix caching, KV events published on
# ${KVGATE_VLLM_EVENTS:-ipc://$run/NAME-events.ipc} (vLLM binds a PUB endpoint only when it is a wildcard
# `tcp://*:P` or ipc; `tcp://127.0.0.1:P` makes it connect, and a wildcard would listen beyond
# loopback) and replay on 127.0.0.1:REPLAY_PORT; its log and pid are under
# ${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}/NAME.{log,pid}. `start` waits until /health answers
# (at most ${KVGATE_VLLM_START_S:-240} s) and fails with the log's tail otherwise.
# The dtype: bfloat16 where the CPU has bf16 arithmetic (the flag `avx512_bf16` or `amx_bf16` in
# ${KVGATE_CPUINFO:-/proc/cpuinfo}), else float32 (on an AVX2-only CPU bf16 is emulated, and
# slower); ${KVGATE_VLLM_DTYPE} overrides the choice, and a `--dtype` among the vllm args wins
# over both. The dtype a pod runs with is written to $run/NAME.dtype.
# The pod serves its model as ${KVGATE_VLLM_SERVED_NAME:-tiny} (--served-model-name).
# KVGATE_VLLM_PIN=1 starts the pod under `taskset -c CORE` (every process and thread on its core;
# scripts/real-vllm/layout.sh measures what that does); `restart` does not keep it.
set -euo pipefail
cd "$(dirname "$0")/../.."
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
venv=${KVGATE_VLLM_VENV:-.venv-vllm}
mkdir -p "$run"
cmd=${1:-} name=${2:-}
# The dtype for this machine's CPU (see above).
cpu_dtype() {
  if [ -n "${KVGATE_VLLM_DTYPE:-}" ]; then
    echo "$KVGATE_VLLM_DTYPE"
  elif grep -qwE 'avx512_bf16|amx_bf16' "${KVGATE_CPUINFO:-/proc/cpuinfo}" 2>/dev/null; then
    echo bfloat16
  else
    echo float32
  fi
}
case "$cmd" in
dtype) cpu_dtype ;;
start)
  # Saved for `restart`, one argument per line (and NIXL's side-channel port, P/D pods).
  printf '%s\n' "${@:3}" > "$run/$name.args"
  served=${KVGATE_VLLM_SERVED_NAME:-tiny}
  echo "$served" > "$run/$name.served"
  if [ -n "${VLLM_NIXL_SIDE_CHANNEL_PORT:-}" ]; then
    echo "$VLLM_NIXL_SIDE_CHANNEL_PORT" > "$run/$name.nixl-port"
  else
    rm -f "$run/$name.nixl-port"
  fi
  model=$3 port=$4 replay=$5 core=$6; shift 6
  # KVGATE_VLLM_EVENTS: another PUB endpoint (a data-parallel server's, fleet.sh dp-up).
  events=${KVGATE_VLLM_EVENTS:-ipc://$run/$name-events.ipc}
  echo "$events" > "$run/$name.events"
  # An explicit --dtype among the vllm args is the pod's dtype; else the CPU's.
  dtype=
  prev=
  for a in "$@"; do
    case "$a" in --dtype=*) dtype=${a#--dtype=} ;; esac
    [ "$prev" = --dtype ] && dtype=$a
    prev=$a
  done
  dtype_arg=()
  if [ -z "$dtype" ]; then
    dtype=$(cpu_dtype)
    dtype_arg=(--dtype "$dtype")
  fi
  echo "$dtype" > "$run/$name.dtype"
  pin=()
  [ "${KVGATE_VLLM_PIN:-0}" = 1 ] && pin=(taskset -c "$core")
  VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=${KVGATE_VLLM_KV_GIB:-1} \
  VLLM_CPU_OMP_THREADS_BIND=$core VLLM_SERVER_DEV_MODE=1 \
  setsid "${pin[@]}" "$venv/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$model" --served-model-name "$served" --host 127.0.0.1 --port "$port" \
    --enable-prefix-caching --max-model-len 4096 "${dtype_arg[@]}" \
    --kv-events-config "{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"$events\", \"replay_endpoint\": \"tcp://127.0.0.1:$replay\"}" \
    "$@" > "$run/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
  deadline=$((SECONDS + ${KVGATE_VLLM_START_S:-240}))
  until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
    if ! kill -0 "$(cat "$run/$name.pid")" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
      echo "vLLM pod $name did not start; last log lines:" >&2
      tail -n 30 "$run/$name.log" >&2
      exit 1
    fi
    sleep 1
  done
  echo "vLLM pod $name up on 127.0.0.1:$port (events $events, replay tcp://127.0.0.1:$replay, core $core, $dtype)"
  ;;
restart)
  [ -f "$run/$name.args" ] || { echo "pod $name was never started" >&2; exit 1; }
  mapfile -t saved < "$run/$name.args"
  if [ -f "$run/$name.nixl-port" ]; then
    VLLM_NIXL_SIDE_CHANNEL_PORT=$(cat "$run/$name.nixl-port")
    export VLLM_NIXL_SIDE_CHANNEL_PORT
  fi
  if [ -f "$run/$name.events" ]; then
    KVGATE_VLLM_EVENTS=$(cat "$run/$name.events")
    export KVGATE_VLLM_EVENTS
  fi
  # The same dtype as before (an override at start included).
  if [ -f "$run/$name.dtype" ]; then
    KVGATE_VLLM_DTYPE=$(cat "$run/$name.dtype")
    export KVGATE_VLLM_DTYPE
  fi
  if [ -f "$run/$name.served" ]; then
    KVGATE_VLLM_SERVED_NAME=$(cat "$run/$name.served")
    export KVGATE_VLLM_SERVED_NAME
  fi
  "$0" kill "$name"
  exec "$0" start "$name" "${saved[@]}"
  ;;
stop|kill)
  [ -f "$run/$name.pid" ] || exit 0
  pid=$(cat "$run/$name.pid")
  if [ "$cmd" = kill ]; then
    kill -KILL -- "-$pid" 2>/dev/null || true
  else
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  # Until every process of the group is gone (its ports, NIXL side channel and shared memory
  # are released then), at most 30 s: a start right after a kill must not meet the old engine.
  for _ in $(seq 60); do pgrep -g "$pid" > /dev/null 2>&1 || break; sleep 0.5; done
  rm -f "$run/$name.pid"
  ;;
*) echo "usage: $0 start|stop|kill|restart NAME …, or $0 dtype" >&2; exit 2 ;;
esac
