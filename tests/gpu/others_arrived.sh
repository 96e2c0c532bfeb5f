#!/usr/bin/env bash
# Issue 33's others-arrived on a real GPU, in one device call (about 2 minutes): a healthy training loop of
# 60 s (tests/gpu/forecast.py healthy) under gpudoc while processes outside the job take memory on its GPU
# (tests/gpu/hold.py, started by this script, not by the job): about 15 s in, one holds 20 GiB for 3 s (a
# blip: it must not be told); about 10 s later another takes 20 GiB and keeps it (it must be told during the
# run, once, no sooner than 12 s after it took the memory). Expects .device/gpudoc (a release build). Leaves
# $OUT/others.tar.gz (fixtures/others/h200_* are made from it) and prints what was said and when.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec33o; rm -rf $R; mkdir -p $R/others
O=$R/others
# hold NAME: starts hold.py 20 outside the job and waits until it holds the memory; its PID in NAME.pid,
# the moment (Unix seconds) in NAME.at.
hold() {
  python3 tests/gpu/hold.py 20 > $O/$1.hold.out 2>&1 &
  echo $! > $O/$1.pid
  until grep -q '^held' $O/$1.hold.out; do sleep 0.1; done
  date +%s.%N > $O/$1.at
}
$G run --json $O/arrived.report.json --trace $O/arrived.trace.jsonl \
  -- python3 tests/gpu/forecast.py healthy --secs 60 > $O/arrived.out 2>&1 &
run=$!
sleep 15
hold blip; sleep 3; kill $(cat $O/blip.pid)
sleep 7
hold stays
wait $run; echo "arrived exit $?" > $O/exits.txt
kill $(cat $O/stays.pid)
tar czf $OUT/others.tar.gz -C /tmp rec33o
python3 - $O <<'PY'
import json, sys
d = sys.argv[1]
r = json.load(open(d + "/arrived.report.json"))
lines = open(d + "/arrived.out", errors="replace").read().splitlines()
last = max([i for i, l in enumerate(lines) if l.startswith("step ")] or [0])
mid = [l for l in lines[:last] if l.startswith("gpudoc")]
pid = {n: open("%s/%s.pid" % (d, n)).read().strip() for n in ("blip", "stays")}
at = {n: float(open("%s/%s.at" % (d, n)).read()) - r["started_unix_s"] for n in ("blip", "stays")}
told = [x for x in r["diagnoses"] if x["rule"] == "others-arrived"]
print("said mid-run:", mid or "nothing")
print("blip pid %s held from %.1f s; stays pid %s held from %.1f s" % (pid["blip"], at["blip"], pid["stays"], at["stays"]))
for x in told:
    print("%s: at %.1f s, known at %s s" % (x["subject"], x["at_s"], x.get("known_at_s")))
ok = (len(mid) == 1 and ("pid %s (" % pid["stays"]) in mid[0] and len(told) == 1
      and told[0]["subject"] == "pid " + pid["stays"] and (told[0].get("known_at_s") or 0) - at["stays"] >= 10
      and not any(("pid %s (" % pid["blip"]) in l for l in lines))
print("verdict:", "ok" if ok else "FAIL")
PY
