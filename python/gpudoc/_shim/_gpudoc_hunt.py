"""gpudoc's leak hunt, loaded by the shim only when a hunt starts: a healthy job never loads it.

A hunt records PyTorch's memory history (torch.cuda.memory._record_memory_history, Python stacks only)
for a bounded window of optimizer steps, then reads the allocator's snapshot once and stops recording:

- where: the blocks allocated in the window and still alive at its end, grouped by the innermost frame
  in the user's code (not torch's, the standard library's or an installed package's). A site that keeps
  alive a good share of what it allocated, in many of the window's steps, leaks; one whose blocks are
  freed step after step (activations, gradients) does not.
- what holds it (Search): the Python objects that refer to those blocks' tensors, found by walking from
  the program's names (its running functions' locals, its modules' globals) a few milliseconds a step,
  so no pause grows with the program's heap, and named by the way they were reached (a global, a local
  of a running function, an attribute, a closure variable, an lru_cache); when none do, the autograd
  graph of a tensor one of those names holds, accumulated step after step.

It may look, never hold: between slices nothing of the program's is referred to, and a running
function's locals are read in place (Locals), never through frame.f_locals, which before Python 3.13
keeps them alive in the frame. At an out-of-memory failure the same search names what filled the GPU.
Everything here runs inside try/except in the shim: a failure is reported to gpudoc and never reaches
the program.
"""
import collections
import gc
import itertools
import linecache
import os
import sys
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
# Graph nodes counted at most when looking for the autograd graph that holds memory (a graph spans the
# window's steps when it has as many nodes: more are not needed to say so).
MAX_NODES = 5000

_prefixes = None
_user_cache = {}


def _not_user_prefixes(torch):
    """The standard library's folder, the site folders, torch's and gpudoc's (from what is loaded:
    sysconfig, which knows them too, takes tens of milliseconds to import)."""
    paths = set([os.path.dirname(os.path.realpath(os.__file__))])
    site = sys.modules.get("site")
    try:
        paths.update(os.path.realpath(p) for p in site.getsitepackages())
    except Exception:
        pass
    f = getattr(torch, "__file__", None)
    if f:
        paths.add(os.path.dirname(os.path.realpath(f)))
    # gpudoc's own folder (this module's __file__ is no real file's name: its code's is), and its package's
    # (the notebook extension's frames are gpudoc's too).
    here = os.path.dirname(os.path.realpath(_not_user_prefixes.__code__.co_filename))
    paths.add(here)
    if os.path.basename(here) == "_shim":
        paths.add(os.path.dirname(here))
    return tuple(p.rstrip(os.sep) + os.sep for p in paths)


def is_user(filename):
    """The file is the program's own code: not torch, not the standard library, not an installed package."""
    hit = _user_cache.get(filename)
    if hit is None:
        if filename.startswith("<ipython-input-"):
            hit = True  # a cell of IPython's terminal
        elif not filename or filename.startswith("<"):
            hit = False
        else:
            real = os.path.realpath(filename)
            hit = not real.startswith(_prefixes) and os.sep + "site-packages" + os.sep not in real \
                and os.sep + "dist-packages" + os.sep not in real and not _installed(real)
        _user_cache[filename] = hit
    return hit


_installs = {}


def _installed(real):
    """The file is in a folder of sys.path that pip installed into (`pip install --target DIR`, a
    PYTHONPATH of installed packages): one that holds a `*.dist-info`. A source tree has none (an editable
    install puts its own in site-packages)."""
    for entry in sys.path:
        if type(entry) is not str or not entry:
            continue
        folder = _installs.get(entry)
        if folder is None:
            d = os.path.realpath(entry)
            try:
                pip = any(n.endswith(".dist-info") for n in os.listdir(d))
            except OSError:
                pip = False
            folder = _installs[entry] = (d.rstrip(os.sep) + os.sep, pip)
        if folder[1] and real.startswith(folder[0]):
            return True
    return False


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
    allocs, last = {}, {}
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    for i, e in enumerate(trace):
        if e.get("action") == "alloc" and e.get("frames"):
            f = _site_of(e["frames"])
            key = (f.get("filename", "?"), f.get("line", 0), f.get("name", "?"))
            allocs[key] = allocs.get(key, 0) + 1
            last[e.get("addr")] = i
    out, ranges = [], []
    for key, (nbytes, blocks, frames, addrs) in live.items():
        made = max(allocs.get(key, 0), blocks)
        if leaks_only and not (_every_step(blocks, made, addrs, last, len(trace), steps)
                               or _every_few_steps(blocks, made, addrs, last, len(trace))):
            continue
        out.append({
            "file": key[0], "line": key[1], "function": key[2], "code": _code(key[0], key[1]),
            "bytes": nbytes, "bytes_per_step": nbytes // max(1, steps), "blocks": blocks,
            "allocs": made, "stack": [_frame_text(f) for f in frames[:MAX_FRAMES]],
        })
        ranges.extend(addrs)
    out.sort(key=lambda s: -s["bytes"])
    return out[:TOP], sorted(ranges), len(trace) >= MAX_ENTRIES


def _every_step(blocks, made, addrs, last, events, steps):
    """A site that keeps blocks in at least half the window's steps, a quarter or more of what it
    allocated or kept all through the window (`_spread`)."""
    return blocks >= max(2, steps // 2) and (blocks >= LIVE_SHARE * made or _spread(addrs, last, events,
                                                                                       steps))


