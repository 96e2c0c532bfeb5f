#!/usr/bin/env bash
# Issue 31 on a real GPU, in one device call (under 5 minutes): where the memory went inside the model.
# 1. tests/gpu/where.py at growing sequence lengths, under gpudoc run --snapshot, until one runs out of
#    memory: the first that does fails in backward (its forward fitted). Checks: the pass and module
#    named, the breakdown, the snapshot opening with pickle and torch.cuda._memory_viz.
# 2. The same model healthy (half that length, 30 steps, then an evaluation of 5 calls under no_grad),
#    with --snapshot: the measured step's breakdown against the program's own max_memory_allocated for
#    that step (within 5%), its per-module table (forward, saved for backward, backward peak); the
#    evaluation's call against the program's own peak for it.
# 3. The same model in inference only (30 calls under inference_mode, no optimizer): one call measured,
#    against the program's own peak for it.
# 4. The cost: bench/shim_loop.py fast, bare and under gpudoc, 3 alternated rounds, and the measured
#    step's own time from the report (analysis_s).
# Expects .device/gpudoc (a release build). Leaves $OUT/where.tar.gz (fixtures/where/ is made from it)
# and prints a table.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec31; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' > $R/versions.txt 2>&1
run() { # NAME T STEPS [ARGS]: gpudoc run with a report, a trace, a snapshot; stdout, stderr, exit code.
  local name=$1 t=$2 steps=$3; shift 3
  timeout 120 $G run --json $R/$name.report.json --trace $R/$name.trace.jsonl --snapshot $R/$name.pickle \
    --html $R/$name.html -- python3 tests/gpu/where.py $t $steps "$@" > $R/$name.stdout 2> $R/$name.stderr
  echo "$name T=$t exit $?" | tee -a $R/exits.txt
}
# Scores of 1 x 16 x T x T float32 per block, six blocks: T near sqrt(capacity / (6 * 16 * 4)).
EST=$(python3 -c 'import torch, math; print(int(math.sqrt(torch.cuda.mem_get_info()[1] / (6 * 16 * 4))))')
T=$(( EST * 80 / 100 )); OOM_T=0
for i in $(seq 12); do
  run oom_try$i $T 1
  if grep -q OutOfMemoryError $R/oom_try$i.stderr; then OOM_T=$T; cp $R/oom_try$i.report.json $R/oom.report.json
    cp $R/oom_try$i.pickle $R/oom.pickle 2>/dev/null; cp $R/oom_try$i.stderr $R/oom.stderr; break; fi
  T=$(( T * 104 / 100 ))
done
echo "first T that ran out: $OOM_T" | tee -a $R/exits.txt
run healthy $(( EST / 2 )) 30 --eval 5
run infer $(( EST / 2 )) 0 --infer 30
# The fast loop, bare and under gpudoc, alternated.
for i in 1 2 3; do
  timeout 60 python3 bench/shim_loop.py fast 3000 >> $R/loop-bare.jsonl 2>>$R/loop.err
  timeout 60 $G run -q --json $R/loop-gpudoc-$i.report.json -- python3 bench/shim_loop.py fast 3000 \
    >> $R/loop-gpudoc.jsonl 2>>$R/loop.err
done
tar czf $OUT/where.tar.gz -C /tmp rec31
python3 - <<'PY'
import glob, json, pickle
from torch.cuda import _memory_viz as mv
R = "/tmp/rec31"
def where(name):
    try:
        r = json.load(open(f"{R}/{name}.report.json"))
    except Exception as e:
        return None, [], f"no report: {e}"
    ws = [w for p in r["torch"]["processes"] for w in p.get("where", [])]
    return r, ws, ""
def snap(path):
    try:
        s = pickle.load(open(path, "rb"))
        text = mv.segsum(s)
        html = mv.trace_plot(s)
        return f"ok ({len(s['segments'])} segments, {sum(len(t) for t in s['device_traces'])} events, " \
               f"segsum {len(text)} chars, trace_plot {len(html)} chars)"
    except Exception as e:
        return f"BAD {type(e).__name__}: {e}"
print("== the OOM ==")
r, ws, err = where("oom")
oom = [w for w in ws if w["why"] == "oom"]
if not oom:
    print("BAD no where at the OOM", err)
