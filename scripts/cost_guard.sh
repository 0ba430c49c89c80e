#!/usr/bin/env bash
# Regression guard for the router's own cost: counts the instructions (valgrind callgrind) of
# (a) 200 core decisions at 1,024 pods and (b) a 600-request chat simulation on 4 pods
# (crates/kvgate-sim/examples/cost_guard.rs; only the measured functions are counted, not the
# setup), and fails when either is more than 20 % above bench/cost-baseline.json.
# Instruction counts do not depend on the machine's load, but they do on the compiler, the
# CPU's instruction set (glibc picks its memcpy per CPU) and valgrind: compare on one toolchain.
# Updating the baseline is deliberate: `scripts/cost_guard.sh --update` rewrites the file; commit
# it together with the change that moved the counts, saying why they moved.
# Usage: scripts/cost_guard.sh [--update] [--install]
#   --install  installs Debian's valgrind first when it is missing (as CI does: .ci/run)
# Valgrind shows the program a CPU without the features it cannot run (AVX-512 among them), so
# glibc should pick the same string functions on any x86-64 host with AVX2 (not yet checked on a
# second CPU type: if CI's counts differ, the baseline says which machine type it is for).
set -euo pipefail
cd "$(dirname "$0")/.."
baseline=bench/cost-baseline.json
max_rise=1.20
update=0
for a in "$@"; do
  case "$a" in
    --update) update=1 ;;
    --install)
      if ! command -v valgrind > /dev/null; then
        sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
        "${sudo[@]}" apt-get install -y -q valgrind > /dev/null \
          || { "${sudo[@]}" apt-get update -q > /dev/null && "${sudo[@]}" apt-get install -y -q valgrind > /dev/null; }
      fi ;;
    *) echo "usage: $0 [--update] [--install]" >&2; exit 2 ;;
  esac
done
command -v valgrind > /dev/null || { echo "cost_guard: valgrind not installed (apt-get install -y valgrind, or --install)" >&2; exit 2; }
cargo build --quiet --release -p kvgate-sim --example cost_guard
bin=${CARGO_TARGET_DIR:-target}/release/examples/cost_guard
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() { # what, counted function
  valgrind --tool=callgrind --callgrind-out-file="$out/$1.cg" --toggle-collect="$2" \
    "$bin" "$1" > "$out/$1.stdout" 2> "$out/$1.stderr" \
    || { cat "$out/$1.stderr" >&2; exit 1; }
  callgrind_annotate "$out/$1.cg" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}
decisions=$(count decisions 'cost_guard::decide_many')
sim=$(count sim 'cost_guard::simulate')
echo "decisions_ir $decisions"
echo "sim_ir $sim"
if [ "$update" = 1 ]; then
  printf '{\n  "decisions_ir": %s,\n  "sim_ir": %s\n}\n' "$decisions" "$sim" > "$baseline"
  echo "cost_guard: wrote $baseline"
  exit 0
fi
python3 - "$baseline" "$decisions" "$sim" "$max_rise" <<'PY'
import json, sys
base = json.load(open(sys.argv[1]))
now = {"decisions_ir": int(sys.argv[2]), "sim_ir": int(sys.argv[3])}
limit = float(sys.argv[4])
bad = False
for k, v in now.items():
    ratio = v / base[k]
    over = ratio > limit
    bad |= over
    print(f"{k:14} {v:>14,} baseline {base[k]:>14,} x{ratio:.3f}{'  OVER x%.2f' % limit if over else ''}")
sys.exit(1 if bad else 0)
PY
