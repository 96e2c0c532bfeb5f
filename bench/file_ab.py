"""A command writing a file (`> out`), bare and under one or more gpudoc builds, rotated in each round: wall
time (the truncation of the last run's file included, as the shell's `>` does), the command's CPU (the
shell's `times`), gpudoc's own CPU (its rusage less the command's) and the page-cache counters the run moved
(`pgactivate`: pages the kernel took for often used). `sync` before every run.
    python3 bench/file_ab.py ROUNDS NAME=GPUDOC... [bare]
    CMD='yes | head -c 209715200' python3 bench/file_ab.py 9 bare new=target/release/gpudoc
The default command is `cat` of 200 MB of 80-character lines to stderr (made in $W, default /tmp/file_ab)."""
import json, os, statistics, subprocess, sys, time

W = os.environ.get("W", "/tmp/file_ab")
os.makedirs(W, exist_ok=True)
ROUNDS = int(sys.argv[1])
CONFIGS = [(a.split("=", 1)[0], a.split("=", 1)[1] if "=" in a else None) for a in sys.argv[2:]]
src = W + "/lines80"
if not os.path.exists(src):
    with open(src, "wb") as f:
        f.write((b"x" * 79 + b"\n") * (200 * 1024 * 1024 // 80))
CMD = os.environ.get("CMD", f"cat {src}")
KEYS = ["pgactivate", "pgdeactivate", "pgrefill", "pgscan_kswapd", "pgscan_direct"]


def vmstat():
    d = {}
    for line in open("/proc/vmstat"):
        k, v = line.split()
        if k in KEYS:
            d[k] = int(v)
    return d


def secs(s):
    m, r = s.rstrip("s").split("m")
    return float(m) * 60 + float(r)


def one(gpudoc):
    os.sync()
    r, w = os.pipe()
    sh = f"{CMD} >&2; times >&{w}"
    argv = ["sh", "-c", sh] if gpudoc is None else [gpudoc, "run", "-q", "--", "sh", "-c", sh]
    env = dict(os.environ, GPUDOC_NVML_LIB="/nonexistent")
    v0 = vmstat()
    t0 = time.perf_counter()
    out = os.open(W + "/out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    p = subprocess.Popen(argv, stdout=out, stderr=out, pass_fds=(w,), env=env)
    _, _, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    os.close(out)
    os.close(w)
    times = os.read(r, 4096).decode().split("\n")
    os.close(r)
    cmd_cpu = sum(secs(x) for x in times[1].split())
    v1 = vmstat()
    return dict(wall=wall, cmd_cpu=cmd_cpu, gpudoc_cpu=ru.ru_utime + ru.ru_stime - cmd_cpu,
                **{k: v1.get(k, 0) - v0.get(k, 0) for k in KEYS})


res = {name: [] for name, _ in CONFIGS}
for rnd in range(ROUNDS):
    k = rnd % len(CONFIGS)
    for name, gpudoc in CONFIGS[k:] + CONFIGS[:k]:
        res[name].append(one(gpudoc))
print("| run | median ms | range ms | command CPU ms | gpudoc CPU ms | " + " | ".join(KEYS) + " |")
print("|---|---:|---:|---:|---:|" + "---:|" * len(KEYS))
for name, _ in CONFIGS:
    x = res[name]
    med = lambda key: statistics.median(d[key] for d in x)
    walls = [d["wall"] * 1e3 for d in x]
    print(f"| {name} | {med('wall') * 1e3:.1f} | {min(walls):.0f}-{max(walls):.0f} | {med('cmd_cpu') * 1e3:.0f} | "
          f"{max(med('gpudoc_cpu'), 0) * 1e3:.0f} | " + " | ".join(f"{med(k):.0f}" for k in KEYS) + " |")
json.dump(res, open(W + "/file_ab.json", "w"))
