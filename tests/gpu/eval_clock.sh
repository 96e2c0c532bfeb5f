#!/usr/bin/env bash
# The evaluation's forward clock on a real GPU (one device call, ~2 min): tests/gpu/phases.py's
# evaluations after 50 training steps under gpudoc run (eval_keep keeps its detached outputs, eval_oom its
# outputs with their graphs until the OOM: the leak's line and holder must be named), then the cost:
# bench/shim_loop.py fast with an evaluation every 100 steps (EVAL_EVERY=100), bare and under gpudoc,
# ROUNDS alternated rounds (the first argument, default 3). Expects .device/gpudoc; leaves
# $OUT/eval_clock.tar.gz and prints the diagnoses.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/evalclock; rm -rf $R; mkdir -p $R
for what in eval_keep eval_oom; do
  timeout 150 $G run --json $R/$what.report.json --trace $R/$what.trace.jsonl -- python3 tests/gpu/phases.py $what \
    > $R/$what.stdout 2> $R/$what.stderr
  echo "$what: exit $?"
  python3 - $R/$what.report.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["torch"]["processes"]:
    for h in p.get("hunts", []):
        print("  hunt", h.get("why"), h.get("clock"), "sites", len(h.get("sites", [])), "holders", len(h.get("holders", [])))
for d in r["diagnoses"]:
    print("  %s: %s" % (d["rule"], d["message"][:300]))
    for l in d["details"][:3]:
        print("      " + l[:300])
PY
done
ROUNDS=${1:-3}
for i in $(seq "$ROUNDS"); do
  EVAL_EVERY=100 timeout 90 python3 bench/shim_loop.py fast 3000 >> $R/loop-bare.jsonl 2>>$R/loop.err
  EVAL_EVERY=100 timeout 90 $G run -q --json $R/loop-gpudoc-$i.report.json -- python3 bench/shim_loop.py fast 3000 \
    >> $R/loop-gpudoc.jsonl 2>>$R/loop.err
done
python3 - <<'PY'
import json
R = "/tmp/evalclock"
for name in ("bare", "gpudoc"):
    v = [json.loads(l)["steps_per_s"] for l in open(f"{R}/loop-{name}.jsonl")]
    print(f"{name:7} steps/s {[round(x, 1) for x in v]}")
import glob
for i in range(1, len(glob.glob(f"{R}/loop-gpudoc-*.report.json")) + 1):
    r = json.load(open(f"{R}/loop-gpudoc-{i}.report.json"))
    p = r["torch"]["processes"][0]
    print(f"  run {i}: diagnoses {[d['rule'] for d in r['diagnoses']]}, hunts {len(p.get('hunts', []))}, shim {p.get('shim_cost_pct')}%")
PY
tar czf $OUT/eval_clock.tar.gz -C /tmp evalclock
