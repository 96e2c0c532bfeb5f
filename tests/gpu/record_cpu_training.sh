#!/usr/bin/env bash
# gpudoc's steady-state CPU during training: the slope between a 3000-step and a 12000-step run of
# bench/train_loop.py under gpudoc (start-up and warm-up cancel out). Expects .device/gpudoc.
set -u
G=.device/gpudoc; chmod +x $G
for n in 3000 12000; do
  $G run -q --json /tmp/t$n.json -- python3 bench/train_loop.py $n > /tmp/t$n.out
done
python3 - <<'PY'
import json
a, b = json.load(open("/tmp/t3000.json")), json.load(open("/tmp/t12000.json"))
ca, cb = a["sampling"]["self_cpu_s"], b["sampling"]["self_cpu_s"]
da, db = a["duration_s"], b["duration_s"]
print(f"3000 steps: {ca:.3f} s CPU over {da:.1f} s ({ca/da*100:.2f}%); 12000 steps: {cb:.3f} s over {db:.1f} s ({cb/db*100:.2f}%)")
print(f"steady state during training: {(cb-ca)/(db-da)*100:.2f}% of a core; rss {b['sampling']['self_max_rss_bytes']>>20} MiB")
PY
