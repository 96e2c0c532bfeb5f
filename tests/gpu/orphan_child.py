"""A PyTorch program whose multiprocessing child holds CUDA memory: the parent prints the child's pid once
the child holds 4 GiB, then waits to be killed (leaving the child an orphan)."""
import multiprocessing as mp
import time


def child(ready):
    import torch

    x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    ready.set()
    while True:
        time.sleep(1)


if __name__ == "__main__":
    mp.set_start_method("spawn")
    ready = mp.Event()
    p = mp.Process(target=child, args=(ready,))
    p.start()
    ready.wait(60)
    print(p.pid, flush=True)
    while True:
        time.sleep(1)
