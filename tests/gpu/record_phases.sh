#!/usr/bin/env bash
# Issue 28 on a real GPU, in one device call (`record_phases.sh verdicts`: issue 43's programs alone): growth with no optimizer step, an OOM placed among a program's
# phases, DataLoader workers with CUDA contexts of their own, an inference server that preallocates, leaks
# the hunt must name through a model's forward calls, a forward hook and a function's local (with the
# line and holder in each diagnosis's details), and the healthy controls that must stay quiet. Each program (tests/gpu/phases.py) runs under gpudoc run
# with a report, a trace, its stdout and stderr. Expects .device/gpudoc (a release build). Leaves
# $OUT/phases.tar.gz (fixtures/phases/ is made from it) and prints, per run, the classification, the OOM's
# phase and the rules that fired, against what each must give.
set -u
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=0
G=$PWD/.device/gpudoc; chmod +x $G
R=/tmp/rec28; rm -rf $R; mkdir -p $R/phases
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv > $R/nvidia-smi.csv
python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' > $R/versions.txt 2>&1
python3 -c 'import vllm; print("vllm", vllm.__version__)' >> $R/versions.txt 2>&1
# rec NAME [gpudoc run flags] -- COMMAND...: report, trace, stdout, stderr, exit code and time.
rec() {
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout 240 $G run --json $R/phases/$name.report.json --trace $R/phases/$name.trace.jsonl "$@" \
    > $R/phases/$name.stdout 2> $R/phases/$name.stderr
  local rc=$?
  echo "$name exit $rc $(( ($(date +%s%N) - t0) / 1000000 )) ms" | tee -a $R/phases/exits.txt
}
P="python3 tests/gpu/phases.py"
if [ "${1:-}" = verdicts ]; then
  # Issue 43 alone (a few minutes): the phase and the remedy from what the program was doing.
  for p in bw_oom fwd_oom val_keep infer_cache load_oom eval_oom; do
    rec $p -- $P $p
  done
else
for p in infer_leak infer_healthy load_serve up_and_back eval_oom eval_keep eval_healthy load_oom \
         workers_cuda workers_cpu model_leak hook_leak local_leak; do
  rec $p -- $P $p
done
# The same leaking loop without the shim: NVML alone must still see the growth.
rec infer_leak_noshim --no-torch -- $P infer_leak
# An inference server: vLLM itself where it is installed (a tiny Llama with dummy weights: nothing to
# download), else the stand-in under the name vllm. Each ends by SIGTERM once it has served.
if python3 -c 'import vllm' 2>/dev/null; then
  M=/tmp/tiny-llama; mkdir -p $M
  cat > $M/config.json <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
 "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1,
 "eos_token_id": 2}
JSON
  export HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
  VLLM="vllm serve $M"
  command -v vllm >/dev/null || VLLM="python3 -m vllm.entrypoints.openai.api_server --model $M"
  health() { python3 -c 'import urllib.request as u; u.urlopen("http://localhost:8123/health", timeout=2)' 2>/dev/null; }
  serve() { # NAME FLAGS...: gpudoc run in the background; timeout passes its SIGTERM to gpudoc, and
    # gpudoc to vllm.
    local name=$1; shift
    timeout 150 $G run --json $R/phases/$name.report.json --trace $R/phases/$name.trace.jsonl -- \
      $VLLM --load-format dummy --skip-tokenizer-init --enforce-eager --max-model-len 512 \
      --port 8123 "$@" > $R/phases/$name.stdout 2> $R/phases/$name.stderr &
    local job=$! up=1
    for i in $(seq 120); do health && up=0 && break; kill -0 $job 2>/dev/null || break; sleep 1; done
    python3 - $M > $R/phases/$name.completion.json 2>&1 <<'PY'
import json, sys, urllib.request as u
body = json.dumps({"model": sys.argv[1], "prompt": [1, 5, 9, 13], "max_tokens": 16}).encode()
req = u.Request("http://localhost:8123/v1/completions", body, {"Content-Type": "application/json"})
print(u.urlopen(req, timeout=30).read().decode())
PY
    sleep 3
    kill -TERM $job
    wait $job
    echo "$name exit $? (ended by SIGTERM; served: $([ $up = 0 ] && echo yes || echo no))" | tee -a $R/phases/exits.txt
    return $up
  }
  serve vllm --gpu-memory-utilization 0.5 && serve vllm_default
