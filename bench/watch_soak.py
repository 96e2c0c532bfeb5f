#!/usr/bin/env python3
"""Soak test of the node agent: `gpudoc watch --metrics` against the fake NVML, for minutes or days.

Processes come and go on two fake H200s (a churn of --churn new processes a second, new PIDs every time,
each holding memory for --life seconds): live children of this script, orphans (their parent exits, so
they are re-parented) and ghosts (PIDs NVML lists and no process has), so every verdict, every
`leftover-holder` diagnosis and every `pid` label keeps changing. A Prometheus-style scrape (OpenMetrics
`Accept`) every second. gpudoc's RSS (/proc/PID/status VmRSS) and CPU time (/proc/PID/stat utime+stime)
are sampled every --sample seconds; the table gives, per --row minutes, the RSS at the row's end (and its
heap part, RssAnon) and the CPU used over the row, then a verdict: the RSS growth per hour of a linear fit
over the second half (flat below --flat-mib-per-hour), and the CPU of the second half against the first.

    cargo build --bin gpudoc -p fake-nvml          # or --release, then --gpudoc target/release/gpudoc
    python3 bench/watch_soak.py                    # 3 minutes
    python3 bench/watch_soak.py --duration 10m
    nohup python3 bench/watch_soak.py --duration 3d --row 60 > soak.log 2>&1 &   # days: a row an hour

Exit status: 0 when RSS and CPU are flat, 1 when either grows, 2 when gpudoc died or a scrape failed.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20
TICKS = os.sysconf("SC_CLK_TCK")
# Above any PID this machine hands out (pid_max is at most 2^22): a ghost's PID never names a process.
GHOST_BASE = 1 << 23


def duration(s):
    unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if s[-1] in unit:
        return float(s[:-1]) * unit[s[-1]]
    return float(s)


def args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=duration, default=180, help="how long: 90s, 10m, 3d (default 3m)")
    p.add_argument("--churn", type=int, default=6, help="new processes a second (default 6)")
    p.add_argument("--life", type=float, default=5, help="seconds each holds memory (default 5)")
    p.add_argument("--sample", type=float, default=5, help="seconds between RSS/CPU samples (default 5)")
    p.add_argument("--row", type=float, default=1, help="minutes per table row (default 1)")
    p.add_argument("--flat-mib-per-hour", type=float, default=2.0, help="RSS growth called flat (default 2)")
    p.add_argument("--gpudoc", default=os.path.join(ROOT, "target/debug/gpudoc"))
    p.add_argument("--fake-lib", default=os.path.join(ROOT, "target/debug/deps/libfake_nvml.so"))
    return p.parse_args()


def h200s(n):
    return {
        "driver": "580.159.04",
        "cuda": 13000,
        "devices": [
            {
                "name": "NVIDIA H200",
                "uuid": f"GPU-fa4e0000-0000-0000-0000-00000000000{i}",
                "total": 143771 * MIB,
                "reserved": 615 * MIB,
                "base_used": 0,
            }
            for i in range(n)
        ],
        "procs": [],
    }


def store(path, state):
    """As the fake NVML's writers do: a whole new file renamed over the old, never half a write."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Churn:
    """The processes holding fake GPU memory: each second `n` new ones, each gone `life` seconds later."""

    def __init__(self, life):
        self.life = life
        self.held = []  # (until, pid, popen or None, ghost)
        self.count = 0

    def spawn(self, kind):
        if kind == "ghost":
            return GHOST_BASE + self.count, None
        if kind == "live":
            child = subprocess.Popen(["sleep", str(self.life + 5)])
            return child.pid, child
        # An orphan: the session leader that started it exits at once (as `gpudoc orphans` judges it).
        out = subprocess.run(
            ["sh", "-c", f"sleep {self.life + 5} >/dev/null 2>&1 & echo $!"],
            capture_output=True,
            start_new_session=True,
        )
        return int(out.stdout), None

    def tick(self, n, now):
        for _until, pid, child, ghost in [h for h in self.held if h[0] <= now]:
            if not ghost:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if child is not None:
                child.wait()
        self.held = [h for h in self.held if h[0] > now]
        for _ in range(n):
            kind = ("live", "orphan", "ghost")[self.count % 3]
            pid, child = self.spawn(kind)
            self.held.append((now + self.life, pid, child, kind == "ghost"))
            self.count += 1

    def procs(self):
        return [
            {"pid": pid, "gpu": pid % 2, "bytes": (1 + pid % 7) * 256 * MIB, "ghost": ghost}
            for _, pid, _, ghost in self.held
        ]

    def end(self):
        self.tick(0, float("inf"))


