#!/usr/bin/env bash
# Issue 42 on a real GPU (one device call, ~3 min): tests/gpu/no_harm.py bare and under gpudoc run, with
# and without a compiled optimizer step; the JSON lines must be equal (block forwards, packs and unpacks of
# the checkpointed blocks, every loss, the deepcopy computing with its own weights, torch.save of a module
# with its own __getstate__), and gpudoc's report must count every step. Expects .device/gpudoc (a release
# build). Leaves $OUT/no_harm.tar.gz; prints one line per check, BAD where one fails.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/noharm; rm -rf $R; mkdir -p $R
for mode in plain compiled; do
  args=(); [ $mode = compiled ] && args=(--compiled-step)
  timeout 200 python3 tests/gpu/no_harm.py "${args[@]}" > $R/$mode-bare.json 2> $R/$mode-bare.err
  echo "$mode bare: exit $?"
  timeout 200 $G run --json $R/$mode.report.json --trace $R/$mode.trace.jsonl -- \
    python3 tests/gpu/no_harm.py "${args[@]}" > $R/$mode-gpudoc.json 2> $R/$mode-gpudoc.err
  echo "$mode gpudoc: exit $?"
done
tar czf $OUT/no_harm.tar.gz -C /tmp noharm
python3 - <<'PY'
import json
R = "/tmp/noharm"
for mode in ("plain", "compiled"):
    try:
        bare = json.loads(open(f"{R}/{mode}-bare.json").read().strip().splitlines()[-1])
        ours = json.loads(open(f"{R}/{mode}-gpudoc.json").read().strip().splitlines()[-1])
    except Exception as e:
        print(f"BAD {mode}: no result ({e}); stderr: {open(f'{R}/{mode}-gpudoc.err').read()[-600:]}")
        continue
    for k in bare:
        same = bare[k] == ours.get(k)
        print(f"{'ok ' if same else 'BAD'} {mode} {k}: bare {str(bare[k])[:80]} gpudoc {str(ours.get(k))[:80]}")
    for k in ("copy_computes_with_its_own_weights", "copy_differs_from_original"):
        print(f"{'ok ' if ours.get(k) else 'BAD'} {mode} {k} under gpudoc")
    r = json.load(open(f"{R}/{mode}.report.json"))
    p = r["torch"]["processes"][0]
    n = p.get("steps_total")
    print(f"{'ok ' if n == 30 else 'BAD'} {mode} steps counted: {n}; where records {len(p.get('where', []))}")
    for w in p.get("where", []):
        print(f"     where: {w.get('kind') or w.get('clock')} saved {w.get('saved_bytes')} hooked {w.get('saved_hooked')} unread {w.get('saved_unread')}")
PY
