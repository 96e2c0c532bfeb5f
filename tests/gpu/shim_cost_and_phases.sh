#!/usr/bin/env bash
# On the lent H200: the shim's step hook within one run (bench/shim_cost.py, both loops), and where gpudoc's
# time goes around a command writing 200 MB to a file (its fixed start and end against `sleep 0.1`, a file
# opened for appending, a file truncated by `>`), bare and under gpudoc, 5 times each. Expects
# .device/gpudoc; leaves $OUT/c4.tar.gz and prints what it measured (bench/README.md has the tables).
export CUDA_VISIBLE_DEVICES=0; mkdir -p /tmp/c4; G=$PWD/.device/gpudoc
for k in "fast 20000" "faster 40000"; do timeout 80 python3 bench/shim_cost.py $G $k >> /tmp/c4/shim_cost.jsonl 2>>/tmp/c4/err.txt; done
python3 -c "import sys; sys.stdout.buffer.write((b'x'*79+b'\n')*(200*1024*1024//80))" > /tmp/lines80
export GPUDOC_NVML_LIB=/nonexistent
for i in 1 2 3 4 5; do for c in bare gd; do
  X=""; [ $c = gd ] && X="$G run -q --"
  : > /tmp/o; s=$(date +%s%N); $X sleep 0.1 >>/tmp/o 2>&1; e=$(date +%s%N); echo "sleep-$c $(( (e-s)/1000 ))"
  : > /tmp/o; s=$(date +%s%N); $X sh -c 'cat /tmp/lines80 >&2' >>/tmp/o 2>&1; e=$(date +%s%N); echo "file-$c $(( (e-s)/1000 ))"
  s=$(date +%s%N); $X sh -c 'cat /tmp/lines80 >&2' > /tmp/o 2>&1; e=$(date +%s%N); echo "file_trunc-$c $(( (e-s)/1000 ))"
done; done > /tmp/c4/phases.txt
tar czf $OUT/c4.tar.gz -C /tmp c4; cat /tmp/c4/*
