#!/usr/bin/env python3
"""Markdown tables from `kvgate sim --json` outputs (standard library only).

    scripts/sim_tables.py SUBCOMMAND ARGS...      (scripts/sim_tables.py SUBCOMMAND -h for each)

Ratios are printed as mean [min–max] over the seeds, each seed against the same seed's reference;
other figures are means over the seeds. "gate e/x/n/l" is the gate's explore / exploit /
no_sticky / load_break count per run.

sim OUT.json [--focus POLICY]
    Per rate scale: every policy's mean / p50 / p99 TTFT, prefix hit rate, pod busy fraction,
    pods used and gate branches; then the focus policy's (default affinity-gate) mean and p99
    TTFT against the best peer policy (the best of round-robin … llmd-chain for that metric, per
    seed) and against `latency`.
gate PEERS.json VARIANT.json...
    PEERS.json is a `--policy all` run; each VARIANT.json an `--policy affinity-gate` run with
    some router config on the same workload, pods, rate scales and seeds (its file name names the
    variant). Per rate scale and variant: mean and p99 TTFT against the best peer (round-robin …
    dynamo-kv, without `llmd-chain`) and against `latency`; hit rate; pods used; gate branches.
peer-ratio PEERS.json [VARIANT.json...]
    As `gate`, but the best peer is the best of every policy in PEERS.json that is not kvgate's
    own (`affinity-gate`, `latency`), `llmd-chain` included, and named; with mean / p99 TTFT and
    TPOT p50.
variant BASE.json VARIANT.json...
    `--policy affinity-gate` runs of one workload side by side (file names name them). Per rate
    scale: mean / p99 TTFT and their ratios to BASE, hit rate, SLO goodput when the runs had SLOs,
    and the τ / ε the gate had at the end (`gate_state`).
predictor [--policy POLICY] [NAME=]FILE.json...
    Each file's runs are labelled NAME, else by the file's `router_config.predictor_model`.
    Accuracy of the focus policy (default affinity-gate): busy %, TTFT and TPOT MAPE % (the chosen
    pod's predictions), TTFT coverage % (TTFT ≤ predicted), the predictor's own online p90
    coverage; then its mean / p99 TTFT and hit rate per label against the best baseline (lowest
    mean TTFT among round-robin … dynamo-kv in any file at that rate).
predictor-cross [--fit WORKLOAD] WORKLOAD:MODEL=FILE.json...
    affinity-gate runs. Per workload and rate: busy %, queued % (pod scrapes with waiting
    requests), and per model the TTFT MAPE % and the predictor's own p90 coverage %; a summary
    per model over the held-out workloads (all but --fit): the worst MAPE at ≤ 95 % busy and
    above, the mean, the coverage range, against the aims (≤ 10 %, ≤ 15 %, 85–95 %); then mean /
    p99 TTFT per model and its ratio to the first model's.
mape-by-tenth LABEL=FILE.json...
    affinity-gate runs: the TTFT MAPE % over the whole run, over the first tenth of the requests
    (arrival order), the second, the last eight tenths (`predictor.ttft_mape_by_tenth`), and the
    share of the error in the first tenth: where the error sits, cold start or warm predictor.
step-phase WORKLOAD=FILE.json...
    affinity-gate runs: busy %, the share of requests dispatched to a pod in mid-step, that
    wait's mean (ms) and mean share of the observed TTFT, the TTFT MAPE %, the MAPE knowing the
    wait (`predictor.step_phase`), and the share of the error that is the step phase alone.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

# The peers of `sim` (every non-kvgate policy `--policy all` runs but `lora-affinity`), and of
# `gate` and `predictor` (the same without upstream's `llmd-chain`, which came later).
PEERS = ["round-robin", "random", "least-request", "least-kv", "prefix", "weighted",
         "sglang-cache-aware", "dynamo-kv", "llmd-chain"]
PEERS_NO_CHAIN = PEERS[:-1]
OWN = {"affinity-gate", "latency"}
GATE = "affinity-gate"


# ---------------------------------------------------------------------------------------------
# One loader


def load(path):
    """A `kvgate sim --json` report."""
    with open(path) as f:
        return json.load(f)


def labelled(arg):
    """LABEL=path → (LABEL, path); a bare path → (None, path)."""
    return tuple(arg.split("=", 1)) if "=" in arg else (None, arg)


def file_label(path):
    """A variant file's name without `.json`: the variant."""
    return os.path.basename(path).removesuffix(".json")


