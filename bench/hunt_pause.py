"""The leak hunt's pause against the size of the program's heap (bench/README.md): fixtures/fake_torch's
big_heap.py (N small objects, then a leak of 16 MiB a step held by a global list made after them) bare and
under `gpudoc run --hunt-leaks`, for each N: the longest optimizer step, the collections the program's
gc.callbacks saw inside a step, the peak RSS, the run's time, and the hunt's holder and analysis time.
LEAK=graph in the environment: the leak is held by an autograd graph, so the search walks the whole heap.
    python3 bench/hunt_pause.py GPUDOC [N ...]"""
import json
import os
import subprocess
import sys
import tempfile

gpudoc = sys.argv[1]
sizes = [int(n) for n in sys.argv[2:]] or [500000, 2000000, 6000000]
here = os.path.dirname(os.path.abspath(__file__))
fake = os.path.join(here, "..", "fixtures", "fake_torch")
script = os.path.join(fake, "big_heap.py")
env = dict(os.environ, PYTHONPATH=fake)
steps, leak = "300", os.environ.get("LEAK", "list")
for n in sizes:
    bare = json.loads(subprocess.run([sys.executable, script, str(n), steps, "0.005", leak], env=env, check=True,
                                     capture_output=True, text=True).stdout)
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "r.json")
        out = subprocess.run([gpudoc, "run", "-q", "--hunt-leaks", "--json", report, "--", sys.executable,
                              script, str(n), steps, "0.005", leak], env=env, check=True, capture_output=True, text=True)
        under = json.loads(out.stdout)
        hunts = json.load(open(report))["torch"]["processes"][0].get("hunts", [])
    held = [(h["holders"][0]["text"] if h["holders"] else None, h["analysis_s"]) for h in hunts]
    print(json.dumps({"objects": n, "leak": leak, "bare": bare, "gpudoc": under, "holder, analysis_s": held}))
