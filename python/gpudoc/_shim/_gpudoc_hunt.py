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
import collections
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


def _plain_tensors(torch):
    """Tensor types whose attributes run no Python code (a subclass's __torch_function__ could)."""
    kinds = {torch.Tensor}
    for path in ("nn.Parameter", "nn.parameter.Buffer"):
        obj = torch
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            kinds.add(obj)
        except AttributeError:
            pass
    return kinds


def cuda_tensors(torch, device, ranges=None):
    """The Python tensors on `device` (within `ranges` when given) and their storages' sizes by id. A
    storage shared by several tensors counts once. Objects are told apart by their exact type: nothing of
    the program's runs (an isinstance() could call a `__class__` property, a subclass its
    __torch_function__)."""
    found, sizes, storages = [], {}, set()
    kinds = _plain_tensors(torch)
    for o in gc.get_objects():
        if type(o) not in kinds:
            continue
        try:
            if not o.is_cuda or o.device.index != device:
                continue
            ptr, nbytes = _storage(o)
            if ranges is None or _inside(ranges, ptr):
                found.append(o)
                sizes[id(o)] = 0 if ptr in storages else nbytes
                storages.add(ptr)
        except Exception:
            continue
    return found, sizes


# Containers looked into: builtin types only, so that no code of the program's runs.
_CONTAINERS = (list, tuple, set, frozenset, dict, collections.deque)


def _user_modules():
    """id(module dict) -> (module name, file) for __main__ and the program's own modules."""
    mods = {}
    for name, m in list(sys.modules.items()):
        if not issubclass(type(m), types.ModuleType):
            continue
        try:
            d = object.__getattribute__(m, "__dict__")
        except Exception:
            continue
        f = d.get("__file__")
        if name == "__main__" or (type(f) is str and is_user(f)):
            mods[id(d)] = (d, os.path.basename(f) if type(f) is str else name)
    return mods


def _instance_dict(o):
    """`o.__dict__` when reading it runs none of the program's code, else None."""
    t = type(o)
    if t.__getattribute__ is not object.__getattribute__:
        return None
    try:
        d = object.__getattribute__(o, "__dict__")
    except Exception:
        return None
    return d if type(d) is dict else None


def _key_of(d, obj):
    for k, v in list(d.items()):
        if v is obj and type(k) is str:
            return k
    return None


def _scan(by_id, skip):
    """One pass over the heap: the objects that refer to the tensors in `by_id` (with those they hold),
    and the instance each attribute dict belongs to. gc.get_referrers with many objects at once would be
    quadratic; gc.get_referents runs no code of the program's."""
    refs, owners = [], {}
    for o in gc.get_objects():
        i = id(o)
        if i in skip or i in by_id:
            continue
        t = type(o)
        if t is types.FrameType:
            continue
        try:
            inside = gc.get_referents(o)
        except Exception:
            continue
        held = [v for v in inside if id(v) in by_id]
        if held:
            refs.append((o, held))
        if t not in _CONTAINERS:
            for v in inside:
                if type(v) is dict:
                    owners[id(v)] = o
    return refs, owners


def _owner(d, owners):
    """The instance whose attribute dict `d` is."""
    o = owners.get(id(d))
    return o if o is not None and _instance_dict(o) is d else None


def _name_in(obj, skip, mods, owners):
    """A name for `obj`: a global of a user module, a local of a user frame, an attribute of an object."""
    for r in gc.get_referrers(obj):
        if id(r) in skip:
            continue
        if type(r) is dict and id(r) in mods:
            k = _key_of(r, obj)
            if k:
                return "`%s` (%s, module globals)" % (k, mods[id(r)][1])
        elif type(r) is types.FrameType and is_user(r.f_code.co_filename):
            k = _key_of(r.f_locals, obj)
            if k:
                return "`%s` (%s, in %s)" % (k, os.path.basename(r.f_code.co_filename), r.f_code.co_name)
        elif type(r) is dict:
            o = _owner(r, owners)
            k = _key_of(r, obj) if o is not None else None
            if k:
                return "attribute `%s` of a `%s`" % (k, type(o).__name__)
        elif type(r) not in _CONTAINERS:
            d = _instance_dict(r)
            k = _key_of(d, obj) if d is not None else None
            if k:
                return "attribute `%s` of a `%s`" % (k, type(r).__name__)
    return None


