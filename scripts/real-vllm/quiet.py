#!/usr/bin/env python3
"""Is the machine quiet? Lists the processes outside a benchmark harness that use more than a
threshold of one CPU, from /proc (Python standard library only). Used by peers.sh before and
during each run: a load average cannot judge this (the harness's own two busy pods keep it at 2
or more on 2 cores), a process's own CPU time can.

    quiet.py check [--seconds 5] [EXCLUSIONS] [--threshold 5]
        Two reads of /proc, SECONDS apart. Exit 0 when no foreign process used more than
        THRESHOLD % of one CPU over that window, 1 otherwise (the culprits on stdout, one a line).
    quiet.py watch --out FILE [--interval 2] [EXCLUSIONS] [--threshold 5]
        Reads /proc every INTERVAL seconds until SIGTERM or SIGINT, then writes a JSON summary to
        FILE: `disturbed` (some foreign process went over THRESHOLD % in some interval), the
        `violations` (pid, comm, nice, the largest % of one interval, how many intervals, CPU
        seconds over the whole watch), and for information only (not part of the verdict):
        `foreign_cpu_s` (all foreign processes' CPU seconds, the quiet ones included),
        `unattributed_pct_mean` (the machine's busy time, /proc/stat, less every process seen:
        short-lived processes, interrupts, the kernel; % of one CPU), `steal_pct_mean` (a VM's
        stolen time, % of one CPU) and `harness_pct_mean`.

EXCLUSIONS (the harness): `--pid P` excludes P and all its descendants (found through the parent
links of /proc/*/stat at every read, so children started later count too); `--session S`
excludes every process of session S (pods started with setsid: the session outlives the parent
link); `--pgrp G` every process of process group G. Kernel threads are never judged (they are
listed in the summary when over the threshold, as `kernel_threads`).

A process's CPU share over an interval is Δ(utime + stime) / CLK_TCK / Δt, in % of one CPU (a
process with 4 busy threads can show 400 %). A process that started during the interval counts
all its CPU time; one that started and ended between two reads is not seen (the unattributed
figure holds it). Cost: one read of /proc/*/stat per interval (a few ms for a few hundred
processes).
"""
import argparse
import json
import os
import signal
import sys
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
PF_KTHREAD = 0x00200000


class Proc:
    __slots__ = ("pid", "comm", "ppid", "pgrp", "session", "ticks", "nice", "start", "kthread")


def read_proc(pid):
    """One process's /proc/PID/stat, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return parse_stat(raw)


def parse_stat(raw):
    # comm is in parentheses and may hold spaces or ')': split at the last ')'.
    head, _, tail = raw.rpartition(")")
    pid_s, _, comm = head.partition(" (")
    f = tail.split()
    # f[0] is field 3 (state): field n is f[n - 3].
    p = Proc()
    p.pid = int(pid_s)
    p.comm = comm
    p.ppid, p.pgrp, p.session = int(f[1]), int(f[2]), int(f[3])
    flags = int(f[6])
    p.ticks = int(f[11]) + int(f[12])
    p.nice = int(f[16])
    p.start = int(f[19])
    p.kthread = bool(flags & PF_KTHREAD) or p.pid == 2 or p.ppid == 2
    return p


def snapshot():
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            p = read_proc(name)
            if p is not None:
                procs[p.pid] = p
    return procs


def machine_ticks():
    """(busy, steal) ticks summed over the CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    v += [0] * (8 - len(v))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return user + nice + system + irq + softirq + steal, steal


def uptime_ticks():
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) * CLK_TCK


def harness_set(procs, pids, sessions, pgrps):
    """Pids of the harness: the given pids and their descendants, the given sessions and groups."""
    out = set()
    for p in procs.values():
        if p.pid in pids or p.session in sessions or p.pgrp in pgrps:
            out.add(p.pid)
    # Descendants: walk each process's parent chain (with memo).
    verdict = {}

    def inside(pid, depth=0):
        if pid in verdict:
            return verdict[pid]
        p = procs.get(pid)
        if p is None or pid <= 1 or depth > 512:
            r = False
        elif pid in out:
            r = True
        else:
            r = inside(p.ppid, depth + 1)
        verdict[pid] = r
        return r

    return {pid for pid in procs if inside(pid)}


class Sample:
    """Two snapshots' difference."""

    def __init__(self, prev, prev_t, prev_up, prev_m, cur, cur_t, cur_m, excl):
        self.dt = cur_t - prev_t
        harness = harness_set(cur, *excl)
        self.per_proc = []  # (Proc, ticks in the interval, harness?)
        for pid, p in cur.items():
            q = prev.get(pid)
            if q is not None and q.start == p.start:
                d = p.ticks - q.ticks
            elif p.start >= prev_up - 1:
                d = p.ticks  # started during the interval
            else:
                continue  # missed earlier (a race with listdir): unknown share
            if d > 0:
                self.per_proc.append((p, d, pid in harness))
        self.busy = cur_m[0] - prev_m[0]
        self.steal = cur_m[1] - prev_m[1]

    def pct(self, ticks):
        return 100.0 * ticks / CLK_TCK / self.dt if self.dt > 0 else 0.0


