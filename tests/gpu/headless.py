"""Holds GiB of GPU memory on cuda:0, then ends its main thread alone (pthread_exit) while another thread
runs on: /proc shows the process as a zombie, yet it lives and keeps its memory (issue 26, item 16).
    python3 headless.py 2      # hold 2 GiB; prints `held PID` once the main thread is about to exit"""
import ctypes
import os
import sys
import threading
import time

import torch

x = torch.empty(int(float(sys.argv[1]) * (1 << 30)), dtype=torch.uint8, device="cuda:0")
torch.cuda.synchronize()
threading.Thread(target=lambda: time.sleep(3600)).start()
print(f"held {os.getpid()}", flush=True)
ctypes.CDLL(None).pthread_exit(None)