def rss_and_cpu(pid):
    """VmRSS, CPU seconds (utime + stime) and RssAnon (the heap's part of VmRSS; the rest is mapped files:
    the binary's and libraries' pages, touched once)."""
    with open(f"/proc/{pid}/status") as f:
        kib = {
            k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if k in ("VmRSS", "RssAnon")
        }
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return kib["VmRSS"] * 1024, (int(fields[11]) + int(fields[12])) / TICKS, kib["RssAnon"] * 1024


def scrape(port):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/metrics", headers={"Accept": "application/openmetrics-text;version=1.0.0"}
    )
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read().decode()
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def fit(points):
    """Least-squares slope of (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def cpu_pct(samples, t0, t1):
    """gpudoc's CPU between the last samples taken by t0 and by t1, in % of a core."""
    a = [s for s in samples if s[0] <= t0][-1:] or samples[:1]
    b = [s for s in samples if s[0] <= t1][-1:]
    (ta, _, ca, _), (tb, _, cb, _) = a[0], b[0]
    return 100 * (cb - ca) / (tb - ta) if tb > ta else float("nan")


def report(a, samples, scrapes, series_max, churned):
    print(f"\n{'minute':>6} {'RSS MiB':>8} {'of it heap':>10} {'CPU % (row)':>11}")
    start, end = samples[0][0], samples[-1][0]
    rows = max(1, round((end - start) / (a.row * 60)))
    for i in range(rows):
        # The last row runs to the end (a few seconds more or less than the others).
        t0 = start + i * a.row * 60
        t1 = end if i == rows - 1 else t0 + a.row * 60
        _, rss, _, anon = [s for s in samples if s[0] <= t1][-1]
        cpu = cpu_pct(samples, t0, t1)
        print(f"{(t1 - start) / 60:>6.1f} {rss / MIB:>8.2f} {anon / MIB:>10.2f} {cpu:>11.2f}")
    mid = start + (end - start) / 2
    second = [s for s in samples if s[0] >= mid]
    growth = fit([(s[0] / 3600, s[1] / MIB) for s in second])
    heap = fit([(s[0] / 3600, s[3] / MIB) for s in second])
    cpu1, cpu2 = cpu_pct(samples, start, mid), cpu_pct(samples, mid, end)
    rss_flat = abs(growth) < a.flat_mib_per_hour
    # CPU is flat when the second half costs no more than the first, give or take a fifth (a shared
    # machine's noise) and 0.2 points.
    cpu_flat = cpu2 <= cpu1 * 1.2 + 0.2
    print(
        f"\n{churned} processes churned, {scrapes} scrapes (at most {series_max} series), "
        f"{len(samples)} samples over {(end - start) / 60:.1f} min"
    )
    print(
        f"verdict: RSS {'flat' if rss_flat else 'GROWS'}: {growth:+.2f} MiB/hour over the second half "
        f"(heap {heap:+.2f}; flat below {a.flat_mib_per_hour:g}); CPU {'flat' if cpu_flat else 'GROWS'}: "
        f"{cpu1:.2f}% of a core in the first half, {cpu2:.2f}% in the second"
    )
    return rss_flat and cpu_flat


def main():
    a = args()
    home = tempfile.mkdtemp(prefix="gpudoc-soak-")
    state = os.path.join(home, "nvml.json")
    base = h200s(2)
    store(state, base)
    port = free_port()
    env = dict(
        os.environ,
        GPUDOC_NVML_LIB=a.fake_lib,
        FAKE_NVML_STATE=state,
        XDG_STATE_HOME=os.path.join(home, "state"),
        NO_COLOR="1",
    )
    watch = subprocess.Popen(
        [a.gpudoc, "watch", "--metrics", f"127.0.0.1:{port}"], env=env, stdin=subprocess.DEVNULL
    )
    churn = Churn(a.life)
    samples, scrapes, series_max, failed = [], 0, 0, None
    start = time.monotonic()
    next_sample, ticks = start, 0
    try:
        while (now := time.monotonic()) - start < a.duration:
            churn.tick(a.churn, now)
            store(state, dict(base, procs=churn.procs()))
            if watch.poll() is not None:
                failed = f"gpudoc watch exited with {watch.returncode}"
                break
            if now >= next_sample:
                samples.append((now, *rss_and_cpu(watch.pid)))
                next_sample += a.sample
            try:
                series_max = max(series_max, scrape(port))
                scrapes += 1
            except OSError as e:
                if now - start > 5:  # the server may still be starting
                    failed = f"a scrape failed: {e}"
                    break
            ticks += 1
            time.sleep(max(0.0, start + ticks - time.monotonic()))
        samples.append((time.monotonic(), *rss_and_cpu(watch.pid)))
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait()
        churn.end()
    if failed:
        print(f"soak: {failed}", file=sys.stderr)
        return 2
    return 0 if report(a, samples, scrapes, series_max, churn.count) else 1


if __name__ == "__main__":
    sys.exit(main())
