#!/usr/bin/env bash
# CPU cost of gpudoc's sampling at default rates (adaptive) and at a fixed 1 kHz, idle and around a
# training loop; throughput bare vs wrapped, alternated. Expects .device/gpudoc.
set -u
G=.device/gpudoc; chmod +x $G
R=/tmp/results3; mkdir -p $R
for mode in default fixed; do
  flag=""; [ $mode = fixed ] && flag="--idle-interval 1ms"
  $G run -q $flag --json $R/idle2_$mode.json -- sleep 2
  $G run -q $flag --json $R/idle12_$mode.json -- sleep 12
done
for i in 1 2 3; do
  python3 bench/train_loop.py 3000 > $R/bare_$i.json
  $G run -q --json $R/wrapped_$i.report.json -- python3 bench/train_loop.py 3000 > $R/wrapped_$i.json
done
tar czf $OUT/results3.tar.gz -C /tmp results3
python3 - <<'PY'
import json
R = "/tmp/results3"
def s(f): return json.load(open(f"{R}/{f}"))
for mode in ("default", "fixed"):
    a, b = s(f"idle2_{mode}.json")["sampling"], s(f"idle12_{mode}.json")["sampling"]
    slope = (b["self_cpu_s"] - a["self_cpu_s"]) / 10
    print(f"idle {mode}: cpu 2s {a['self_cpu_s']:.3f} 12s {b['self_cpu_s']:.3f} -> {slope*100:.2f}% of a core; rss {b['self_max_rss_bytes']>>20} MiB; samples {b['device_samples']}")
for i in (1, 2, 3):
    r = s(f"wrapped_{i}.report.json"); b = s(f"bare_{i}.json")["steps_per_s"]; w = s(f"wrapped_{i}.json")["steps_per_s"]
    cpu = r["sampling"]["self_cpu_s"] / r["duration_s"] * 100
    print(f"train {i}: bare {b:.2f} wrapped {w:.2f} ({(w/b-1)*100:+.2f}%); gpudoc cpu {cpu:.2f}% over {r['duration_s']:.1f}s, rss {r['sampling']['self_max_rss_bytes']>>20} MiB, device samples {r['sampling']['device_samples']}")
PY
