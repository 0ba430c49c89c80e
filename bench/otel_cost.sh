#!/usr/bin/env bash
# The CPU cost of OpenTelemetry tracing per proxied request, in instructions (valgrind
# callgrind, all threads: client, gateway, upstream, the span exporter's thread): the overhead
# example (crates/kvgate-gateway/examples/overhead.rs) sends N streams one after the other
# through the gateway with tracing off, at sampling ratio 0.01 and at 1.0; each mode runs at two
# N and the difference of the totals over the difference of N is its cost per request (start-up,
# warm-up and the final export flush cancel out). `off` runs twice: the spread of those two is
# the method's noise. BASE=path/to/overhead (the example built from an earlier commit, run with
# tracing off) adds that binary's rows first and last: the cost of the change with tracing off.
# Usage: [BASE=…] bench/otel_cost.sh [N_LOW N_HIGH]   (default 100 400)
set -euo pipefail
cd "$(dirname "$0")/.."
lo=${1:-100}
hi=${2:-400}
command -v valgrind > /dev/null || { echo "otel_cost: valgrind not installed (apt-get install -y valgrind)" >&2; exit 2; }
cargo build --quiet --release -p kvgate-gateway --example overhead
bin=${CARGO_TARGET_DIR:-target}/release/examples/overhead
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
total() { # mode, n[, binary]
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "${3:-$bin}" --count "$2" --tracing "$1" \
    > "$out/stdout" 2> "$out/stderr" || { cat "$out/stderr" >&2; exit 1; }
  callgrind_annotate "$out/cg" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}
printf '%-8s %16s %16s %14s\n' mode "Ir at $lo" "Ir at $hi" "Ir / request"
row() { # label, mode[, binary]
  a=$(total "$2" "$lo" "${3:-}")
  b=$(total "$2" "$hi" "${3:-}")
  printf '%-8s %16s %16s %14s\n' "$1" "$a" "$b" $(( (b - a) / (hi - lo) ))
}
[ -n "${BASE:-}" ] && row base off "$BASE"
for mode in off 0.01 1.0 off; do row "$mode" "$mode"; done
[ -n "${BASE:-}" ] && row base off "$BASE"
true
