#!/usr/bin/env bash
# The CPU cost of OpenTelemetry tracing per proxied request, in instructions (valgrind
# callgrind, all threads: client, gateway, upstream, the span exporter's thread): the overhead
# example (crates/kvgate-gateway/examples/overhead.rs) sends N streams one after the other
# through the gateway with tracing off, at sampling ratio 0.01 and at 1.0; each mode runs at two
# N and the difference of the totals over the difference of N is its cost per request (start-up,
# warm-up and the final export flush cancel out). `off` runs twice: the spread of those two is
# the method's noise.
# Usage: scripts/otel_cost.sh [N_LOW N_HIGH]   (default 100 600)
set -euo pipefail
cd "$(dirname "$0")/.."
lo=${1:-100}
hi=${2:-600}
command -v valgrind > /dev/null || { echo "otel_cost: valgrind not installed (apt-get install -y valgrind)" >&2; exit 2; }
cargo build --quiet --release -p kvgate-gateway --example overhead
bin=${CARGO_TARGET_DIR:-target}/release/examples/overhead
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
total() { # mode, n
  valgrind --tool=callgrind --callgrind-out-file="$out/cg" "$bin" --count "$2" --tracing "$1" \
    > "$out/stdout" 2> "$out/stderr" || { cat "$out/stderr" >&2; exit 1; }
  callgrind_annotate "$out/cg" 2>/dev/null | sed -n 's/^ *\([0-9,]*\) .*PROGRAM TOTALS.*/\1/p' | tr -d ,
}
printf '%-8s %16s %16s %14s\n' mode "Ir at $lo" "Ir at $hi" "Ir / request"
for mode in off 0.01 1.0 off; do
  a=$(total "$mode" "$lo")
  b=$(total "$mode" "$hi")
  printf '%-8s %16s %16s %14s\n' "$mode" "$a" "$b" $(( (b - a) / (hi - lo) ))
done
