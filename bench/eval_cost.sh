#!/usr/bin/env bash
# An evaluation every 100 steps of a fast training loop, on the CPU (bench/README.md, "An evaluation every
# 100 steps, on the CPU"): bench/eval_loop.py's variants (none, call, method) bare and under `gpudoc run`
# (the fake NVML; the loop plays CUDA's start for the shim), alternated, ROUNDS rounds of STEPS steps.
#   bench/eval_cost.sh [ROUNDS [STEPS]]      after `cargo build --workspace`
# Prints each round, then per variant the medians: steps/s, ms added per step, the process's CPU time a
# step, ms per evaluation.
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-5} STEPS=${2:-2000}
PY=${PY:-target/py-venv/bin/python} G=${GPUDOC:-target/debug/gpudoc}
VARIANTS=${VARIANTS:-none call method}
R=$(mktemp -d)
export FAKE_NVML_STATE=$R/state.json GPUDOC_NVML_LIB=${GPUDOC_NVML_LIB:-$PWD/target/debug/libfake_nvml.so}
cat > "$FAKE_NVML_STATE" <<'J'
{"driver": "580.159.04", "cuda": 13000,
 "devices": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000",
              "total": 85520809984, "reserved": 644874240}]}
J
for i in $(seq "$ROUNDS"); do
  for v in $VARIANTS; do
    "$PY" bench/eval_loop.py "$v" "$STEPS" >> "$R/$v-bare.jsonl"
    "$G" run -q --json "$R/$v-$i.report.json" -- "$PY" bench/eval_loop.py "$v" "$STEPS" >> "$R/$v-gpudoc.jsonl"
    echo "round $i $v: bare $(tail -1 "$R/$v-bare.jsonl")"
    echo "round $i $v: gpudoc $(tail -1 "$R/$v-gpudoc.jsonl")"
  done
done
VARIANTS="$VARIANTS" "$PY" - "$R" <<'PY'
import json, os, statistics, sys
R = sys.argv[1]
print("| loop | rounds | bare steps/s | gpudoc steps/s | median ratio | ms added a step | CPU ms a step, bare / gpudoc "
      "| ms an evaluation, bare / gpudoc |")
print("|---|---|---|---|---|---|---|---|")
for v in os.environ["VARIANTS"].split():
    got = {w: [json.loads(l) for l in open(f"{R}/{v}-{w}.jsonl")] for w in ("bare", "gpudoc")}
    assert all(r["shim"] for r in got["gpudoc"]) and not any(r["shim"] for r in got["bare"])
    sps = {w: [r["steps_per_s"] for r in got[w]] for w in got}
    b, g = statistics.median(sps["bare"]), statistics.median(sps["gpudoc"])
    ev = {w: [r["ms_per_eval"] for r in got[w] if r["ms_per_eval"] is not None] for w in got}
    evs = " / ".join("%.2f" % statistics.median(ev[w]) for w in ("bare", "gpudoc")) if ev["bare"] else "-"
    cpu = " / ".join("%.3f" % statistics.median(r["cpu_ms_per_step"] for r in got[w]) for w in ("bare", "gpudoc"))
    print(f"| {v} | {len(sps['bare'])} | {', '.join('%.0f' % x for x in sps['bare'])} | "
          f"{', '.join('%.0f' % x for x in sps['gpudoc'])} | {g / b:.3f} | {1e3 / g - 1e3 / b:+.3f} | {cpu} "
          f"| {evs} |")
PY
rm -rf "$R"
