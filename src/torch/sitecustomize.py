# gpudoc's framework shim. gpudoc puts this file first on PYTHONPATH for the command it runs, so every
# Python process of the job loads it at start-up. It imports nothing new, never imports torch and never
# initializes CUDA: it waits for the program to import torch, then, once the program has initialized CUDA,
# samples PyTorch's caching allocator for the devices the process uses and writes JSON lines (each under
# PIPE_BUF, so processes writing at once never interleave) to gpudoc's pipe. Any failure makes it go
# quiet; it never breaks the program. Then it runs the sitecustomize the environment already had.
import os
import sys


def _gpudoc_shim():
    pipe = os.environ.get("GPUDOC_TORCH_PIPE")
    if not pipe:
        return
    shim_dir = os.path.dirname(os.path.abspath(__file__))
    interval = float(os.environ.get("GPUDOC_TORCH_INTERVAL", "0.01"))
    reset_peaks = os.environ.get("GPUDOC_TORCH_RESET_PEAKS", "1") == "1"
    state = {"fd": None, "dead": False, "thread": False, "steps": 0, "last": {}, "devices": {}}
    rank = os.environ.get("RANK")
    local_rank = os.environ.get("LOCAL_RANK")
    max_line = 4000

    def send(msg):
        if state["dead"]:
            return
        msg["pid"] = os.getpid()
        if rank is not None:
            msg["rank"] = int(rank) if rank.isdigit() else rank
        if local_rank is not None:
            msg["local_rank"] = int(local_rank) if local_rank.isdigit() else local_rank
        import json

        line = (json.dumps(msg, separators=(",", ":")) + "\n").encode()
        if len(line) > max_line:
            return
        try:
            if state["fd"] is None:
                state["fd"] = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.write(state["fd"], line)
        except BlockingIOError:
            pass  # gpudoc is behind: drop this sample rather than slow the program
        except OSError:
            state["dead"] = True

    def fail(where, exc):
        send({"k": "error", "where": where, "error": "%s: %s" % (type(exc).__name__, exc)})
        state["dead"] = True

    def devices(torch):
        # Only devices this process has allocated on. Reading statistics never creates a context; and
        # the current device can't tell, since it is per thread (this thread's is 0 whatever the program
        # set with torch.cuda.set_device).
        out = []
        for d in range(torch.cuda.device_count()):
            s = torch.cuda.memory_stats_as_nested_dict(d)
            if s.get("num_device_alloc", 0):
                out.append((d, s))
        return out

    def uuid_of(torch, d):
        if d not in state["devices"]:
            try:
                u = str(torch.cuda.get_device_properties(d).uuid)
                state["devices"][d] = u if u.startswith("GPU-") else "GPU-" + u
            except Exception:
                state["devices"][d] = None
        return state["devices"][d]

    def numbers(s):
        def cur(key):
            return s.get(key, {}).get("all", {}).get("current", 0)

        def peak(key):
            return s.get(key, {}).get("all", {}).get("peak", 0)

        return {
            "a": cur("allocated_bytes"),
            "r": cur("reserved_bytes"),
            "pa": peak("allocated_bytes"),
            "pr": peak("reserved_bytes"),
            "i": cur("inactive_split_bytes"),
            "q": cur("requested_bytes"),
            "nr": s.get("num_alloc_retries", 0),
            "no": s.get("num_ooms", 0),
            "nda": s.get("num_device_alloc", 0),
            "ndf": s.get("num_device_free", 0),
        }

    def sample(torch, kind="s", extra=None):
        for d, s in devices(torch):
            n = numbers(s)
            if kind == "s" and state["last"].get(d) == n:
                continue
            state["last"][d] = n
            msg = {"k": kind, "dev": d, "uuid": uuid_of(torch, d), "t": _time()}
            msg.update(n)
            if extra:
                msg.update(extra)
            send(msg)

    def on_step(torch):
        def hook(optimizer, args, kwargs):
            if state["dead"]:
                return
            try:
                if not torch.cuda.is_initialized():
                    return
                state["steps"] += 1
                sample(torch, "step", {"step": state["steps"]})
                if reset_peaks:
                    for d, _ in devices(torch):
                        torch.cuda.reset_peak_memory_stats(d)
            except Exception as e:
                fail("step hook", e)

        return hook

    def on_oom(torch):
        def observer(device, alloc, device_allocated, device_free):
            try:
                s = torch.cuda.memory_stats_as_nested_dict(device)
                msg = {"k": "oom", "dev": device, "uuid": uuid_of(torch, device), "t": _time(),
                       "alloc": alloc, "device_allocated": device_allocated, "device_free": device_free}
                msg.update(numbers(s))
                send(msg)
            except Exception as e:
                fail("oom observer", e)

        return observer

    def run(torch):
        import time

        try:
            # Until the program initializes CUDA there is nothing to read; poll gently.
            while not torch.cuda.is_initialized():
                time.sleep(0.05)
            try:
                torch._C._cuda_attach_out_of_memory_observer(on_oom(torch))
            except Exception:
                pass  # older torch: no observer; the OOM text still reaches gpudoc
            send({"k": "hello", "torch": getattr(torch, "__version__", "?"), "interval": interval})
            while not state["dead"]:
                sample(torch)
                time.sleep(interval)
        except Exception as e:
            fail("sampler", e)

    def start(torch):
        if state["thread"] or state["dead"]:
            return
        try:
            import threading

            hook = on_step(torch)
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook

                register_optimizer_step_post_hook(hook)
            except Exception:
                pass  # torch < 2.0: no global step hook
            state["thread"] = True
            threading.Thread(target=run, args=(torch,), name="gpudoc-shim", daemon=True).start()
        except Exception as e:
            fail("start", e)

    def after_fork():
        # A forked child (a DataLoader worker) has no sampler thread; it starts one only if it imports
        # torch anew, which a fork never does. Its own CUDA use is not possible after a fork anyway.
        state["thread"] = True
        state["fd"] = None

    os.register_at_fork(after_in_child=after_fork)

    def _time():
        import time

        return time.time()

    class Finder:
        """Watches for `import torch` without importing anything itself."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch" or state["dead"]:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    loader = spec.loader
                    real_exec = loader.exec_module

                    def exec_module(module, real_exec=real_exec):
                        real_exec(module)
                        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, Finder)]
                        start(module)

                    loader.exec_module = exec_module
                    return spec
            return None

    if "torch" in sys.modules:
        start(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, Finder())
    return shim_dir


def _gpudoc_chain(shim_dir):
    """Runs the sitecustomize this one shadows, if the environment had one."""
    if not shim_dir:
        return
    # The import machinery already loaded at start-up, so chaining imports no module of its own.
    bootstrap = sys.modules["_frozen_importlib"]
    path = [p for p in sys.path if os.path.abspath(p or ".") != shim_dir]
    for finder in sys.meta_path:
        if getattr(finder, "__name__", "") != "PathFinder":
            continue
        spec = finder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = bootstrap.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)
        return


try:
    _gpudoc_dir = _gpudoc_shim()
except Exception:
    _gpudoc_dir = os.path.dirname(os.path.abspath(__file__))
_gpudoc_chain(_gpudoc_dir)
