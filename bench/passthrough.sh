#!/usr/bin/env bash
# The command's output through gpudoc against the same command bare: the workloads of issues 11 and 16,
# bare and under `gpudoc run` alternated, medians and spread of wall time. Output goes to a file, as with
# `> log 2>&1`, or to a pipe (`| cat > log`), and the bytes are compared. NVML is off (no GPU needed:
# this measures the output path; gpudoc's one line saying so, at the end, is left out of the comparison).
#   bench/passthrough.sh [RUNS]          (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
# GPUDOC=path uses a gpudoc built elsewhere (the lent GPU machine has no cargo).
if [ -z "${GPUDOC:-}" ]; then cargo build --release -q; fi
G="${GPUDOC:-$PWD/target/release/gpudoc}"
RUNS="${1:-5}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
export GPUDOC_NVML_LIB=/nonexistent
python3 -c "import sys; sys.stdout.buffer.write((b'x'*79+b'\n')*(200*1024*1024//80))" > "$W/lines80"
head -c $((2 * 1024 * 1024 * 1024)) /dev/urandom > "$W/random2g"
head -c $((2 * 1000 * 1000 * 1000)) /dev/zero | tr '\0' 'a' | fold -w 100 > "$W/stream2g"

# name | command (run by sh, its output to $W/out)
WORKLOADS=(
  "200 MB of 80-character lines to stderr|cat $W/lines80 >&2"
  "200 MB of yes to stderr|yes | head -c 209715200 >&2"
  "2 GiB of random bytes to stderr|cat $W/random2g >&2"
  "2 GB stream through cat to stdout|cat < $W/stream2g"
  "100k short lines to stdout|seq 100000"
)

. bench/timing.sh

bare_to() { if [ "$1" = file ]; then sh -c "$2" > "$W/out.bare" 2>&1; else sh -c "$2" 2>&1 | cat > "$W/out.bare"; fi; }
# The same with one more process copying the stream on (`| cat`): what any pipe hop costs.
hop_to() {
  if [ "$1" = file ]; then sh -c "$2" 2>&1 | cat > "$W/out.hop"
  else sh -c "$2" 2>&1 | cat | cat > "$W/out.hop"; fi
}
wrapped_to() {
  if [ "$1" = file ]; then "$G" run -q -- sh -c "$2" > "$W/out.wrapped" 2>&1
  else "$G" run -q -- sh -c "$2" 2>&1 | cat > "$W/out.wrapped"; fi
}

echo "| workload | output to | bare (median, s) | bare \`\| cat\` (median, s) | gpudoc run (median, s) | gpudoc / bare | bare range | gpudoc range | bytes identical |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---|"
for w in "${WORKLOADS[@]}"; do
 for to in file pipe; do
  name="${w%%|*}"; cmd="${w#*|}"
  : > "$W/bare"; : > "$W/hop"; : > "$W/wrapped"
  for _ in $(seq "$RUNS"); do
    # Each run starts with nothing left to write back: otherwise truncating the last run's 200 MB (the
    # shell's `>`) waits for the disk, by luck more in one column than another.
    sync; secs bare_to "$to" "$cmd" 3>> "$W/bare" || true
    sync; secs hop_to "$to" "$cmd" 3>> "$W/hop" || true
    sync; secs wrapped_to "$to" "$cmd" 3>> "$W/wrapped" || true
  done
  same=no; cmp -s -n "$(stat -c %s "$W/out.bare")" "$W/out.bare" "$W/out.wrapped" && same=yes
  b=$(median < "$W/bare"); h=$(median < "$W/hop"); g=$(median < "$W/wrapped")
  echo "| $name | $to | $(fmt "$b") | $(fmt "$h") | $(fmt "$g") | $(awk -v a="$g" -v b="$b" 'BEGIN{printf "%.2f", a/b}') | $(spread < "$W/bare") | $(spread < "$W/wrapped") | $same |"
 done
done
