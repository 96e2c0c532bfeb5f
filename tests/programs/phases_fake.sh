#!/usr/bin/env bash
# Records fixtures/phases/fake_eval_oom with the fake NVML and the fake torch, no GPU: phases.py eval_oom
# (20 training steps, then an evaluation after eval() under no_grad keeping 4 GiB a batch until the GPU is
# full), recorded on an idle machine: how its memory grew before the OOM is read from the recording's
# samples, which a loaded machine running the test does not change (tests/phases.rs). Run from the
# repository root after `cargo build --workspace`.
set -eu
T=$PWD/target/debug
O=$PWD/fixtures/phases
export GPUDOC_NVML_LIB=$T/libfake_nvml.so FAKE_NVML_STATE=$(mktemp) PATH=$T:$PATH NO_COLOR=1
export PYTHONPATH=$PWD/fixtures/fake_torch
cat > "$FAKE_NVML_STATE" <<'JSON'
{"driver": "580.159.04", "cuda": 13000,
 "devices": [{"name": "NVIDIA H200", "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000",
              "total": 150754820096, "reserved": 644874240}]}
JSON
gpudoc run -q --trace "$O/fake_eval_oom.trace.jsonl" -- python3 fixtures/fake_torch/phases.py eval_oom || true
gpudoc report "$O/fake_eval_oom.trace.jsonl" --json "$O/fake_eval_oom.report.json" > /dev/null
rm -f "$FAKE_NVML_STATE" "$FAKE_NVML_STATE".*
