#!/usr/bin/env bash
# Issue 48 on a real GPU, in one device call (under 5 minutes): the framework view of JAX, CuPy and
# TensorFlow. A framework that is not importable on the device is skipped (it says so), never failed.
# 1. tests/gpu/frameworks.py jax_leak (300 steps keeping 16 MiB each), jax_healthy, jax_oom (2 GiB outputs
#    kept until XLA's allocator runs out, under JAX's default preallocation of 75%), cupy_bloat (a pool
#    that kept a one-off 8 GiB temporary), each under gpudoc run with a report, a trace and the summary.
# 2. Checks (BAD lines): the framework view is there with the framework's name and the program's own
#    numbers (its final memory_stats / pool, printed by the program); jax_leak: step-leak at 16 MiB a step
#    and jax-preallocation; jax_healthy: no step-leak; jax_oom: an OOM with the allocator's record
#    (framework jax) and oom-cap naming XLA_PYTHON_CLIENT_MEM_FRACTION; cupy_bloat: cache-bloat;
#    tf_leak (Keras's fit, 16 MiB kept per batch, no memory growth): step-leak and jax-preallocation
#    naming TF_FORCE_GPU_ALLOW_GROWTH; tf_healthy (memory growth on): neither.
# Expects .device/gpudoc (a release build); jax with CUDA, cupy, tensorflow with CUDA where installed. Leaves
# $OUT/frameworks.tar.gz (fixtures/frameworks/ is made from it: traces and reports) and prints a table.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec48; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import jax, jaxlib; print("jax", jax.__version__, jaxlib.__version__, jax.devices())' > $R/versions.txt 2>&1
python3 -c 'import cupy; print("cupy", cupy.__version__)' >> $R/versions.txt 2>&1
python3 -c 'import tensorflow as tf; print("tensorflow", tf.__version__, tf.config.list_physical_devices("GPU"))' >> $R/versions.txt 2>&1
run() { # NAME ARGS...: gpudoc run with a report and a trace; stdout, stderr, exit code.
  local name=$1; shift
  timeout 150 $G run --json $R/$name.report.json --trace $R/$name.trace.jsonl -- python3 tests/gpu/frameworks.py \
    "$@" > $R/$name.stdout 2> $R/$name.stderr
  echo "$name exit $?" | tee -a $R/exits.txt
}
have() { # MODULE: importable here? Says so when not.
  if python3 -c "import $1" > /dev/null 2>&1; then return 0; fi
  echo "SKIP $1: not importable on this machine" | tee -a $R/exits.txt
  return 1
}
if have jax; then
  run jax_leak jax_leak 300
  run jax_healthy jax_healthy 300
  run jax_oom jax_oom
fi
if have cupy; then run cupy_bloat cupy_bloat 3; fi
if have tensorflow; then
  run tf_leak tf_leak 300
  run tf_healthy tf_healthy 300
fi
tar czf $OUT/frameworks.tar.gz -C /tmp rec48
python3 - <<'PY'
import json
R = "/tmp/rec48"
import os
def load(name):
    if not os.path.exists(f"{R}/{name}.stdout"):
        print(f"skip {name}: its framework is not on this machine")
        return None
    try:
        return json.load(open(f"{R}/{name}.report.json"))
    except Exception as e:
        print(f"BAD {name}: no report: {e}")
        return None
def own(name):
    try:
        return json.loads(open(f"{R}/{name}.stdout").read().strip().splitlines()[-1])
    except Exception:
        return None
def fired(r):
    return sorted({d["rule"] for d in r["diagnoses"]})
def msg(r, rule):
    return next((d["message"] for d in r["diagnoses"] if d["rule"] == rule), "")
def check(ok, what):
    print(("ok  " if ok else "BAD ") + what)
for name, fw in (("jax_leak", "jax"), ("jax_healthy", "jax"), ("jax_oom", "jax"), ("cupy_bloat", "cupy"),
                 ("tf_leak", "tensorflow"), ("tf_healthy", "tensorflow")):
    r = load(name)
    if r is None:
        continue
    ps = [p for p in r["torch"]["processes"] if p.get("framework") == fw]
    check(len(ps) == 1, f"{name}: one {fw} process in the framework view ({len(ps)})")
    if not ps:
        continue
    p = ps[0]
    print(f"    {name}: gpu {p['gpu']} allocated peak {p['peak_allocated_bytes']} reserved peak "
          f"{p['peak_reserved_bytes']} final {p['final_allocated_bytes']}/{p['final_reserved_bytes']} "
          f"steps {p['steps_total']} every {p['record_every']} cost {p.get('shim_cost_pct')} limit "
          f"{p.get('limit_bytes')} nvml {p.get('nvml_peak_bytes')} outside {p.get('non_pytorch_bytes')}")
    print(f"    rules: {fired(r)}")
    o = own(name)
    if fw == "jax" and o:
        s = o["stats"]
        # The program's last reading is before its arrays went at its end; the shim's exit record after.
        check(p["peak_allocated_bytes"] == s["peak_bytes_in_use"], f"{name}: peak = peak_bytes_in_use "
              f"({p['peak_allocated_bytes']} vs {s['peak_bytes_in_use']})")
        check(p["steps_total"] == o["steps"], f"{name}: steps = the jitted step's calls ({o['steps']})")
    if fw == "cupy" and o:
        check(p["final_reserved_bytes"] == o["total"], f"{name}: final reserved = the pool's total_bytes")
    if name == "jax_leak":
        check("16.00 MiB per step" in msg(r, "step-leak"), "jax_leak: step-leak at 16 MiB a step: " + msg(r, "step-leak"))
        check("JAX preallocated" in msg(r, "jax-preallocation"), "jax_leak: " + msg(r, "jax-preallocation"))
    if name == "jax_healthy":
        check("step-leak" not in fired(r), "jax_healthy: no step-leak")
    if name == "jax_oom":
        oom = r.get("oom") or {}
        check((oom.get("allocator") or {}).get("framework") == "jax", "jax_oom: the allocator's record at the OOM")
        check(oom.get("cause") == "cap" and "XLA_PYTHON_CLIENT_MEM_FRACTION" in oom.get("explanation", ""),
              f"jax_oom: cause {oom.get('cause')}: {oom.get('explanation')}")
    if name == "cupy_bloat":
        check("CuPy kept" in msg(r, "cache-bloat"), "cupy_bloat: " + msg(r, "cache-bloat"))
    if fw == "tensorflow" and o:
        # get_memory_info's peak is TensorFlow's own since the start: the report's is at least the last one.
        check(p["peak_allocated_bytes"] >= o["info"]["peak"], f"{name}: peak >= get_memory_info's "
              f"({p['peak_allocated_bytes']} vs {o['info']['peak']})")
        check(p["steps_total"] == o["steps"], f"{name}: steps = fit's batches ({o['steps']})")
    if name == "tf_leak":
        check("16.00 MiB per step" in msg(r, "step-leak"), "tf_leak: step-leak at 16 MiB a batch: " + msg(r, "step-leak"))
        check("TF_FORCE_GPU_ALLOW_GROWTH" in msg(r, "jax-preallocation"), "tf_leak: " + msg(r, "jax-preallocation"))
    if name == "tf_healthy":
        check("step-leak" not in fired(r) and "jax-preallocation" not in fired(r), f"tf_healthy: {fired(r)}")
PY
