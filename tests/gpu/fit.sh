#!/usr/bin/env bash
# On the lent H200 (issue 34): `gpudoc fit` on a real model (tests/gpu/fit_model.py), the answer checked by
# bare runs (no gpudoc) at it and one above it, 10 steps each, and by `--try '{}=A'` from one above it;
# then `gpudoc run --try expandable_segments` on a real fragmentation OOM that expandable segments rescue
# (tests/gpu/frag.py, checked bare both ways first). Expects .device/gpudoc; results in $OUT/fit/.
#   tests/gpu/fit.sh          # all (about 4 minutes)
#   tests/gpu/fit.sh frag     # the fragmentation part alone (under a minute)
set -u
G=${GPUDOC:-$PWD/.device/gpudoc}; D=$OUT/fit; mkdir -p $D
if [ "${1:-all}" != frag ]; then
  "$G" fit --json $D/fit.json -- python3 tests/gpu/fit_model.py --batch-size {} > $D/fit.log 2>&1
  echo "fit exit $?"; grep '^gpudoc fit\|^  ' $D/fit.log
  A=$(python3 -c "import json; print(json.load(open('$D/fit.json'))['answer'])")
  for b in $A $((A + 1)); do
    python3 tests/gpu/fit_model.py --batch-size $b --steps 10 > $D/bare_$b.log 2>&1
    echo "bare batch $b: exit $? ($(grep -c '^step' $D/bare_$b.log) steps; $(grep -o 'OutOfMemoryError' $D/bare_$b.log | head -1))"
  done
  # A smaller value tried for real: one above the answer runs out, the answer fits (exit 0).
  "$G" run --try "{}=$A" --json $D/try_value.json -- python3 tests/gpu/fit_model.py --batch-size "{$((A + 1))}" --steps 20 > $D/try_value.log 2>&1
  echo "try {}=$A from $((A + 1)): exit $?"; grep -A3 '^gpudoc run --try' $D/try_value.log
fi
# The premise, bare: frag.py runs out of memory as is (exit 1), and fits with expandable segments (exit 0).
python3 tests/gpu/frag.py > $D/frag_bare.log 2>&1
echo "frag.py bare: exit $?"; grep -v '^ \|^Traceback' $D/frag_bare.log | cut -c1-400
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 tests/gpu/frag.py > $D/frag_bare_es.log 2>&1
echo "frag.py bare, expandable_segments:True: exit $?"; grep -v '^ \|^Traceback' $D/frag_bare_es.log | cut -c1-400
"$G" run --try expandable_segments --json $D/try.json -- python3 tests/gpu/frag.py > $D/try.log 2>&1
echo "try exit $?"; grep -A3 '^gpudoc run --try' $D/try.log
python3 -c "import json; t=json.load(open('$D/try.json'))['tried']; print('tried:', {k: t[k] for k in ('remedy', 'alloc_conf', 'fits_now')}, [(s, t[s] and (t[s]['outcome'], t[s]['oom_cause'], t[s]['peak_bytes'], t[s]['fragmentation_bytes'])) for s in ('before', 'after')])"
"$G" run --json $D/frag.json -- python3 tests/gpu/frag.py > $D/frag.log 2>&1
echo "fragmentation run: exit $?, $(grep -c 'try: gpudoc run --try expandable_segments' $D/frag.log) suggestion line(s)"
