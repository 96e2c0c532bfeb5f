"""gpudoc's leak hunt, loaded by the shim only when a hunt starts: a healthy job never imports it.

A hunt records PyTorch's memory history (torch.cuda.memory._record_memory_history, Python stacks only)
for a bounded window of optimizer steps, then reads the allocator's snapshot once and stops recording:

- where: the blocks allocated in the window and still alive at its end, grouped by the innermost frame
  in the user's code (not torch's, the standard library's or an installed package's). A site that keeps
  alive a good share of what it allocated, in many of the window's steps, leaks; one whose blocks are
  freed step after step (activations, gradients) does not.
- what holds it: the Python objects that refer to those blocks' tensors (a list, a dict, a global, an
  attribute), found through the garbage collector; when none do, the autograd graph that keeps them (a
  tensor that requires grad, accumulated step after step).

At an out-of-memory failure the same search names what filled the GPU. Everything here runs inside
try/except in the shim: a failure is reported to gpudoc and never reaches the program.
"""
import gc
import linecache
import os
import sys
import sysconfig
import time
import types

# The window: at most this many steps and seconds of recording.
WINDOW_STEPS = 20
WINDOW_S = 30.0
# Events kept by PyTorch's ring buffer during the window (each a few KB of host memory at most).
MAX_ENTRIES = 20000
# A site leaks when it keeps alive at least this share of the blocks it allocated in the window...
LIVE_SHARE = 0.25
TOP = 5
MAX_FRAMES = 12
# Graph nodes counted at most when looking for the autograd graph that holds memory.
MAX_NODES = 200000

_prefixes = None
_user_cache = {}


def _not_user_prefixes(torch):
    paths = set()
    try:
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            p = sysconfig.get_paths().get(key)
            if p:
                paths.add(os.path.realpath(p))
    except Exception:
        pass
    for mod in (torch, sys.modules.get(__name__)):
        f = getattr(mod, "__file__", None)
        if f:
            paths.add(os.path.dirname(os.path.realpath(f)))
    return tuple(p.rstrip(os.sep) + os.sep for p in paths)


def is_user(filename):
    """The file is the program's own code: not torch, not the standard library, not an installed package."""
    hit = _user_cache.get(filename)
    if hit is None:
        if not filename or filename.startswith("<"):
            hit = False
        else:
            real = os.path.realpath(filename)
            hit = not real.startswith(_prefixes) and os.sep + "site-packages" + os.sep not in real \
                and os.sep + "dist-packages" + os.sep not in real
        _user_cache[filename] = hit
    return hit


def _frame_text(f):
    return "%s:%d in %s" % (f.get("filename", "?"), f.get("line", 0), f.get("name", "?"))


def _site_of(frames):
    """The innermost user frame (frames come innermost first), else the outermost one."""
    for f in frames:
        if is_user(f.get("filename", "")):
            return f
    return frames[-1]


def _code(filename, line):
    try:
        return linecache.getline(filename, line).strip()[:160]
    except Exception:
        return ""


def _block_frames(block):
    frames = block.get("frames")
    if frames is None and block.get("history"):
        frames = block["history"][-1].get("frames")
    return frames or []