else:
    w = oom[0]
    parts = w["parts"]; total = sum(parts.values())
    # The softmax of a block's attention: named by the attention it ran in, not by qkv below it.
    module = w.get("module") or ""
    ok = w.get("pass") == "backward" and module.startswith("model.layers.") and module.endswith(".attn")
    print(f"{'ok ' if ok else 'BAD'} pass={w.get('pass')} module={module} node={w.get('node')} "
          f"line={(w.get('line') or {}).get('code')}")
    print(f"    allocated {w['allocated_bytes']/2**30:.2f} GiB, parts sum {total/2**30:.2f} GiB: " +
          ", ".join(f"{k} {v/2**30:.2f}" for k, v in parts.items()) + f"; analysis {w['analysis_s']} s")
    # Every block but the one running still holds its softmax's output (one score-sized tensor each).
    saved = sum(m.get("activation_bytes", 0) for m in w["modules"])
    ok = parts["activations"] >= 0.5 * w["allocated_bytes"] and saved >= 0.9 * parts["activations"]
    print(f"{'ok ' if ok else 'BAD'} saved for backward {parts['activations']/2**30:.2f} GiB, "
          f"{saved/2**30:.2f} GiB of it placed in the table's modules:")
    for m in w["modules"]:
        print(f"    {m['name']:22} saved {m.get('activation_bytes', 0)/2**30:8.3f} GiB  parameters "
              f"{m.get('parameter_bytes', 0)/2**20:8.1f} MiB")
    print("    diagnoses:", [d["rule"] for d in r["diagnoses"]])
    for d in r["diagnoses"]:
        print("      ", d["details"][:3], d["advice"][:1])
    print("    snapshot:", snap(f"{R}/oom.pickle"))
print("== healthy ==")
r, ws, err = where("healthy")
peak = [w for w in ws if w["why"] == "peak"]
own = [json.loads(l) for l in open(f"{R}/healthy.stdout") if l.startswith("{")]
if not peak:
    print("BAD no measured step", err)
else:
    w = peak[0]
    print(f"{'ok ' if w.get('phase') == 'training' else 'BAD'} phase {w.get('phase')}")
    steps = [o for o in own if "step" in o]
    step = w["step"]; theirs = steps[step - 1]["peak"] if len(steps) >= step else 0
    total = sum(w["parts"].values())
    off = abs(total - theirs) / max(theirs, 1) * 100
    print(f"{'ok ' if off <= 5 else 'BAD'} step {step}: parts sum {total/2**30:.3f} GiB, "
          f"max_memory_allocated {theirs/2**30:.3f} GiB ({off:.2f}% off); reported peak "
          f"{w['allocated_bytes']/2**30:.3f} GiB; analysis {w['analysis_s']} s")
    print("    parts:", ", ".join(f"{k} {v/2**30:.3f}" for k, v in w["parts"].items()))
    for m in w["modules"]:
        print(f"    {m['name']:22} forward {m.get('forward_bytes', 0)/2**20:10.1f} MiB  saved "
              f"{m.get('activation_bytes', 0)/2**20:10.1f} MiB  backward peak "
              f"{m.get('backward_peak_bytes', 0)/2**30:8.3f} GiB")
    print("    snapshot:", snap(f"{R}/healthy.pickle"))
    steps = [o for o in own if "step" in o]
    print("    steps' own peaks equal after the measured one:", len({o['peak'] for o in steps[step:]}) == 1)
def call(name, phase, own):
    """The one call measured in `phase`, against the program's own peaks of its calls."""
    ws = [w for w in where(name)[1] if w.get("phase") == phase]
    calls = [o["peak"] for o in own if "call" in o]
    if not ws or not calls:
        print(f"BAD no {phase} call measured ({len(calls)} calls)")
        return
    w = ws[0]
    off = min(abs(w["allocated_bytes"] - c) for c in calls) / max(calls) * 100
    total = sum(w["parts"].values())
    print(f"{'ok ' if off <= 5 and total == w['allocated_bytes'] else 'BAD'} {phase}: peak "
          f"{w['allocated_bytes']/2**30:.3f} GiB, the calls' own {min(calls)/2**30:.3f}-{max(calls)/2**30:.3f} "
          f"GiB ({off:.2f}% off the nearest); analysis {w['analysis_s']} s")
    print("    parts:", ", ".join(f"{k} {v/2**30:.3f}" for k, v in w["parts"].items()))
    for m in w["modules"][:3]:
        print(f"    {m['name']:22} forward {m.get('forward_bytes', 0)/2**20:10.1f} MiB")
print("== evaluation after training ==")
call("healthy", "evaluation", own)
print("== inference ==")
call("infer", "inference", [json.loads(l) for l in open(f"{R}/infer.stdout") if l.startswith("{")])
print("== cost: fast loop, steps/s ==")
def rates(f):
    out = []
    for l in open(f):
        try:
            out.append(json.loads(l)["steps_per_s"])
        except Exception:
            pass
    return out
b, g = rates(f"{R}/loop-bare.jsonl"), rates(f"{R}/loop-gpudoc.jsonl")
print("bare  ", b); print("gpudoc", g)
for f in sorted(glob.glob(f"{R}/loop-gpudoc-*.report.json")):
    r = json.load(open(f))
    for p in r["torch"]["processes"]:
        for w in p.get("where", []):
            print(f"  {f.split('/')[-1]}: measured step {w.get('step')}, analysis {w['analysis_s']} s of "
                  f"{r['duration_s']:.1f} s ({w['analysis_s'] / r['duration_s'] * 100:.3f}%)")
PY
