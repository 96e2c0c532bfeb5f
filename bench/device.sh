#!/usr/bin/env bash
# A 2 GiB write to a character device as stdout (`> /dev/null`), bare and under `gpudoc run -q`,
# alternated: medians and spread of wall time. NVML is off (this measures the output path).
# GPUDOC_BEFORE=path adds another build of gpudoc to the rotation (the one before a change).
#   bench/device.sh [RUNS]          (default 9)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${GPUDOC:-}" ]; then cargo build --release -q; fi
G="${GPUDOC:-$PWD/target/release/gpudoc}"
B="${GPUDOC_BEFORE:-}"
RUNS="${1:-9}"
W="$(mktemp -d)"
trap 'rm -rf "$W"' EXIT
export GPUDOC_NVML_LIB=/nonexistent

# name | command (run by sh, its stdout to /dev/null)
WORKLOADS=(
  "head -c 2GiB /dev/zero|head -c 2147483648 /dev/zero"
  "dd bs=1M count=2048|dd if=/dev/zero bs=1M count=2048 status=none"
  "true (gpudoc's fixed start and end)|true"
)

. bench/timing.sh
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }

bare() { sh -c "$1" > /dev/null; }
under() { "$2" run -q -- sh -c "$1" > /dev/null 2> "$W/err"; }

if [ -n "$B" ]; then
  echo "| workload | bare (median, s) | before (median, s) | gpudoc run (median, s) | before / bare | gpudoc / bare | bare range | before range | gpudoc range |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
else
  echo "| workload | bare (median, s) | gpudoc run (median, s) | gpudoc / bare | bare range | gpudoc range |"
  echo "|---|---:|---:|---:|---:|---:|"
fi
for w in "${WORKLOADS[@]}"; do
  name="${w%%|*}"; cmd="${w#*|}"
  : > "$W/bare"; : > "$W/before"; : > "$W/now"
  for _ in $(seq "$RUNS"); do
    secs bare "$cmd" 3>> "$W/bare"
    if [ -n "$B" ]; then secs under "$cmd" "$B" 3>> "$W/before"; fi
    secs under "$cmd" "$G" 3>> "$W/now"
  done
  b=$(median < "$W/bare"); g=$(median < "$W/now")
  if [ -n "$B" ]; then
    o=$(median < "$W/before")
    echo "| $name | $(fmt "$b") | $(fmt "$o") | $(fmt "$g") | $(ratio "$o" "$b") | $(ratio "$g" "$b") | $(spread < "$W/bare") | $(spread < "$W/before") | $(spread < "$W/now") |"
  else
    echo "| $name | $(fmt "$b") | $(fmt "$g") | $(ratio "$g" "$b") | $(spread < "$W/bare") | $(spread < "$W/now") |"
  fi
done
