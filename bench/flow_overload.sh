#!/usr/bin/env bash
# Flow control live: `kvgate serve` in front of mock pods under overload, with 20 % high-priority
# requests and one tenant sending 10× its share — the live twin of the simulator's
# `cargo run --release -p kvgate-sim --example flow_overload` (docs/decisions/flow-control.md).
#
#   bench/flow_overload.sh [--requests N] [--pods P] [--time-scale X] [--rate R]
#                          [--unloaded-rate U] [--seed S] [--trace FILE] [--out DIR]
#                          [--runs LIST] [--repeat N] [--config-extra TOML] [--port-base PORT]
#
# Rates are in the trace's own time (as in the simulator): `--rate` 3 (overload), `--unloaded-rate`
# 0.5 (the reference); with `--pods` 4 that is the simulator's 8 pods at 6× and 1×. The mock pods
# run `--time-scale` X (default 2) times faster than wall time, so loadgen replays at rate × X, and
# the queue TTL is 30 s of model time (30,000 / X ms of wall time) and the gateway scrapes the pods
# every 50 ms of model time (the simulator's default; 50 / X ms of wall time). Requests: the first N
# (default 800) of the trace (default: the Mooncake conversation trace).
#
# Runs (`--runs`, comma-separated, default all, each on fresh pods and a fresh gateway):
#   unloaded   the trace at --unloaded-rate, flow control off: the reference TTFTs
#   off, on    the trace at --rate, flow control off / on (defaults + the scaled TTL)
#   on-noflood on, with the flooding rule off (`bulk_window_ms = 0`: only the queue's bulk
#              tenant is bulk), for the flooding rule's side-by-side
#              (docs/decisions/flow-control.md)
#   off-share, on-share  the same with the noisy tenant thinned to its share
#                (`kvgate loadgen --noisy-keep 0.1`; the other tenants' requests identical)
# --config-extra TOML: text appended to every run's gateway config (after its [flow_control]
#   table, so give it its own table), e.g. $'[router]\nrelative_gate_queue_rule = "off"'.
# Tags: `kvgate loadgen --classes --class-seed S` (the simulator's `workload::classes` tags for
# the same seed: priority 1 for 20 %, 10 tenants, tenant 0 at 10× each other's share).
#
# Prints a Markdown table (p99 TTFT of high priority and its ratio to the unloaded run's, p99 of
# normal priority, p99 of the quiet tenants and its ratio to the same flow setting with the noisy
# tenant at its share, share served per group, errors by kind) and writes each run's loadgen
# report under --out (`--requests-jsonl` lines name each request's pod and its time in kvgate's
# queue). `--repeat N` (default 1) runs the whole list N times, round r under --out/rep<r>,
# prints each round's table, then the median [range] of each ratio over the rounds (ratios
# within a round: a run and its reference side by side; a round without an `unloaded` run takes
# the one already in --out, e.g. `--runs unloaded` once, then `--runs on,on-share --repeat 3`
# with the same --out). The quiet tenants' p99 is the
# 11th-slowest of ~1,100 first tokens at 2,400 requests, so single rounds scatter (BENCHMARKS.md
# "Flow control under overload"). Needs: cargo, curl, python3 (standard library only).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

requests=800
pods=4
time_scale=2
rate=3
unloaded_rate=0.5
seed=1
trace="$root/../shared/traces/mooncake_fast25_conversation_trace.jsonl"
out="$root/target/bench-flow"
runs="unloaded,off,on,off-share,on-share"
repeat=1
config_extra=""
port_base=18600
while [ $# -gt 0 ]; do
  case "$1" in
    --requests) requests=$2; shift 2 ;;
    --pods) pods=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --unloaded-rate) unloaded_rate=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --trace) trace=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --config-extra) config_extra=$2; shift 2 ;;
    --port-base) port_base=$2; shift 2 ;;
    -h|--help) sed -n '2,39p' "$0"; exit 0 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
