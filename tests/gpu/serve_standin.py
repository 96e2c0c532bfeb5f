"""A stand-in for an inference server that preallocates, for machines without vLLM (tests/gpu/record_phases.sh
runs it as `vllm serve MODEL --gpu-memory-utilization F`, through a link named vllm): the memory vLLM's
startup shows, on a real GPU through PyTorch's allocator. Weights (4 GiB, in shards), a profiling pass
(8 GiB of activations, freed), then one KV cache filling the share F of the GPU (0.9 by default), held flat
while it "serves" for 6 s. With --overload, a batch of requests then asks for activations larger than what the
share leaves: PyTorch's own out-of-memory error, inside the server."""
import sys
import time

import torch

GiB = 1 << 30
args = sys.argv[1:]
share = 0.9
for i, a in enumerate(args):
    if a.startswith("--gpu-memory-utilization"):
        share = float(a.split("=", 1)[1] if "=" in a else args[i + 1])
dev = torch.device("cuda:0")
weights = [torch.empty(GiB, dtype=torch.uint8, device=dev) for _ in range(4)]
profile = torch.empty(8 * GiB, dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
del profile
torch.cuda.empty_cache()
free, total = torch.cuda.mem_get_info(dev)
kv = torch.empty(int(total * share) - (total - free), dtype=torch.uint8, device=dev)
torch.cuda.synchronize()
print(f"serving with {kv.numel() / GiB:.1f} GiB of KV cache", flush=True)
if "--overload" in args:
    time.sleep(2)
    free, total = torch.cuda.mem_get_info(dev)
    activations = torch.empty(free + 2 * GiB, dtype=torch.uint8, device=dev)
time.sleep(6)
