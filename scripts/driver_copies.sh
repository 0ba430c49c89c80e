#!/usr/bin/env bash
# No structural copy between the gateway's drivers and the simulator's (issue 39): jscpd
# (npm, pinned) looks for clones of 50 tokens or more in crates/kvgate-gateway/src and
# crates/kvgate-sim/src, and this fails if any clone has one side in each. Clones inside one
# crate are not this check's business (`duplicates` lists them). Run by .ci/run (~15 s once
# jscpd is installed under target/jscpd).
#
#   scripts/driver_copies.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools=${CARGO_TARGET_DIR:-target}/jscpd
if [ ! -x "$tools/node_modules/.bin/jscpd" ]; then
  mkdir -p "$tools"
  npm install --silent --no-audit --no-fund --prefix "$tools" jscpd@4.0.5 >/dev/null
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$tools/node_modules/.bin/jscpd" --min-tokens 50 --format rust --reporters json \
  --output "$out" --silent crates/kvgate-gateway/src crates/kvgate-sim/src >/dev/null
python3 - "$out/jscpd-report.json" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
cross = [d for d in report["duplicates"]
         if ("kvgate-gateway/" in d["firstFile"]["name"]) != ("kvgate-gateway/" in d["secondFile"]["name"])]
for d in cross:
    a, b = d["firstFile"], d["secondFile"]
    print(f"copy: {a['name']}:{a['start']}-{a['end']} ~ {b['name']}:{b['start']}-{b['end']} ({d['lines']} lines)")
total = report["statistics"]["total"]
print(f"driver copies: {len(cross)} between the gateway and the simulator "
      f"({total['clones']} clones within either, {total['sources']} files)")
sys.exit(1 if cross else 0)
PY
