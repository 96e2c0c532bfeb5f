"""Does gpudoc's NVML sampling slow a launch-bound training loop (driver lock contention)? Within one run,
so the run-to-run noise of a launch-bound loop (±20% on the H200 host) cancels: bench/shim_loop.py runs
under `gpudoc run --no-torch`, and gpudoc itself is stopped (SIGSTOP) and continued (SIGCONT) every
second. Blocks of 100 steps that ran wholly while gpudoc sampled are compared with blocks that ran wholly
while it was stopped. Prints one JSON line per run; needs a GPU.
    python3 bench/sampling_cost.py GPUDOC fast|faster STEPS [gpudoc run flags...]"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from blocks import compare

gpudoc, kind, steps, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp()
blocks_file = os.path.join(work, "blocks")
cmd = [gpudoc, "run", "-q", "--no-torch", *flags, "--json", os.path.join(work, "r.json"), "--",
       sys.executable, os.path.join(here, "shim_loop.py"), kind, str(steps), blocks_file]
job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
# Toggling starts once the loop has warmed up (its first block is written).
while not (os.path.exists(blocks_file) and os.path.getsize(blocks_file) > 0):
    if job.poll() is not None:
        sys.exit(f"the loop ended early: {job.returncode}")
    time.sleep(0.05)
switches = []  # (monotonic time, sampling after it)
sampling = True
while job.poll() is None:
    time.sleep(1.0)
    sampling = not sampling
    try:
        os.kill(job.pid, signal.SIGCONT if sampling else signal.SIGSTOP)
    except ProcessLookupError:
        break
    switches.append((time.monotonic(), sampling))
os.kill(job.pid, signal.SIGCONT) if job.poll() is None else None
job.wait()


def state_over(start, end):
    """True/False when gpudoc sampled/was stopped for the whole of [start, end]; None across a switch."""
    state = True
    for t, s in switches:
        if t <= start:
            state = s
        elif t < end:
            return None
    return state


on, off = [], []
for line in open(blocks_file):
    end, secs = map(float, line.split())
    s = state_over(end - secs, end)
    if s is not None:
        (on if s else off).append(secs / 100 * 1e3)
print(json.dumps({"kind": kind, "flags": " ".join(flags), "on": "gpudoc sampling", "off": "gpudoc stopped",
                  **compare(on, off)}))
