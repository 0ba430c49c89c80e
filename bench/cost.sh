#!/usr/bin/env bash
# The router's own cost, side by side in one run: kvgate (routed index), kvgate (engine index,
# token mode), sglang-router 0.3.2 (cache_aware) and no router, in front of the same
# fixed-answer pods, at three chat body sizes.
#
#   bench/cost.sh [--seconds S] [--concurrency C] [--tokenizer FILE] [--out DIR] [--base-port P]
#
# - Pods: `cost_bench pod` (crates/kvgate-gateway/examples/cost_bench.rs), 4 of them, answering
#   every chat request at once with the same small completion (no tokenizer, no engine model).
# - Bodies (bench/bodies.py): short (~200 chars), ~32,000 chars and ~400,000 chars; each a shared system prompt
#   plus a user message that starts with the request's number (`@@N@@`), so every request is a
#   new turn after a shared prefix (for the engine index: the system prompt's ids are reused,
#   the user message is tokenized; its share is 1/8 of the body).
# - Per path and size, two closed-loop runs of `cost_bench load`: 1 client for S/2 s (added
#   latency = p50/p99 minus direct's, nothing queued), and C clients for S s (requests/s).
# - CPU per request: the router's process tree's utime + stime (/proc/PID/stat, children
#   included) over each run, divided by the requests it completed (warm-up included).
# - The engine index uses --tokenizer (default: /tmp/kvgate-vllm/tiny-model/tokenizer.json, a
#   4,096-token byte-level BPE with a chat template, if present; else the built-in cl100k).
#
# sglang-router comes from PyPI (`sglang-router==0.3.2`): taken from .venv-bench if there, else
# installed into .venv. Ports: P (default 19200)…P+3 pods, P+10 router, P+11 admin, P+12 its
# Prometheus port. Needs: cargo, python3, curl. Run it niced on a shared machine and read the
# ratios within one run.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds=8
conc=8
out="$root/target/bench-cost"
base=19200
tokenizer=/tmp/kvgate-vllm/tiny-model/tokenizer.json
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --base-port) base=$2; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out/log"
target=${CARGO_TARGET_DIR:-$root/target}

echo "== building kvgate and cost_bench (release)"
cargo build --release -q -p kvgate || exit 1
cargo build --release -q -p kvgate-gateway --example cost_bench || exit 1
kvgate="${KVGATE_BIN:-$target/release/kvgate}"  # KVGATE_BIN: another build, side by side
bench="$target/release/examples/cost_bench"

python=""
for venv in "$root/.venv-bench" "$root/.venv" /work/main/.venv-bench /work/main/.venv; do
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import sglang_router' 2>/dev/null; then
    python="$venv/bin/python"; break
  fi
done
if [ -z "$python" ] && [ -x "$root/.venv/bin/pip" ]; then
  "$root/.venv/bin/pip" install -q sglang-router==0.3.2 >"$out/log/pip.log" 2>&1 \
    && python="$root/.venv/bin/python"
fi
[ -n "$python" ] || echo "!! sglang-router not available; its rows are skipped"

tok_flag=()
if [ -f "$tokenizer" ]; then tok_flag=(--tokenizer "$tokenizer"); else tokenizer="built-in cl100k"; fi

. bench/lib.sh  # pids, cleanup (on exit too), wait_http (the script has cd-ed to the repo root)

pod_ports=$(seq "$base" $((base + 3)))
"$bench" pod $pod_ports >"$out/log/pods.log" 2>&1 &
pod_pid=$!
pids+=("$pod_pid")
for p in $pod_ports; do wait_http "http://127.0.0.1:$p/health" 20 || { echo "!! pod $p did not start"; exit 1; }; done

python3 bench/bodies.py "$out"
[ -f "$out/body-400k.json" ] || { echo "!! bodies not written"; exit 1; }

router_port=$((base + 10))
start_router() { # name
  local pods_flags="" p
  for p in $pod_ports; do pods_flags+=" --pod http://127.0.0.1:$p"; done
  case "$1" in
    kvgate-routed)
      "$kvgate" serve --listen "127.0.0.1:$router_port" --admin-listen "127.0.0.1:$((base + 11))" \
        --shutdown-drain-ms 0 $pods_flags >"$out/log/$1.log" 2>&1 & ;;
    kvgate-engine)
      "$kvgate" serve --listen "127.0.0.1:$router_port" --admin-listen "127.0.0.1:$((base + 11))" \
        --index engine "${tok_flag[@]}" --shutdown-drain-ms 0 $pods_flags >"$out/log/$1.log" 2>&1 & ;;
    sglang)
      [ -n "$python" ] || return 1
      local urls=""; for p in $pod_ports; do urls+=" http://127.0.0.1:$p"; done
      "$python" -m sglang_router.launch_router --host 127.0.0.1 --port "$router_port" \
        --worker-urls $urls --policy cache_aware --prometheus-port $((base + 12)) \
        >"$out/log/$1.log" 2>&1 & ;;
  esac
  router_pid=$!
  pids+=("$router_pid")
  wait_http "http://127.0.0.1:$router_port/v1/models" 60 || { echo "!! $1 did not come up (see $out/log/$1.log)"; return 1; }
}

