"""A trace of a long run, for timing and sizing `gpudoc report` on it: one GPU whose memory and one
process's change at every sample, 100 samples a second, for SECONDS (default 4800: 1.44 M rows, 108 MB).
  python3 bench/long_trace.py 4800 > /tmp/long.trace.jsonl
  /usr/bin/time -f '%e s %M KB' gpudoc report /tmp/long.trace.jsonl > /dev/null
"""
import json
import sys

secs = float(sys.argv[1]) if len(sys.argv) > 1 else 4800
out = sys.stdout
out.write(json.dumps({
    "kind": "start", "schema": "gpudoc.trace/2", "unix_s": 1796143471.0, "command": ["python3", "train.py"],
    "gpus": [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-0", "total_bytes": 150754820096}],
}) + "\n")
t, i = 0.02, 0
while t < secs:
    used = (10 << 30) + ((i % 50) << 20)
    out.write('{"kind":"device","t":%.6f,"gpu":0,"used":%d,"total":150754820096}\n' % (t, used))
    first = ',"cmdline":"python3 train.py","uid":0,"visible":true' if i == 0 else ""
    out.write('{"kind":"process","t":%.6f,"gpu":0,"pid":100,"used":%d,"in_job":true%s}\n' % (t, used - (500 << 20), first))
    out.write('{"kind":"job","t":%.6f,"gpu":0,"used":%d}\n' % (t, used - (500 << 20)))
    t += 0.01
    i += 1
