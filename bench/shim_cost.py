"""The shim's cost to a launch-bound training loop, within one run so that the run-to-run noise of such a
loop (±20% on the H200 host) cancels: bench/shim_loop.py runs under `gpudoc run` with TOGGLE_SHIM=1, which
takes gpudoc's step hook out of PyTorch's optimizer hooks for every other block of 100 steps. Blocks with
the hook are compared with blocks without it. Prints one JSON line; needs a GPU.
    python3 bench/shim_cost.py GPUDOC fast|faster STEPS [gpudoc run flags...]"""
import json
import os
import statistics as st
import subprocess
import sys
import tempfile

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
m_on, m_off = st.median(with_hook), st.median(without)
p = json.load(open(report))["torch"]["processes"][0]
print(json.dumps({"kind": kind, "flags": " ".join(flags), "blocks": [len(with_hook), len(without)],
                  "ms_per_step_with_hook": round(m_on, 4), "ms_per_step_without": round(m_off, 4),
                  "cost_pct": round((m_on / m_off - 1) * 100, 3),
                  "iqr_with_hook": [round(x, 4) for x in st.quantiles(with_hook, n=4)[::2]],
                  "iqr_without": [round(x, 4) for x in st.quantiles(without, n=4)[::2]],
                  "shim_cost_pct_self_measured": p.get("shim_cost_pct"), "record_every": p.get("record_every")}))
