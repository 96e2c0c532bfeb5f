"""Two OOM texts the reader was taught from public trackers, provoked for real on cuda:0, to check them on
this machine's torch:
    python3 oom_texts.py segment_cap   # a 2 MiB request with the cache 10 MiB under a memory fraction
    PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 oom_texts.py async
segment_cap: the cap is checked against the 20 MiB segment PyTorch asks for, not the 2 MiB asked (the text
shows held + 2 MiB under `X allowed`, and still fails: gpudoc must call it `cap`).
async: the cudaMallocAsync allocator's text (its `Currently allocated` ... `PyTorch limit` lines); on
device 0 older torch printed the device as a NUL character that cut the message after `device `."""
import sys

import torch

MiB = 1 << 20
GiB = 1 << 30
dev = torch.device("cuda:0")
what = sys.argv[1]

if what == "segment_cap":
    total = torch.cuda.get_device_properties(0).total_memory
    cap = 4 * GiB
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    # Fill the cache to 10 MiB under the cap with 2 MiB segments (requests up to 1 MiB each take one).
    keep = []
    while torch.cuda.memory_reserved(dev) + 12 * MiB <= cap:
        keep.append(torch.empty(MiB, dtype=torch.uint8, device=dev))
    print(f"reserved {torch.cuda.memory_reserved(dev)} of {cap}", file=sys.stderr, flush=True)
    x = torch.empty(2 * MiB, dtype=torch.uint8, device=dev)
    print("segment_cap: no failure", file=sys.stderr)
elif what == "async":
    x = torch.empty(200 * GiB, dtype=torch.uint8, device=dev)
else:
    sys.exit(f"unknown scenario {what}")
