#!/usr/bin/env bash
# Held-out judgement, second set, on a real GPU in one device call: nine programs unlike judgement.sh's ten
# and record_phases.sh's six (tests/gpu/judgement2.py says each, and what an expert would say of it), each
# under gpudoc run with a report, a trace, its stdout and stderr. detached_eval leaves an evaluator running
# on purpose: it is ended here as soon as gpudoc has judged the run (and ends itself after 40 s at most).
# Then `judgement2.py check` prints an ok/BAD line per expectation (judgement.py's checker) and the count.
# Expects .device/gpudoc (a release build). Leaves $OUT/judgement2.tar.gz.
#   bash tests/gpu/open.sh judgement2.sh
#   bash tests/gpu/judgement2.sh frac_cap soup_load    # only these (the check then says the others have
#                                                      # no report)
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/judgement2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' > $R/versions.txt 2>&1
P="python3 tests/gpu/judgement2.py"
export JUDGEMENT2_PIDFILE=$R/detached_eval.pid
# rec NAME [gpudoc run flags]: NAME under gpudoc run with its report, trace, stdout, stderr, exit and time.
rec() {
  local name=$1; shift
  local t0
  t0=$(date +%s%N)
  timeout 50 "$G" run --json $R/$name.report.json --trace $R/$name.trace.jsonl "$@" -- $P "$name" \
    > $R/$name.stdout 2> $R/$name.stderr
  local rc=$?
  echo "$name exit $rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/exits.txt
}
# The evaluator detached_eval left running, ended (by its pid, which it wrote), and said.
end_evaluator() {
  [[ -s $JUDGEMENT2_PIDFILE ]] || { echo "detached_eval: no evaluator pid" | tee -a $R/exits.txt; return; }
  local pid
  pid=$(cat "$JUDGEMENT2_PIDFILE")
  if kill "$pid" 2>/dev/null; then
    # Gone, and its GPU memory with it, before the next program starts: else that program's run finds
    # memory held before it started (held-before-start, rightly: the H100's first round saw 2.97 GiB).
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    echo "detached_eval: evaluator $pid ended after the run" | tee -a $R/exits.txt
  else
    echo "detached_eval: evaluator $pid had already gone" | tee -a $R/exits.txt
  fi
}
names=("$@")
((${#names[@]})) || names=(frac_cap compiled_step soup_load prompt_cache cuda_collate detached_eval
                           empty_cache_loop ckpt_snapshot healthy_eval)
# open.sh gives this script 330 s: a program that could not finish in what is left is not started, so the
# check and the archive always come.
for n in "${names[@]}"; do
  if ((SECONDS + 50 > ${JUDGEMENT2_BUDGET_S:-310})); then
    echo "$n not started: $SECONDS s gone" | tee -a $R/exits.txt; continue
  fi
  rec "$n"
  [[ $n == detached_eval ]] && end_evaluator
done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv > $R/nvidia-smi.after.csv
tar czf "$OUT/judgement2.tar.gz" -C /tmp judgement2
$P check $R
