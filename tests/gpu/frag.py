"""A fragmentation OOM that expandable segments rescue, sized to the GPU it runs on (issue 34's H200 check:
`gpudoc run --try expandable_segments` must report that it fits). oom.py's fragmentation case does not do
for that: it keeps a 3 MiB tensor in every 18 MiB, so every 20 MiB page of an expandable segment holds a
live tensor and none can be unmapped (on the H200 it ran out both ways).

Without expandable segments (PyTorch's CUDACachingAllocator.cpp): one tensor of F bytes is one
cudaMalloc'd segment; freed, it stays cached, and later requests above 1 MiB are served from it by best fit,
splitting it (a large-pool block is split when more than 1 MiB would remain; max_split_size is unlimited
by default, so no block is too big to split). Pieces of P bytes laid end to end across it, every other one
then freed, leave F/2 cached in holes of P, each between two live pieces: no free block larger than P, and
the segment cannot be given back (release_cached_blocks frees only segments with no block in use). A
request larger than P and larger than what the device has free then fails with F/2 "reserved by PyTorch
but unallocated": a fragmentation OOM.

With expandable_segments:True the same pieces lie in one segment whose address range is 1 1/8 of the GPU's
memory, mapped in 20 MiB pages. The failed request makes the allocator unmap every page that lies wholly
inside a free block (unmap_block; P a multiple of 20 MiB from the segment's start: every hole is whole
pages), and map the request where the range has room for it: the last hole and the unmapped range past F.
The request fits.

Sizes: F = 80% of the memory free at the start, in whole pairs of pieces; P = 200 MiB; the request R =
what is free once the pieces are in place + min(F/4, total/16): more than is free (so it fails as is),
within what is free + F/2 (so the unmapped holes make room), and at most total/16 past what is free (so
the 1/8 of spare address range holds it).
    python3 frag.py                                                    # out of memory (fragmentation)
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 frag.py   # fits, exits 0"""
import os
import sys

import torch

MiB = 1 << 20
GiB = 1 << 30
PAGE = 20 * MiB  # the large pool's page in an expandable segment (kLargeBuffer)
P = 10 * PAGE
dev = torch.device("cuda:0")


def say(what):
    print(what, file=sys.stderr, flush=True)


def stats():
    s = torch.cuda.memory_stats(dev)
    return (f"allocated {s['allocated_bytes.all.current'] / GiB:.2f} GiB, "
            f"reserved {s['reserved_bytes.all.current'] / GiB:.2f} GiB, "
            f"inactive split {s['inactive_split_bytes.all.current'] / GiB:.2f} GiB, "
            f"device frees {s['num_device_free']}, retries {s['num_alloc_retries']}")


say(f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')}")
torch.cuda.init()
free0, total = torch.cuda.mem_get_info(dev)
F = int(free0 * 0.8) // (2 * P) * (2 * P)
n = F // P
# One segment of F, cached once freed; the pieces split it from its start, end to end.
big = torch.empty(F, dtype=torch.uint8, device=dev)
del big
pieces = [torch.empty(P, dtype=torch.uint8, device=dev) for _ in range(n)]
kept = pieces[0::2]
del pieces  # every other piece freed: holes of P between live pieces
free, _ = torch.cuda.mem_get_info(dev)
R = (free + min(F // 4, total // 16) + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
say(f"total {total / GiB:.2f} GiB, free at start {free0 / GiB:.2f} GiB; {n} pieces of {P // MiB} MiB "
    f"over {F / GiB:.2f} GiB, {len(kept)} kept; free now {free / GiB:.2f} GiB; asking for {R / GiB:.2f} GiB")
say(f"before: {stats()}")
x = torch.empty(R, dtype=torch.uint8, device=dev)
x.fill_(1)
torch.cuda.synchronize(dev)
say(f"fits: {R / GiB:.2f} GiB in one piece; after: {stats()}")
