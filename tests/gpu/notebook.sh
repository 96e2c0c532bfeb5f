#!/usr/bin/env bash
# Issue 30 on a real GPU, in one device call: a real notebook with torch executed in a real Jupyter kernel
# (nbclient, ipykernel) with `%load_ext gpudoc`: a cell that runs out of memory in the model's forward, what
# holds its memory after it, `%gpudoc free`, the same cell with a smaller batch succeeding, a cell that
# leaks at each run, `%%gpudoc` with its HTML page. Then the same notebook with its kernel under
# `gpudoc run` (the report names the cells). Expects .device/gpudoc (a release build) and, where the
# device's python3 lacks them, ipykernel, nbclient and nbformat as wheels in .whl/ (made here for the
# device's Python, and carried):
#   pip download -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 ipykernel nbclient nbformat
# Leaves $OUT/notebook.tar.gz (fixtures/notebooks/ is made from it: h200.ipynb, h200_run.ipynb,
# h200_run.report.json, .trace.jsonl) and prints each check, ok or BAD.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec30; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
NBPKGS=
if ! python3 -c 'import ipykernel, nbclient, nbformat' 2>/dev/null; then
  # Beside the device's own packages (torch), on PYTHONPATH: the kernel nbclient starts inherits it.
  python3 -m pip install -q --no-index --find-links .whl --target /tmp/nbpkgs ipykernel nbclient nbformat
  NBPKGS=:/tmp/nbpkgs
fi
PYTHONPATH=${NBPKGS#:} python3 -c 'import sys, torch, ipykernel, nbclient; print(sys.version.split()[0], torch.__version__, torch.version.cuda, "ipykernel", ipykernel.__version__, "nbclient", nbclient.__version__)' > $R/versions.txt 2>&1
# The package from this tree, the binary from .device (first on PATH: the extension runs `gpudoc report`).
mkdir -p /tmp/gbin && cp $G /tmp/gbin/gpudoc
export PATH=/tmp/gbin:$PATH PYTHONPATH=$PWD/python$NBPKGS JUPYTER_PLATFORM_DIRS=1 IPYTHONDIR=$R/ipython
# The cells: a 2 GiB model of 8 layers; a batch whose activations (18.3 GiB each, kept for backward) fill
# the 140 GiB; then the same with a tenth of the batch.
python3 - > $R/cells.json <<'PY'
import json
cells = [
    "%load_ext gpudoc\nimport torch\nmodel = torch.nn.Sequential(*[torch.nn.Linear(8192, 8192) for _ in range(8)]).cuda()",
    "def run(batch):\n    x = torch.randn(batch, 8192, device='cuda')\n    y = model(x)\n    y.float().mean().backward()\n    return y.shape\nrun(600_000)",
    "%gpudoc",
    "%gpudoc free",
    "run(60_000)",
    "outs = []",
    "outs.append(model(torch.randn(4096, 8192, device='cuda')).detach())",
    "outs.append(model(torch.randn(4096, 8192, device='cuda')).detach())",
    "outs.append(model(torch.randn(4096, 8192, device='cuda')).detach())",
    "torch.ones(1 << 28, device='cuda')",
    "%gpudoc free",
    "%%gpudoc\nz = model(torch.randn(16384, 8192, device='cuda'))\ndel z",
]
print(json.dumps(cells))
PY
N=tests/programs/notebook.py
timeout 200 python3 $N $R/h200.ipynb < $R/cells.json > $R/h200.cells.jsonl 2> $R/h200.stderr
echo "plain kernel exit $?" | tee $R/exits.txt
# The same notebook, its kernel a process of gpudoc run's job.
timeout 200 $G run --json $R/h200_run.report.json --trace $R/h200_run.trace.jsonl -- \
  python3 $N $R/h200_run.ipynb < $R/cells.json > $R/h200_run.cells.jsonl 2> $R/h200_run.stderr
echo "under gpudoc run exit $?" | tee -a $R/exits.txt
tar czf $OUT/notebook.tar.gz -C /tmp rec30
python3 - <<'PY'
import json
def cells(name):
    try:
        return [json.loads(l) for l in open("/tmp/rec30/%s.cells.jsonl" % name)]
    except OSError:
        return []
def check(what, ok, text):
    print("%s %s" % ("ok " if ok else "BAD", what))
    if not ok:
        print("    " + text[:1500].replace("\n", "\n    "))
for name in ("h200", "h200_run"):
    c = cells(name)
    print("== %s: %d cells" % (name, len(c)))
    if len(c) < 12:
        continue
    t = lambda i: c[i]["text"]
    check("cell 1: a line with the model's 2 GiB", "gpudoc: cell 1: allocated +2.00 GiB" in t(0), t(0))
    check("cell 2: OOM raised", (c[1]["error"] or "").startswith("OutOfMemoryError"), str(c[1]["error"]))
    check("cell 2: explained by the engine", "ran out of GPU memory on GPU 0" in t(1) and "in cell 2" in t(1), t(1))
    check("cell 2: the traceback holds its memory", "the traceback of the OOM in cell 2 still holds" in t(1), t(1))
    check("%gpudoc names the traceback", "the traceback of the OOM" in t(2), t(2))
    check("%gpudoc free gives it back", t(3).startswith("gpudoc: dropped the last traceback's frames"), t(3))
    check("the smaller batch succeeds", c[4]["error"] is None, str(c[4]["error"]))
    check("cell-leak at the third append", "[cell-leak]" in t(8), t(8))
    check("the output cache holds Out[10]", "the output cache holds 1.00 GiB (Out[10]" in t(9), t(9))
    check("%%gpudoc: report and HTML", "ran cell 12" in t(11) and (c[11]["html"] or "").startswith("<div><iframe"), t(11))
    for i, x in enumerate(c):
        print("  [%d] %s%s" % (i + 1, x["text"][:600].replace("\n", "\n      "), " !! " + x["error"] if x["error"] else ""))
try:
    r = json.load(open("/tmp/rec30/h200_run.report.json"))
    p = [q for q in r["torch"]["processes"] if q.get("cells")]
    check("gpudoc run's report names the cells", bool(p) and len(p[0]["cells"]) >= 12, json.dumps(r["torch"])[:800])
    print("  rules:", sorted(d["rule"] for d in r["diagnoses"]))
except (OSError, ValueError, KeyError) as e:
    print("BAD no report of the run: %s" % e)
PY
