#!/usr/bin/env python3
"""The simulator against the real pods (issue 42): `kvgate sim` replays the workloads that
scripts/real-vllm/peers.sh ran on real vLLM pods, with the profile `kvgate calibrate` fitted on
them, and prints both side by side. Python standard library only.

    sim_check.py OUT_DIR [--kvgate BIN] [--profile FILE] [--workload W ...] [--keep-disturbed]

OUT_DIR is a peers.sh directory run with TOKEN_PROMPTS=1 (the pods then see exactly the lengths
and the sharing the simulator replays) and CALIBRATE=1 (OUT_DIR/profile.json; --profile names
another). Each peers.sh router that is a kvgate policy is simulated under that policy:
kvgate-routed → affinity-gate, round-robin, latency, least-request, sglang-cache-aware,
llmd-chain. Per round k the simulator replays what round k replayed (the Mooncake slice, or
the generator with --workload-seed k when WORKLOAD_SEED=round) with router seed k, on NPODS
pods, at the same rate scale.

Per policy it prints the MEDIAN over the kept rounds (disturbed runs left out) of the real runs'
TTFT mean, p50, p90, p99, TPOT mean and the pods' hit rate, the simulator's median over the same
rounds, and sim ÷ real. Then the rankings by median mean TTFT, real and simulated; two policies
whose real per-round ratio of mean TTFT has a bootstrap 90 % interval containing 1 are a tie
(their order is within the real runs' noise), and the ranking check counts a pair only when the
real runs separate it.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers_table as pt  # noqa: E402

POLICY = {"kvgate-routed": "affinity-gate", "round-robin": "round-robin", "latency": "latency",
          "least-request": "least-request", "sglang-cache-aware": "sglang-cache-aware",
          "llmd-chain": "llmd-chain"}
KEYS = [("TTFT mean", "ttft_mean"), ("p50", "ttft_p50"), ("p90", "ttft_p90"), ("p99", "ttft_p99"),
        ("TPOT mean", "tpot_mean"), ("hit %", "hit")]


def real_figures(cell):
    """A real run's figures (peers_table's, plus TTFT p50 and mean TPOT), from its records."""
    ttft, tpot = [], []
    for r in cell.records:
        if r.get("error") is not None or r.get("ttft_ms") is None:
            continue
        ttft.append(r["ttft_ms"])
        out = r.get("output_tokens") or 0
        if out >= 2:
            tpot.append((r["e2e_ms"] - r["ttft_ms"]) / (out - 1))
    ttft.sort()
    f = dict(cell.m)
    f["ttft_p50"] = pt.nearest_rank(ttft, 0.50)
    f["tpot_mean"] = sum(tpot) / len(tpot) if tpot else None
    f["hit"] = None if cell.m["hit"] is None else 100 * cell.m["hit"]
    return f


def sim_args(params, k, out_dir):
    """The `kvgate sim` workload arguments replaying round k of a peers.sh workload."""
    w = params["workload"]
    if w == "mooncake":
        args = ["--trace", os.path.join(out_dir, w, "slice.jsonl")]
    else:
        seed = params.get("workload_seed", "1")
        seed = str(k) if seed == "round" else seed
        args = ["--workload", w, "--workload-seed", seed, "--max-requests", params["requests"]]
        if w == "shared-prefix":
            args += ["--preset", params["preset"]]
        if w in ("chat", "agent"):
            args += ["--max-context-tokens", params["max_context_tokens"]]
            if params.get("agent_compact_every"):
                args += ["--agent-compact-every", params["agent_compact_every"]]
    return args + ["--rate-scale", params["rate_scale"], "--pods", params.get("npods", "2")]


def simulate(kvgate, profile, params, k, policies, out_dir):
    """{policy: figures} of the simulator's run of round k."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sim.json")
        cmd = [kvgate, "sim", *sim_args(params, k, out_dir), "--profile", profile,
               "--policy", ",".join(policies), "--seed", str(k), "--json", path, "--quiet"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        runs = json.load(open(path))["runs"]
    out = {}
    for r in runs:
        out[r["policy"]] = {"ttft_mean": r["ttft_ms"]["mean"], "ttft_p50": r["ttft_ms"]["p50"],
                            "ttft_p90": r["ttft_ms"]["p90"], "ttft_p99": r["ttft_ms"]["p99"],
                            "tpot_mean": r["tpot_ms"]["mean"], "hit": 100 * r["prefix_hit_rate"]}
    return out


def fmt(x):
    return "n/a" if x is None else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def report(out_dir, w, kvgate, profile, keep_disturbed, resamples):
    wdir = os.path.join(out_dir, w)
    params = {k: str(v) for k, v in (pt.load_json(os.path.join(wdir, "params.json")) or {}).items()}
    if params.get("token_prompts") != "1":
        print(f"!! {wdir}: not run with TOKEN_PROMPTS=1: the pods saw text, the simulator would "
              "replay other lengths; skipped", file=sys.stderr)
        return
    cells = pt.load_workload(wdir)
    routers = sorted({name for (_, name) in cells if name in POLICY},
                     key=lambda n: list(POLICY).index(n))
    rounds = sorted({k for (k, name) in cells if name in POLICY})
    real = {n: {} for n in routers}
    for (k, name), c in cells.items():
        if name in POLICY and (keep_disturbed or not c.disturbed):
            real[name][k] = real_figures(c)
    # A router whose every run was disturbed has nothing to compare.
    routers = [n for n in routers if real[n]]
    if not routers:
        print(f"!! {wdir}: no kept run of a kvgate policy", file=sys.stderr)
        return
    policies = [POLICY[n] for n in routers]
    sim = {k: simulate(kvgate, profile, params, k, policies, out_dir) for k in rounds}
    print(f"\n### {w}: {params.get('npods', '2')} pod(s), {params['requests']} requests, rate ×{params['rate_scale']}"
          f" — real (median of kept rounds) / simulated (median of the same rounds)\n")
    print("| policy | rounds | " + " | ".join(f"{h} real / sim" for h, _ in KEYS)
          + " | sim ÷ real mean | p90 | TPOT |")
    print("|---|---:|" + "---:|" * (len(KEYS) + 3))
    med_real, med_sim = {}, {}
    for n in routers:
        ks = sorted(real[n])
        r = {key: pt.median([real[n][k][key] for k in ks if real[n][k][key] is not None]) for _, key in KEYS}
        s = {key: pt.median([sim[k][POLICY[n]][key] for k in ks]) for _, key in KEYS}
        med_real[n], med_sim[n] = r, s
        cols = " | ".join(f"{fmt(r[key])} / {fmt(s[key])}" for _, key in KEYS)
        ratio = lambda key: "n/a" if not r[key] or s[key] is None else f"{s[key] / r[key]:.2f}"
        print(f"| {POLICY[n]} | {len(ks)} | {cols} | {ratio('ttft_mean')} | {ratio('ttft_p90')} | {ratio('tpot_mean')} |")
    if len(routers) < 2:
        return
    rank = lambda d: sorted(routers, key=lambda n: d[n]["ttft_mean"])
    print("\nranking by mean TTFT, real: " + ", ".join(POLICY[n] for n in rank(med_real)))
    print("ranking by mean TTFT, sim:  " + ", ".join(POLICY[n] for n in rank(med_sim)))
    agree = disagree = ties = 0
    for i, a in enumerate(routers):
        for b in routers[i + 1:]:
            ratios = [x for _, x in pt.paired_ratios(cells, a, "ttft_mean", base=b, keep_disturbed=keep_disturbed)]
            m, lo, hi = pt.bootstrap_median(ratios, resamples, f"{w}/{a}/{b}")
            if m is None or lo is None or lo <= 1.0 <= hi:
                ties += 1
                continue
            real_a_first = m < 1.0
            sim_a_first = med_sim[a]["ttft_mean"] < med_sim[b]["ttft_mean"]
            if real_a_first == sim_a_first:
                agree += 1
            else:
                disagree += 1
                print(f"  order differs: real {POLICY[a]} ÷ {POLICY[b]} ×{m:.2f} [{lo:.2f}–{hi:.2f}], "
                      f"sim ×{med_sim[a]['ttft_mean'] / med_sim[b]['ttft_mean']:.2f}")
    print(f"pairs the real runs separate: {agree + disagree} ({agree} in the same order in the simulator,"
          f" {disagree} not); pairs within the real runs' noise (ties): {ties}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--kvgate", default=os.path.join(os.path.dirname(__file__), "../../target/release/kvgate"))
    ap.add_argument("--profile", help="default: OUT_DIR/profile.json")
    ap.add_argument("--workload", action="append")
    ap.add_argument("--keep-disturbed", action="store_true")
    ap.add_argument("--resamples", type=int, default=10000)
    a = ap.parse_args(argv)
    profile = a.profile or os.path.join(a.out_dir, "profile.json")
    if not os.path.isfile(profile):
        sys.exit(f"no profile at {profile}: run peers.sh with CALIBRATE=1, or give --profile")
    workloads = a.workload or sorted(d for d in os.listdir(a.out_dir)
                                     if os.path.isfile(os.path.join(a.out_dir, d, "params.json")))
    print(f"profile: {profile}")
    print(json.dumps(pt.load_json(profile)))
    for w in workloads:
        report(a.out_dir, w, a.kvgate, profile, a.keep_disturbed, a.resamples)


if __name__ == "__main__":
    main()
