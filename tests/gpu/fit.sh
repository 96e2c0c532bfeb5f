#!/usr/bin/env bash
# On the lent H200: `gpudoc fit` on a real model (tests/gpu/fit_model.py), the answer checked by bare runs
# (no gpudoc) at it and one above it, 10 steps each; then `gpudoc run --try expandable_segments` on a real
# fragmentation OOM (tests/gpu/oom.py fragmentation). Expects .device/gpudoc; results in $OUT/fit/.
#   tests/gpu/fit.sh
set -u
G=${GPUDOC:-$PWD/.device/gpudoc}; D=$OUT/fit; mkdir -p $D
"$G" fit --json $D/fit.json -- python3 tests/gpu/fit_model.py --batch-size {} > $D/fit.log 2>&1
echo "fit exit $?"; grep '^gpudoc fit\|^  ' $D/fit.log
A=$(python3 -c "import json; print(json.load(open('$D/fit.json'))['answer'])")
for b in $A $((A + 1)); do
  python3 tests/gpu/fit_model.py --batch-size $b --steps 10 > $D/bare_$b.log 2>&1
  echo "bare batch $b: exit $? ($(grep -c '^step' $D/bare_$b.log) steps; $(grep -o 'OutOfMemoryError' $D/bare_$b.log | head -1))"
done
"$G" run --try expandable_segments --json $D/try.json -- python3 tests/gpu/oom.py fragmentation > $D/try.log 2>&1
echo "try exit $?"; grep -A3 '^gpudoc run --try' $D/try.log
"$G" run --json $D/frag.json -- python3 tests/gpu/oom.py fragmentation > $D/frag.log 2>&1
echo "fragmentation run: $(grep -c 'try: gpudoc run --try expandable_segments' $D/frag.log) suggestion line(s)"