def by_seed(runs, key):
    """key(run) → seed → run (a later run of the same key and seed replaces an earlier one)."""
    by = defaultdict(dict)
    for r in runs:
        by[key(r)][r["seed"]] = r
    return by


def by_rate_policy(runs):
    return by_seed(runs, lambda r: (r["rate_scale"], r["policy"]))


def grouped(args, policy=GATE):
    """LABEL=file.json arguments → (keys in first-seen order, (LABEL, rate) → the policy's runs)."""
    cells = defaultdict(list)
    order = []
    for arg in args:
        label, path = arg.split("=", 1)
        for r in load(path)["runs"]:
            if r["policy"] == policy:
                key = (label, r["rate_scale"])
                if key not in order:
                    order.append(key)
                cells[key].append(r)
    return order, cells


# ---------------------------------------------------------------------------------------------
# Figures and one Markdown table printer


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def spread(xs):
    """mean [min–max], or n/a."""
    return f"{mean(xs):.3f} [{min(xs):.3f}–{max(xs):.3f}]" if xs else "n/a"


def pods_used(run):
    return sum(1 for s in run.get("pod_samples", []) if any(x["running"] + x["waiting"] > 0 for x in s))


def branches(runs):
    """The gate's explore/exploit/no_sticky/load_break counts, rounded means over runs."""
    runs = list(runs)
    g = lambda k: round(mean(r["gate"][k] for r in runs))
    return f"{g('explore')}/{g('exploit')}/{g('no_sticky')}/{g('load_break')}"


def table(head, align, rows):
    """A Markdown table: head's cells, align one letter per column (l: text, r: number), rows."""
    line = lambda cells: "| " + " | ".join(cells) + " |"
    print(line(head))
    print("|" + "".join("---:|" if a == "r" else "---|" for a in align))
    for row in rows:
        print(line(row))


# ---------------------------------------------------------------------------------------------
# Subcommands


def cmd_sim(a):
    report = load(a.file)
    runs = report["runs"]
    by = by_rate_policy(runs)
    rates = sorted({r["rate_scale"] for r in runs})
    policies = list(dict.fromkeys(r["policy"] for r in runs))
    wl = report["workload"]
    print(f"workload: {wl.get('source') or wl['params']['kind']}, {wl['request_count']} requests, "
          f"{report['pods']} pods × {report['profile']}\n")
    for rate in rates:
        print(f"### rate scale {rate}\n")
        rows = []
        for p in policies:
            seeds = by.get((rate, p), {})
            if not seeds:
                continue
            avg = lambda f: mean(f(r) for r in seeds.values())
            rows.append([p, f"{avg(lambda r: r['ttft_ms']['mean']):.1f}", f"{avg(lambda r: r['ttft_ms']['p50']):.1f}",
                         f"{avg(lambda r: r['ttft_ms']['p99']):.1f}", f"{100 * avg(lambda r: r['prefix_hit_rate']):.1f}",
                         f"{100 * avg(lambda r: r['mean_pod_busy']):.1f}", f"{avg(pods_used):.1f}",
                         branches(seeds.values())])
        table(["policy", "TTFT mean ms", "p50", "p99", "hit %", "busy %", "pods used", "gate e/x/n/l"],
              "lrrrrrrl", rows)
        focus_seeds = by.get((rate, a.focus), {})
        if focus_seeds:
            print()
            for metric in ["mean", "p99"]:
                vs_peer, vs_lat, best_names = [], [], []
                for seed, r in focus_seeds.items():
                    peers = [(by[(rate, q)][seed]["ttft_ms"][metric], q) for q in PEERS if seed in by.get((rate, q), {})]
                    if peers:
                        best, name = min(peers)
                        vs_peer.append(r["ttft_ms"][metric] / best)
                        best_names.append(name)
                    lat = by.get((rate, "latency"), {}).get(seed)
                    if lat:
                        vs_lat.append(r["ttft_ms"][metric] / lat["ttft_ms"][metric])
                names = ", ".join(sorted(set(best_names)))
                print(f"- {a.focus} / best peer ({names}), {metric} TTFT: {spread(vs_peer)}; / latency: {spread(vs_lat)}")
            print()


