"""A job that notes every signal it gets, for tests of what reaches it under gpudoc and without.

    signals.py LOG [SECONDS]

Catches INT, TERM, USR1, USR2, HUP, QUIT and ALRM; prints `ready` once the handlers are in place; waits until
a signal came (or SECONDS passed, 10 by default), then half a second more for any copy of it; writes the
names it got, one a line, to LOG, and exits 0.
"""
import os
import signal
import sys
import time

got = []


def note(sig, frame):
    got.append(signal.Signals(sig).name)


for s in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGALRM"):
    signal.signal(getattr(signal, s), note)
print("ready", flush=True)
limit = time.time() + (float(sys.argv[2]) if len(sys.argv) > 2 else 10.0)
while not got and time.time() < limit:
    time.sleep(0.01)
end = time.time() + 0.5
while time.time() < end:
    time.sleep(0.01)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write("".join(n + "\n" for n in got))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