def sites(snapshot, device, steps, leaks_only=True):
    """The sites of `device`'s live blocks recorded in the window, largest first: those that leak (or all of
    them, at an OOM), their address ranges, and whether the event log overflowed."""
    live = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", device) != device:
            continue
        for b in seg.get("blocks", []):
            if b.get("state") != "active_allocated":
                continue
            frames = _block_frames(b)
            if not frames:
                continue  # allocated before the window
            f = _site_of(frames)
            key = (f.get("filename", "?"), f.get("line", 0), f.get("name", "?"))
            entry = live.setdefault(key, [0, 0, frames, []])
            entry[0] += b.get("size", 0)
            entry[1] += 1
            entry[3].append((b.get("address", 0), b.get("size", 0)))
    allocs = {}
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    for e in trace:
        if e.get("action") == "alloc" and e.get("frames"):
            f = _site_of(e["frames"])
            key = (f.get("filename", "?"), f.get("line", 0), f.get("name", "?"))
            allocs[key] = allocs.get(key, 0) + 1
    out, ranges = [], []
    for key, (nbytes, blocks, frames, addrs) in live.items():
        made = max(allocs.get(key, 0), blocks)
        if leaks_only and (blocks < max(2, steps // 2) or blocks < LIVE_SHARE * made):
            continue
        out.append({
            "file": key[0], "line": key[1], "function": key[2], "code": _code(key[0], key[1]),
            "bytes": nbytes, "bytes_per_step": nbytes // max(1, steps), "blocks": blocks,
            "allocs": made, "stack": [_frame_text(f) for f in frames[:MAX_FRAMES]],
        })
        ranges.extend(addrs)
    out.sort(key=lambda s: -s["bytes"])
    return out[:TOP], sorted(ranges), len(trace) >= MAX_ENTRIES


def _storage(t):
    try:
        s = t.untyped_storage()
    except AttributeError:
        s = t.storage()
    return s.data_ptr(), s.nbytes()


def _inside(ranges, ptr):
    lo, hi = 0, len(ranges)
    while lo < hi:
        mid = (lo + hi) // 2
        if ranges[mid][0] <= ptr:
            lo = mid + 1
        else:
            hi = mid
    return lo > 0 and ptr < ranges[lo - 1][0] + ranges[lo - 1][1]


def cuda_tensors(torch, device, ranges=None):
    """The Python tensors on `device` (within `ranges` when given) and their storages' sizes by id. A
    storage shared by several tensors counts once."""
    found, sizes, storages = [], {}, set()
    for o in gc.get_objects():
        try:
            if not isinstance(o, torch.Tensor) or not o.is_cuda or o.device.index != device:
                continue
            ptr, nbytes = _storage(o)
            if ranges is None or _inside(ranges, ptr):
                found.append(o)
                sizes[id(o)] = 0 if ptr in storages else nbytes
                storages.add(ptr)
        except Exception:
            continue
    return found, sizes


def _user_modules():
    mods = {}
    for m in list(sys.modules.values()):
        d = getattr(m, "__dict__", None)
        f = getattr(m, "__file__", None)
        if d is not None and (getattr(m, "__name__", "") == "__main__" or (f and is_user(f))):
            mods[id(d)] = m
    return mods


def _where_module(m):
    f = getattr(m, "__file__", None) or getattr(m, "__name__", "?")
    return "%s, module globals" % os.path.basename(f)


def _name_in(obj, skip):
    """A name for `obj`: a global of a user module, a local of a user frame, an attribute of an object."""
    mods = _user_modules()
    for r in gc.get_referrers(obj):
        if id(r) in skip:
            continue
        if type(r) is dict and id(r) in mods:
            for k, v in r.items():
                if v is obj:
                    return "`%s` (%s)" % (k, _where_module(mods[id(r)]))
        if isinstance(r, types.FrameType) and is_user(r.f_code.co_filename):
            for k, v in r.f_locals.items():
                if v is obj:
                    return "`%s` (%s, in %s)" % (
                        k, os.path.basename(r.f_code.co_filename), r.f_code.co_name)
        if type(r) is dict:
            for owner in gc.get_referrers(r):
                if getattr(owner, "__dict__", None) is r and id(owner) not in skip:
                    for k, v in r.items():
                        if v is obj:
                            return "attribute `%s` of a `%s`" % (k, type(owner).__name__)
    return None


def holders(found, by_id, skip):
    """Who refers to the tensors in `found` (`by_id`: their bytes), grouped: [{kind, text, tensors, bytes,
    items}], most bytes first."""
    groups = {}
    skip = set(skip) | {id(found)}
    mods = _user_modules()
    for r in gc.get_referrers(*found):
        if id(r) in skip or id(r) in by_id or isinstance(r, types.FrameType):
            continue
        held = [v for v in _values(r) if id(v) in by_id]
        if not held:
            continue
        if type(r) is dict and id(r) in mods:
            for k, v in r.items():
                if id(v) in by_id:
                    _add(groups, ("global", k), "global `%s` (%s)" % (k, _where_module(mods[id(r)])),
                         [v], by_id, None)
            continue
        owner = None
        if type(r) is dict:
            for o in gc.get_referrers(r):
                if getattr(o, "__dict__", None) is r:
                    owner = o
                    break
        if owner is not None:
            for k, v in r.items():
                if id(v) in by_id:
                    text = "attribute `%s` of a `%s`" % (k, type(owner).__name__)
                    _add(groups, ("attr", id(owner), k), text, [v], by_id, None)
            continue
        kind = type(r).__name__
        # Naming a container searches the heap: the largest few are named, the rest described.
        named = sum(1 for g in groups.values() if g["kind"] == "container")
        name = _name_in(r, skip | {id(groups)}) if named < 2 * TOP else None
        text = "%s %s" % (kind, name) if name else "a %s that gpudoc could not name" % kind
        _add(groups, ("obj", id(r)), text, held, by_id, len(r) if hasattr(r, "__len__") else None)
    out = sorted(groups.values(), key=lambda g: -g["bytes"])
    for g in out:
        if g["items"] is not None:
            g["text"] += ", %d items" % g["items"]
    return out[:TOP]


def _values(r):
    try:
        if type(r) is dict or isinstance(r, dict):
            return list(r.values())
        if isinstance(r, (list, tuple, set, frozenset)) or hasattr(r, "__iter__") and hasattr(r, "__len__"):
            return list(r)
    except Exception:
        pass
    return []


def _add(groups, key, text, tensors, by_id, items):
    g = groups.setdefault(key, {"kind": key[0] if key[0] != "obj" else "container", "text": text,
                                "tensors": 0, "bytes": 0, "items": items})
    for t in tensors:
        g["tensors"] += 1
        g["bytes"] += by_id[id(t)]


def _graph_size(t):
    seen, todo = set(), [t.grad_fn]
    while todo and len(seen) < MAX_NODES:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        for nxt, _ in getattr(fn, "next_functions", ()):
            todo.append(nxt)
    return len(seen)


def graph_holder(torch, steps):
    """The tensor in the program's globals or its frames' locals with the largest autograd graph, when that
    graph spans many steps: it keeps every step's saved tensors alive."""
    best = None
    places = []
    for m in _user_modules().values():
        places.append((vars(m), _where_module(m)))
    f = sys._getframe()
    while f is not None:
        if is_user(f.f_code.co_filename):
            places.append((f.f_locals, "%s, in %s" % (os.path.basename(f.f_code.co_filename), f.f_code.co_name)))
        f = f.f_back
    for names, where in places:
        for k, v in list(names.items()):
            try:
                if isinstance(v, torch.Tensor) and v.grad_fn is not None:
                    n = _graph_size(v)
                    if best is None or n > best[0]:
                        best = (n, k, where)
            except Exception:
                continue
    if best is None or best[0] < steps:
        return None
    return {"kind": "graph", "text": "the autograd graph of `%s` (%s), %d nodes%s" % (
        best[1], best[2], best[0], "+" if best[0] >= MAX_NODES else ""),
        "tensors": 0, "bytes": 0, "items": None}


class Hunt(object):
    """One window of recording on the devices in use."""

    def __init__(self, torch, why, step, devices, allocated):
        self.torch = torch
        self.why = why
        self.from_step = step
        self.devices = list(devices)
        self.allocated = dict(allocated)
        self.t0 = time.time()
        self.ours = True
        global _prefixes
        if _prefixes is None:
            _prefixes = _not_user_prefixes(torch)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)

    def due(self, step):
        return step - self.from_step >= WINDOW_STEPS or time.time() - self.t0 >= WINDOW_S

    def finish(self, step, allocated, skip=()):
        """Reads the snapshot, stops recording, and returns one result per device."""
        torch = self.torch
        t1 = time.time()
        try:
            snap = torch.cuda.memory._snapshot()
        finally:
            if self.ours:
                torch.cuda.memory._record_memory_history(enabled=None)
        steps = max(1, step - self.from_step)
        out = []
        for d in self.devices:
            found_sites, ranges, truncated = sites(snap, d, steps)
            held = []
            if ranges:
                found, by_id = cuda_tensors(torch, d, ranges)
                if found:
                    held = holders(found, by_id, skip)
                seen = sum(g["bytes"] for g in held)
                leaked = sum(s["bytes"] for s in found_sites)
                if seen < leaked // 10:
                    g = graph_holder(torch, steps)
                    if g:
                        held.insert(0, g)
            out.append({
                "k": "hunt", "why": self.why, "dev": d, "t": time.time(), "from_step": self.from_step,
                "to_step": step, "steps": steps,
                "growth_bytes": allocated.get(d, 0) - self.allocated.get(d, 0),
                "sites": found_sites, "holders": held, "truncated": truncated,
                "record_s": round(t1 - self.t0, 3), "analysis_s": round(time.time() - t1, 3),
            })
        return out


def at_oom(torch, device, hunt, skip=()):
    """What filled `device` at an out-of-memory failure: the holders of its Python tensors, and the sites of
    the blocks a hunt in progress recorded."""
    global _prefixes
    if _prefixes is None:
        _prefixes = _not_user_prefixes(torch)
    t0 = time.time()
    found_sites = []
    if hunt is not None:
        try:
            found_sites = sites(torch.cuda.memory._snapshot(), device, 1, leaks_only=False)[0]
        except Exception:
            found_sites = []
    found, by_id = cuda_tensors(torch, device)
    held = holders(found, by_id, skip) if found else []
    return {"k": "hunt", "why": "oom", "dev": device, "t": time.time(), "from_step": 0, "to_step": 0,
            "steps": 0, "growth_bytes": 0, "sites": found_sites, "holders": held, "truncated": False,
            "record_s": 0.0, "analysis_s": round(time.time() - t0, 3),
            "tensor_bytes": sum(by_id.values()), "tensors": len(found)}