def holders(found, by_id, skip):
    """Who refers to the tensors in `found` (`by_id`: their bytes), grouped: [{kind, text, tensors, bytes,
    items}], most bytes first."""
    groups = {}
    skip = set(skip) | {id(found), id(groups), id(by_id)}
    mods = _user_modules()
    refs, owners = _scan(by_id, skip)
    containers = []
    skip.update((id(refs), id(containers)))
    for r, held in refs:
        t = type(r)
        if t is dict and id(r) in mods:
            for v in held:
                k = _key_of(r, v) or "?"
                _add(groups, ("global", k), "global `%s` (%s, module globals)" % (k, mods[id(r)][1]),
                     [v], by_id, None)
            continue
        owner = _owner(r, owners) if t is dict else (r if t not in _CONTAINERS else None)
        attrs = _instance_dict(owner) if owner is not None and t is not dict else r
        if owner is not None and attrs is not None:
            for v in held:
                k = _key_of(attrs, v) or "?"
                text = "attribute `%s` of a `%s`" % (k, type(owner).__name__)
                _add(groups, ("attr", id(owner), k), text, [v], by_id, None)
            continue
        if t not in _CONTAINERS:
            _add(groups, ("obj", id(r)), "a `%s` object" % t.__name__, held, by_id, None)
            continue
        containers.append((sum(by_id[id(v)] for v in held), r, held))
    # Naming a container searches the heap: the largest few are named, the rest described.
    containers.sort(key=lambda c: -c[0])
    for rank, (_, r, held) in enumerate(containers):
        kind = type(r).__name__
        name = _name_in(r, skip, mods, owners) if rank < 2 * TOP else None
        text = "%s %s" % (kind, name) if name else "a %s that gpudoc could not name" % kind
        _add(groups, ("obj", id(r)), text, held, by_id, len(r))
    return _ranked(groups.values())


def _ranked(groups):
    """Holders with the same description merged ("(in 3 of them)"), most bytes first (of equals, a named
    one first), those holding less than a tenth of the first left out."""
    merged = {}
    for g in groups:
        m = merged.get(g["text"])
        if m is None:
            merged[g["text"]] = dict(g, count=1)
        else:
            m["count"] += 1
            m["bytes"] += g["bytes"]
            m["tensors"] += g["tensors"]
            if m["items"] is not None and g["items"] is not None:
                m["items"] += g["items"]
    out = sorted(merged.values(), key=lambda g: (-g["bytes"], g["text"].startswith("a ")))
    out = [g for g in out if g["bytes"] * 10 >= out[0]["bytes"]] if out else out
    for g in out:
        if g["items"] is not None:
            g["text"] += ", %d items" % g["items"]
        if g["count"] > 1:
            g["text"] += " (in %d of them)" % g["count"]
        del g["count"]
    return out[:TOP]


def _add(groups, key, text, tensors, by_id, items):
    g = groups.setdefault(key, {"kind": key[0] if key[0] != "obj" else "container", "text": text,
                                "tensors": 0, "bytes": 0, "items": items})
    for t in tensors:
        g["tensors"] += 1
        g["bytes"] += by_id[id(t)]


def _graph_size(t):
    """Nodes in the autograd graph behind `t`. The nodes are kept while counting: an id is an object's
    only while it lives, and torch makes a node's Python object anew once the last one is gone."""
    seen, todo = {}, [t.grad_fn]
    while todo and len(seen) < MAX_NODES:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for nxt, _ in getattr(fn, "next_functions", ()):
            todo.append(nxt)
    return len(seen)


def graph_holder(torch, steps):
    """The tensor in the program's globals or its frames' locals with the largest autograd graph, when that
    graph spans many steps: it keeps every step's saved tensors alive."""
    best = None
    places = [(d, "%s, module globals" % where) for d, where in _user_modules().values()]
    f = sys._getframe()
    while f is not None:
        if is_user(f.f_code.co_filename):
            places.append((f.f_locals, "%s, in %s" % (os.path.basename(f.f_code.co_filename), f.f_code.co_name)))
        f = f.f_back
    kinds = _plain_tensors(torch)
    for names, where in places:
        for k, v in list(names.items()):
            if type(v) not in kinds:
                continue
            try:
                if v.grad_fn is not None:
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
                        # The graph holds what Python's objects don't: they hold too little to say.
                        held = [g] + [h for h in held if h["bytes"] * 10 >= leaked]
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
    return {"k": "hunt", "why": "oom", "dev": device, "t": t0, "from_step": 0, "to_step": 0,
            "steps": 0, "growth_bytes": 0, "sites": found_sites, "holders": held, "truncated": False,
            "record_s": 0.0, "analysis_s": round(time.time() - t0, 3),
            "tensor_bytes": sum(by_id.values()), "tensors": len(found)}