def cmd_gate(a):
    peers = by_rate_policy(load(a.peers)["runs"])
    variants = [(file_label(p), by_rate_policy(load(p)["runs"])) for p in a.variants]
    for rate in sorted({rate for (rate, _) in peers}):
        print(f"\n### rate scale {rate}\n")
        rows = []
        for name, by in [("affinity-gate (as run with the peers)", peers)] + variants:
            seeds = by.get((rate, GATE), {})
            if not seeds:
                continue
            cols = []
            for key in ["mean", "p99"]:
                xs = []
                for seed, r in seeds.items():
                    best = [peers[(rate, q)][seed]["ttft_ms"][key] for q in PEERS_NO_CHAIN if seed in peers.get((rate, q), {})]
                    if best:
                        xs.append(r["ttft_ms"][key] / min(best))
                cols.append(spread(xs))
            for key in ["mean", "p99"]:
                cols.append(spread([r["ttft_ms"][key] / peers[(rate, "latency")][s]["ttft_ms"][key]
                                    for s, r in seeds.items() if s in peers.get((rate, "latency"), {})]))
            hit = 100 * sum(r["prefix_hit_rate"] for r in seeds.values()) / len(seeds)
            used = mean(pods_used(r) for r in seeds.values())
            rows.append([name, *cols, f"{hit:.1f}", f"{used:.1f}", branches(seeds.values())])
        table(["variant", "mean / best peer", "p99 / best peer", "mean / latency", "p99 / latency", "hit %",
               "pods used", "gate e/x/n/l"], "lllllrrl", rows)


def cmd_peer_ratio(a):
    peer_runs = load(a.peers)["runs"]
    peers = by_rate_policy(peer_runs)
    names = sorted({r["policy"] for r in peer_runs} - OWN)
    variants = [("affinity-gate (default, with the peers)", peers)]
    variants += [(file_label(p), by_rate_policy(load(p)["runs"])) for p in a.variants]
    for rate in sorted({rate for (rate, _) in peers}):
        best = {}
        for key in ["mean", "p99"]:
            for seed in {s for (r, _), by in peers.items() if r == rate for s in by}:
                best[(key, seed)] = min((peers[(rate, q)][seed]["ttft_ms"][key], q) for q in names
                                        if seed in peers.get((rate, q), {}))
        named = lambda key: ", ".join(sorted({q for (k, _), (_, q) in best.items() if k == key}))
        print(f"\n#### rate scale {rate}\n")
        print(f"Best peer: mean {named('mean')}; p99 {named('p99')}.\n")
        rows = []
        for name, by in variants:
            seeds = by.get((rate, GATE), {})
            if not seeds:
                continue
            ratio = lambda key: spread([r["ttft_ms"][key] / best[(key, s)][0]
                                        for s, r in seeds.items() if (key, s) in best])
            avg = lambda f: mean(f(r) for r in seeds.values())
            rows.append([name, f"{avg(lambda r: r['ttft_ms']['mean']):.1f}", f"{avg(lambda r: r['ttft_ms']['p99']):.1f}",
                         ratio("mean"), ratio("p99"), f"{avg(lambda r: r['tpot_ms']['p50']):.2f}",
                         f"{100 * avg(lambda r: r['prefix_hit_rate']):.1f}", branches(seeds.values())])
        table(["variant", "TTFT mean ms", "p99 ms", "mean / best peer", "p99 / best peer", "TPOT p50 ms", "hit %",
               "gate e/x/n/l"], "lrrllrrl", rows)


