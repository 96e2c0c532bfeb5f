#!/usr/bin/env bash
# Re-records every real-GPU fixture with this gpudoc (reports with diagnoses, traces with their end rows),
# the held-out situations of issue 13 and their near misses, the planted leaks of issue 15, and DDP on two
# GPUs when the machine has them. Expects .device/gpudoc (a release build). Leaves $OUT/rec.tar.gz.
set -u
export PYTHONUNBUFFERED=1
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec; mkdir -p $R/runs $R/traces $R/oom $R/leaks $R/multi
export CUDA_VISIBLE_DEVICES=0
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch, jax; print(torch.__version__, torch.version.cuda, jax.__version__)' > $R/versions.txt 2>&1
# rec DIR NAME [gpudoc run flags] -- COMMAND...: report, trace, stdout, stderr, exit code.
rec() {
  local dir=$1 name=$2; shift 2
  local t0=$(date +%s%N)
  timeout 150 $G run --json $R/$dir/$name.report.json --trace $R/$dir/$name.trace.jsonl "$@" \
    > $R/$dir/$name.stdout 2> $R/$dir/$name.stderr
  local rc=$?
  echo "$dir/$name exit $rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/exits.txt
}
hold() { # GiB...: a foreign process holding memory, started outside the job
  python3 tests/gpu/hold.py "$@" > /tmp/hold.out 2>&1 & HOLD=$!
  for i in $(seq 150); do grep -q held /tmp/hold.out && break; sleep 0.1; done
}
S="python3 tests/gpu/scenarios.py"
# Rule situations and their near misses.
for s in healthy cache_bloat cache_small spike spike_small thrash near_capacity near_capacity_miss \
         periodic_eval eval_small leftover_miss signal_kill; do
  rec runs $s -- $S $s
done
rec runs spike_noshim --no-torch -- $S spike
rec runs leftover --kill-orphans -- $S leftover
rec runs jax_prealloc -- $S jax_prealloc
XLA_PYTHON_CLIENT_PREALLOCATE=false rec runs jax_noprealloc -- $S jax_prealloc
rec runs leak -- python3 tests/gpu/torch_steps.py 60 --leak
hold 10; rec runs others_before -- $S healthy; kill $HOLD; wait $HOLD 2>/dev/null
# Out of memory, each cause.
O="python3 tests/gpu/oom.py"
rec oom torch_too_big -- $O too_big
rec oom torch_fragmentation -- $O fragmentation
rec oom torch_cublas -- $O cublas
rec oom jax_too_big -- python3 tests/gpu/oom_jax.py
rec oom grow_oom -- $S grow_oom
rec oom fraction_cap -- $S fraction_cap
rec oom child_hog -- $S child_hog
hold 100; echo "holder pid $HOLD" > $R/oom/torch_other_process.holder
rec oom torch_other_process -- $O squeeze; kill $HOLD; wait $HOLD 2>/dev/null
hold all 0.2
rec oom torch_context -- python3 -c 'import torch; torch.zeros(1, device="cuda")'
kill $HOLD; wait $HOLD 2>/dev/null
# The framework view against torch's own numbers.
rec traces alloc_known -- python3 tests/gpu/alloc_known.py
python3 tests/gpu/alloc_check.py $R/traces/alloc_known.report.json $R/traces/alloc_known.stdout | tee $R/alloc_check.txt
rec traces torch_steps_plain -- python3 tests/gpu/torch_steps.py 40
rec traces torch_steps_leak -- python3 tests/gpu/torch_steps.py 40 --leak
rec traces context_shim -- $S context_only
rec traces context_noshim --no-torch -- $S context_only
# Planted leaks, and the same leak without hunting (for the hunt's cost).
for m in list dict graph helper healthy plateau; do
  (cd tests/gpu && rec leaks $m -- python3 leaks.py $m 300)
done
(cd tests/gpu && rec leaks list_nohunt --hunt-leaks=off -- python3 leaks.py list 300)
(cd tests/gpu && rec leaks healthy_on --hunt-leaks -- python3 leaks.py healthy 300)
# DDP on two GPUs.
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  unset CUDA_VISIBLE_DEVICES
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  nvidia-smi --query-gpu=index,name,memory.used --format=csv > $R/multi/gpus.csv
  for m in correct stray rank0_extra oom; do
    rec multi $m -- torchrun --nproc-per-node 2 --master-port 29511 tests/gpu/ddp.py $m
  done
fi
tar czf $OUT/rec.tar.gz -C /tmp rec
for f in $R/*/*.report.json; do
  python3 - "$f" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
n = sys.argv[1].split("/rec/")[1].replace(".report.json", "")
d = ",".join(x["rule"] for x in r["diagnoses"])
print(f"{n:28} {r['exit']['classification']:9} {(r['oom'] or {}).get('cause', '-'):13} {d}")
PY
done
