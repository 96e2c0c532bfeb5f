#!/usr/bin/env bash
# Issue 48: what the framework shim costs a JAX or CuPy job at the fastest step rates users run (one device
# call, ~2-3 min): bench/framework_loop.py jax|cupy (a jitted MLP step, ~50 us; the same in CuPy) bare, under
# `gpudoc run --no-torch` (the outside view alone: NVML sampling, no shim) and under `gpudoc run` (the
# framework view), ROUNDS rounds (the first argument, default 5) whose order rotates each round, so that a
# drift of the machine falls on every variant alike. The kinds: the second argument or KINDS, "jax cupy" by default; `tensorflow` measures the tf.function counter of a custom loop. Expects .device/gpudoc
# (a release build). Leaves $OUT/frameworks_cost.tar.gz; prints steps/s per run and the medians' ratios.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/fwcost; rm -rf $R; mkdir -p $R
ROUNDS=${1:-5}
STEPS=${STEPS:-20000}
KINDS=${2:-${KINDS:-jax cupy}}
variants=(bare outside gpudoc)
one() { # kind variant round
  local cmd=(python3 bench/framework_loop.py "$1" "$STEPS")
  case $2 in
    bare) timeout 60 "${cmd[@]}" ;;
    outside) timeout 60 "$G" run -q --no-torch -- "${cmd[@]}" ;;
    gpudoc) timeout 60 "$G" run -q --json "$R/$1-gpudoc-$3.report.json" -- "${cmd[@]}" ;;
  esac >> "$R/$1-$2.jsonl" 2>>"$R/err.log"
}
# A framework not on this machine is said and left out (TensorFlow was on no device so far).
kinds=
for kind in $KINDS; do
  if python3 -c "import $kind" 2>/dev/null; then kinds+=" $kind"; else echo "SKIP $kind: not importable here"; fi
done
KINDS=${kinds# }
for i in $(seq "$ROUNDS"); do
  for kind in $KINDS; do
    line="round $i $kind:"
    for k in 0 1 2; do
      v=${variants[$(((i + k) % 3))]}
      one "$kind" "$v" "$i"
      line+=" $v $(tail -1 "$R/$kind-$v.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["steps_per_s"])' 2>/dev/null)"
    done
    echo "$line"
  done
done
tar czf "$OUT/frameworks_cost.tar.gz" -C /tmp fwcost
KINDS="$KINDS" python3 - <<'PY'
import json, os, statistics
R = "/tmp/fwcost"
for kind in os.environ["KINDS"].split():
    got = {}
    for who in ("bare", "outside", "gpudoc"):
        try:
            got[who] = [json.loads(l)["steps_per_s"] for l in open(f"{R}/{kind}-{who}.jsonl") if l.strip()]
        except (OSError, ValueError):
            got[who] = []
    if not all(got.values()):
        print(f"BAD {kind}: missing runs ({got})")
        continue
    b = statistics.median(got["bare"])
    print(f"{kind}: bare {got['bare']}")
    for who in ("outside", "gpudoc"):
        g = statistics.median(got[who])
        print(f"  {who} {got[who]}: medians {b:.0f} vs {g:.0f} steps/s ({100 * (g / b - 1):+.2f}%, "
              f"{1e6 / g - 1e6 / b:+.2f} us a step)")
    for i in range(1, 99):
        try:
            r = json.load(open(f"{R}/{kind}-gpudoc-{i}.report.json"))
        except OSError:
            break
        p = (r.get("torch") or {}).get("processes") or [{}]
        print(f"  run {i}: framework {p[0].get('framework')} steps {p[0].get('steps_total')} "
              f"records {p[0].get('records')} rules {[d['rule'] for d in r.get('diagnoses', [])]}")
        break
PY