done
pod_port=$port_base
gw_port=$((port_base + 50))
admin_port=$((port_base + 51))
mkdir -p "$out"
base_out=$out  # --repeat: each round writes under $base_out/rep<r>; the configs stay here

if [ -z "${KVGATE_BIN:-}" ]; then
  echo "== building kvgate (release)"
  cargo build --release -q -p kvgate || exit 1
  KVGATE_BIN="${CARGO_TARGET_DIR:-$root/target}/release/kvgate"
fi
kvgate=$KVGATE_BIN

ttl_ms=$(python3 -c "print(round(30000 / $time_scale))")
scrape_ms=$(python3 -c "print(max(1, round(50 / $time_scale)))")
cat >"$out/flow-on.toml" <<EOF
[flow_control]
enabled = true
queue_ttl_ms = $ttl_ms
EOF
{ cat "$out/flow-on.toml"; echo "bulk_window_ms = 0"; } >"$out/flow-noflood.toml"
: >"$out/flow-off.toml"
if [ -n "$config_extra" ]; then
  for f in on noflood off; do printf '%s\n' "$config_extra" >>"$out/flow-$f.toml"; done
fi

. bench/lib.sh  # pids, cleanup (on exit too), wait_http (the script has cd-ed to the repo root)


# run NAME RATE FLOW(on|off) NOISY_KEEP
run() {
  local name=$1 r=$2 flow=$3 keep=$4 i
  echo "== $name (rate $r, flow $flow, noisy keep $keep)"
  "$kvgate" mock-pod --count "$pods" --listen "127.0.0.1:$pod_port" --time-scale "$time_scale" \
    >"$out/$name-pods.log" 2>&1 &
  pids+=($!)
  for ((i = 0; i < pods; i++)); do
    wait_http "http://127.0.0.1:$((pod_port + i))/health" 30 || { echo "!! pod $i did not start"; cleanup; return 1; }
  done
  local flags=()
  for ((i = 0; i < pods; i++)); do flags+=(--pod "http://127.0.0.1:$((pod_port + i))"); done
  "$kvgate" serve --listen "127.0.0.1:$gw_port" --admin-listen "127.0.0.1:$admin_port" \
    --config "$base_out/flow-$flow.toml" --seed "$seed" --scrape-interval-ms "$scrape_ms" "${flags[@]}" \
    --max-concurrent-requests 4096 --max-queued-requests 4096 >"$out/$name-gateway.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$admin_port/readyz" 30 || { echo "!! gateway not ready"; cleanup; return 1; }
  local metrics=()
  for ((i = 0; i < pods; i++)); do metrics+=(--pod-metrics "http://127.0.0.1:$((pod_port + i))"); done
  "$kvgate" loadgen --target "http://127.0.0.1:$gw_port" --trace "$trace" --max-requests "$requests" \
    --rate-scale "$(python3 -c "print($r * $time_scale)")" --stream --max-concurrency 4096 \
    --classes --class-seed "$seed" --noisy-keep "$keep" "${metrics[@]}" \
    --json "$out/$name.json" --requests-jsonl "$out/$name-requests.jsonl" \
    >"$out/$name-loadgen.log" 2>&1
  tail -n 8 "$out/$name-loadgen.log"
  curl -fsS "http://127.0.0.1:$admin_port/metrics" >"$out/$name-gateway.metrics" 2>/dev/null
  cleanup
}

IFS=, read -ra wanted <<<"$runs"
for ((rep = 1; rep <= repeat; rep++)); do
if [ "$repeat" -gt 1 ]; then
  out="$base_out/rep$rep"; mkdir -p "$out"
  echo "== round $rep of $repeat (load average $(cut -d' ' -f1-3 /proc/loadavg))"
fi
for w in "${wanted[@]}"; do
  case "$w" in
    unloaded) run unloaded "$unloaded_rate" off 1 ;;
    off) run off "$rate" off 1 ;;
    on) run on "$rate" on 1 ;;
    on-noflood) run on-noflood "$rate" noflood 1 ;;
    off-share) run off-share "$rate" off 0.1 ;;
    on-share) run on-share "$rate" on 0.1 ;;
    *) echo "unknown run $w" >&2; exit 2 ;;
  esac
