#!/usr/bin/env bash
# The cost of `gpudoc run` to a launch-bound training loop (issue 12), on a GPU: bench/shim_loop.py at
# about 1.7 ms and 0.4 ms a step, bare, under gpudoc (shim on, leak hunting auto), with --hunt-leaks=off,
# and with --no-torch (NVML sampling only), rotated so no configuration always runs first; medians and
# spread. GPUDOC=path uses a gpudoc built elsewhere (the GPU machine has no cargo). PIN=1 runs the loop on
# core 3 and gpudoc on cores 5-7 (taskset), so the scheduler's placement drops out of the noise.
#   bench/shim_bench.sh [ALTERNATIONS]     (default 5)
set -u
cd "$(dirname "$0")/.."
G="${GPUDOC:-$PWD/target/release/gpudoc}"
N="${1:-5}"
# CONFIGS picks configurations; SHIM_BENCH_DIR keeps the results (each run's line is appended as it ends).
W="${SHIM_BENCH_DIR:-$(mktemp -d)}"; mkdir -p "$W"
read -r -a configs <<< "${CONFIGS:-bare gpudoc hunt_off no_torch}"
NC=${#configs[@]}
LOOP=(python3); WRAP=()
if [ "${PIN:-0}" = 1 ]; then LOOP=(taskset -c 3 python3); WRAP=(taskset -c 5-7); fi
run() { # config kind
  case $1 in
    bare) "${LOOP[@]}" bench/shim_loop.py $2 ;;
    gpudoc) "${WRAP[@]}" $G run -q --json $W/r.json -- "${LOOP[@]}" bench/shim_loop.py $2 ;;
    hunt_off) "${WRAP[@]}" $G run -q --hunt-leaks=off --json $W/r.json -- "${LOOP[@]}" bench/shim_loop.py $2 ;;
    no_torch) "${WRAP[@]}" $G run -q --no-torch --json $W/r.json -- "${LOOP[@]}" bench/shim_loop.py $2 ;;
  esac
}
for i in $(seq $N); do
  for kind in fast faster; do
    for j in $(seq 0 $((NC - 1))); do
      c=${configs[$(( (i + j) % NC ))]}
      run $c $kind | tail -1 | sed "s/^/{\"config\":\"$c\",\"run\":$i,\"x\":/; s/\$/}/" >> $W/results.jsonl
      if [ $c = gpudoc ]; then
        python3 -c "import json; r=json.load(open('$W/r.json')); p=r['torch']['processes'][0]; print(json.dumps({'config':'shim','kind':'$kind','record_every':p['record_every'],'shim_cost_pct':p['shim_cost_pct'],'cpu_s':r['sampling']['self_cpu_s'],'duration_s':r['duration_s']}))" >> $W/shim.jsonl
      fi
    done
  done
done
cp $W/results.jsonl $W/shim.jsonl "${OUT:-.}/" 2>/dev/null
python3 - $W/results.jsonl $W/shim.jsonl <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| loop | configuration | runs | median steps/s | min - max | vs bare (median) |")
print("|---|---|---|---|---|---|")
for kind in ("fast", "faster"):
    b = [r["x"]["steps_per_s"] for r in rows if r["x"]["kind"] == kind and r["config"] == "bare"]
    if not b:
        continue
    bare = st.median(b)
    for c in ("bare", "gpudoc", "hunt_off", "no_torch"):
        v = [r["x"]["steps_per_s"] for r in rows if r["x"]["kind"] == kind and r["config"] == c]
        if not v:
            continue
        ms = st.median(r["x"]["ms_per_step"] for r in rows if r["x"]["kind"] == kind and r["config"] == c)
        m = st.median(v)
        print(f"| {kind} ({ms:.2f} ms/step) | {c} | {len(v)} | {m:.1f} | {min(v):.1f} - {max(v):.1f} | {(m / bare - 1) * 100:+.2f}% |")
for l in open(sys.argv[2]):
    print(l.strip())
PY
