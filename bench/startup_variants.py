"""What Python's start-up spends on `import sitecustomize` (`-X importtime`'s figure, median of ROUNDS
alternated runs, PYTHONDONTWRITEBYTECODE=1) with nothing on PYTHONPATH, an empty folder, a folder with a
sitecustomize.py of one `pass`, and two shim folders as `gpudoc run` writes them (BEFORE, NOW), and the sum
of the top-level imports (bench/README.md):
    python3 bench/startup_variants.py PYTHON BEFORE NOW [ROUNDS]"""
import os
import statistics
import subprocess
import sys
import tempfile

py, before, now = sys.argv[1], sys.argv[2], sys.argv[3]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 40
G = "hunt=auto;peaks=reset;where=on;pipe=/nonexistent/torch.pipe"
empty, trivial = tempfile.mkdtemp(), tempfile.mkdtemp()
with open(os.path.join(trivial, "sitecustomize.py"), "w") as f:
    f.write("pass\n")
variants = {"bare": None, "empty folder": empty, "sitecustomize.py of one `pass`": trivial,
            "shim before": before, "shim now": now}


def once(pp):
    env = dict((k, v) for k, v in os.environ.items() if k != "PYTHONPATH")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pp:
        env["PYTHONPATH"], env["GPUDOC_TORCH"] = pp, G
    err = subprocess.run([py, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                         text=True).stderr
    rows = [line.split("|") for line in err.splitlines() if line.startswith("import time:")]
    rows = [r for r in rows if len(r) == 3 and r[1].strip().isdigit()]
    top = sum(int(r[1]) for r in rows if not r[2].startswith("  "))
    sc = [int(r[1]) for r in rows if r[2].strip() == "sitecustomize"]
    return (sc[0] if sc else 0) / 1e3, top / 1e3


res = dict((k, ([], [])) for k in variants)
for _ in range(rounds):
    for k, pp in variants.items():
        a, b = once(pp)
        res[k][0].append(a)
        res[k][1].append(b)
for k, (a, b) in res.items():
    print("| %s | %.2f ms | %.2f ms |" % (k, statistics.median(a), statistics.median(b)))
