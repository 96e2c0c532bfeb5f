#!/usr/bin/env bash
# On the lent H200: the cost of --metrics and `gpudoc watch` beside training (issue 18), whether NVML
# sampling slows a launch-bound loop (issue 12, bench/sampling_cost.py), and the output passthrough
# benchmark on a quiet host (issue 11). Expects .device/gpudoc; leaves $OUT/costs.tar.gz and prints a digest.
# The pinned shim benchmark is a separate call: PIN=1 GPUDOC=.device/gpudoc bench/shim_bench.sh 5
set -u
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/costs; mkdir -p $R
export CUDA_VISIBLE_DEVICES=0
# --metrics and watch beside training: the same run without and with a scraper, twice.
for i in 1 2; do
  $G run -q --json $R/plain_$i.json -- python3 bench/train_loop.py 3000 > $R/plain_$i.out
  $G run -q --metrics 9400 --json $R/metrics_$i.json -- python3 bench/train_loop.py 3000 > $R/metrics_$i.out &
  RUN=$!
  sleep 3
  for k in $(seq 15); do curl -s -o $R/scrape_$i.prom -w '%{time_total}\n' http://127.0.0.1:9400/metrics >> $R/scrape_$i.txt; sleep 1; done
  $G watch --format jsonl --interval 1s > $R/watch_$i.jsonl 2>/dev/null & W=$!
  wait $RUN
  sleep 1; kill $W; wait $W 2>/dev/null
done
# watch alone on an idle GPU: its CPU over 10 s.
$G watch --format jsonl --interval 1s > $R/watch_idle.jsonl 2>/dev/null & W=$!; sleep 10
awk '{print "watch cpu ticks over 10 s idle:", $14+$15}' /proc/$W/stat > $R/watch_cpu.txt; kill $W
# NVML sampling beside a launch-bound loop, gpudoc stopped and continued every second.
for kind in "fast 20000" "faster 40000"; do
  for flags in "" "--idle-interval 1ms"; do
    python3 bench/sampling_cost.py $G $kind $flags >> $R/sampling_cost.jsonl
  done
done
# The output path on a quiet host.
GPUDOC=$G timeout 200 bash bench/passthrough.sh 3 > $R/passthrough.txt 2>&1
tar czf $OUT/costs.tar.gz -C /tmp costs
cat $R/watch_cpu.txt $R/sampling_cost.jsonl $R/passthrough.txt
python3 - <<'PY'
import json, statistics as st
R = "/tmp/costs"
for i in (1, 2):
    p = json.load(open(f"{R}/plain_{i}.json")); m = json.load(open(f"{R}/metrics_{i}.json"))
    sc = [float(x) for x in open(f"{R}/scrape_{i}.txt")]
    print(f"round {i}: gpudoc cpu {p['sampling']['self_cpu_s']:.3f} s of {p['duration_s']:.1f} s; with --metrics scraped every second {m['sampling']['self_cpu_s']:.3f} s of {m['duration_s']:.1f} s; scrape median {st.median(sc)*1e3:.1f} ms, max {max(sc)*1e3:.1f} ms; steps/s {json.load(open(f'{R}/plain_{i}.out'))['steps_per_s']:.1f} vs {json.load(open(f'{R}/metrics_{i}.out'))['steps_per_s']:.1f}")
PY
