#!/usr/bin/env bash
# Listing GPU holders on a machine with 5,000 processes: `gpudoc orphans` against `fuser -v` on the same
# device files, alternated, 10 runs each; prints a table (median and min, milliseconds). The device files
# are stand-ins (GPUDOC_NVIDIA_DEV_PREFIX) so it runs on any machine; 50 of the processes hold them.
#   bench/orphans_listing.sh [path/to/gpudoc]
set -euo pipefail
G=${1:-target/release/gpudoc}
N=${N:-5000}
D=$(mktemp -d)
touch "$D/nvidia0" "$D/nvidiactl" "$D/nvidia-uvm"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; rm -rf "$D"; }
trap cleanup EXIT
for i in $(seq "$N"); do
  if (( i % 100 == 0 )); then
    sh -c "exec 3<$D/nvidia0 4<$D/nvidiactl 5<$D/nvidia-uvm; exec sleep 600" & pids+=($!)
  else
    sleep 600 & pids+=($!)
  fi
done
sleep 1
total=$(ls /proc | grep -c '^[0-9]')
export GPUDOC_NVIDIA_DEV_PREFIX="$D/nvidia" GPUDOC_NVML_LIB=/nonexistent
run_ms() { local s e; s=$(date +%s%N); "$@" >/dev/null 2>&1 || true; e=$(date +%s%N); echo $(( (e - s) / 1000 )); }
g=(); f=()
for r in $(seq 10); do
  g+=("$(run_ms "$G" orphans)")
  f+=("$(run_ms fuser -v "$D"/nvidia*)")
done
found_g=$("$G" orphans --json - 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["holders"]))')
found_f=$(fuser "$D"/nvidia0 2>/dev/null | wc -w)
python3 - "$total" "$found_g" "$found_f" "${g[*]}" "${f[*]}" <<'PY'
import statistics, sys
total, fg, ff, g, f = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
g = [int(x) / 1000 for x in g]; f = [int(x) / 1000 for x in f]
print(f"| tool | processes on the machine | holders found | median ms | min ms |")
print(f"|---|---|---|---|---|")
print(f"| gpudoc orphans | {total} | {fg} | {statistics.median(g):.1f} | {min(g):.1f} |")
print(f"| fuser -v /dev/nvidia* | {total} | {ff} | {statistics.median(f):.1f} | {min(f):.1f} |")
PY
