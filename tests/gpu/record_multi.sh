#!/usr/bin/env bash
# Issue 8: DDP on two H200s under gpudoc, four situations; reports, traces and output in $OUT/multi.tar.gz.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
G=.device/gpudoc; chmod +x $G
R=/tmp/multi; mkdir -p $R
nvidia-smi --query-gpu=index,name,memory.used --format=csv > $R/gpus.csv
for m in correct stray rank0_extra oom; do
  timeout 150 $G run --json $R/$m.report.json --trace $R/$m.trace.jsonl -- \
    torchrun --nproc-per-node 2 --master-port 29511 tests/gpu/ddp.py $m > $R/$m.stdout 2> $R/$m.stderr
  echo "$m exit $?" >> $R/exits.txt
done
tar czf $OUT/multi.tar.gz -C /tmp multi
cat $R/gpus.csv $R/exits.txt
for m in correct stray rank0_extra oom; do echo "== $m"; grep -E "^  (error|warn |info )|^gpudoc|GPU [01] NVIDIA|torchrun:" $R/$m.stderr | head -12; done
