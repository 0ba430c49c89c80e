#!/usr/bin/env bash
# Chaos soak of `kvgate serve` on the real engine (issue 38): the two real vLLM CPU pods of
# scripts/real-vllm/fleet.sh (running: $KVGATE_VLLM_RUN/fleet.env), kvgate in front of them
# (routed, default config but for its --config file and shorter first-byte / idle-chunk
# timeouts), and an open-loop load that overloads the pods for a while, with, during the load:
#   - a config reload (the file rewritten: [router] affinity_gate_tau 0.80 -> 0.70), and back;
#   - pod p0 killed (SIGKILL, `pod.sh restart p0`: killed, then started again, ~1 min);
#   - pod p1's /metrics made slow (3 s per answer, past kvgate's 1 s scrape timeout) for 40 s,
#     while p0 is still down: kvgate reaches p1 through a small proxy (chaos_soak.py proxy)
#     that delays /metrics on demand;
#   - with --cluster: two kvgate replicas sharing a NATS server (.venv/bin/nats-server), the load
#     alternating between them, and NATS killed (SIGKILL) and started again 10 s later.
# Then it checks and prints (chaos_soak.py report; exit status 1 when a check fails):
#   - no request lost but the streams in flight on the killed pod, and those end with an SSE
#     error event and `data: [DONE]`;
#   - no `no_healthy_pod` answer (p1 serves throughout; flow control's / admission's 429 and
#     503 by cause would be allowed, and are listed);
#   - kvgate's RSS (VmRSS sampled each second) below a bound (--rss-limit-mib, 256);
#   - kvgate's ledgers back to zero at the end (kvgate_active_requests, queued, in flight per
#     pod and its tokens, open connections, the cluster's remote charges), the pods idle;
# beside the CPU model, the pods' speed (speed.py --summary), the load average and whether a
# compile (rustc) ran during the run.
#
# Usage: scripts/real-vllm/chaos_soak.sh [--cluster] [--minutes N] [--rate-scale F]
#          [--timeout-ms MS] [--max-requests N] [--out DIR] [--analyze-only]
#   --minutes N     length of the load, 2..10 (then it drains: at most the client timeout)  [4]
#   --rate-scale F  multiplies both load phases' rates                                        [1]
#   --timeout-ms MS kvgate's --first-byte-timeout-ms and --idle-chunk-timeout-ms
#                   [max(5000, 8 engine steps): a step of 2,048 prompt tokens at the measured
#                   prefill speed; the timeout must outlast one step]
#   --max-requests N  at most N requests                                                    [1500]
#   --out DIR       logs, per-request records, the report        [target/chaos-soak[-cluster]]
# The load: a first phase (35 % of the time) at 1.4x the fleet's estimated capacity, then 0.45x
# (the queues drain). Capacity estimate: 800 / (prefill ms per 1k tokens) requests/s for both
# pods (the tiny model on the 2-core Xeon, prefill 324 ms per 1k: ~2.5 requests/s), from
# fleet.env's measured speed; streamed (7 in 8) and whole-body completions of ~150-2,000 prompt
# tokens, 16-48 output tokens. Schedule (L = the load's length): reload at 0.10 L, (NATS killed
# at 0.18 L, back 10 s later), p0 killed at 0.25 L, p1's /metrics slow from the kill + 20 s for
# 40 s, reload back at 0.75 L.
# Ports: 127.0.0.1:$CHAOS_PORT_BASE (18400) +11 proxy, +22 NATS, +80/+81 kvgate, +90/+91 admin.
# Needs: the fleet up, cargo (builds kvgate unless $KVGATE_BIN), curl, python3 (stdlib).
# The fleet is left running: p0 comes back through pod.sh restart (also on an early exit).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-vllm}
export KVGATE_VLLM_RUN=$run
base=${CHAOS_PORT_BASE:-18400}
minutes=4
rate_scale=1
timeout_ms=
max_requests=1500
cluster=0
out=
analyze_only=0
rss_limit_mib=256
while [ $# -gt 0 ]; do
  case "$1" in
    --cluster) cluster=1; shift ;;
    --minutes) minutes=$2; shift 2 ;;
    --rate-scale) rate_scale=$2; shift 2 ;;
    --timeout-ms) timeout_ms=$2; shift 2 ;;
    --max-requests) max_requests=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rss-limit-mib) rss_limit_mib=$2; shift 2 ;;
    --analyze-only) analyze_only=1; shift ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=target/chaos-soak$([ "$cluster" = 1 ] && echo -cluster || true)
