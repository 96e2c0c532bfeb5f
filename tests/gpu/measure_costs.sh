#!/usr/bin/env bash
# The cost of --metrics and `gpudoc watch` beside training; the shim's cost with the loop pinned to a core;
# the output passthrough benchmark. Expects .device/gpudoc. Leaves $OUT/costs.
set -u
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/recb; mkdir -p $R/costs
export CUDA_VISIBLE_DEVICES=0
# 3. --metrics and watch beside training.
for i in 1 2; do
  $G run -q --json $R/costs/plain_$i.json -- python3 bench/train_loop.py 3000 > $R/costs/plain_$i.out
  $G run -q --metrics 9400 --json $R/costs/metrics_$i.json -- python3 bench/train_loop.py 3000 > $R/costs/metrics_$i.out &
  RUN=$!
  sleep 3
  for k in $(seq 15); do curl -s -o /dev/null -w '%{time_total}\n' http://127.0.0.1:9400/metrics >> $R/costs/scrape_$i.txt; sleep 1; done
  $G watch --format jsonl --interval 1s > $R/costs/watch_$i.jsonl 2>/dev/null & W=$!
  wait $RUN
  sleep 1; kill $W; wait $W 2>/dev/null
  curl -s http://127.0.0.1:9400/metrics > /dev/null || true
done
$G watch --format jsonl --interval 1s > $R/costs/watch_idle.jsonl 2>/dev/null & W=$!; sleep 10
awk '{print "watch cpu ticks (10 s idle):", $14+$15}' /proc/$W/stat > $R/costs/watch_cpu.txt; kill $W
# 4. The shim's cost with the loop pinned to one core (gpudoc on others).
for i in 1 2 3 4; do
  for c in bare gpudoc no_torch; do
    case $c in
      bare) taskset -c 3 python3 bench/shim_loop.py fast ;;
      gpudoc) taskset -c 5-7 $G run -q --json /tmp/r.json -- taskset -c 3 python3 bench/shim_loop.py fast ;;
      no_torch) taskset -c 5-7 $G run -q --no-torch --json /tmp/r.json -- taskset -c 3 python3 bench/shim_loop.py fast ;;
    esac | tail -1 | sed "s/^/{\"config\":\"$c\",\"run\":$i,\"x\":/; s/\$/}/" >> $R/costs/pinned.jsonl
  done
done
# 5. Output passthrough.
GPUDOC=$G timeout 150 bash bench/passthrough.sh 3 > $R/costs/passthrough.txt 2>&1
cp -r $R/costs $OUT/
cat $R/costs/watch_cpu.txt $R/costs/passthrough.txt | tail -20
python3 - <<'PY'
import json, statistics as st
R = "/tmp/recb/costs"
for i in (1, 2):
    p = json.load(open(f"{R}/plain_{i}.json")); m = json.load(open(f"{R}/metrics_{i}.json"))
    sc = [float(x) for x in open(f"{R}/scrape_{i}.txt")]
    print(f"round {i}: cpu plain {p['sampling']['self_cpu_s']:.3f}s/{p['duration_s']:.1f}s, with --metrics {m['sampling']['self_cpu_s']:.3f}s/{m['duration_s']:.1f}s; scrape median {st.median(sc)*1e3:.1f} ms max {max(sc)*1e3:.1f} ms; steps/s {json.load(open(f'{R}/plain_{i}.out'))['steps_per_s']:.1f} vs {json.load(open(f'{R}/metrics_{i}.out'))['steps_per_s']:.1f}")
rows = [json.loads(l) for l in open(f"{R}/pinned.jsonl")]
for c in ("bare", "gpudoc", "no_torch"):
    v = [r["x"]["steps_per_s"] for r in rows if r["config"] == c]
    print("pinned", c, [round(x, 1) for x in v], "median", round(st.median(v), 1))
PY