# CPU seconds (utime + stime, children included) of a process and its descendants.
tree_cpu() {
  python3 - "$1" <<'PY'
import os, sys
root, hz = int(sys.argv[1]), os.sysconf("SC_CLK_TCK")
stats = {}
for d in os.listdir("/proc"):
    if d.isdigit():
        try:
            f = open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()
            stats[int(d)] = (int(f[1]), sum(int(x) for x in f[11:15]))
        except OSError:
            pass
tree, grew = {root}, True
while grew:
    grew = False
    for pid, (ppid, _) in stats.items():
        if ppid in tree and pid not in tree:
            tree.add(pid); grew = True
print(sum(stats[p][1] for p in tree if p in stats) / hz)
PY
}

results="$out/results.jsonl"; : >"$results"
half=$(python3 -c "print(max(2, $seconds / 2))")
for name in direct kvgate-routed kvgate-engine sglang; do
  url="http://127.0.0.1:$base/v1/chat/completions"
  if [ "$name" != direct ]; then
    router_pid=""
    start_router "$name" || { [ -n "$router_pid" ] && kill "$router_pid" 2>/dev/null; continue; }
    url="http://127.0.0.1:$router_port/v1/chat/completions"
  fi
  for size in short 32k 400k; do
    for phase in lat thr; do
      c=1; s=$half; [ $phase = thr ] && { c=$conc; s=$seconds; }
      cpu0=0; [ "$name" != direct ] && cpu0=$(tree_cpu "$router_pid")
      r=$("$bench" load "$url" "$out/body-$size.json" "$c" "$s")
      cpu1=0; [ "$name" != direct ] && cpu1=$(tree_cpu "$router_pid")
      echo "{\"path\":\"$name\",\"size\":\"$size\",\"phase\":\"$phase\",\"cpu_s\":$(python3 -c "print($cpu1-$cpu0)"),\"load\":$r}" >>"$results"
      echo "-- $name $size $phase: $r"
    done
  done
  if [ "$name" != direct ]; then kill "$router_pid" 2>/dev/null; wait "$router_pid" 2>/dev/null; sleep 0.5; fi
done

python3 - "$results" "$tokenizer" "$conc" "$seconds" <<'PY' | tee "$out/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r = {(x["path"], x["size"], x["phase"]): x for x in rows}
print(f"engine index tokenizer: {sys.argv[2]}; throughput at {sys.argv[3]} clients for {sys.argv[4]} s, latency at 1 client\n")
print("| body | path | req/s | vs sglang | p50 ms (1 client) | added p50 ms | added p99 ms | added vs sglang | CPU ms / request | errors |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for size in ["short", "32k", "400k"]:
    d = r.get(("direct", size, "lat"))
    sg_thr, sg_lat = r.get(("sglang", size, "thr")), r.get(("sglang", size, "lat"))
    for path in ["direct", "kvgate-routed", "kvgate-engine", "sglang"]:
        t, l = r.get((path, size, "thr")), r.get((path, size, "lat"))
        if not t or not l:
            print(f"| {size} | {path} | not run | | | | | | | |"); continue
        rps = t["load"]["requests_per_s"]
        vs = f"{rps / sg_thr['load']['requests_per_s']:.2f}×" if sg_thr and sg_thr["load"]["requests_per_s"] else ""
        p50, p99 = l["load"]["latency_ms"]["p50"], l["load"]["latency_ms"]["p99"]
        add50 = p50 - d["load"]["latency_ms"]["p50"] if d else float("nan")
        add99 = p99 - d["load"]["latency_ms"]["p99"] if d else float("nan")
        sg_add = (sg_lat["load"]["latency_ms"]["p50"] - d["load"]["latency_ms"]["p50"]) if sg_lat and d else None
        vs_lat = f"{add50 / sg_add:.2f}×" if sg_add and path != "direct" else ""
        n = t["load"]["all_ok"] + l["load"]["all_ok"]
        cpu = "" if path == "direct" else f"{1000 * (t['cpu_s'] + l['cpu_s']) / max(n, 1):.2f}"
        errs = t["load"]["errors"] + l["load"]["errors"]
        a50 = "" if path == "direct" else f"{add50:+.3f}"
        a99 = "" if path == "direct" else f"{add99:+.3f}"
        print(f"| {size} | {path} | {rps:.0f} | {vs} | {p50:.3f} | {a50} | {a99} | {vs_lat} | {cpu} | {errs} |")
PY
kill "$pod_pid" 2>/dev/null
echo; echo "results and logs in $out"