py=python3
helper=scripts/real-vllm/chaos_soak.py
if [ "$analyze_only" = 1 ]; then
  exec "$py" "$helper" report "$out"
fi
if ! [[ "$minutes" =~ ^[0-9]+$ ]] || [ "$minutes" -lt 2 ] || [ "$minutes" -gt 10 ]; then
  echo "--minutes must be 2..10 (the soak is bounded), got $minutes" >&2
  exit 2
fi
[ -f "$run/fleet.env" ] || { echo "no real-vLLM fleet ($run/fleet.env): scripts/real-vllm/fleet.sh up" >&2; exit 1; }
set -a; . "$run/fleet.env"; set +a
p0_url=${KVGATE_VLLM_P0%%,*}
p1_url=${KVGATE_VLLM_P1%%,*}
p1_port=${p1_url##*:}
for u in "$p0_url" "$p1_url"; do
  curl -sf "$u/health" > /dev/null || { echo "pod $u is not healthy: is the fleet up?" >&2; exit 1; }
done
if pgrep -f 'deps/real_vllm' > /dev/null; then
  echo "!! a real-vLLM test binary is running: it shares these pods (the soak kills p0)" >&2
  exit 1
fi
prefill=${KVGATE_VLLM_PREFILL_MS_PER_1K:-120}
if [ -z "$timeout_ms" ]; then
  timeout_ms=$("$py" -c "print(max(5000, int(8 * 2.048 * $prefill + 0.999)))")
fi
load_s=$((minutes * 60))
read -r rate_hi rate_lo t_hi t_lo < <("$py" -c "
cap = 800.0 / $prefill * $rate_scale
print(f'{1.4 * cap:.3f} {0.45 * cap:.3f} {0.35 * $load_s:.1f} {0.65 * $load_s:.1f}')")

mkdir -p "$out"
rm -f "$out"/{requests.jsonl,monitor.jsonl,events.tsv,run.json,report.md,stop,load_start,load_sent,load_end,metrics_end_*.txt,pods_end.json,*.log,metrics_delay,kvgate.toml}
if [ -n "${KVGATE_BIN:-}" ]; then
  bin=$KVGATE_BIN
else
  echo "== building kvgate (release)"
  cargo build --release -p kvgate --quiet
  bin=${CARGO_TARGET_DIR:-target}/release/kvgate
fi

now_ms() { date +%s%3N; }
event() { printf '%s\t%s\t%s\n' "$1" "$(now_ms)" "${2:-}" >> "$out/events.tsv"; echo "   $(date +%T) $1 ${2:-}"; }
wait_http() {
  local url=$1 what=$2
  for _ in $(seq 1 300); do
    curl -fsS -o /dev/null "$url" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "$what did not come up ($url)" >&2
  exit 1
}

proxy_pid= nats_pid= monitor_pid= load_pid= restart_pid=
gw_pids=()
cleanup() {
  for p in "$load_pid" "$monitor_pid" "${gw_pids[@]}" "$proxy_pid" "$nats_pid"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null || true
  done
  # Leave the fleet running: p0 back up (its restart finishes, or runs now).
  if [ -n "$restart_pid" ] && kill -0 "$restart_pid" 2>/dev/null; then
    echo "== waiting for p0's restart to finish (the fleet stays up)"
    wait "$restart_pid" || true
  fi
  if ! curl -sf "$p0_url/health" > /dev/null; then
    echo "== p0 is down: starting it again"
    scripts/real-vllm/pod.sh restart p0 > "$out/p0-restart-cleanup.log" 2>&1 || echo "!! p0 did not come back: $out/p0-restart-cleanup.log" >&2
  fi
}
trap cleanup EXIT

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')
machine="$cpu, $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
echo "== machine: $machine; load average $(cut -d' ' -f1-3 /proc/loadavg); rustc running: $(pgrep -c -x rustc || true)"
speed=$(.venv-vllm/bin/python scripts/real-vllm/speed.py "$p0_url" "$p1_url" --summary 2>/dev/null || echo "not measured now")
speed="$speed (fleet.env: prefill ${prefill} ms per 1k tokens, decode ${KVGATE_VLLM_DECODE_MS_PER_TOKEN:-?} ms per token, ${KVGATE_VLLM_POD_DTYPE:-?})"
echo "== $speed"

# p1 behind the /metrics-delaying proxy.
proxy_port=$((base + 11))
echo 0 > "$out/metrics_delay"
"$py" "$helper" proxy "$proxy_port" "$p1_port" "$out/metrics_delay" "$out/proxy.log" 2>> "$out/proxy.log" &
proxy_pid=$!
wait_http "http://127.0.0.1:$proxy_port/health" "the proxy in front of p1"
p1_via="http://127.0.0.1:$proxy_port"

nats_url=
if [ "$cluster" = 1 ]; then
  nats_port=$((base + 22))
  nats_url="nats://127.0.0.1:$nats_port"
  .venv/bin/nats-server -a 127.0.0.1 -p "$nats_port" > "$out/nats.log" 2>&1 &
  nats_pid=$!
  for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$nats_port") 2>/dev/null && break; sleep 0.1; done
fi

write_config() { # TAU
  cat > "$out/kvgate.toml.new" <<TOML
# chaos_soak.sh: p0 direct, p1 through the /metrics-delaying proxy
[[pods]]
url = "$p0_url"

[[pods]]
url = "$p1_via"

[router]
affinity_gate_tau = $1
TOML
  mv "$out/kvgate.toml.new" "$out/kvgate.toml"
}
write_config 0.80

replicas=$([ "$cluster" = 1 ] && echo 2 || echo 1)
targets=() admins=()
for k in $(seq 0 $((replicas - 1))); do
  args=(serve --config "$out/kvgate.toml" --listen "127.0.0.1:$((base + 80 + k))"
        --admin-listen "127.0.0.1:$((base + 90 + k))" --first-byte-timeout-ms "$timeout_ms"
        --idle-chunk-timeout-ms "$timeout_ms" --shutdown-drain-ms 0)
  [ "$cluster" = 1 ] && args+=(--cluster "$nats_url" --cluster-name chaos)
  RUST_LOG=${RUST_LOG:-info} "$bin" "${args[@]}" > "$out/kvgate$k.log" 2>&1 &
  gw_pids+=($!)
  targets+=("http://127.0.0.1:$((base + 80 + k))")
  admins+=("http://127.0.0.1:$((base + 90 + k))")
done
for a in "${admins[@]}"; do wait_http "$a/readyz" "kvgate ($a)"; done
label="$([ "$cluster" = 1 ] && echo "--cluster, 2 replicas" || echo "1 replica"), $minutes min of load (${t_hi} s at ${rate_hi}/s, then ${t_lo} s at ${rate_lo}/s), timeouts ${timeout_ms} ms, kvgate $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates Cargo.lock ':(exclude)crates/*/tests/**' || echo '+uncommitted')"
"$py" - "$out/run.json" <<EOF
import json, sys
json.dump({"label": """$label""", "machine": """$machine""", "speed": """$speed""",
           "replicas": $replicas, "killed_pod": "$p0_url", "serving_pod": "$p1_via",
           "rss_limit_kib": $((rss_limit_mib * 1024)), "timeout_ms": $timeout_ms},
          open(sys.argv[1], "w"))
EOF
echo "== $label"

join() { local IFS=,; echo "$*"; }
"$py" "$helper" monitor "$out" --admins "$(join "${admins[@]}")" --pids "$(join "${gw_pids[@]}")" \
  --pods "$p0_url,$p1_url" 2> "$out/monitor.log" &
monitor_pid=$!
"$py" "$helper" load "$out" --targets "$(join "${targets[@]}")" --schedule "$t_hi:$rate_hi,$t_lo:$rate_lo" \
  --max-requests "$max_requests" > "$out/load.log" 2>&1 &
load_pid=$!
for _ in $(seq 100); do [ -f "$out/load_start" ] && break; sleep 0.1; done
t0=$(cat "$out/load_start")
at() { # SECONDS after the load's start
  local target
  target=$(awk -v t0="$t0" -v s="$1" 'BEGIN {printf "%.0f", t0 + s * 1000}')
  while [ "$(now_ms)" -lt "$target" ]; do sleep 0.2; done
}
tau_is() { # TAU: every replica shows it within 10 s
  for _ in $(seq 100); do
    local all=1
    for a in "${admins[@]}"; do
      curl -fsS "$a/metrics" 2>/dev/null | grep -q "^kvgate_affinity_gate_tau $1\$" || all=0
    done
    [ "$all" = 1 ] && return 0
    sleep 0.1
  done
  return 1
}

f() { awk -v f="$1" -v l="$load_s" 'BEGIN {printf "%.1f", f * l}'; }
at "$(f 0.10)"
write_config 0.70
if tau_is 0.7; then event reload_1 "tau 0.80 -> 0.70, applied"; else event reload_1 "tau 0.80 -> 0.70, NOT seen"; fi
if [ "$cluster" = 1 ]; then
  at "$(f 0.18)"
  kill -KILL "$nats_pid"; wait "$nats_pid" 2>/dev/null || true; nats_pid=
  event nats_kill
  sleep 10
  .venv/bin/nats-server -a 127.0.0.1 -p "$nats_port" >> "$out/nats.log" 2>&1 &
  nats_pid=$!
  event nats_restart
fi
at "$(f 0.25)"
event pod_kill p0
( scripts/real-vllm/pod.sh restart p0 > "$out/p0-restart.log" 2>&1 && event pod_up p0 || event pod_restart_failed p0 ) &
restart_pid=$!
kill_at=$(now_ms)
while [ "$(now_ms)" -lt $((kill_at + 20000)) ]; do sleep 0.2; done
echo 3 > "$out/metrics_delay"
event metrics_slow "p1 /metrics +3 s"
sleep 40
echo 0 > "$out/metrics_delay"
event metrics_fast p1
at "$(f 0.75)"
write_config 0.80
if tau_is 0.8; then event reload_2 "tau 0.70 -> 0.80, applied"; else event reload_2 "tau 0.70 -> 0.80, NOT seen"; fi
echo "== load sent until $(f 1.0) s; waiting for every answer"
wait "$load_pid" || true
load_pid=
event load_done
if kill -0 "$restart_pid" 2>/dev/null; then wait "$restart_pid" || true; fi
restart_pid=
# The ledgers: back to zero within 15 s (a cluster peer's charges expire after its lease).
zero=0
for _ in $(seq 150); do
  all=1
  for a in "${admins[@]}"; do
    curl -fsS "$a/metrics" > "$out/metrics_now.txt"
    s=$(awk '/^kvgate_(active_requests|queued_requests|in_flight_requests|in_flight_prefill_tokens|in_flight_decode_tokens|cluster_remote_requests|open_connections)[ {]/ {s += $NF} END {print s + 0}' "$out/metrics_now.txt")
    [ "$s" = 0 ] || all=0
  done
  [ "$all" = 1 ] && { zero=1; break; }
  sleep 0.1
done
event ledgers "$([ "$zero" = 1 ] && echo zero || echo "NOT zero after 15 s")"
for k in $(seq 0 $((replicas - 1))); do curl -fsS "${admins[$k]}/metrics" > "$out/metrics_end_$k.txt"; done
"$py" - "$p0_url" "$p1_url" > "$out/pods_end.json" <<'EOF'
import json, sys, urllib.request
out = {}
for u in sys.argv[1:]:
    try:
        t = urllib.request.urlopen(u + "/metrics", timeout=5).read().decode()
        s = lambda p: sum(float(l.rsplit(" ", 1)[1]) for l in t.splitlines() if l.startswith(p))
        out[u] = [s("vllm:num_requests_running{"), s("vllm:num_requests_waiting{")]
    except Exception as e:
        out[u] = None
print(json.dumps(out))
EOF
touch "$out/stop"
wait "$monitor_pid" 2>/dev/null || true
monitor_pid=
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg); rustc running: $(pgrep -c -x rustc || true)"
"$py" "$helper" report "$out"
