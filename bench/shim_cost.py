"""The shim's cost to a launch-bound training loop, within one run so that the run-to-run noise of such a
loop (±20% on the H200 host) cancels: bench/shim_loop.py runs under `gpudoc run` with TOGGLE_SHIM=1, which
takes gpudoc's step hook out of PyTorch's optimizer hooks for every other block of 100 steps. Blocks with
the hook are compared with blocks without it. Prints one JSON line; needs a GPU.
    python3 bench/shim_cost.py GPUDOC fast|faster STEPS [gpudoc run flags...]"""
import json
import os
import subprocess
import sys
import tempfile

from blocks import compare

gpudoc, kind, steps, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp()
blocks_file, report = os.path.join(work, "blocks"), os.path.join(work, "r.json")
subprocess.run([gpudoc, "run", "-q", *flags, "--json", report, "--", sys.executable,
                os.path.join(here, "shim_loop.py"), kind, steps, blocks_file],
               env=dict(os.environ, TOGGLE_SHIM="1"), stdout=subprocess.DEVNULL, check=True)
with_hook, without = [], []
for line in open(blocks_file):
    _, secs, state = line.split()
    (with_hook if state == "1" else without).append(float(secs) / 100 * 1e3)
p = json.load(open(report))["torch"]["processes"][0]
print(json.dumps({"kind": kind, "flags": " ".join(flags), "on": "with the step hook", "off": "without it",
                  **compare(with_hook, without),
                  "shim_cost_pct_self_measured": p.get("shim_cost_pct"), "record_every": p.get("record_every")}))
