#!/usr/bin/env bash
# kvgate's own instructions per ~400,000-character chat request on the routed path, counted by
# callgrind: a load that repeats on a noisy machine, where bench/cost.sh's CPU seconds do not.
#
#   bench/body_ir.sh [--requests-s S] [--out DIR] [--base-port P] [KVGATE_BIN]
#
# - `kvgate serve` (default config, routed index; KVGATE_BIN, default the release build) runs
#   under `valgrind --tool=callgrind --instr-atstart=no` in front of 4 `cost_bench pod`s
#   (crates/kvgate-gateway/examples/cost_bench.rs), as in bench/cost.sh.
# - The body is bench/cost.sh's 400k body (a shared ~350,000-character system prompt, a
#   ~50,000-character user message that starts with the request's number).
# - Warm-up, not counted: 2 closed-loop clients for 20 s (fills the pods' 100,000-block
#   routed LRUs, so each request also evicts). Then `callgrind_control -i on`, 2 clients for S
#   seconds (default 20), `callgrind_control -d`: the dump's instructions ÷ the requests of that
#   run. Counted: every thread of kvgate's process in user space (kernel time is not seen), the
#   pods' metrics scrapes in that window included (a few % at most).
# Prints one line: requests, instructions, instructions per request, and the top functions
# (inclusive) of the dump under DIR (default target/body-ir).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=20
out="$root/target/body-ir"
base=19300
kvgate=""
while [ $# -gt 0 ]; do
  case "$1" in
    --requests-s) seconds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --base-port) base=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) kvgate=$1; shift ;;
  esac
done
command -v valgrind >/dev/null || { echo "valgrind not installed" >&2; exit 2; }
target=${CARGO_TARGET_DIR:-$root/target}
bench="$target/release/examples/cost_bench"
# The pods and the load are not measured: an existing build of them will do.
[ -x "$bench" ] || cargo build --release -q -p kvgate-gateway --example cost_bench || exit 1
[ -n "$kvgate" ] || { cargo build --release -q -p kvgate || exit 1; kvgate="$target/release/kvgate"; }
mkdir -p "$out"
rm -f "$out"/callgrind.out.*

. bench/lib.sh

python3 bench/bodies.py "$out" 400k

pod_ports=$(seq "$base" $((base + 3)))
"$bench" pod $pod_ports >"$out/pods.log" 2>&1 &
pids+=($!)
for p in $pod_ports; do wait_http "http://127.0.0.1:$p/health" 20 || { echo "pod $p did not start" >&2; exit 1; }; done
pods_flags=()
for p in $pod_ports; do pods_flags+=(--pod "http://127.0.0.1:$p"); done
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out.%p" \
  "$kvgate" serve --listen "127.0.0.1:$((base + 10))" --admin-listen "127.0.0.1:$((base + 11))" \
  --shutdown-drain-ms 0 "${pods_flags[@]}" >"$out/kvgate.log" 2>&1 &
kv_pid=$!
pids+=("$kv_pid")
url="http://127.0.0.1:$((base + 10))"
wait_http "$url/v1/models" 120 || { echo "kvgate did not come up (see $out/kvgate.log)" >&2; exit 1; }
"$bench" load "$url/v1/chat/completions" "$out/body-400k.json" 2 20 >"$out/warm.json" || exit 1
callgrind_control -i on "$kv_pid" >/dev/null
"$bench" load "$url/v1/chat/completions" "$out/body-400k.json" 2 "$seconds" >"$out/load.json" || exit 1
callgrind_control -d "$kv_pid" >/dev/null
callgrind_control -i off "$kv_pid" >/dev/null
dump="$out/callgrind.out.$kv_pid.1"  # the dump of the counted run (the exit writes another)
python3 - "$out/load.json" "$dump" "$out" <<'PY'
import json, subprocess, sys
load = json.load(open(sys.argv[1]))
ann = subprocess.run(["callgrind_annotate", "--inclusive=yes", sys.argv[2]],
                     capture_output=True, text=True).stdout
open(f"{sys.argv[3]}/annotate.txt", "w").write(ann)
total = next(int(l.split()[0].replace(",", "")) for l in ann.splitlines() if "PROGRAM TOTALS" in l)
n = load["all_ok"]
print(f"requests {n} errors {load['errors']} instructions {total:,} per_request {total / max(n, 1):,.0f}")
PY
