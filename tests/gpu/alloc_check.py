"""Compares a gpudoc report of tests/gpu/alloc_known.py with PyTorch's own numbers (its last stdout line)
plus the CUDA context measured by NVML. Prints the check and exits 1 if it is off by more than 1%.
    python3 alloc_check.py report.json stdout.txt

The non-PyTorch memory (CUDA context, cuBLAS, ...) is what NVML says the process holds minus what torch
reserves, read by the script itself at its end."""
import json
import sys

report = json.load(open(sys.argv[1]))
torch_view = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
context = torch_view["non_pytorch_at_end"]
job_peak = report["gpus"][0]["job_peak_bytes"]
expected = torch_view["max_memory_reserved"] + context
err = abs(job_peak - expected) / expected
print(f"job_peak_bytes={job_peak} torch max_memory_reserved={torch_view['max_memory_reserved']} "
      f"context={context} expected={expected} error={err * 100:.3f}%")
sys.exit(0 if err < 0.01 else 1)
