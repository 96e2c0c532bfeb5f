#!/usr/bin/env bash
# On the lent H200: real PyTorch OOMs whose output goes to a file the command writes itself (`> log 2>&1`),
# as gpudoc reads it (sieved; deferred while the command writes faster than 32 MiB/s), against the same runs
# through a pipe (`2>&1 | cat > log`, every byte scanned). Prints, per run, the classification, cause,
# request and the OOM's time from both; they must agree. Expects .device/gpudoc.
#   tests/gpu/file_oom.sh
set -u
G=${GPUDOC:-$PWD/.device/gpudoc}; D=/tmp/file_oom; mkdir -p $D
# name | command
RUNS=(
  "too_big|python3 tests/gpu/oom.py too_big"
  "fragmentation|python3 tests/gpu/oom.py fragmentation"
  "firehose_then_oom|python3 tests/gpu/firehose.py 4000000; python3 tests/gpu/oom.py too_big"
  "oom_amid_firehose|python3 tests/gpu/firehose.py 2000000; python3 tests/gpu/oom.py too_big; python3 tests/gpu/firehose.py 2000000; exit 1"
)
show() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
o = r.get("oom") or {}
print(r["exit"]["classification"], o.get("cause"), o.get("requested_bytes"), "at_s=%s" % o.get("at_s"),
      "reports=%s" % o.get("reports"), "run_s=%.2f" % r["duration_s"])
PY
}
for run in "${RUNS[@]}"; do
  name="${run%%|*}"; cmd="${run#*|}"
  "$G" run -q --json $D/$name.file.json -- sh -c "$cmd" > $D/$name.file.log 2>&1
  "$G" run -q --json $D/$name.pipe.json -- sh -c "$cmd" 2>&1 | cat > $D/$name.pipe.log
  echo "$name file: $(show $D/$name.file.json) ($(stat -c %s $D/$name.file.log) bytes)"
  echo "$name pipe: $(show $D/$name.pipe.json) ($(stat -c %s $D/$name.pipe.log) bytes)"
done
rm -f $D/*.log
tar czf $OUT/file_oom.tar.gz -C /tmp file_oom
