#!/usr/bin/env bash
# One torchrun job on two "nodes" (each a gpudoc run owning one GPU, --host node-a and node-b), merged;
# the leak and OOM recordings redone with the hunt that touches nothing of the program's.
# Expects .device/gpudoc and two GPUs. Writes straight under $OUT/recb, so a run cut short keeps what it did.
set -u
export PYTHONUNBUFFERED=1
G=$PWD/.device/gpudoc; chmod +x $G
R=$OUT/recb; mkdir -p $R/merge $R/leaks $R/oom
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# 1. Two nodes of one job.
PORT=29600
for m in correct rank0_extra oom; do
  PORT=$((PORT + 1))
  for n in 0 1; do
    host=node-$([ $n = 0 ] && echo a || echo b)
    CUDA_VISIBLE_DEVICES=$n timeout $([ $m = oom ] && echo 45 || echo 60) $G run --host $host --name ddp-$m \
      --json $R/merge/${m}_$host.report.json --trace $R/merge/${m}_$host.trace.jsonl -- \
      torchrun --nnodes 2 --node-rank $n --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $PORT \
      tests/gpu/ddp.py $m > $R/merge/${m}_$host.stdout 2> $R/merge/${m}_$host.stderr &
  done
  wait
  $G report $R/merge/${m}_node-a.report.json $R/merge/${m}_node-b.report.json --json $R/merge/$m.merged.json \
    --color never > $R/merge/$m.merged.txt 2>&1
  echo "== $m"; head -12 $R/merge/$m.merged.txt
done
export CUDA_VISIBLE_DEVICES=0
rec() { local dir=$1 name=$2; shift 2
  timeout 150 $G run --json $R/$dir/$name.report.json --trace $R/$dir/$name.trace.jsonl "$@" \
    > $R/$dir/$name.stdout 2> $R/$dir/$name.stderr; echo "$dir/$name exit $?" | tee -a $R/exits.txt; }
# 2. Leak hunts and OOM searches again.
for m in list graph dict helper; do (cd tests/gpu && rec leaks $m -- python3 leaks.py $m 300); done
S="python3 tests/gpu/scenarios.py"
rec oom grow_oom -- $S grow_oom
rec oom fraction_cap -- $S fraction_cap
rec oom child_hog -- $S child_hog
rec oom torch_fragmentation -- python3 tests/gpu/oom.py fragmentation
echo "program output touched by the shim:"; grep -l "_gpudoc" $R/*/*.stderr $R/*/*.stdout || echo none
