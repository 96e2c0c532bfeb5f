#!/usr/bin/env bash
# On the lent H200 host: the command's output through gpudoc (bench/passthrough.sh RUNS) and where gpudoc's
# own time goes around a command (its fixed start and end against `true` and `sleep 0.1`; 200 MB written to a
# file opened for appending and to one truncated by the shell's `>`), bare and under gpudoc alternated, with
# nothing left to write back before each run (sync). Expects .device/gpudoc; leaves $OUT/output_path.tar.gz
# and prints what it measured (bench/README.md has the tables).
#   tests/gpu/output_path.sh [RUNS]       (default 7)
set -u
RUNS="${1:-7}"; D=/tmp/output_path; mkdir -p $D; G=$PWD/.device/gpudoc
export GPUDOC_NVML_LIB=/nonexistent
python3 -c "import sys; sys.stdout.buffer.write((b'x'*79+b'\n')*(200*1024*1024//80))" > /tmp/lines80
# Prints "NAME-bare|gpudoc MICROSECONDS" for one run of one row.
row() {
  local name=$1 how=$2 cmd=$3 c X s e
  for c in bare gpudoc; do
    X=""; [ $c = gpudoc ] && X="$G run -q --"
    [ "$how" = append ] && : > /tmp/o
    sync; s=$(date +%s%N)
    if [ "$how" = append ]; then $X sh -c "$cmd" >> /tmp/o 2>&1; else $X sh -c "$cmd" > /tmp/o 2>&1; fi
    e=$(date +%s%N); echo "$name-$c $(( (e - s) / 1000 ))"
  done
}
for _ in $(seq "$RUNS"); do
  row true append true
  row sleep append "sleep 0.1"
  row file_append append "cat /tmp/lines80 >&2"
  row file_trunc trunc "cat /tmp/lines80 >&2"
done > $D/phases.txt
awk '{split($1, k, "-"); v[$1] = v[$1] " " $2} END {for (x in v) print x ":" v[x]}' $D/phases.txt | sort
GPUDOC=$G timeout 480 bash bench/passthrough.sh "$RUNS" > $D/passthrough.md 2> $D/passthrough.err
cat $D/passthrough.md
tar czf $OUT/output_path.tar.gz -C /tmp output_path
