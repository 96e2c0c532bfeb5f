#!/usr/bin/env bash
# Real-GPU checks and benchmarks for `gpudoc run` and the OOM fixtures, in one device call.
# Expects .device/ to hold the release build of gpudoc, the sample_cost bench and nvml_loop (built on the
# development machine: the device has no crate registry). Leaves everything in $OUT/results.tar.gz.
set -u
export PYTHONUNBUFFERED=1
D=.device; G=$D/gpudoc
R=/tmp/results; mkdir -p $R/oom $R/traces $R/bench
chmod +x $D/*
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch, jax; print(torch.__version__, torch.version.cuda, jax.__version__)' > $R/versions.txt 2>&1

# 1. A known allocation: job peak vs torch max_memory_reserved + non-PyTorch memory.
$G run --json $R/traces/alloc_known.report.json --trace $R/traces/alloc_known.trace.jsonl \
   -- python3 tests/gpu/alloc_known.py > $R/traces/alloc_known.stdout 2> $R/traces/alloc_known.stderr
python3 tests/gpu/alloc_check.py $R/traces/alloc_known.report.json $R/traces/alloc_known.stdout | tee $R/alloc_check.txt

# 2. OOM texts, each under gpudoc (reports and traces kept).
oom() { # name, command...
  local name=$1; shift
  timeout 120 $G run -q --json $R/oom/$name.report.json --trace $R/oom/$name.trace.jsonl -- "$@" \
     > $R/oom/$name.stdout 2> $R/oom/$name.stderr
  echo "$name exit $?" >> $R/oom/exits.txt
}
oom torch_too_big python3 tests/gpu/oom.py too_big
oom torch_fragmentation python3 tests/gpu/oom.py fragmentation
oom torch_cublas python3 tests/gpu/oom.py cublas
oom jax_too_big python3 tests/gpu/oom_jax.py
# Another process holds 100 GiB, started outside the job.
python3 tests/gpu/hold.py 100 > /tmp/hold.out 2>&1 & HOLD=$!
for i in $(seq 100); do grep -q held /tmp/hold.out && break; sleep 0.1; done
echo "holder pid $HOLD" > $R/oom/torch_other_process.holder
oom torch_other_process python3 tests/gpu/oom.py squeeze
kill $HOLD; wait $HOLD 2>/dev/null
# A holder takes all but 200 MiB: a new process cannot even create its CUDA context.
python3 tests/gpu/hold.py all 0.2 > /tmp/hold.out 2>&1 & HOLD=$!
for i in $(seq 100); do grep -q held /tmp/hold.out && break; sleep 0.1; done
oom torch_context python3 -c 'import torch; torch.zeros(1, device="cuda")'
kill $HOLD; wait $HOLD 2>/dev/null

# 3. Benchmarks.
B=$R/bench
$D/nvml_loop 200000 > $B/nvml_loop.txt
$D/sample_cost 200000 > $B/sample_cost.txt
$G run --json $B/idle.report.json -q -- sleep 10
for i in 1 2 3; do
  python3 bench/train_loop.py > $B/bare_$i.json
  $G run -q --json $B/wrapped_$i.report.json -- python3 bench/train_loop.py > $B/wrapped_$i.json
done
nvidia-smi > $R/nvidia-smi-end.txt
tar czf $OUT/results.tar.gz -C /tmp results
cat $R/alloc_check.txt $R/oom/exits.txt $B/nvml_loop.txt $B/sample_cost.txt
for i in 1 2 3; do echo "bare $(cat $B/bare_$i.json) wrapped $(cat $B/wrapped_$i.json)"; done
python3 -c "import json; r=json.load(open('$B/idle.report.json'))['sampling']; print('idle', r)"