else
  mkdir -p /tmp/standin
  printf '#!/bin/sh\nexec python3 %s "$@"\n' $PWD/tests/gpu/serve_standin.py > /tmp/standin/vllm
  chmod +x /tmp/standin/vllm
  PATH=/tmp/standin:$PATH rec vllm_standin -- vllm serve tiny --gpu-memory-utilization 0.5
  PATH=/tmp/standin:$PATH rec vllm_standin_default -- vllm serve tiny
fi
# PyTorch's own OOM inside a server (the stand-in, named vllm, whatever is installed): oom-self-growth, its server's wording.
mkdir -p /tmp/standin
printf '#!/bin/sh\nexec python3 %s "$@"\n' $PWD/tests/gpu/serve_standin.py > /tmp/standin/vllm
chmod +x /tmp/standin/vllm
PATH=/tmp/standin:$PATH rec vllm_standin_oom -- vllm serve tiny --gpu-memory-utilization 0.9 --overload
# The compiled optimizer step that Dynamo once traced into the shim's hook and died (issue 27).
timeout 150 $G run -q --json $R/phases/compiled_step.report.json -- python3 tests/gpu/big_heap.py compiled 100000 60 \
  > $R/phases/compiled_step.stdout 2> $R/phases/compiled_step.stderr
echo "compiled_step exit $?" | tee -a $R/phases/exits.txt
fi
tar czf $OUT/phases.tar.gz -C /tmp rec28
# What each must give: the rules that must fire (empty: none at warn or error).
python3 - <<'PY'
import glob, json, os
want = {
    "infer_leak": {"steady-growth"}, "infer_leak_noshim": {"steady-growth"}, "infer_healthy": set(),
    "load_serve": set(), "up_and_back": set(), "eval_oom": {"oom-self-growth"},
    "eval_keep": {"steady-growth"}, "eval_healthy": set(), "load_oom": {"oom-self-growth"},
    "workers_cuda": {"worker-contexts"}, "workers_cpu": set(), "vllm": {"server-preallocation"},
    "vllm_default": {"server-preallocation"}, "vllm_standin": {"server-preallocation"},
    "vllm_standin_default": {"server-preallocation"}, "vllm_standin_oom": {"oom-self-growth"},
    "compiled_step": set(),
    "model_leak": {"steady-growth"}, "hook_leak": {"step-leak"}, "local_leak": {"step-leak"},
    "bw_oom": {"oom-self-growth"}, "fwd_oom": {"oom-self-growth"}, "val_keep": {"oom-self-growth", "step-leak"},
    "infer_cache": {"steady-growth"},
}
for f in sorted(glob.glob("/tmp/rec28/phases/*.report.json")):
    n = os.path.basename(f).replace(".report.json", "")
    r = json.load(open(f))
    fired = {d["rule"] for d in r["diagnoses"]}
    loud = {d["rule"] for d in r["diagnoses"] if d["severity"] in ("warn", "error")}
    w = want.get(n, set())
    ok = w <= fired and loud <= w | {"near-capacity"}
    oom = r["oom"] or {}
    print(f"{'ok ' if ok else 'BAD'} {n:22} {r['exit']['classification']:9} {oom.get('cause', '-'):12} "
          f"{','.join(sorted(fired)) or '-'}")
    act = (oom.get("allocator") or {}).get("activity")
    if act is not None:
        print(f"      {n}'s activity at the OOM:", json.dumps(act))
    for d in r["diagnoses"]:
        print(f"      {d['severity']:5} {d['rule']}: {d['message'][:400]}")
        for line in (d.get("details") or [])[:4]:
            print(f"        {line[:300]}")
PY