class Sampler:
    def __init__(self, excl):
        self.excl = excl
        self.prev = snapshot()
        self.prev_t = time.monotonic()
        self.prev_up = uptime_ticks()
        self.prev_m = machine_ticks()

    def sample(self):
        cur, t, up, m = snapshot(), time.monotonic(), uptime_ticks(), machine_ticks()
        s = Sample(self.prev, self.prev_t, self.prev_up, self.prev_m, cur, t, m, self.excl)
        self.prev, self.prev_t, self.prev_up, self.prev_m = cur, t, up, m
        return s


def culprits(s, threshold):
    """Foreign user-space processes over the threshold in one sample, largest first."""
    out = [(s.pct(d), p) for p, d, h in s.per_proc if not h and not p.kthread and s.pct(d) > threshold]
    return sorted(out, key=lambda x: -x[0])


def describe(pct, p):
    return f"pid {p.pid} ({p.comm}) nice {p.nice}: {pct:.1f} % of a CPU"


def exclusions(a):
    return (set(a.pid), set(a.session), set(a.pgrp))


def cmd_check(a):
    sampler = Sampler(exclusions(a))
    time.sleep(a.seconds)
    s = sampler.sample()
    bad = culprits(s, a.threshold)
    for pct, p in bad:
        print(describe(pct, p))
    return 1 if bad else 0


class Stop(Exception):
    pass


def cmd_watch(a):
    def stop(*_):
        raise Stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    t0 = time.monotonic()
    viol = {}  # (pid, start) -> dict
    kthreads = {}
    n = 0
    sums = {"foreign": 0.0, "harness": 0.0, "unattributed": 0.0, "steal": 0.0, "dt": 0.0}
    sampler = None
    try:
        sampler = Sampler(exclusions(a))
        while True:
            time.sleep(a.interval)
            s = sampler.sample()
            n += 1
            account(s, a.threshold, viol, kthreads, sums)
    except Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The last, partial interval (if long enough to judge).
    if sampler is not None and time.monotonic() - sampler.prev_t >= 0.5:
        s = sampler.sample()
        n += 1
        account(s, a.threshold, viol, kthreads, sums)
    dt = sums["dt"] or 1.0
    over = sorted(viol.values(), key=lambda v: -v["max_pct"])
    report = {
        "threshold_pct": a.threshold,
        "interval_s": a.interval,
        "intervals": n,
        "duration_s": round(time.monotonic() - t0, 2),
        "disturbed": any(v["intervals"] > 0 for v in over),
        "violations": [v for v in over if v["intervals"] > 0][:20],
        "foreign_cpu_s": round(sums["foreign"], 2),
        "harness_pct_mean": round(100 * sums["harness"] / dt, 1),
        "unattributed_pct_mean": round(100 * sums["unattributed"] / dt, 1),
        "steal_pct_mean": round(100 * sums["steal"] / dt, 1),
        "kernel_threads": sorted(kthreads.values(), key=lambda v: -v["max_pct"])[:10],
        "exclusions": {"pid": sorted(a.pid), "session": sorted(a.session), "pgrp": sorted(a.pgrp)},
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1)
    os.replace(tmp, a.out)
    return 0


def account(s, threshold, viol, kthreads, sums):
    if s.dt <= 0:
        return
    seen = 0
    for p, d, h in s.per_proc:
        seen += d
        sec = d / CLK_TCK
        pct = s.pct(d)
        if h:
            sums["harness"] += sec
            continue
        if p.kthread:
            if pct > threshold:
                k = kthreads.setdefault(p.comm, {"comm": p.comm, "max_pct": 0.0, "intervals": 0})
                k["max_pct"] = round(max(k["max_pct"], pct), 1)
                k["intervals"] += 1
            continue
        sums["foreign"] += sec
        key = (p.pid, p.start)
        v = viol.get(key)
        if v is None and pct > threshold:
            v = viol[key] = {"pid": p.pid, "comm": p.comm, "nice": p.nice, "max_pct": 0.0,
                             "intervals": 0, "cpu_s": 0.0}
        if v is not None:
            v["cpu_s"] = round(v["cpu_s"] + sec, 2)
            if pct > threshold:
                v["intervals"] += 1
                v["max_pct"] = round(max(v["max_pct"], pct), 1)
    sums["unattributed"] += max(0.0, (s.busy - seen) / CLK_TCK)
    sums["steal"] += s.steal / CLK_TCK
    sums["dt"] += s.dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("check", "watch"):
        p = sub.add_parser(name)
        p.add_argument("--pid", type=int, action="append", default=[])
        p.add_argument("--session", type=int, action="append", default=[])
        p.add_argument("--pgrp", type=int, action="append", default=[])
        p.add_argument("--threshold", type=float, default=5.0, help="%% of one CPU")
        if name == "check":
            p.add_argument("--seconds", type=float, default=5.0)
        else:
            p.add_argument("--interval", type=float, default=2.0)
            p.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    return cmd_check(a) if a.cmd == "check" else cmd_watch(a)


if __name__ == "__main__":
    sys.exit(main())
