#!/usr/bin/env bash
# One request's trace from the client through kvgate into a real vLLM CPU pod, in one OTLP
# receiver: starts scripts/otlp_receiver.py, one vLLM pod (scripts/real-vllm/pod.sh) with
# --otlp-traces-endpoint pointing at it (OTLP/HTTP protobuf), and `kvgate serve` in front with
# `[tracing]` on; sends one chat request with a sampled `traceparent`, stops kvgate and the pod
# (both export what they hold), and prints every span of that trace id as a tree with its
# service (kvgate's and vLLM's). Everything it started is stopped on exit.
#
# Usage: scripts/real-vllm/otel_trace.sh [PORT_BASE]    (default 18400: the receiver on
#   PORT_BASE, the pod on +1 with its replay socket on +2, kvgate on +3 and its admin on +4)
# Needs .venv-vllm (scripts/real-vllm/install.sh); installs vLLM's optional OpenTelemetry
# packages into it when missing (opentelemetry-sdk, -api, -exporter-otlp,
# -semantic-conventions-ai: vLLM's docs; -exporter-otlp brings opentelemetry-proto, which the
# receiver uses too). KVGATE_VLLM_RUN (default /tmp/kvgate-otel-trace) holds the logs, the
# model and the spans.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
venv=${KVGATE_VLLM_VENV:-$root/.venv-vllm}
run=${KVGATE_VLLM_RUN:-/tmp/kvgate-otel-trace}
base=${1:-18400}
rport=$base pod_port=$((base + 1)) replay=$((base + 2)) kv_port=$((base + 3)) admin=$((base + 4))
export KVGATE_VLLM_RUN=$run KVGATE_VLLM_VENV=$venv
mkdir -p "$run"
rm -f "$run/spans.jsonl"
py="$venv/bin/python"
[ -x "$py" ] || { echo "no $venv: run scripts/real-vllm/install.sh first" >&2; exit 2; }
if ! "$py" -c 'import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.semconv_ai, opentelemetry.proto' 2>/dev/null; then
  echo "== installing vLLM's OpenTelemetry packages into $venv"
  "$py" -m pip install --quiet --disable-pip-version-check opentelemetry-sdk opentelemetry-api \
    opentelemetry-exporter-otlp opentelemetry-semantic-conventions-ai
fi
model=${KVGATE_VLLM_MODEL_DIR:-$run/model}
[ -f "$model/config.json" ] || "$py" scripts/real-vllm/make_model.py "$model"
cargo build --quiet --release -p kvgate
kvgate=${CARGO_TARGET_DIR:-target}/release/kvgate

receiver_pid= kvgate_pid=
cleanup() {
  [ -n "$kvgate_pid" ] && kill "$kvgate_pid" 2>/dev/null || true
  scripts/real-vllm/pod.sh stop otel-pod || true
  [ -n "$receiver_pid" ] && kill "$receiver_pid" 2>/dev/null || true
}
trap cleanup EXIT

"$py" scripts/otlp_receiver.py "$run/spans.jsonl" --port "$rport" > "$run/receiver.log" 2>&1 &
receiver_pid=$!
echo "== OTLP receiver on 127.0.0.1:$rport (pid $receiver_pid)"

# vLLM exports with the OTLP exporter its environment names: HTTP/protobuf to the receiver.
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_SERVICE_NAME=vllm \
  scripts/real-vllm/pod.sh start otel-pod "$model" "$pod_port" "$replay" 0 \
  --otlp-traces-endpoint "http://127.0.0.1:$rport/v1/traces"

cat > "$run/kvgate.toml" <<EOF
[tracing]
otlp_traces_endpoint = "http://127.0.0.1:$rport/v1/traces"
EOF
"$kvgate" serve --config "$run/kvgate.toml" --pod "http://127.0.0.1:$pod_port" \
  --listen "127.0.0.1:$kv_port" --admin-listen "127.0.0.1:$admin" > "$run/kvgate.log" 2>&1 &
kvgate_pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$admin/readyz" > /dev/null && break
  sleep 0.2
done
trace_id=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
echo "== one chat request with traceparent 00-$trace_id-00f067aa0ba902b7-01"
curl -sS -D "$run/headers.txt" -o "$run/answer.txt" "http://127.0.0.1:$kv_port/v1/chat/completions" \
  -H 'content-type: application/json' \
  -H "traceparent: 00-$trace_id-00f067aa0ba902b7-01" \
  -d '{"model": "tiny", "messages": [{"role": "user", "content": "Tell me about tracing."}], "max_tokens": 16, "stream": true}'
grep -i '^x-kvgate' "$run/headers.txt" || true
tail -c 200 "$run/answer.txt"; echo

# kvgate exports at its shutdown; vLLM's batch processor every 5 s and at its exit.
kill -TERM "$kvgate_pid"; wait "$kvgate_pid" || true; kvgate_pid=
sleep 6
scripts/real-vllm/pod.sh stop otel-pod
sleep 1

echo "== spans of trace $trace_id received by the OTLP receiver"
"$py" - "$run/spans.jsonl" "$trace_id" <<'PY'
import json, sys
spans = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mine = [s for s in spans if s["trace_id"] == sys.argv[2]]
others = len(spans) - len(mine)
by_parent = {}
for s in mine:
    by_parent.setdefault(s["parent_span_id"], []).append(s)
ids = {s["span_id"] for s in mine}
def show(s, depth):
    ms = (s["end_ns"] - s["start_ns"]) / 1e6
    attrs = {k: v for k, v in s["attributes"].items()
             if k.startswith(("kvgate.", "gen_ai.")) or k in ("server.address", "http.response.status_code")}
    print(f"{'  ' * depth}{s['service']:7} {s['name']:<24} {s['kind']:<8} {ms:9.2f} ms  "
          f"span {s['span_id']} parent {s['parent_span_id'] or '-'}")
    for k in sorted(attrs):
        print(f"{'  ' * depth}          {k} = {attrs[k]}")
    for c in sorted(by_parent.get(s["span_id"], []), key=lambda c: c["start_ns"]):
        show(c, depth + 1)
roots = [s for s in mine if s["parent_span_id"] not in ids]
for r in sorted(roots, key=lambda s: s["start_ns"]):
    show(r, 0)
services = sorted({s["service"] for s in mine})
print(f"{len(mine)} spans in this trace from {services}; {others} other spans received")
PY