def _every_few_steps(blocks, made, addrs, last, events):
    """A site that keeps a quarter or more of what it allocated, in blocks allocated at three or more
    moments from the window's first third to its last (a validation every 5 steps that keeps its losses,
    a checkpoint's copy every few steps): the blocks of one moment (a buffer made once, the last step's
    activations) are not spread so."""
    if blocks < 3 or blocks < LIVE_SHARE * made or not events:
        return False
    at = sorted(last.get(a, -1) for a, _ in addrs)
    moments = 1 + sum(1 for x, y in zip(at, at[1:]) if y - x > events // 20)
    return moments >= 3 and at[0] < events // 3 and at[-1] > 2 * events // 3


def _spread(addrs, last, events, steps):
    """The live blocks `addrs` were allocated all through the window, not only in its last steps: a quarter
    of the window's steps' worth of them in the first half of its events (a block allocated before the
    event log's first entry, when it overflowed, counts as early). A site that allocates many blocks a
    step (the model's call: every layer's activation) and keeps one of them (a forward hook's) keeps a
    small share of what it allocates, but keeps it step after step; the activations of the step the window
    ended in are all late."""
    if not events:
        return False
    early = sum(1 for a, _ in addrs if last.get(a, -1) < events // 2)
    return early >= max(2, steps // 4)


def _storage(t):
    try:
        s = t.untyped_storage()
    except AttributeError:
        s = t.storage()
    return s.data_ptr(), s.nbytes()


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


class Search(object):
    """Finds what holds the tensors in `ranges` (all of the device's when None) by walking, a slice at a
    time, from the program's names: the locals of its running functions (innermost first, read by
    Locals) and the globals of its own modules. Between slices it keeps no reference to anything of the
    program's: where it was is a path of positions and ids, found again at the next slice (a container
    changed meanwhile is passed over). Only builtin containers' own methods and gc.get_referents are used
    on the program's objects: none of its code runs. The garbage collector is off during a slice, so the
    program's gc.callbacks see no collection of gpudoc's."""

    def __init__(self, torch, device, ranges, skip, steps=0, roots=None):
        _prepare(torch)
        self.torch, self.device, self.ranges, self.steps = torch, device, ranges, steps
        self.kinds = _plain_tensors(torch)
        # IPython's shell is no holder of the program's (its namespace, a root, is): not gone into.
        self.skip = set(skip) | {id(self)} | set(id(o) for o in _notebook()[:1] if o is not None)
        # Where the search starts, made anew at each slice (`roots(skip)`: a list of _Root).
        self.roots = roots or _roots
        # What a slice's budget is counted in: wall time in a job (a step's pause), or the notebook's
        # thread's own CPU time (what a search finds in a cell does not depend on the machine's load).
        self.clock = time.perf_counter
        # Roots searched whole (by key: the program's frames come and go between slices), where in the
        # current one the last slice stopped, and the large containers left for the end (a leak's list
        # is found before a data set's million items are walked).
        self.finished, self.key, self.path, self.label = set(), None, [], None
        self.later, self.floor = [], 0
        self.seen, self.storages, self.covered = set(), set(), set()
        self.bytes, self.groups, self.graph = {}, {}, None
        # Per name a root holds (a global, a local, an output): the storages reached from it.
        self.named, self.storage_bytes = {}, {}
        self.done, self.visited, self.spent = False, 0, 0.0
        # The device's live tensors at an OOM (see at_oom).
        self.allocated = None
        # The device's live tensors, when finding them all is enough (no name is needed past them).
        self.enough = None

    def run(self, budget):
        """One slice of at most `budget` seconds; whether the search is over."""
        if self.done:
            return True
        clock = self.clock
        t0 = clock()
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._slice(t0 + budget)
        finally:
            if collecting:
                gc.enable()
            self.spent += clock() - t0
        return self.done

    def _slice(self, deadline):
        roots = self.roots(self.skip)
        stop = _Stops(self.skip)
        while not self._complete():
            stack = self._resume(roots)
            if stack is None:
                if not self.later:
                    break
                # A large container left for the end: from its root, by its path, if still there.
                self.key, self.label, self.path = self.later.pop(0)
                self.floor = len(self.path)
                continue
            if self._walk(stack, stop, deadline):
                self.path = [(id(e[0]), e[2]) for e in stack]
                labels = stack[0][0].labels()
                at = stack[0][2] - 1
                self.label = labels[at] if 0 <= at < len(labels) else None
                return
            if self.floor:
                self.key, self.path, self.floor = None, [], 0
            else:
                self.finished.add(self.key)
        self.done = True

    def _complete(self):
        """Nothing is left to find: every range covered, or tensors found for all `enough` bytes (each
        storage may be up to 511 bytes under its block: the allocator rounds to 512)."""
        if self.ranges is not None:
            return len(self.covered) == len(self.ranges)
        return self.enough is not None and sum(self.bytes.values()) + 512 * len(self.storages) >= self.enough

    def _resume(self, roots):
        """The stack at the saved path: the root it was in (the first root not searched yet, when none),
        then each container found again where it was. None when there is nothing to resume."""
        if self.floor:
            root = [r for r in roots if r.key == self.key]
            if not root:
                self.key, self.path, self.floor = None, [], 0
                return self._resume(roots)
            root = root[0]
        else:
            todo = [r for r in roots if r.key not in self.finished]
            if not todo:
                return None
            root = todo[0]
            if root.key != self.key:
                self.key, self.path = root.key, []
        stack = [_open(root)]
        for i, (oid, pos) in enumerate(self.path):
            parent = stack[-1]
            if i == 0:
                # A root is resumed at the name it was at: a program adds and deletes globals (`del y`).
                at = _find(root.labels(), self.label) if self.label is not None else -1
                parent[2] = at + 1 if at >= 0 else min(pos, len(root.labels()))
                if at < 0:
                    break
                continue
            child = _nth(parent, parent[2] - 1)
            if child is None or id(child) != oid:
                break
            entry = _open(child)
            _skip(entry, pos)
            stack.append(entry)
        self.path = []
        if self.floor and len(stack) < self.floor:
            # The container left for the end is gone, or its place changed: nothing to resume there.
            self.key, self.floor = None, 0
            return self._resume(roots)
        return stack

    def _walk(self, stack, stop, deadline):
        """Depth first from the stack's top until what it started in is done (False: the root, or the
        container left for the end at `floor`) or time is up (True)."""
        kinds, seen, steps, floor = self.kinds, self.seen, 0, max(1, self.floor)
        clock = self.clock
        while len(stack) >= floor:
            # Every child counts toward the deadline, those not gone into too: a container of a million
            # ints or strings is walked in slices as any other.
            steps += 1
            if steps & 63 == 0 and clock() > deadline:
                return True
            entry = stack[-1]
            child = _next(entry)
            if child is _END:
                stack.pop()
                continue
            t = type(child)
            if t in kinds:
                self._suspect(child, stack)
            if not gc.is_tracked(child) or id(child) in seen or len(stack) > MAX_DEPTH:
                continue
            if stop.here(child, t):
                continue
            base = _base(t)
            if not self.floor and base is not None and base.__len__(child) > BIG:
                labels = stack[0][0].labels()
                self.later.append((stack[0][0].key, labels[stack[0][2] - 1] if stack[0][2] else None,
                                   [(id(e[0]), e[2]) for e in stack] + [(id(child), 0)]))
                continue
            # An object only this container refers to cannot be reached twice: not remembered. Held here
            # by `child` and getrefcount's argument, and by the list of a "refs" or root entry.
            if sys.getrefcount(child) > (2 if entry[1] in ("seq", "iter") else 3) + 1:
                seen.add(id(child))
            stack.append(_open(child))
            self.visited += 1
        return False

    def _suspect(self, t, stack):
        """A plain tensor reached from the top of `stack`: counted when it is on the device (in the
        ranges), and what refers to it is its holder."""
        try:
            if not t.is_cuda or t.device.index != self.device:
                return
            # A graph made after the window keeps the window's blocks too: any tensor a name holds.
            if len(stack) == 1 and t.grad_fn is not None:
                self._graph(t, stack[0][0], stack[0][2] - 1)
            ptr, nbytes = _storage(t)
            block = _block_of(self.ranges, ptr)
            if block is None:
                return
        except Exception:
            return
        i = id(t)
        if i not in self.bytes:
            self.bytes[i] = 0 if ptr in self.storages else nbytes
            self.storages.add(ptr)
            self.covered.add(block)
            self.storage_bytes[ptr] = nbytes
        try:
            graph = t.grad_fn is not None
        except Exception:
            graph = False
        self._name(stack[0][0], stack[0][2] - 1, ptr, graph)
        key, kind, text, items = _holder(stack, t)
        g = self.groups.setdefault(key, {"kind": kind, "text": text, "tensors": 0, "bytes": 0,
                                         "items": items, "graphs": 0, "ids": set()})
        if i not in g["ids"]:
            g["ids"].add(i)
            g["tensors"] += 1
            g["bytes"] += self.bytes[i]
            g["graphs"] += graph

    def _name(self, root, pos, ptr, graph):
        """Counts the storage `ptr` for the name at `pos` of `root` (the first step of the path to it), and
        whether its tensor carries an autograd graph."""
        name = _name_at(root, pos)
        entry = self.named.get((root.key, name))
        if entry is None:
            entry = self.named[(root.key, name)] = {"kind": _kind_of(root, name), "where": root.where,
                                                    "name": name, "function": root.function, "ptrs": set(),
                                                    "graphs": 0}
        entry["ptrs"].add(ptr)
        entry["graphs"] += graph

    def total(self, kind):
        """The bytes the names of `kind` hold together (each storage once), the functions whose frames
        hold them, and how many of their tensors carry an autograd graph."""
        ptrs, functions, graphs = set(), [], 0
        for e in self.named.values():
            if e["kind"] == kind:
                ptrs |= e["ptrs"]
                graphs += e["graphs"]
                if e["function"] is not None and e["function"] not in functions:
                    functions.append(e["function"])
        return sum(self.storage_bytes.get(p, 0) for p in ptrs), functions, graphs

    def names(self):
        """What each name holds on the device, most first: kind (global, local, traceback, output), where,
        name, bytes (its storages, each once), tensors' storages, and how many carry an autograd graph."""
        out = []
        for e in self.named.values():
            out.append({"kind": e["kind"], "where": e["where"], "name": e["name"], "storages": len(e["ptrs"]),
                        "bytes": sum(self.storage_bytes.get(p, 0) for p in e["ptrs"]), "graphs": e["graphs"]})
        out.sort(key=lambda e: -e["bytes"])
        return out

    def unreached(self, allocated):
        """Of `allocated` bytes (the device's live tensors), those no Python tensor the search reached
        refers to: what autograd graphs save (and C++ holds), once the search covered every name; None
        before, or when it is under a tenth (as _behind)."""
        hidden = (allocated or 0) - sum(self.bytes.values())
        if not self.done or hidden <= 0 or hidden * 10 < (allocated or 0):
            return None
        return hidden

    def _graph(self, t, root, pos):
        """A tensor named by a global or a local whose autograd graph spans the window's steps keeps every
        step's saved tensors alive, where Python cannot see them."""
        n = _graph_size(t)
        if n >= max(1, self.steps) and (self.graph is None or n > self.graph[0]):
            self.graph = (n, "the autograd graph of `%s` (%s), %d nodes%s" % (
                _name_at(root, pos), root.where, n, "+" if n >= MAX_NODES else ""))

    def holders(self, leaked=None):
        """What was found, grouped and ranked; the autograd graph first when Python's objects hold too
        little of `leaked` bytes to say; the graphs behind held tensors after their holder (see
        _behind)."""
        groups = [dict(g) for g in self.groups.values()]
        for g in groups:
            del g["ids"]
        held = _ranked(groups)
        if leaked is not None and self.graph and sum(g["bytes"] for g in held) < leaked // 10:
            g = {"kind": "graph", "text": self.graph[1], "tensors": 0, "bytes": 0, "items": None}
            return [g] + [h for h in held if h["bytes"] * 10 >= leaked]
        return _behind(held, leaked if leaked is not None else self.allocated, sum(self.bytes.values()),
                       self.done)


def _behind(held, base, found, done):
    """`held` with, after the first holder whose tensors carry autograd graphs (grad_fn), what those graphs
    keep: of `base` bytes (what leaked, or all the device's live tensors at an OOM), those no Python
    tensor refers to (`found` is what the search reached), when the search covered the whole heap and
    that is a tenth of `base` or more. The saved tensors themselves are never read: unpacking one runs
    the program's saved-tensor hooks (a checkpoint's recomputation)."""
    owner = [h for h in held if h.get("graphs")]
    hidden = (base or 0) - found
    if not owner or not done or hidden * 10 < (base or 0) or hidden <= 0:
        return held
    o = owner[0]
    g = {"kind": "graphs", "tensors": sum(h["graphs"] for h in owner), "bytes": hidden, "items": None,
         "graphs": 0, "of": o["text"],
         "text": "the autograd graphs behind the %d tensors with grad_fn in %s: what the forward passes "
                 "that made them saved, which no Python object refers to and no backward has freed yet"
                 % (o["graphs"], o["text"])}
    i = held.index(o)
    return held[:i + 1] + [g] + held[i + 1:]


# Deeper than this from a root is not followed.
MAX_DEPTH = 48
# A container with more items than this is walked last.
BIG = 10000
_END = object()


class _Root(object):
    """Where a search starts: a running function's locals (`kind` "f": `names`, `values`) or a module's
    globals (`kind` "m": `obj`, the module's dict)."""

    def __init__(self, kind, key, where, obj=None, names=None, values=None, shell=False):
        self.kind, self.key, self.where = kind, key, where
        self.obj, self.names, self.values = obj, names, values
        # IPython's namespace: its output cache (Out, _, _7) is searched after the user's own names, so
        # that what both refer to is named by the user's name.
        self.shell = shell
        # A frame's: its function's name.
        self.function = None

    def labels(self):
        """The names of its children, in order: the locals' names, or the globals' (as they are now)."""
        if self.kind == "m" and self.names is None:
            items = list(dict.items(self.obj))
            if self.shell:
                items.sort(key=lambda kv: output_name(kv[0]) is not None)
            self.names, self.values = [k for k, _ in items], [v for _, v in items]
        return self.names


def _roots(skip):
    """The program's names, now: its running functions' locals, innermost first, then its modules'
    globals, __main__ first, then the frames the last exception's traceback keeps."""
    roots, frames = [], []
    f = sys._getframe(1)
    while f is not None:
        frames.append(f)
        f = f.f_back
    # A frame's key: its code and its depth from the outermost frame, which stay while it runs.
    for depth, f in reversed(list(enumerate(reversed(frames)))):
        code = f.f_code
        # CO_NEWLOCALS: a function, not a module; gpudoc's own (the notebook extension's) are not roots.
        if code.co_flags & 0x2 and is_user(code.co_filename) and not _gpudocs(f):
            root = _frame_root(f, ("f", id(code), depth), "")
            if root is not None:
                roots.append(root)
    del frames, f
    shell, ns = _notebook()[:2]
    mods = sorted(_user_modules().values(), key=lambda m: m[2] != "__main__")
    for d, label, _ in mods:
        if id(d) not in skip:
            if d is ns:
                roots.append(_Root("m", ("m", id(d)), "%s's variables" % _shell_name(), obj=d, shell=True))
            else:
                roots.append(_Root("m", ("m", id(d)), "%s, module globals" % label, obj=d))
    return roots + traceback_roots()


def _gpudocs(f):
    name = f.f_globals.get("__name__")
    return type(name) is str and (name == "gpudoc" or name.startswith("gpudoc."))


def _frame_root(f, key, suffix):
    """A root for the locals of frame `f` (None when there are none, or they cannot be read)."""
    code = f.f_code
    pairs = LOCALS.read(f) if LOCALS.read is not None else []
    if not pairs:
        return None
    where = "%s, in %s%s" % (file_label(code.co_filename), code.co_name, suffix)
    root = _Root(key[0], key, where, names=[k for k, _ in pairs], values=[v for _, v in pairs])
    root.function = code.co_name if is_user(code.co_filename) else None
    return root


# Frames of a traceback searched at most.
MAX_TB_FRAMES = 64


def traceback_frames():
    """The frames of the last exception's traceback, outermost first: an interactive session (IPython,
    python -i, pdb) keeps it in sys.last_traceback, and with it every local of the functions it went
    through, until the next exception."""
    tb = getattr(sys, "last_traceback", None)
    out = []
    while tb is not None and len(out) < MAX_TB_FRAMES:
        out.append(tb.tb_frame)
        tb = tb.tb_next
    return out


def traceback_roots():
    """Roots for the locals of the last traceback's functions, from the program's own first frame inward
    (the frames before it are the interpreter's or IPython's, which ran the program's code)."""
    roots, inside = [], False
    for f in traceback_frames():
        inside = inside or is_user(f.f_code.co_filename)
        if inside and f.f_code.co_flags & 0x2:
            root = _frame_root(f, ("t", id(f)), ", the last exception's traceback")
            if root is not None:
                roots.append(root)
    return roots


def _notebook():
    """(IPython's shell, its namespace, its cells' file names -> cell numbers) in this process, or Nones
    (read from IPython's class: nothing is imported, none of the program's code runs)."""
    mod = sys.modules.get("IPython.core.interactiveshell")
    cls = getattr(mod, "InteractiveShell", None)
    try:
        shell = cls._instance if cls is not None else None
        if shell is None:
            return None, None, None
        d = object.__getattribute__(shell, "__dict__")
        ns = d.get("_user_ns", d.get("user_ns"))  # IPython 9 keeps it as _user_ns
        files = getattr(d.get("compile"), "_filename_map", None)
        return shell, ns if type(ns) is dict else None, files if type(files) is dict else None
    except Exception:
        return None, None, None


def _shell_name():
    return "the notebook" if "ipykernel" in sys.modules else "IPython"


def file_label(filename):
    """A file as a user knows it: `cell 12` for a notebook cell's code, else its name."""
    files = _notebook()[2]
    n = files.get(filename) if files else None
    return "cell %d" % n if type(n) is int and n > 0 else os.path.basename(filename)


def output_name(name):
    """IPython's name for an entry of its output cache (`Out[7]` for _7, `_` for _, __ and ___, `Out` for
    Out and _oh), or None for any other name."""
    if type(name) is not str or not name.startswith("_") and name != "Out":
        return None
    if name in ("_", "__", "___"):
        return name
    if name in ("Out", "_oh"):
        return "Out"
    digits = name[1:]
    return "Out[%s]" % digits if digits.isdigit() else None


def _kind_of(root, name):
    if root.kind == "t":
        return "traceback"
    if root.kind == "f":
        return "local"
    return "output" if root.shell and output_name(name) is not None else "global"


class _Stops(object):
    """What a search does not go into: modules and their globals (a module of the program's is a root of
    its own), classes not of the program's modules, code, gpudoc's own frames and objects."""

    def __init__(self, skip):
        self.skip = skip
        self.module_dicts, users = _scan_modules()
        self.user_modules = set(_user_modules(users))

    def here(self, o, t):
        i = id(o)
        if i in self.skip or i in self.module_dicts or t is types.CodeType:
            return True
        if issubclass(t, types.ModuleType):
            return True
        if t is types.FrameType:
            return not is_user(o.f_code.co_filename)
        if issubclass(t, type):
            d = type.__dict__["__dict__"].__get__(o)
            mod = sys.modules.get(d.get("__module__")) if type(d.get("__module__")) is str else None
            try:
                return mod is None or id(object.__getattribute__(mod, "__dict__")) not in self.user_modules
            except Exception:
                return True
        return False


# Py_TPFLAGS_*_SUBCLASS: the built-in a class derives from, read from its flags without running its code.
_SUBCLASS_FLAGS = ((1 << 29, dict), (1 << 25, list), (1 << 26, tuple))


def _base(t):
    """The built-in container `t` is or derives from (a defaultdict, OrderedDict or Counter is a dict, a
    namedtuple a tuple), else None. Its contents are read through the built-in's own methods, never the
    subclass's code, and a large one is walked in slices as the built-in's are: gc.get_referents of a
    dict subclass lists its millions of entries in one call (a pause in proportion to the heap)."""
    if t in _CONTAINERS:
        return t
    flags = t.__flags__
    for flag, base in _SUBCLASS_FLAGS:
        if flags & flag:
            return base
    if issubclass(t, (set, frozenset, collections.deque)):
        return next(b for b in (set, frozenset, collections.deque) if issubclass(t, b))
    return None


def _open(o):
    """A container's entry on the search's stack: [object, how its contents are read, position, aux]."""
    t = type(o)
    if t is _Root:
        return [o, "root", 0, None]
    base = _base(t)
    if base is list or base is tuple:
        # aux: the built-in whose methods read a subclass's items (None: the built-in itself).
        return [o, "seq", 0, None if base is t else base]
    if base is dict:
        values = iter(dict.values(o))
        own = _instance_dict(o) if base is not t else None
        # A subclass's own attributes after its entries (what get_referents would have listed too).
        return [o, "iter", 0, itertools.chain(values, (own,)) if own else values]
    if base is not None:
        return [o, "iter", 0, base.__iter__(o)]
    return [o, "refs", 0, gc.get_referents(o)]


def _next(entry):
    o, mode, pos, aux = entry
    entry[2] = pos + 1
    try:
        if mode == "seq":
            if aux is not None:
                return aux.__getitem__(o, pos) if pos < aux.__len__(o) else _END
            return o[pos] if pos < len(o) else _END
        if mode == "iter":
            return next(aux, _END)
        if mode == "refs":
            return aux[pos] if pos < len(aux) else _END
        return _root_child(o, pos)
    except (RuntimeError, IndexError):
        return _END  # changed while iterated (another thread): the rest of it is passed over


def _root_child(root, pos):
    root.labels()
    return root.values[pos] if pos < len(root.values) else _END


def _find(names, name):
    """The position of `name` among names (compared as strings only: no code of the program's runs)."""
    for i, n in enumerate(names):
        if n is name or (type(n) is str and type(name) is str and n == name):
            return i
    return -1


def _skip(entry, pos):
    """Moves an entry to `pos`, as if that many children were read."""
    if entry[1] == "iter":
        # Consumed in C (itertools' "consume"): a resumed slice of a large dict skips fast.
        next(itertools.islice(entry[3], pos, pos), None)
    entry[2] = pos


def _nth(entry, pos):
    """The child at `pos` of an entry, read anew."""
    if pos < 0:
        return None
    fresh = _open(entry[0])
    _skip(fresh, pos)
    child = _next(fresh)
    return None if child is _END else child


def _block_of(ranges, ptr):
    """The index of the range holding `ptr` (any range: 0, when `ranges` is None), else None."""
    if ranges is None:
        return 0
    lo, hi = 0, len(ranges)
    while lo < hi:
        mid = (lo + hi) // 2
        if ranges[mid][0] <= ptr:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1 if lo > 0 and ptr < ranges[lo - 1][0] + ranges[lo - 1][1] else None


def _holder(stack, t):
    """(key, kind, text, items) for what refers to `t` at the top of `stack`."""
    top = stack[-1][0]
    tt = type(top)
    if tt is _Root:
        k = _name_at(top, stack[-1][2] - 1)
        kind = _kind_of(top, k)
        if kind == "output":
            text = "%s (%s's output cache)" % (output_name(k), _shell_name())
            return (kind, top.key, k), kind, text, None
        word = "global" if kind == "global" else "local"
        return (kind, top.key, k), kind, "%s `%s` (%s)" % (word, k, top.where), None
    lru = _lru_name(stack, len(stack) - 1)
    if lru:
        return ("obj", id(top)), "cache", lru, len(top) if tt in _CONTAINERS else None
    if tt is dict and len(stack) > 2 and _owner_of(stack[-2][0], top):
        owner = stack[-2][0]
        return _attribute(owner, top, t)
    if tt in _CONTAINERS:
        name = _describe(stack, len(stack) - 1)
        kind = tt.__name__
        text = "%s %s" % (kind, name) if name else "a %s that gpudoc could not name" % kind
        return ("obj", id(top)), "container", text, len(top)
    if tt is _CELL:
        return ("obj", id(top)), "closure", _cell_name(stack, len(stack) - 1) or "a closure's variable", None
    d = _instance_dict(top)
    if d is not None:
        return _attribute(top, d, t)
    return ("obj", id(top)), "container", "a `%s` object" % tt.__name__, None


def _attribute(owner, d, t):
    k = _key_of(d, t) or "?"
    return ("attr", id(owner), k), "attr", "attribute `%s` of a `%s`" % (k, type(owner).__name__), None


def _owner_of(o, d):
    """`d` is the attribute dict of `o`, an instance (read without running its code), or cannot be read
    as one but was reached from it."""
    if type(o) in _CONTAINERS or type(o) is _Root or type(o) is _CELL:
        return False
    own = _instance_dict(o)
    return own is d or own is None


def _name_at(root, pos):
    names = root.labels()
    name = names[pos] if 0 <= pos < len(names) else "?"
    return name if type(name) is str else "?"


def _describe(stack, i, depth=0):
    """A name for stack[i]'s object, from how it was reached: a global or a local, an attribute, a
    closure variable, an lru_cache; else what it is inside of."""
    if i < 1 or depth > 3:
        return None
    parent = stack[i - 1][0]
    pt = type(parent)
    o = stack[i][0]
    if pt is _Root:
        return "`%s` (%s)" % (_name_at(parent, stack[i - 1][2] - 1), parent.where)
    if pt is _CELL:
        return _cell_name(stack, i - 1)
    if pt is dict and i >= 2 and _owner_of(stack[i - 2][0], parent):
        return _attribute(stack[i - 2][0], parent, o)[2]
    if pt not in _CONTAINERS:
        d = _instance_dict(parent)
        k = _key_of(d, o) if d is not None else None
        if k:
            return "attribute `%s` of a `%s`" % (k, pt.__name__)
        lru = _lru_name(stack, i - 1)
        if lru:
            return "in %s" % lru
    if pt is dict:
        k = _key_of(parent, o)
        inner = _describe(stack, i - 1, depth + 1)
        if k is not None and inner:
            return "`%s` of dict %s" % (k, inner)
    inner = _describe(stack, i - 1, depth + 1)
    return "inside %s %s" % (pt.__name__, inner) if inner else None


def _cell_name(stack, i):
    """The closure variable stack[i] (a cell) is: its function and tuple are above it."""
    if i < 2:
        return None
    cells, fn = stack[i - 1][0], stack[i - 2][0]
    if type(cells) is not tuple or type(fn) is not types.FunctionType:
        return None
    try:
        names = fn.__code__.co_freevars
        k = [j for j, c in enumerate(cells) if c is stack[i][0]][0]
        return "`%s`, a closure variable of `%s`" % (names[k], fn.__name__)
    except Exception:
        return None


def _lru_name(stack, i):
    """stack[i] is an lru_cache or what it keeps its results in: the cache of which function."""
    for j in range(i, max(0, i - 3), -1):
        o = stack[j][0]
        if type(o).__name__ == "_lru_cache_wrapper":
            try:
                d = object.__getattribute__(o, "__dict__")
                name = d.get("__qualname__") or d.get("__name__") or "?"
            except Exception:
                name = "?"
            parent = stack[j - 1][0] if j >= 1 else None
            where = " (%s)" % parent.where if type(parent) is _Root else ""
            return "the lru_cache of `%s`%s" % (name, where)
    return None


# A closure cell's type (types.CellType from Python 3.8 on; the shim loads on older Pythons too). A closure
# of one free variable has one cell; typeshed's __closure__ may be None.
_CELL = type((lambda x: lambda: x)(0).__closure__[0])  # type: ignore[index]


def _graph_size(t):
    """Nodes in the autograd graph behind `t`, up to MAX_NODES. The nodes are kept while counting: an
    id is an object's only while it lives, and torch makes a node's Python object anew once the last one
    is gone."""
    seen, todo = {}, [t.grad_fn]
    while todo and len(seen) < MAX_NODES:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        for nxt, _ in getattr(fn, "next_functions", ()):
            todo.append(nxt)
    return len(seen)


class Locals(object):
    """The values of a running function's local variables, read without frame.f_locals: before Python
    3.13 that copies them into a dict the frame keeps until the function returns (a tensor the program
    dropped stays alive), and clearing that dict would delete the function's variables under a tracer.
    3.13 and later: PEP 667's proxy, which copies nothing. Before: the frame's own slots, read in place
    (ctypes), where they are is found on a frame of this module's with known values; when that cannot
    be checked, no locals are read at all."""

    def __init__(self):
        self.read = None
        if sys.version_info >= (3, 13):
            self.read = self._proxy
            return
        try:
            self._calibrate()
            self.read = self._slots
        except Exception:
            self.read = None

    @staticmethod
    def _proxy(frame):
        return list(frame.f_locals.items())

    def _calibrate(self):
        import ctypes

        self.ct = ctypes
        self.word = ctypes.sizeof(ctypes.c_void_p)
        a, b, c = object(), object(), object()

        def probe(x, y):
            z = c

            def inner():
                return y

            return self._find_layout(sys._getframe(), {"x": id(x), "z": id(z), "inner": id(inner)},
                                     id(inner.__closure__[0]))

        if not probe(a, b):
            raise RuntimeError("frame layout not recognised")

    def _find_layout(self, frame, want, cell):
        """Finds where `frame`'s slots are: for each candidate, every named slot must hold the object
        expected (only addresses are compared: nothing read is used until the layout is known)."""
        ct, word = self.ct, self.word
        names, _ = self._names(frame.f_code)
        if ct.c_void_p.from_address(id(frame) + word).value != id(type(frame)):
            return False
        if sys.version_info < (3, 11):
            self.indirect, candidates = False, [type(frame).__basicsize__ - word]
        else:
            self.indirect = True
            self.fptr = 3 * word  # ob_refcnt, ob_type, f_back, then f_frame
            base = ct.c_void_p.from_address(id(frame) + self.fptr).value
            if not base:
                return False
            # Within the frame's own memory: its fixed part, then its slots and value stack.
            candidates = [k * word for k in range(min(16, 9 + frame.f_code.co_stacksize))]
        for off in candidates:
            self.offset = off
            slots = self._addresses(frame, len(names))
            got = dict(zip(names, slots))
            if all(got.get(k) == v for k, v in want.items()) and cell in slots:
                return True
        return False

    def _names(self, code):
        """The slots' names, in order, and the names whose slot holds a cell."""
        cells = set(code.co_cellvars) | set(code.co_freevars)
        if sys.version_info < (3, 11):
            return list(code.co_varnames) + list(code.co_cellvars) + list(code.co_freevars), cells
        local = set(code.co_varnames)
        return (list(code.co_varnames) + [n for n in code.co_cellvars if n not in local]
                + list(code.co_freevars)), cells

    def _addresses(self, frame, n):
        ct = self.ct
        base = id(frame)
        if self.indirect:
            base = ct.c_void_p.from_address(base + self.fptr).value
        return list((ct.c_void_p * n).from_address(base + self.offset))

    def _slots(self, frame):
        names, cells = self._names(frame.f_code)
        out = []
        for name, p in zip(names, self._addresses(frame, len(names))):
            if not p:
                continue
            v = self.ct.cast(p, self.ct.py_object).value
            if name in cells and type(v) is _CELL:
                try:
                    v = v.cell_contents
                except ValueError:
                    continue
            out.append((name, v))
        return out


class _Lazy(object):
    """The reader, made at the first search (ctypes is imported only then)."""

    def __getattr__(self, name):
        global LOCALS
        LOCALS = Locals()
        return getattr(LOCALS, name)


LOCALS = _Lazy()
# Containers looked into: builtin types only, so that no code of the program's runs.
_CONTAINERS = (list, tuple, set, frozenset, dict, collections.deque)


# The last scan of sys.modules, kept while its length stays (an import adds to it; a search reads it at
# every slice, and a scan of a program with torch's ~1,300 modules takes milliseconds): the length, the ids
# of every module's dict, the names of the program's own modules. Ids and names only: nothing is held.
_SCAN = [-1, frozenset(), ()]


def _scan_modules():
    """(ids of every module's dict, names of __main__ and the program's own modules), as of now."""
    n = len(sys.modules)
    if _SCAN[0] != n:
        dicts, users = set(), []
        for name, m in list(sys.modules.items()):
            try:
                d = object.__getattribute__(m, "__dict__")
            except Exception:
                continue
            dicts.add(id(d))
            if not issubclass(type(m), types.ModuleType):
                continue
            f = d.get("__file__")
            if name == "__main__" or (type(f) is str and is_user(f)):
                users.append(name)
        _SCAN[:] = [n, frozenset(dicts), tuple(users)]
    return _SCAN[1], _SCAN[2]


def _user_modules(names=None):
    """id(module dict) -> (its dict, file name, module name) for __main__ and the program's own modules
    (`names`: as _scan_modules gave them)."""
    mods = {}
    for name in _scan_modules()[1] if names is None else names:
        m = sys.modules.get(name)
        if m is None or not issubclass(type(m), types.ModuleType):
            continue
        try:
            d = object.__getattribute__(m, "__dict__")
        except Exception:
            continue
        f = d.get("__file__")
        if name == "__main__" and f is None and sys.argv and str(sys.argv[0]).endswith(".py"):
            f = str(sys.argv[0])  # Python takes a script's __file__ off __main__ once it has run (exit)
        mods[id(d)] = (d, os.path.basename(f) if type(f) is str else name, name)
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
            m["graphs"] += g.get("graphs", 0)
            if m["items"] is not None and g["items"] is not None:
                m["items"] += g["items"]
    out = sorted(merged.values(), key=lambda g: (-g["bytes"], g["text"].startswith("a ")))
    big = [g for g in out if g["bytes"] * 10 >= out[0]["bytes"]] if out else out
    # The first holder of tensors with autograd graphs stays, however small its own tensors (a list of
    # scalar losses): the graphs behind them are told after it (_behind), and may be most of the memory.
    carrying = [g for g in out if g.get("graphs") and g not in big][:1]
    out = big[:TOP - len(carrying)] + carrying
    for g in out:
        if g["items"] is not None:
            g["text"] += ", %d items" % g["items"]
        if g["count"] > 1:
            g["text"] += " (in %d of them)" % g["count"]
        del g["count"]
    return out


class Hunt(object):
    """One window of recording on the devices in use."""

    def __init__(self, torch, why, step, devices, allocated, unit="steps"):
        self.torch = torch
        self.why = why
        # What the window counts: optimizer steps, or forward calls of the outermost module (the shim's
        # clock where there are no steps, which the shim keeps in `clock`).
        self.unit = unit
        self.clock = None
        self.from_step = step
        self.devices = list(devices)
        self.allocated = dict(allocated)
        self.t0 = time.time()
        _prepare(torch)
        torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=MAX_ENTRIES)

    def due(self, step):
        return step - self.from_step >= WINDOW_STEPS or time.time() - self.t0 >= WINDOW_S

    def end(self, step, allocated, skip):
        """Reads the snapshot, stops recording, and returns the snapshot and, per device, its result and
        the Search that will find the holders (None when no site leaks)."""
        torch = self.torch
        t1 = time.time()
        try:
            snap = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        steps = max(1, step - self.from_step)
        out = []
        for d in self.devices:
            found_sites, ranges, truncated = sites(snap, d, steps)
            result = {
                "k": "hunt", "why": self.why, "dev": d, "t": time.time(), "from_step": self.from_step,
                "to_step": step, "steps": steps, "clock": self.unit,
                "growth_bytes": allocated.get(d, 0) - self.allocated.get(d, 0),
                "sites": found_sites, "holders": [], "truncated": truncated,
                "record_s": round(t1 - self.t0, 3), "analysis_s": round(time.time() - t1, 3),
            }
            search = Search(torch, d, ranges, skip, steps) if ranges else None
            out.append((result, search, sum(s["bytes"] for s in found_sites)))
        return snap, out


def at_oom(torch, device, hunt, skip, allocated=None):
    """What filled `device` at an out-of-memory failure: the sites of the blocks a hunt in progress
    recorded, now, and the Search for the holders of all its Python tensors (`allocated`: the device's
    live tensors then, to tell what the graphs behind held tensors keep)."""
    _prepare(torch)
    t0 = time.time()
    found_sites = []
    if hunt is not None:
        try:
            found_sites = sites(torch.cuda.memory._snapshot(), device, 1, leaks_only=False)[0]
        except Exception:
            found_sites = []
    result = {"k": "hunt", "why": "oom", "dev": device, "t": t0, "from_step": 0, "to_step": 0,
              "steps": 0, "growth_bytes": 0, "sites": found_sites, "holders": [], "truncated": False,
              "record_s": 0.0, "analysis_s": round(time.time() - t0, 3)}
    search = Search(torch, device, None, skip)
    search.allocated = allocated
    return result, search


def finish(result, search, leaked=None):
    """A result with what its search found (all of it, or what it found in the time it was given)."""
    if search is not None:
        result["holders"] = search.holders(leaked)
        result["analysis_s"] = round(result["analysis_s"] + search.spent, 3)
        if result["why"] == "oom":
            result["tensor_bytes"] = sum(search.bytes.values())
            result["tensors"] = len(search.bytes)
    result["t"] = time.time()
    return result


def _prepare(torch):
    global _prefixes
    if _prefixes is None:
        _prefixes = _not_user_prefixes(torch)
