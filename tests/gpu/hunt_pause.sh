#!/usr/bin/env bash
# Issue 27 on the lent H200 (one call, about 5 minutes; expects .device/gpudoc, a release build of this
# tree): tests/gpu/big_heap.py bare and under `gpudoc run --hunt-leaks` with a 2M-object heap (a list
# leak, a loss accumulated in a local of train() then dropped, a compiled optimizer step), the fast
# loop's throughput bare and under gpudoc (bench/shim_loop.py fast, 5 alternated rounds), and the shim's
# start-up cost (bench/startup.py). Leaves $OUT/hunt27.tar.gz (the reports too) and prints the lines that
# go into bench/README.md.
export CUDA_VISIBLE_DEVICES=0 GPUDOC_NVML_LIB=${GPUDOC_NVML_LIB:-libnvidia-ml.so.1}
G=$PWD/.device/gpudoc; R=/tmp/hunt27; mkdir -p $R
for mode in list local compiled; do
  timeout 150 python3 tests/gpu/big_heap.py $mode 2000000 300 > $R/bare-$mode.json 2> $R/bare-$mode.err
  timeout 150 $G run -q --hunt-leaks --json $R/report-$mode.json -- python3 tests/gpu/big_heap.py $mode 2000000 300 \
    > $R/gpudoc-$mode.json 2> $R/gpudoc-$mode.err
done
for i in 1 2 3 4 5; do
  timeout 60 python3 bench/shim_loop.py fast 3000 >> $R/loop-bare.jsonl 2>>$R/loop.err
  timeout 60 $G run -q -- python3 bench/shim_loop.py fast 3000 >> $R/loop-gpudoc.jsonl 2>>$R/loop.err
done
timeout 120 python3 bench/startup.py $G python3 100 > $R/startup.json 2>>$R/startup.err
python3 - $R <<'PY'
import glob, json, os, statistics, sys
R = sys.argv[1]
for mode in ("list", "local", "compiled"):
    row = {}
    for who in ("bare", "gpudoc"):
        try:
            row[who] = json.load(open(f"{R}/{who}-{mode}.json"))
        except Exception as e:
            row[who] = {"error": repr(e), "stderr": open(f"{R}/{who}-{mode}.err").read()[-500:]}
    try:
        hunts = json.load(open(f"{R}/report-{mode}.json"))["torch"]["processes"][0].get("hunts", [])
        row["hunts"] = [{"holders": [h["text"] for h in x["holders"]][:2], "sites": len(x["sites"]),
                         "analysis_s": x["analysis_s"], "steps": [x["from_step"], x["to_step"]]} for x in hunts]
    except Exception as e:
        row["hunts"] = repr(e)
    print(json.dumps({mode: row}))
for who in ("bare", "gpudoc"):
    rates = [json.loads(l)["steps_per_s"] for l in open(f"{R}/loop-{who}.jsonl")]
    print(json.dumps({"fast loop": who, "steps_per_s": [round(r) for r in rates], "median": round(statistics.median(rates))}))
print(open(f"{R}/startup.json").read().strip())
PY
tar czf $OUT/hunt27.tar.gz -C /tmp hunt27
