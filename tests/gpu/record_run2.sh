#!/usr/bin/env bash
# Real-GPU checks for the framework view and orphans, recorded rule scenarios, and the CPU and throughput
# benchmarks, in one device call. Expects .device/gpudoc (release build). Leaves $OUT/results2.tar.gz.
set -u
export PYTHONUNBUFFERED=1
G=.device/gpudoc; chmod +x $G
R=/tmp/results2; mkdir -p $R/steps $R/runs $R/bench $R/orphans
# 1. Per-step numbers: the shim's vs torch's own, with and without a leak.
for v in plain leak; do
  flag=""; [ $v = leak ] && flag=--leak
  $G run --json $R/steps/$v.report.json --trace $R/steps/$v.trace.jsonl -- python3 tests/gpu/torch_steps.py 40 $flag \
    > $R/steps/$v.stdout 2> $R/steps/$v.stderr
done
# 2. No context from the shim: the same tiny program with and without it; NVML's per-process peak.
for s in shim noshim; do
  flag=""; [ $s = noshim ] && flag=--no-torch
  $G run -q $flag --json $R/steps/context_$s.report.json -- python3 tests/gpu/scenarios.py context_only
done
# 3. Rule scenarios.
for s in healthy cache_bloat spike thrash near_capacity jax_prealloc; do
  timeout 120 $G run --json $R/runs/$s.report.json --trace $R/runs/$s.trace.jsonl -- python3 tests/gpu/scenarios.py $s \
    > /dev/null 2> $R/runs/$s.stderr
done
$G run --json $R/runs/leak.report.json --trace $R/runs/leak.trace.jsonl -- python3 tests/gpu/torch_steps.py 60 --leak > /dev/null 2> $R/runs/leak.stderr
# Memory held by another process before the job starts.
python3 tests/gpu/hold.py 10 > /tmp/hold.out 2>&1 & HOLD=$!
for i in $(seq 100); do grep -q held /tmp/hold.out && break; sleep 0.1; done
$G run --json $R/runs/others_before.report.json --trace $R/runs/others_before.trace.jsonl -- python3 tests/gpu/scenarios.py healthy > /dev/null 2> $R/runs/others_before.stderr
kill $HOLD; wait $HOLD 2>/dev/null
# A real OOM with the shim on: the observer's record.
$G run --json $R/runs/oom_observer.report.json -- python3 tests/gpu/oom.py too_big > /dev/null 2> $R/runs/oom_observer.stderr
# 4. Orphans: the parent dies, its multiprocessing child keeps 4 GiB.
setsid python3 tests/gpu/orphan_child.py > /tmp/orphan.out 2>&1 & PARENT=$!
for i in $(seq 300); do [ -s /tmp/orphan.out ] && break; sleep 0.1; done
CHILD=$(head -1 /tmp/orphan.out); kill -9 $PARENT; sleep 1
echo "parent $PARENT child $CHILD" > $R/orphans/pids.txt
$G orphans > $R/orphans/list.txt 2>&1; echo "exit $?" >> $R/orphans/list.txt
$G orphans --json $R/orphans/list.json > /dev/null 2>&1
$G orphans --kill --yes --grace 5s --json $R/orphans/kill.json > $R/orphans/kill.txt 2>&1; echo "exit $?" >> $R/orphans/kill.txt
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $R/orphans/after.csv
# 5. CPU at default rates: the slope between a 2 s and a 12 s run separates start-up from sampling.
$G run -q --json $R/bench/idle2.report.json -- sleep 2
$G run -q --json $R/bench/idle12.report.json -- sleep 12
# 6. Throughput with the shim on (the default), alternated with bare runs.
for i in 1 2 3; do
  python3 bench/train_loop.py > $R/bench/bare_$i.json
  $G run -q --json $R/bench/wrapped_$i.report.json -- python3 bench/train_loop.py > $R/bench/wrapped_$i.json
done
tar czf $OUT/results2.tar.gz -C /tmp results2
python3 - <<'PY'
import json
R = "/tmp/results2"
for v in ("plain", "leak"):
    r = json.load(open(f"{R}/steps/{v}.report.json"))
    own = [json.loads(l) for l in open(f"{R}/steps/{v}.stdout")]
    procs = r["torch"]["processes"]
    steps = procs[0]["steps"] if procs else []
    same = sum(1 for s, o in zip(steps, own) if s["allocated_bytes"] == o["allocated"] and s["reserved_bytes"] == o["reserved"])
    print(v, "torch procs", len(procs), "steps", len(steps), "own", len(own), "equal", same, "errors", r["torch"]["errors"])
for s in ("shim", "noshim"):
    r = json.load(open(f"{R}/steps/context_{s}.report.json"))
    print("context", s, [(p["pid"], p["gpu"], p["peak_bytes"]) for p in r["processes"]])
for s in ("idle2", "idle12"):
    print(s, json.load(open(f"{R}/bench/{s}.report.json"))["sampling"])
for i in (1, 2, 3):
    b = json.load(open(f"{R}/bench/bare_{i}.json"))["steps_per_s"]; w = json.load(open(f"{R}/bench/wrapped_{i}.json"))["steps_per_s"]
    print("train", i, round(b, 2), round(w, 2), "%+.2f%%" % ((w / b - 1) * 100))
r = json.load(open(f"{R}/runs/oom_observer.report.json"))
print("oom observer", r["torch"]["ooms"], r["oom"]["cause"] if r["oom"] else None)
PY
cat $R/orphans/list.txt $R/orphans/kill.txt $R/orphans/after.csv
for s in healthy cache_bloat spike thrash near_capacity jax_prealloc leak others_before; do
  python3 -c "import json; r=json.load(open('$R/runs/$s.report.json')); print('$s', r['exit']['code'], r['gpus'][0]['job_peak_bytes'], len(r['torch']['processes']))"
done