def cmd_variant(a):
    files = [(file_label(p), by_seed(load(p)["runs"], lambda r: r["rate_scale"])) for p in a.files]
    base_name, base = files[0]
    goodput = any("slo_goodput" in r for _, by in files for seeds in by.values() for r in seeds.values())
    for rate in sorted(base):
        print(f"\n#### rate scale {rate:g}\n")
        head = ["variant", "TTFT mean ms", "/ " + base_name, "p99 ms", "/ " + base_name, "hit %"]
        align = "lrrrrr"
        if goodput:
            head.append("goodput %")
            align += "r"
        head.append("final τ / ε")
        align += "l"
        rows = []
        for name, by in files:
            runs = by.get(rate, {})
            seeds = sorted(runs)
            if not seeds:
                continue
            ttft = lambda key: [runs[s]["ttft_ms"][key] for s in seeds]
            vs_base = lambda key: [runs[s]["ttft_ms"][key] / base[rate][s]["ttft_ms"][key] for s in seeds if s in base[rate]]
            hit = mean(runs[s]["prefix_hit_rate"] * 100 for s in seeds)
            row = [name, f"{mean(ttft('mean')):.1f}", spread(vs_base("mean")), f"{mean(ttft('p99')):.1f}",
                   spread(vs_base("p99")), f"{hit:.1f}"]
            if goodput:
                g = [runs[s]["slo_goodput"] * 100 for s in seeds if "slo_goodput" in runs[s]]
                row.append(f"{mean(g):.1f}" if g else "–")
            gs = [runs[s]["gate_state"] for s in seeds if runs[s].get("gate_state")]
            if gs:
                taus = ", ".join(f"{g['affinity_gate_tau']:.2f}" for g in gs)
                eps = ", ".join(f"{g['epsilon_explore_sticky']:.3f}" for g in gs)
                row.append(f"{taus} / {eps}")
            else:
                row.append("–")
            rows.append(row)
        table(head, align, rows)


def cmd_predictor(a):
    focus = defaultdict(list)  # (rate, label) -> runs
    peers = defaultdict(list)  # (rate, policy) -> runs
    labels = []
    for arg in a.files:
        label, path = labelled(arg)
        report = load(path)
        label = label or report["router_config"].get("predictor_model", "rls")
        if label not in labels:
            labels.append(label)
        for r in report["runs"]:
            if r["policy"] == a.policy:
                focus[(r["rate_scale"], label)].append(r)
            elif r["policy"] in PEERS_NO_CHAIN:
                peers[(r["rate_scale"], r["policy"])].append(r)
    rates = sorted({rate for rate, _ in focus})
    avg = lambda runs, f: mean(f(r) for r in runs)
    print(f"#### accuracy ({a.policy})\n")
    rows = []
    for rate in rates:
        for label in labels:
            runs = focus.get((rate, label))
            if not runs:
                continue
            p = lambda f: 100 * avg(runs, f)
            rows.append([f"{rate}", label, f"{p(lambda r: r['mean_pod_busy']):.1f}",
                         f"{p(lambda r: r['predictor']['ttft_mape']):.1f}",
                         f"{p(lambda r: r['predictor']['tpot_mape']):.1f}",
                         f"{p(lambda r: r['predictor'].get('ttft_coverage', float('nan'))):.1f}",
                         f"{p(lambda r: r['predictor']['online']['ttft_p90_coverage']):.1f}"])
    table(["rate", "model", "busy %", "TTFT MAPE %", "TPOT MAPE %", "TTFT ≤ predicted %", "online p90 coverage %"],
          "rlrrrrr", rows)
    print(f"\n#### routing quality ({a.policy} per model vs the best baseline)\n")
    rows = []
    for rate in rates:
        candidates = [(avg(runs, lambda r: r["ttft_ms"]["mean"]), name, runs)
                      for (rt, name), runs in peers.items() if rt == rate]
        best = min(candidates) if candidates else None
        for label in labels:
            runs = focus.get((rate, label))
            if not runs:
                continue
            m = avg(runs, lambda r: r["ttft_ms"]["mean"])
            p99 = avg(runs, lambda r: r["ttft_ms"]["p99"])
            hit = 100 * avg(runs, lambda r: r["prefix_hit_rate"])
            if best:
                bm, _, bruns = best
                ratios = [f"{m / bm:.3f}", f"{p99 / avg(bruns, lambda r: r['ttft_ms']['p99']):.3f}"]
            else:
                ratios = ["n/a", "n/a"]
            rows.append([f"{rate}", f"{a.policy} ({label})", f"{m:.1f}", f"{p99:.1f}", f"{hit:.1f}", *ratios])
        if best:
            bm, name, bruns = best
            rows.append([f"{rate}", f"best baseline: {name}", f"{bm:.1f}",
                         f"{avg(bruns, lambda r: r['ttft_ms']['p99']):.1f}",
                         f"{100 * avg(bruns, lambda r: r['prefix_hit_rate']):.1f}", "1", "1"])
    table(["rate", "driven by", "TTFT mean ms", "p99", "hit %", "mean / best baseline", "p99 / best baseline"],
          "rlrrrrr", rows)
    print()


