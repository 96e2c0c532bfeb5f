#!/usr/bin/env bash
# What this round's shim costs a job at the fastest step rates (one device call, ~3 min): the forward
# clock on the model's class, counting the model's calls through training (an OOM's phase), the backward
# wrapper and the step pre-hook. bench/shim_loop.py fast (~1.7 ms a step) or faster (~0.4 ms), with an
# evaluation every 100 steps (EVAL_EVERY=100: the evaluation's clock) or without, bare and under gpudoc
# run, ROUNDS alternated rounds (the first argument, default 5); CASES (default: fast without, with, with
# timed, and with timed through a method). Its model is a Sequential of
# Sequentials: every inner call pays the class's identity check. A case is KIND-EVAL, EVAL the
# evaluation's period (0: none) followed by `s` (each evaluation timed between two synchronizations:
# EVAL_SYNC=1, its median `eval_ms` printed) and `m` (the evaluation calls the model's layers one by one,
# as a method of the model does: EVAL_CALL=method). Expects .device/gpudoc (a release build). Leaves
# $OUT/cost_round3.tar.gz; prints steps/s per run and the medians' ratios, and the evaluations' medians.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x "$G"
R=/tmp/cost3; rm -rf $R; mkdir -p $R
ROUNDS=${1:-5}
# KIND-EVAL[s][m]: the loop, its evaluation's period (0: none), timed (s), through a method (m).
CASES=${CASES:-fast-0 fast-100 fast-100s fast-100sm}
for i in $(seq "$ROUNDS"); do
  for case in $CASES; do
    kind=${case%-*} ev=${case#*-} tag=${case%-*}-eval${case#*-}
    sync=0; [[ $ev == *s* ]] && sync=1
    how=model; [[ $ev == *m* ]] && how=method
    export EVAL_EVERY=${ev//[sm]/} EVAL_SYNC=$sync EVAL_CALL=$how
    timeout 60 python3 bench/shim_loop.py $kind 3000 >> $R/$tag-bare.jsonl 2>>$R/err.log
    timeout 60 "$G" run -q --json $R/$tag-gpudoc-$i.report.json -- \
      python3 bench/shim_loop.py $kind 3000 >> $R/$tag-gpudoc.jsonl 2>>$R/err.log
    echo "round $i $tag: bare $(tail -1 $R/$tag-bare.jsonl) gpudoc $(tail -1 $R/$tag-gpudoc.jsonl)"
  done
done
tar czf "$OUT/cost_round3.tar.gz" -C /tmp cost3
CASES="$CASES" python3 - <<'PY'
import glob, json, os, statistics
R = "/tmp/cost3"
for case in os.environ["CASES"].split():
        kind, ev = case.split("-")
        tag = f"{kind}-eval{ev}"
        got, evals = {}, {}
        for who in ("bare", "gpudoc"):
            try:
                runs = [json.loads(l) for l in open(f"{R}/{tag}-{who}.jsonl")]
            except Exception as e:
                runs = []
            got[who] = [r["steps_per_s"] for r in runs]
            evals[who] = [r["eval_ms"] for r in runs if "eval_ms" in r]
            firsts = [round(r["eval_first_ms"], 2) for r in runs if "eval_first_ms" in r]
            if firsts:
                print(f"{tag:16} {who}: the first evaluation of each run, ms: {firsts}")
        b, g = got["bare"], got["gpudoc"]
        ratio = statistics.median(g) / statistics.median(b) if b and g else float("nan")
        print(f"{tag:16} bare {[round(x) for x in b]} gpudoc {[round(x) for x in g]} median ratio {ratio:.4f}")
        if evals["bare"] and evals["gpudoc"]:
            eb, eg = statistics.median(evals["bare"]), statistics.median(evals["gpudoc"])
            print(f"{'':16} an evaluation: bare {eb:.3f} ms, gpudoc {eg:.3f} ms ({eg - eb:+.3f} ms)")
PY
