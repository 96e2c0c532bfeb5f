#!/usr/bin/env bash
# Records fixtures/others/fake_arrived, fake_blip and fake_own with the fake NVML, no GPU (the H200's
# version is tests/gpu/others_arrived.sh): a job holding 8 GiB on GPU 0 for 20 s while a process outside it
# takes 20 GiB 2 s in and keeps it 15 s (fake_arrived: others-arrived fires), or keeps it 3 s (fake_blip: it
# does not); fake_own: a job whose own second process takes 20 GiB 3 s in and keeps it 13 s (as a foreigner
# would, but the job's: nothing fires). Run from the repository root after `cargo build --workspace`;
# `others_fake.sh fake_own` records only the one named.
set -eu
T=$PWD/target/debug
O=$PWD/fixtures/others
mkdir -p "$O"
export GPUDOC_NVML_LIB=$T/libfake_nvml.so FAKE_NVML_STATE=$(mktemp) PATH=$T:$PATH NO_COLOR=1
cat > "$FAKE_NVML_STATE" <<'JSON'
{"driver": "580.159.04", "cuda": 13000,
 "devices": [{"name": "NVIDIA H200", "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000",
              "total": 150754820096, "reserved": 644874240}]}
JSON
# The trace of `gpudoc run -- JOB...` as NAME, and its report.
record() {
  local name=$1
  shift
  gpudoc run -q --trace "$O/$name.trace.jsonl" -- "$@"
  gpudoc report "$O/$name.trace.jsonl" --json "$O/$name.report.json" > /dev/null
}
others() {
  local name=$1 hold_ms=$2
  (sleep 2; fakegpu alloc --steps 20GiB --hold-ms "$hold_ms") &
  record "$name" fakegpu alloc --steps 8GiB --hold-ms 20000
  wait
}
names=("$@")
want() { [ ${#names[@]} -eq 0 ] || [[ " ${names[*]} " == *" $1 "* ]]; }
want fake_arrived && others fake_arrived 15000
want fake_blip && others fake_blip 3000
want fake_own && record fake_own sh -c \
  'fakegpu alloc --steps 4GiB --hold-ms 16000 & sleep 3; fakegpu alloc --steps 20GiB --hold-ms 13000; wait'
rm -f "$FAKE_NVML_STATE" "$FAKE_NVML_STATE".*
