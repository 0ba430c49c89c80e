#!/usr/bin/env bash
# The router's own cost, every figure issue 41 asks for, in one run on one machine:
#   1. the simulator on the whole Mooncake conversation trace with 16 pods: wall and CPU time of
#      this build and of OLD (e.g. the previous commit's binary), alternated, 3 runs each, and
#      whether their outputs match (the JSON without its wall-time keys);
#   2. the decision's cost at 16, 64, 256, 1,024 and 4,096 pods (criterion, `decision/full/N`);
#   3. decisions per second with 1 and 2 threads at 64 and 1,024 pods (`decision_rate`);
#   4. bench/cost.sh: kvgate against sglang-router 0.3.2 at three body sizes.
#
#   bench/router_cost.sh --old OLD_KVGATE_BINARY [--out DIR] [--skip-cost]
#
# Run it on a quiet machine (nothing else building or measuring) and read the ratios within
# the run. Prints the machine (CPU model), the date and the load average first.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
old=""
out="$root/target/router-cost"
skip_cost=0
while [ $# -gt 0 ]; do
  case "$1" in
    --old) old=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --skip-cost) skip_cost=1; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
[ -x "$old" ] || { echo "--old OLD_KVGATE_BINARY is required (an executable)" >&2; exit 2; }
mkdir -p "$out"
target=${CARGO_TARGET_DIR:-$root/target}
trace=${TRACE:-$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl}

echo "== building (release)"
cargo build --release -q -p kvgate
cargo build --release -q -p kvgate-core --example decision_rate
bench_bin=$(cargo bench -q -p kvgate-core --bench decision --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "decision" and m.get("executable"):
        print(m["executable"])' | tail -1)
new="$target/release/kvgate"

echo "== machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs"
echo "== date: $(date -u '+%Y-%m-%d %H:%M UTC'); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== new: $new ($(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')); old: $old"

echo
echo "## 1. The simulator, whole Mooncake trace, 16 pods (wall s / user+sys s)"
echo "| run | old wall | old CPU | new wall | new CPU |"
echo "|---:|---:|---:|---:|---:|"
sim() { # BIN JSON -> "wall cpu"
  /usr/bin/time -f '%e %U %S' -o "$out/time.txt" "$1" sim --trace "$trace" --pods 16 \
    --policy affinity-gate --threads 1 --quiet --json "$2" >/dev/null
  awk '{printf "%.2f %.2f", $1, $2 + $3}' "$out/time.txt"
}
for run in 1 2 3; do
  read -r ow oc <<<"$(sim "$old" "$out/sim-old.json")"
  read -r nw nc <<<"$(sim "$new" "$out/sim-new.json")"
  echo "| $run | $ow | $oc | $nw | $nc |"
done
python3 - "$out/sim-old.json" "$out/sim-new.json" <<'PY'
import json, sys
def strip(v, other):
    # Wall times, and keys only one build knows (e.g. a removed router key), are not compared.
    if isinstance(v, dict):
        o = other if isinstance(other, dict) else {}
        return {k: strip(x, o.get(k)) for k, x in v.items() if "wall" not in k and k in o}
    if isinstance(v, list):
        o = other if isinstance(other, list) else []
        return [strip(x, y) for x, y in zip(v, o + [None] * (len(v) - len(o)))]
    return v
a, b = (json.load(open(p)) for p in sys.argv[1:])
same = strip(a, b) == strip(b, a)
print("outputs:", "identical (wall times and keys only one build has aside)" if same else "DIFFER")
PY

echo
echo "## 2. One decision, criterion median (decision/full/N)"
"$bench_bin" --bench --warm-up-time 1 --measurement-time 3 'decision/full/[0-9]' 2>/dev/null |
  awk '/^decision\/full\/[0-9]/ {name=$1} /time:/ && name {print "| " name " | " $4 " " $5 " |"; name=""}'

echo
echo "## 3. Decisions per second, 1 and 2 threads"
"$target/release/examples/decision_rate" 3 64 1024

if [ "$skip_cost" = 0 ]; then
  echo
  echo "## 4. bench/cost.sh (kvgate routed vs sglang-router, fixed-answer pods)"
  KVGATE_BIN="$new" bench/cost.sh --out "$out/cost"
fi
