#!/usr/bin/env bash
# Held-out judgement on a real GPU, in one device call: ten programs unlike record_phases.sh's six
# (tests/gpu/judgement.py says each, and what an expert would say of it), each under gpudoc run with a
# report, a trace, its stdout and stderr; ckpt_train also bare, to compare its result bit for bit; slow_load
# with --stop-on steady-growth (a slow load must not be ended as a leak). Then `judgement.py check` prints
# an ok/BAD line per expectation (the story, where it ran out, what filled the GPU, the remedies that must
# not be given) and the count. Expects .device/gpudoc (a release build). Leaves $OUT/judgement.tar.gz.
#   bash tests/gpu/open.sh judgement.sh
#   bash tests/gpu/judgement.sh accum_graphs adam_first_step    # only these (the check then says the
#                                                                # others have no report)
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/judgement; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' > $R/versions.txt 2>&1
P="python3 tests/gpu/judgement.py"
# rec NAME [gpudoc run flags]: NAME under gpudoc run with its report, trace, stdout, stderr, exit and time.
rec() {
  local name=$1; shift
  local t0
  t0=$(date +%s%N)
  timeout 90 "$G" run --json $R/$name.report.json --trace $R/$name.trace.jsonl "$@" -- $P "$name" \
    > $R/$name.stdout 2> $R/$name.stderr
  local rc=$?
  echo "$name exit $rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/exits.txt
}
names=("$@")
((${#names[@]})) || names=(accum_graphs adam_first_step kv_generate slow_load logits_kept ckpt_train
                           varlen_frag eval_then_train oom_retry prefetch_stream)
for n in "${names[@]}"; do
  case $n in
    slow_load) rec $n --stop-on steady-growth ;;
    ckpt_train)
      timeout 90 $P $n > $R/$n.bare.stdout 2> $R/$n.bare.stderr
      echo "$n bare exit $?" | tee -a $R/exits.txt
      rec $n ;;
    *) rec $n ;;
  esac
done
tar czf "$OUT/judgement.tar.gz" -C /tmp judgement
$P check $R