done

python3 - "$out" "$time_scale" "$requests" "$pods" "$rate" "$unloaded_rate" "$seed" "$base_out" <<'EOF'
import json, os, sys
out, ts, n, pods, rate, unl, seed, base_out = sys.argv[1:]
def load(name, d=out):
    p = f"{d}/{name}.json"
    return json.load(open(p)) if os.path.exists(p) else None
r = {k: load(k) for k in ["unloaded", "off", "on", "on-noflood", "off-share", "on-share"]}
# With --repeat, a round without its own unloaded run uses the one in --out (run once before).
if r["unloaded"] is None and base_out != out:
    r["unloaded"] = load("unloaded", base_out)
ratios = {}
ts = float(ts)
print(f"\n{n} requests, {pods} mock pods at time scale {ts:g}, rate {rate}× (unloaded {unl}×), class seed {seed}; "
      "TTFTs in model ms (wall × time scale)\n")
print("| run | high p99 | ÷ unloaded | normal p99 | quiet tenants p99 | ÷ at share | high served | normal served | quiet served | noisy served | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
base = r["unloaded"]["classes"]["high"]["ttft_ms"]["p99"] if r["unloaded"] else None
for name, rep in r.items():
    if rep is None:
        continue
    c = rep["classes"]
    hp = c["high"]["ttft_ms"]["p99"]
    qp = c["quiet_tenants"]["ttft_ms"]["p99"]
    share = {"off": "off-share", "on": "on-share", "on-noflood": "on-share"}.get(name, name)
    ref = r.get(share)
    ratio_q = f"{qp / ref['classes']['quiet_tenants']['ttft_ms']['p99']:.2f}" if ref and name in ("off", "on", "on-noflood") else "—"
    ratio_h = f"{hp / base:.2f}" if base else "—"
    served = lambda g: f"{100 * c[g]['served'] / max(c[g]['requests'], 1):.1f} %"
    errs = ", ".join(f"{k} {v}" for k, v in sorted(rep["errors"].items())) or "none"
    print(f"| {name} | {hp * ts:,.0f} ms | {ratio_h} | {c['normal']['ttft_ms']['p99'] * ts:,.0f} ms | {qp * ts:,.0f} ms | {ratio_q} | "
          f"{served('high')} | {served('normal')} | {served('quiet_tenants')} | {served('noisy_tenant')} | {errs} |")
    ratios[name] = {"high_p99_ms": hp * ts, "quiet_p99_ms": qp * ts,
                    "high_vs_unloaded": hp / base if base else None,
                    "quiet_vs_share": float(ratio_q) if ratio_q != "—" else None}
json.dump(ratios, open(f"{out}/ratios.json", "w"), indent=1)
EOF
done

if [ "$repeat" -gt 1 ]; then
python3 - "$base_out" "$repeat" <<'EOF'
import json, statistics, sys
base, n = sys.argv[1], int(sys.argv[2])
rounds = [json.load(open(f"{base}/rep{i}/ratios.json")) for i in range(1, n + 1)]
print(f"\nmedian [min–max] over {n} rounds\n")
print("| run | high p99 ms | high ÷ unloaded | quiet tenants p99 ms | quiet ÷ at share |")
print("|---|---|---|---|---|")
def cell(vals, fmt):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    return f"{fmt(statistics.median(vals))} [{fmt(min(vals))}–{fmt(max(vals))}]"
for name in rounds[0]:
    col = lambda k: [r.get(name, {}).get(k) for r in rounds]
    ms = lambda v: f"{v:,.0f}"
    x = lambda v: f"{v:.2f}"
    print(f"| {name} | {cell(col('high_p99_ms'), ms)} | {cell(col('high_vs_unloaded'), x)} | "
          f"{cell(col('quiet_p99_ms'), ms)} | {cell(col('quiet_vs_share'), x)} |")
EOF
fi