def queued_share(run):
    samples = [s for pod in run.get("pod_samples", []) for s in pod]
    return mean(1.0 if s["waiting"] > 0 else 0.0 for s in samples) if samples else 0.0


def cmd_predictor_cross(a):
    cells = defaultdict(list)  # (workload, rate, model) -> runs
    workloads, models = [], []
    for arg in a.files:
        key, path = arg.split("=", 1)
        workload, model = key.split(":", 1)
        workloads += [workload] if workload not in workloads else []
        models += [model] if model not in models else []
        for r in load(path)["runs"]:
            if r["policy"] == GATE:
                cells[(workload, r["rate_scale"], model)].append(r)
    rates = lambda w: sorted({rt for (wl, rt, _) in cells if wl == w})
    summary = defaultdict(lambda: {"busy": [], "queued": [], "all": [], "cov": []})
    rows = []
    for w in workloads:
        for rate in rates(w):
            base = cells.get((w, rate, models[0]), [])
            busy = 100 * mean(r["mean_pod_busy"] for r in base)
            queued = 100 * mean(queued_share(r) for r in base)
            row = [f"{w}{' (fit)' if w == a.fit else ''}", f"{rate:g}", f"{busy:.1f}", f"{queued:.1f}"]
            for m in models:
                runs = cells.get((w, rate, m), [])
                mape = 100 * mean(r["predictor"]["ttft_mape"] for r in runs)
                cov = 100 * mean(r["predictor"]["online"]["ttft_p90_coverage"] for r in runs)
                row += [f"{mape:.1f}", f"{cov:.1f}"]
                if w != a.fit and runs:
                    s = summary[m]
                    s["all"].append(mape)
                    s["cov"].append(cov)
                    s["busy" if busy <= 95.0 else "queued"].append(mape)
            rows.append(row)
    table(["workload", "rate", "busy %", "queued %", *(f"{m} {c}" for m in models for c in ["MAPE", "p90 cov"])],
          "lrrr" + "rr" * len(models), rows)
    print()
    worst = lambda xs: f"{max(xs):.1f}" if xs else "–"
    table(["model (held out)", "worst MAPE ≤ 95 % busy (aim ≤ 10)", "worst MAPE > 95 % busy (aim ≤ 15)",
           "worst MAPE, all", "mean MAPE", "p90 coverage range (aim 85–95)"], "lrrrrl",
          [[m, worst(s["busy"]), worst(s["queued"]), worst(s["all"]), f"{mean(s['all']):.1f}",
            f"{min(s['cov']):.1f}–{max(s['cov']):.1f}" if s["cov"] else "–"]
           for m, s in ((m, summary[m]) for m in models)])
    print()
    rows = []
    for w in workloads:
        for rate in rates(w):
            stat = {}
            for m in models:
                runs = cells.get((w, rate, m), [])
                stat[m] = (mean(r["ttft_ms"]["mean"] for r in runs), mean(r["ttft_ms"]["p99"] for r in runs))
            b = stat[models[0]]
            rows.append([w, f"{rate:g}", *(f"{stat[m][0]:.1f} / {stat[m][1]:.0f}" for m in models),
                         *(f"{stat[m][0] / b[0]:.3f}, {stat[m][1] / b[1]:.3f}" for m in models[1:])])
    table(["workload", "rate", *(f"{m} TTFT mean / p99 ms" for m in models),
           *(f"{m} mean, p99 / {models[0]}" for m in models[1:])], "lr" + "r" * (2 * len(models) - 1), rows)


