#!/usr/bin/env bash
# Issue 48: what the framework shim costs a JAX or CuPy job at the fastest step rates users run (one device
# call, ~2 min): bench/framework_loop.py jax|cupy (a jitted MLP step, ~0.1 ms; the same in CuPy), bare and
# under gpudoc run, ROUNDS alternated rounds (the first argument, default 5). Expects .device/gpudoc (a
# release build). Leaves $OUT/frameworks_cost.tar.gz; prints steps/s per run and the medians' ratio.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/fwcost; rm -rf $R; mkdir -p $R
ROUNDS=${1:-5}
STEPS=${STEPS:-20000}
for i in $(seq "$ROUNDS"); do
  for kind in jax cupy; do
    timeout 60 python3 bench/framework_loop.py $kind $STEPS >> $R/$kind-bare.jsonl 2>>$R/err.log
    timeout 60 "$G" run -q --json $R/$kind-gpudoc-$i.report.json -- \
      python3 bench/framework_loop.py $kind $STEPS >> $R/$kind-gpudoc.jsonl 2>>$R/err.log
    echo "round $i $kind: bare $(tail -1 $R/$kind-bare.jsonl) gpudoc $(tail -1 $R/$kind-gpudoc.jsonl)"
  done
done
tar czf "$OUT/frameworks_cost.tar.gz" -C /tmp fwcost
python3 - <<'PY'
import json, statistics
R = "/tmp/fwcost"
for kind in ("jax", "cupy"):
    got = {}
    for who in ("bare", "gpudoc"):
        try:
            got[who] = [json.loads(l)["steps_per_s"] for l in open(f"{R}/{kind}-{who}.jsonl") if l.strip()]
        except (OSError, ValueError):
            got[who] = []
    if not got["bare"] or not got["gpudoc"]:
        print(f"BAD {kind}: no runs ({got})")
        continue
    b, g = statistics.median(got["bare"]), statistics.median(got["gpudoc"])
    us = (1e6 / g - 1e6 / b)
    print(f"{kind}: bare {got['bare']} gpudoc {got['gpudoc']}; medians {b:.0f} vs {g:.0f} steps/s "
          f"({100 * (g / b - 1):+.2f}%, {us:+.2f} us a step)")
    for i in range(1, 99):
        try:
            r = json.load(open(f"{R}/{kind}-gpudoc-{i}.report.json"))
        except OSError:
            break
        p = (r.get("torch") or {}).get("processes") or [{}]
        print(f"  run {i}: framework {p[0].get('framework')} steps {p[0].get('steps_total')} "
              f"rules {[d['rule'] for d in r.get('diagnoses', [])]}")
        break
PY
