"""What the shim adds to every Python process's start-up (bench/README.md): the time Python spends on
`import sitecustomize` at start-up (`-X importtime`'s cumulative figure: without gpudoc, the search that
finds none), bare and with the shim as `gpudoc run` sets it up (measured inside a run, so its folder is
there), alternated, ROUNDS times each, with PYTHONDONTWRITEBYTECODE=1 (this file compiled at every start)
and without (cached .pyc). Wall-clock start-up times on a shared machine vary by more than the shim costs.
    python3 bench/startup.py GPUDOC [PYTHON [ROUNDS]]"""
import json
import os
import statistics
import subprocess
import sys

if sys.argv[1] != "--inside":
    gpudoc = sys.argv[1]
    python = sys.argv[2] if len(sys.argv) > 2 else sys.executable
    rounds = sys.argv[3] if len(sys.argv) > 3 else "200"
    sys.exit(subprocess.call([gpudoc, "run", "-q", "--", sys.executable, __file__, "--inside", python, rounds]))

python, rounds = sys.argv[2], int(sys.argv[3])
shim = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
base = {k: v for k, v in shim.items() if k != "PYTHONPATH" and not k.startswith("GPUDOC_")}


def once(env):
    err = subprocess.run([python, "-X", "importtime", "-c", "pass"], env=env, check=True,
                         capture_output=True, text=True).stderr
    line = [l for l in err.splitlines() if l.rstrip().endswith("| sitecustomize") or
            l.split("|")[-1].strip() == "sitecustomize"]
    return int(line[0].split("|")[1]) / 1e3 if line else 0.0


out = {}
for cached in (False, True):
    bare, shimmed = dict(base), dict(shim)
    if not cached:
        bare["PYTHONDONTWRITEBYTECODE"] = shimmed["PYTHONDONTWRITEBYTECODE"] = "1"
    once(shimmed)  # writes the .pyc where it may
    times = {"bare": [], "shim": []}
    for _ in range(rounds):
        times["bare"].append(once(bare))
        times["shim"].append(once(shimmed))
    med = {k: statistics.median(v) for k, v in times.items()}
    out["cached" if cached else "uncached"] = {
        "bare_ms": round(med["bare"], 2), "shim_ms": round(med["shim"], 2),
        "added_ms": round(med["shim"] - med["bare"], 2)}
print(json.dumps({"python": python, "rounds": rounds, **out}))