def cmd_mape_by_tenth(a):
    order, cells = grouped(a.files)
    rows = []
    for label, rate in order:
        runs = cells[(label, rate)]
        tenths = [r["predictor"]["ttft_mape_by_tenth"] for r in runs]
        whole = 100 * mean(r["predictor"]["ttft_mape"] for r in runs)
        share = mean(t[0] / max(sum(t), 1e-12) for t in tenths)
        rows.append([label, f"{rate:g}", f"{whole:.1f}", f"{100 * mean(t[0] for t in tenths):.1f}",
                     f"{100 * mean(t[1] for t in tenths):.1f}", f"{100 * mean(mean(t[2:]) for t in tenths):.1f}",
                     f"{100 * share:.0f} %"])
    table(["run", "rate", "TTFT MAPE %", "first tenth %", "second tenth %", "last 8 tenths %",
           "share of the error in the first tenth"], "lrrrrrr", rows)


def cmd_step_phase(a):
    order, cells = grouped(a.files)
    rows = []
    for label, rate in order:
        runs = cells[(label, rate)]
        ph = [r["predictor"]["step_phase"] for r in runs]
        mape = 100 * mean(p["ttft_mape"] for p in ph)
        known = 100 * mean(p["ttft_mape_phase_known"] for p in ph)
        part = (mape - known) / mape if mape > 0 else float("nan")
        rows.append([label, f"{rate:g}", f"{100 * mean(r['mean_pod_busy'] for r in runs):.1f}",
                     f"{100 * mean(p['busy_requests'] / max(p['requests'], 1) for p in ph):.1f}",
                     f"{mean(p['mean_wait_ms'] for p in ph):.1f}", f"{mean(p['mean_wait_share'] for p in ph):.2f}",
                     f"{mape:.1f}", f"{known:.1f}", f"{part:.0%}"])
    table(["workload", "rate", "busy %", "dispatched mid-step %", "mean wait ms", "wait ÷ TTFT", "TTFT MAPE %",
           "MAPE knowing the wait %", "share of the error that is the phase"], "lrrrrrrrr", rows)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="sim_tables.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    p = sub.add_parser("sim", help="every policy of one run, and the focus policy against the best peer")
    p.add_argument("file", metavar="OUT.json")
    p.add_argument("--focus", default=GATE)
    p.set_defaults(run=cmd_sim)
    p = sub.add_parser("gate", help="affinity-gate variants against the peers (without llmd-chain) and latency")
    p.add_argument("peers", metavar="PEERS.json")
    p.add_argument("variants", metavar="VARIANT.json", nargs="+")
    p.set_defaults(run=cmd_gate)
    p = sub.add_parser("peer-ratio", help="affinity-gate variants against every peer, the best one named")
    p.add_argument("peers", metavar="PEERS.json")
    p.add_argument("variants", metavar="VARIANT.json", nargs="*")
    p.set_defaults(run=cmd_peer_ratio)
    p = sub.add_parser("variant", help="affinity-gate runs side by side, as ratios to the first")
    p.add_argument("files", metavar="BASE.json VARIANT.json", nargs="+")
    p.set_defaults(run=cmd_variant)
    p = sub.add_parser("predictor", help="predictor accuracy and routing quality per model")
    p.add_argument("--policy", default=GATE)
    p.add_argument("files", metavar="[NAME=]FILE.json", nargs="+")
    p.set_defaults(run=cmd_predictor)
    p = sub.add_parser("predictor-cross", help="the cross-workload predictor table")
    p.add_argument("--fit", metavar="WORKLOAD")
    p.add_argument("files", metavar="WORKLOAD:MODEL=FILE.json", nargs="+")
    p.set_defaults(run=cmd_predictor_cross)
    p = sub.add_parser("mape-by-tenth", help="where in a run the TTFT prediction error sits")
    p.add_argument("files", metavar="LABEL=FILE.json", nargs="+")
    p.set_defaults(run=cmd_mape_by_tenth)
    p = sub.add_parser("step-phase", help="how much of the TTFT prediction error is the pod's step phase")
    p.add_argument("files", metavar="WORKLOAD=FILE.json", nargs="+")
    p.set_defaults(run=cmd_step_phase)
    a = ap.parse_args(argv)
    a.run(a)


if __name__ == "__main__":
    sys.exit(main())
