"""The table of scripts/real-vllm/peers.sh from its JSON files (re-runnable on their own):
every run, then each router's median over the runs with its ratio to kvgate-routed.
Usage: python peers_table.py OUT_DIR ROUTER,ROUTER,... RUNS
"""
import json, os, statistics, sys
out, routers, runs = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
keys = [("TTFT mean", "ttft_ms", "mean"), ("TTFT p50", "ttft_ms", "p50"), ("TTFT p90", "ttft_ms", "p90"),
        ("TTFT p99", "ttft_ms", "p99"), ("TPOT p50", "tpot_ms", "p50"), ("TPOT p99", "tpot_ms", "p99")]
def load(name, r):
    p = f"{out}/{name}-{r}.json"
    return json.load(open(p)) if os.path.exists(p) else None
print("| router | run | " + " | ".join(k[0] + " ms" for k in keys) + " | out tok/s | hit % | errors |")
print("|---|---:|" + "---:|" * (len(keys) + 3))
means = {}
for name in routers:
    rows = [x for x in (load(name, r) for r in range(1, runs + 1)) if x]
    for r, x in enumerate(rows, 1):
        errs = sum(x.get("errors", {}).values())
        hit = x.get("prefix_hit_rate")
        hit = "n/a" if hit is None else f"{100 * hit:.1f}"
        print(f"| {name} | {r} | " + " | ".join(f"{x[a][b]:.0f}" for _, a, b in keys)
              + f" | {x['output_tok_per_s']:.0f} | {hit} | {errs} |")
    if rows:
        means[name] = {k[0]: statistics.median(x[k[1]][k[2]] for x in rows) for k in keys}
        means[name]["tok/s"] = statistics.median(x["output_tok_per_s"] for x in rows)
        means[name]["hit"] = statistics.median(100 * (x.get("prefix_hit_rate") or 0) for x in rows)
        means[name]["errors"] = sum(sum(x.get("errors", {}).values()) for x in rows)
        means[name]["n"] = len(rows)
base = means.get("kvgate-routed")
print("\nMedian of the runs (ratio to kvgate-routed's median; errors: total):\n")
print("| router | runs | " + " | ".join(k[0] + " ms" for k in keys) + " | out tok/s | hit % | errors |")
print("|---|---:|" + "---:|" * (len(keys) + 3))
for name, m in means.items():
    cells = []
    for k in keys:
        v = m[k[0]]
        ratio = f" (×{v / base[k[0]]:.2f})" if base and name != "kvgate-routed" else ""
        cells.append(f"{v:.0f}{ratio}")
    print(f"| {name} | {m['n']} | " + " | ".join(cells) + f" | {m['tok/s']:.0f} | {m['hit']:.1f} | {m['errors']} |")
