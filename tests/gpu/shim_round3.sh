#!/usr/bin/env bash
# Issue 42 on a real GPU, one device call (about 2 minutes): the shim never changes what training
# computes. tests/gpu/shim_round3.py's modes, each bare and under gpudoc run: non-reentrant checkpointing
# through the measured step (same forward count and loss, no CheckpointError), save_on_cpu with a
# counting hook (same calls), a compiled opt.step (gpudoc counts its 20 steps), a Lightning-like
# deepcopy of a clocked model (computes with its own weights). Prints OK/BAD lines.
# Expects .device/gpudoc (a release build).
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/rec42; rm -rf $R; mkdir -p $R
for mode in ckpt offload compiled copy; do
  timeout 120 python3 tests/gpu/shim_round3.py $mode > $R/$mode.bare 2> $R/$mode.bare.err
  timeout 120 "$G" run -q --json $R/$mode.report.json -- python3 tests/gpu/shim_round3.py $mode \
    > $R/$mode.gpudoc 2> $R/$mode.gpudoc.err
  if diff -q $R/$mode.bare $R/$mode.gpudoc > /dev/null && [ -s $R/$mode.bare ]; then
    echo "OK $mode: $(tr '\n' ' ' < $R/$mode.bare)"
  else
    echo "BAD $mode: bare [$(tr '\n' ' ' < $R/$mode.bare)] gpudoc [$(tr '\n' ' ' < $R/$mode.gpudoc)]"
    tail -3 $R/$mode.gpudoc.err
  fi
done
python3 - <<'PY'
import json
r = json.load(open("/tmp/rec42/compiled.report.json"))
p = (r.get("torch") or {}).get("processes") or [{}]
n = p[0].get("steps_total")
print(("OK" if n == 20 else "BAD") + " compiled: gpudoc counted %s optimizer steps of 20" % n)
for mode in ("ckpt", "offload"):
    r = json.load(open("/tmp/rec42/%s.report.json" % mode))
    ws = [w for q in r["torch"]["processes"] for w in q.get("where", [])]
    print("%s %s: %d measured step(s), phases %s" % ("OK" if ws else "BAD", mode, len(ws),
          [w.get("phase") for w in ws][:3]))
PY
tar czf "$OUT/shim_round3.tar.gz" -C /tmp rec42
