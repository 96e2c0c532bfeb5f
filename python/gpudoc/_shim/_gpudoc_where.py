"""Where the memory went inside the model, loaded by the shim at the first out-of-memory failure or at the
first step it measures (a job that never fails and runs no measured step never loads it).

- At an out-of-memory failure (PyTorch's OOM observer, on the thread that allocates, before the error
  unwinds): the pass and the module it happened in. Backward: the autograd node running on that thread
  (torch._C._current_autograd_node) and the module of the parameters nearest below it in the graph.
  Forward: the innermost module whose forward is on the Python stack (its `self`). The optimizer: an
  Optimizer's method on the stack. And what the device's allocated memory was: the program's parameters
  and buffers, gradients, optimizer state, activations saved for backward (the saved tensors of the
  autograd graph), and the rest (temporaries, inputs, outputs).
- On one measured step (Measure, after warm-up): for each module of the table (its depth chosen so the
  table is short), the memory its forward added and the peak inside its backward, read from the
  allocator at the module's forward calls (global forward hooks, for that step only) and at the start of
  its backward (a pre-hook on the autograd node of its output); and the same breakdown at the step's peak.
- A snapshot of the allocator (torch.cuda.memory._snapshot, the pickle pytorch.org/memory_viz opens),
  written beside gpudoc's pipe when gpudoc was asked for one.

It may look, never hold: the program's objects are reached from its names (the hunt's readers: locals
read in place, its modules' globals), and nothing is kept past the call (a Measure keeps module ids and
numbers; the hooks it registers go at the step's end). Everything runs inside try/except in the shim.
"""
import os
import sys
import time

# Autograd nodes walked at most for saved tensors, and for the parameters nearest a node.
MAX_NODES = 20000
NEAR_NODES = 400
# Time the walk for saved tensors may take (at an OOM, and at a measured step's backward start).
WALK_S = 0.2
# The table's rows: the shallowest depth with at least MIN_ROWS modules, with at most MAX_ROWS.
MIN_ROWS = 4
MAX_ROWS = 48
# The parts of allocated memory, in the order they are counted (a storage is counted once, in the first).
PARTS = ("parameters", "gradients", "optimizer_state", "activations")
_CO_NEWLOCALS = 0x2
# Looking for the program's models and optimizers among its names: at most this many names of one
# module's globals and attributes of one object (an object with millions of attributes is data, not a
# trainer: reading them all took 11 s at 6 million), and at most LOOK_S in all.
MAX_NAMES = 20000
MAX_ATTRS = 1000
LOOK_S = 0.05
_saved_names = {}


def _storage(t):
    """(address, bytes) of a tensor's storage: the hunt's reader (loaded with this module, always)."""
    return sys.modules["gpudoc._shim.hunt"]._storage(t)


class Parts(object):
    """Bytes per part on one device, each storage counted once (in the first part it is counted in)."""

    def __init__(self, torch, device):
        self.tensor, self.device = torch.Tensor, device
        # storage address -> (part, bytes)
        self.seen = {}
        self.bytes = dict((p, 0) for p in PARTS)

    def add(self, part, t):
        """Counts `t`'s storage in `part`; the bytes newly counted."""
        if not issubclass(type(t), self.tensor):
            return 0
        try:
            if not t.is_cuda or t.device.index != self.device:
                return 0
            ptr, n = _storage(t)
        except Exception:
            return 0
        if ptr in self.seen:
            return 0
        self.seen[ptr] = (part, n)
        self.bytes[part] += n
        return n

    def known(self, other, part):
        """`other`'s storages are known as `part` here, without counting them: what the graph saved of
        them is not counted again."""
        for ptr, (_, n) in other.seen.items():
            self.seen.setdefault(ptr, (part, n))

    def take(self, other, part):
        """`other`'s storages of `part` that this one has not counted yet."""
        for ptr, (p, n) in other.seen.items():
            if p == part and ptr not in self.seen:
                self.seen[ptr] = (p, n)
                self.bytes[p] += n

    def result(self, allocated):
        out = dict(self.bytes)
        out["other"] = max(0, allocated - sum(self.bytes.values()))
        return out


class Program(object):
    """The program's models and optimizers, found from its names now: the locals of its own running
    functions (every thread's), its modules' globals, and one level into the objects those name (a
    trainer's `model`). Roots are models no other one found holds as a submodule."""

    def __init__(self, torch, hunt, extra_optimizer=None):
        hunt._prepare(torch)
        Module = torch.nn.Module
        Optimizer = torch.optim.Optimizer
        found, optimizers = [], []
        seen = set()
        deadline = time.perf_counter() + LOOK_S

        def look(name, v, deep):
            if id(v) in seen:
                return
            seen.add(id(v))
            if issubclass(type(v), Module):
                found.append((name, v))
            elif issubclass(type(v), Optimizer):
                optimizers.append(v)
            elif deep:
                d = hunt._instance_dict(v) if type(v).__module__ not in ("builtins", "torch") else None
                if d is not None:
                    for k, x in _first(d, MAX_ATTRS):
                        if type(k) is str:
                            look(name + "." + k, x, False)

        for _, pairs in _names(hunt):
            for i, (k, v) in enumerate(pairs):
                look(k, v, True)
                if (i & 63) == 63 and time.perf_counter() > deadline:
                    break
            if time.perf_counter() > deadline:
                break
        if extra_optimizer is not None and id(extra_optimizer) not in seen:
            optimizers.append(extra_optimizer)
        inside = set()
        for _, m in found:
            inside.update(id(s) for s in m.modules() if s is not m)
        self.roots = [(n, m) for n, m in found if id(m) not in inside]
        self.optimizers = optimizers

    def names(self):
        """id(module) -> its path from its root ("model.layers.3.mlp")."""
        out = {}
        for rname, root in self.roots:
            for path, m in root.named_modules():
                out.setdefault(id(m), rname + ("." + path if path else ""))
        return out

    def parameter_modules(self):
        """id(parameter) -> the path of the module it belongs to."""
        out = {}
        for rname, root in self.roots:
            for path, p in root.named_parameters():
                out.setdefault(id(p), rname + ("." + path.rpartition(".")[0] if "." in path else ""))
        return out

    def count_weights(self, parts):
        """The parameters and buffers (storages that live as long as the model: a gradient's address may
        be an activation's a moment later)."""
        for _, root in self.roots:
            for p in root.parameters():
                parts.add("parameters", p)
            for b in root.buffers():
                parts.add("parameters", b)

    def count(self, parts):
        self.count_weights(parts)
        for _, root in self.roots:
            for p in root.parameters():
                if p.grad is not None:
                    parts.add("gradients", p.grad)
        for opt in self.optimizers:
            for st in list(opt.state.values()):
                if type(st) is dict:
                    for v in list(st.values()):
                        parts.add("optimizer_state", v)


def _names(hunt):
    """(where, [(name, value)]) for the program's running functions, innermost first, then its modules'
    globals, __main__ first."""
    for f in list(sys._current_frames().values()):
        while f is not None:
            code = f.f_code
            if code.co_flags & _CO_NEWLOCALS and hunt.is_user(code.co_filename):
                pairs = hunt.LOCALS.read(f) if hunt.LOCALS.read is not None else []
                yield code.co_name, pairs
            f = f.f_back
    mods = sorted(hunt._user_modules().values(), key=lambda m: m[2] != "__main__")
    for d, label, _ in mods:
        yield label, [(k, v) for k, v in _first(d, MAX_NAMES) if type(k) is str and not k.startswith("__")]


def _first(d, n):
    """The first `n` items of the dict `d` (its own method: none of the program's code runs), without
    copying the rest; none when another thread changes it meanwhile."""
    import itertools

    try:
        return list(itertools.islice(dict.items(d), n))
    except RuntimeError:
        return []


def _self_of(frame, hunt):
    code = frame.f_code
    if not code.co_argcount or code.co_varnames[0] != "self" or hunt.LOCALS.read is None:
        return None
    for k, v in hunt.LOCALS.read(frame):
        if k == "self":
            return v
    return None


def _saved(node):
    """(tensors, hooked, unread): what an autograd node saved for backward, read without unpacking it.
    Unpacking (`_saved_*`, a Function's `saved_tensors`) runs the program's saved-tensor unpack hooks:
    non-reentrant checkpointing would recompute its blocks there and fail at backward ("Unpack is being
    triggered for a tensor that was already unpacked once"), save_on_cpu would copy each tensor back to
    the GPU. The raw saved tensors (`_raw_saved_*`, torch's SavedTensor) give the tensor itself where no
    hook packed it (`data`), and where one did, what the pack hook returned (`unpack_hook` set; nothing
    of the program's runs): the tensors that object is, or holds one level down, are what the node keeps
    (save_on_cpu's copy on the host, nothing for checkpointing). `hooked`: the saved tensors packed by
    hooks; `unread`: those of a torch whose SavedTensor has no `data` (never unpacked: not counted)."""
    t = type(node)
    names = _saved_names.get(t)
    if names is None:
        names = [a for a in dir(node) if a.startswith("_raw_saved_")]
        _saved_names[t] = names
    out, hooked, unread = [], 0, 0
    for a in names:
        try:
            v = getattr(node, a)
        except Exception:
            continue  # released after its backward ran
        for raw in (v if type(v) in (tuple, list) else (v,)):
            try:
                data = raw.data
                hook = raw.unpack_hook
            except AttributeError:
                unread += 1
                continue
            except Exception:
                continue  # released, or hooks torch cannot say anything of
            if hook is None:
                out.append(data)
                continue
            hooked += 1
            out.extend(data if type(data) in (tuple, list) else (data,))
    return out, hooked, unread


class Graph(object):
    """The autograd graph below `starts` (nodes), walked once before `deadline`: its nodes with their
    sequence numbers (the order the forward made them in, per thread), and each module's span, the first
    and last sequence numbers of the nodes that take its parameters (its submodules' included). The nodes
    are held while it lives: torch makes a node's Python object anew once the last one is gone, so an id
    seen before may be a new node's (on the H200 a walk that kept only ids stopped after a few nodes)."""

    def __init__(self, starts, params, deadline):
        self.nodes, self.spans, self.deadline = [], {}, deadline
        # Saved tensors packed by the program's hooks, and those not read at all (see _saved).
        self.hooked = self.unread = 0
        # The gradients the parameters had when walked: storage address -> bytes.
        self.grads = {}
        seen, stack, prefixes = {}, [n for n in starts if n is not None], {}
        while stack and len(seen) < MAX_NODES:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            seq = _seq(node)
            self.nodes.append((node, seq))
            for nxt in _next(node):
                var = getattr(nxt, "variable", None)  # an AccumulateGrad's parameter
                path = params.get(id(var)) if var is not None else None
                if path is not None and var.grad is not None:
                    try:
                        ptr, n = _storage(var.grad)
                        self.grads[ptr] = n
                    except Exception:
                        pass
                if path is not None and seq is not None:
                    if path not in prefixes:
                        parts = path.split(".")
                        prefixes[path] = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
                    for m in prefixes[path]:
                        lo, hi = self.spans.get(m, (seq, seq))
                        self.spans[m] = (min(lo, seq), max(hi, seq))
                stack.append(nxt)
            if (len(seen) & 127) == 0 and time.perf_counter() > deadline:
                break

    def enclosing(self, seq):
        """The module a node made at `seq` belongs to: the narrowest span holding it (the deepest module of
        equal ones); None outside every span (the loss, code between modules)."""
        best = None
        for path, (lo, hi) in self.spans.items():
            if lo <= seq <= hi:
                key = (hi - lo, -path.count("."))
                if best is None or key < best[0]:
                    best = (key, path)
        return best[1] if best is not None else None

    def owners(self, names):
        """seq -> the one of `names` (the table's modules) whose span holds it most narrowly, or None: a
        lookup by bisection over the points where spans begin and end."""
        import bisect

        spans = [(self.spans[n], n) for n in names if n in self.spans]
        points = sorted(set([lo for (lo, _), _ in spans] + [hi + 1 for (_, hi), _ in spans]))
        owner = []
        for p in points:
            held = [(hi - lo, n) for (lo, hi), n in spans if lo <= p <= hi]
            owner.append(min(held)[1] if held else None)

        def of(seq):
            i = bisect.bisect_right(points, seq) - 1
            return owner[i] if i >= 0 else None

        return of

    def saved(self, parts, owner=None):
        """Counts as activations the tensors its nodes saved for backward (a node backward has run has
        released its own); with `owner` (seq -> name), the bytes of each name's nodes too."""
        per = {}
        for i, (node, seq) in enumerate(self.nodes):
            name = owner(seq) if owner is not None and seq is not None else None
            tensors, hooked, unread = _saved(node)
            self.hooked += hooked
            self.unread += unread
            for t in tensors:
                n = parts.add("activations", t)
                if n and name is not None:
                    per[name] = per.get(name, 0) + n
            if (i & 127) == 127 and time.perf_counter() > self.deadline:
                break
        return per


def _saved_note(out, hooked, unread):
    """The record says how many saved tensors the program's hooks had packed (counted as what the hook
    kept) and how many were not read at all (see _saved)."""
    if hooked:
        out["saved_hooked"] = hooked
    if unread:
        out["saved_unread"] = unread


def _seq(node):
    """The node's sequence number; None for an AccumulateGrad (UINT64_MAX: no operation of the forward) and
    where torch has none."""
    try:
        n = node._sequence_nr()
    except Exception:
        return None
    return n if type(n) is int and n < 1 << 63 else None


def _next(node):
    try:
        return [nxt for nxt, _ in node.next_functions if nxt is not None]
    except Exception:
        return []


def near_module(node, params):
    """The module of the parameters nearest below `node` in the graph (their common path when several
    are as near): where the graph has no sequence numbers. Nodes held while walked (see Graph)."""
    level, seen = [node], {}
    while level and len(seen) < NEAR_NODES:
        hits = []
        below = []
        for n in level:
            if id(n) in seen:
                continue
            seen[id(n)] = n
            var = getattr(n, "variable", None)
            if var is not None and id(var) in params:
                hits.append(params[id(var)])
            below.extend(_next(n))
        if hits:
            return _common(hits)
        level = below
    return None


def _common(paths):
    parts = [p.split(".") for p in paths]
    out = []
    for items in zip(*parts):
        if any(x != items[0] for x in items):
            break
        out.append(items[0])
    return ".".join(out)


def _current_node(torch):
    """The autograd node running on this thread (torch 2.0 and later), None outside backward."""
    current = getattr(torch._C, "_current_autograd_node", None)
    try:
        return current() if current is not None else None
    except Exception:
        return None


def _node_name(node):
    try:
        return node.name()
    except Exception:
        return type(node).__name__


def _line(frames, hunt):
    """The innermost frame of the program's own code: `file:line in function`, and its source."""
    for f in frames:
        code = f.f_code
        if hunt.is_user(code.co_filename):
            return {"file": code.co_filename, "line": f.f_lineno, "function": code.co_name,
                    "code": hunt._code(code.co_filename, f.f_lineno)}
    return None


def _stack(start):
    out, f = [], start
    while f is not None:
        out.append(f)
        f = f.f_back
    return out


def _waiting_thread_frames():
    """The frames of the thread that waits in backward (the main thread's, when the OOM came on the
    autograd engine's own thread, which runs no Python)."""
    import threading

    main = sys._current_frames().get(threading.main_thread().ident)
    return _stack(main)


def at_oom(torch, hunt, device, allocated, snapshot_to=None):
    """Where the out-of-memory failure happened, and what the device's memory held then."""
    t0 = time.perf_counter()
    hunt._prepare(torch)
    out = {"k": "where", "why": "oom", "dev": device, "t": time.time(), "allocated": allocated}
    node = _current_node(torch)
    frames = _stack(sys._getframe(1))
    program = Program(torch, hunt)
    params = program.parameter_modules()
    deadline = t0 + WALK_S
    if node is not None:
        waiting = _waiting_thread_frames()
        out["pass"] = "backward"
        out["node"] = _node_name(node)
        out["line"] = _line(waiting, hunt)
        # From the roots, the graph above the running node too: the spans of the modules it sits in.
        graph = Graph([node] + _backward_roots(frames + waiting, hunt, torch), params, deadline)
        seq = _seq(node)
        if graph.spans:
            out["module"] = graph.enclosing(seq) if seq is not None else None
        else:
            out["module"] = near_module(node, params)
        del waiting
    else:
        out.update(_place(torch, hunt, frames, program))
        graph = Graph(_graphs_on(frames, hunt, torch), params, deadline)
    del node, frames
    parts = Parts(torch, device)
    program.count(parts)
    rows = choose_rows(program)
    per = graph.saved(parts, graph.owners([n for n, _ in rows]))
    _saved_note(out, graph.hooked, graph.unread)
    del graph
    out["parts"] = parts.result(allocated)
    out["rows"] = _row_params(program, rows, device, torch, per)
    if snapshot_to is not None:
        out["snapshot"] = snapshot_to()
    out["analysis_s"] = round(time.perf_counter() - t0, 4)
    return out


# The locals of torch's frames that hold the tensors a backward runs from: _engine_run_backward's
# t_outputs (torch 2.x), torch.autograd.backward's tensors and grad's outputs, Tensor.backward's self.
_ROOT_CALLS = ("_engine_run_backward", "backward", "grad")
_ROOT_LOCALS = ("t_outputs", "tensors", "outputs", "self")


def _backward_roots(frames, hunt, torch):
    """The nodes backward runs from, read from torch's own frames (innermost first) on the threads that
    wait in it. The nodes that have run stay linked below them until the graph goes, with their sequence
    numbers and parameters; only their saved tensors are released."""
    Tensor = torch.Tensor
    if hunt.LOCALS.read is None:
        return []
    for f in frames:
        code = f.f_code
        if code.co_name not in _ROOT_CALLS or hunt.is_user(code.co_filename):
            continue
        found = []
        for k, v in hunt.LOCALS.read(f):
            if k not in _ROOT_LOCALS:
                continue
            for t in (v if type(v) in (tuple, list) else (v,)):
                if issubclass(type(t), Tensor):
                    found.append(t.grad_fn)
                elif type(t).__name__ == "GradientEdge":
                    found.append(t[0])
        found = [n for n in found if n is not None]
        if found:
            return found
    return []


def _place(torch, hunt, frames, program):
    """Forward, the optimizer, or elsewhere: from the Python stack, innermost first."""
    Module, Optimizer = torch.nn.Module, torch.optim.Optimizer
    names = None
    for f in frames:
        me = _self_of(f, hunt)
        if issubclass(type(me), Optimizer):
            return {"pass": "optimizer", "module": None, "line": _line(frames, hunt),
                    "node": type(me).__name__ + "." + f.f_code.co_name}
        if issubclass(type(me), Module):
            names = names if names is not None else program.names()
            return {"pass": "forward", "module": names.get(id(me), type(me).__name__),
                    "line": _line(frames, hunt), "node": None}
    return {"pass": "other", "module": None, "line": _line(frames, hunt), "node": None}


def _graphs_on(frames, hunt, torch):
    """The autograd nodes of the tensors the running functions hold: the graph built so far in forward."""
    Tensor, out = torch.Tensor, []
    for f in frames:
        if not f.f_code.co_flags & _CO_NEWLOCALS or hunt.LOCALS.read is None:
            continue
        for _, v in hunt.LOCALS.read(f):
            for t in (v if type(v) in (tuple, list) else (v,)):
                if issubclass(type(t), Tensor) and getattr(t, "grad_fn", None) is not None:
                    out.append(t.grad_fn)
    return out


def _row_params(program, rows, device, torch, activations):
    """Per module of the table: its parameters' bytes (with their gradients and optimizer state), and the
    tensors its nodes saved for backward (`activations`: name -> bytes, from Graph.saved; absent where the
    graph gave none)."""
    if not rows:
        return []
    state = {}
    for opt in program.optimizers:
        for p, st in list(opt.state.items()):
            if type(st) is dict:
                state[id(p)] = sum(_storage(v)[1] for v in st.values() if issubclass(type(v), torch.Tensor)
                                   and v.is_cuda)
    out = []
    for name, m in rows:
        params = grads = opt = 0
        for p in m.parameters():
            if p.is_cuda and p.device.index == device:
                params += _storage(p)[1]
                if p.grad is not None:
                    grads += _storage(p.grad)[1]
                opt += state.get(id(p), 0)
        row = {"name": name, "parameters": params, "gradients": grads, "optimizer_state": opt}
        if activations:
            row["activations"] = activations.get(name, 0)
        out.append(row)
    return out


def choose_rows(program):
    """The modules of the table: the shallowest depth with at least MIN_ROWS of them (a module with no
    submodule above that depth is a row of its own: a model's head beside its blocks), containers that
    are never called (ModuleList, ModuleDict) passed through. At most MAX_ROWS."""
    Containers = _containers()
    best = None
    for depth in range(1, 8):
        rows = []
        for rname, root in program.roots:
            _rows_at(root, rname, depth, Containers, rows)
        if len(rows) > MAX_ROWS:
            break
        best = rows
        if len(rows) >= MIN_ROWS:
            break
    return best or []


def _rows_at(module, name, depth, containers, out):
    children = list(module.named_children())
    if depth == 0 or not children:
        out.append((name, module))
        return
    for cname, child in children:
        # A container is no level of its own: its items are what the model calls.
        d = depth if issubclass(type(child), containers) else depth - 1
        _rows_at(child, name + "." + cname, d, containers, out)


def _containers():
    import torch

    nn = torch.nn
    return tuple(getattr(nn, k) for k in ("ModuleList", "ModuleDict", "ParameterList") if hasattr(nn, k))


def snapshot(torch, folder, pid, n):
    """The allocator's snapshot, pickled as torch.cuda.memory._dump_snapshot writes it, beside the pipe;
    its file's name."""
    import pickle

    name = "snapshot-%d-%d.pickle" % (pid, n)
    snap = torch.cuda.memory._snapshot()
    with open(os.path.join(folder, name), "wb") as f:
        pickle.dump(snap, f)
    return name


class Measure(object):
    """One measured step or call: the table's modules' forward (and backward), and the breakdown at its
    peak. A training step (phase "training"): armed at a step hook, read at the next one (finish). A call
    of `module` (phase "evaluation" or "inference", no optimizer step in it): its next call, from its
    forward pre-hook to its forward hook, where the result is sent (`done`, with it)."""

    def __init__(self, torch, hunt, shim, optimizer, device, step, phase="training", module=None,
                 done=None):
        self.torch, self.hunt, self.shim, self.device, self.step = torch, hunt, shim, device, step
        self.phase, self.done, self.snapshot_to, self.again = phase, done, None, False
        self.t0 = time.perf_counter()
        program = Program(torch, hunt, optimizer)
        try:
            import weakref

            self.optimizer = weakref.ref(optimizer)  # never kept alive by gpudoc
        except TypeError:
            self.optimizer = lambda: None
        rows = choose_rows(program)
        self.names = dict((id(m), n) for n, m in rows)
        self.order = [n for n, _ in rows]
        self.roots = set(id(m) for _, m in program.roots)
        # id(parameter) -> its module's path (ids and names only: nothing of the program's is kept), and
        # the storages of its parameters and buffers (the weights a node saves are no activations).
        self.params = program.parameter_modules()
        self.weights = Parts(torch, device)
        program.count_weights(self.weights)
        # The call measured: its module's id, and whether it has begun.
        self.call, self.begun, self.missed = (id(module) if module is not None else None), False, 0
        self.before, self.fwd, self.bwd = {}, {}, {}
        self.current, self.marks, self.top = None, 0, 0
        self.activations, self.at_backward, self.saved = None, None, {}
        self.hooked = self.unread = 0
        # The table's modules as their backward started (ids), the one whose backward the peak came in
        # (an index there; -1: before the first, in forward or the loss), the gradients before backward.
        self.bwd_order, self.peak_at, self.grads_before = [], -1, 0
        self.handles = []
        self.cost = 0.0
        mod = sys.modules.get("torch.nn.modules.module")
        patches, why = shim._patches(), "the measured step's or call's modules (for its duration)"
        self.handles.append(patches.hook(mod.register_module_forward_pre_hook(self._pre),
                                         "torch.nn.modules.module global forward pre-hook", why))
        self.handles.append(patches.hook(mod.register_module_forward_hook(self._post),
                                         "torch.nn.modules.module global forward hook", why))

    def _now(self):
        stats = self.shim.S.orig_stats(self.device)
        return stats

    def _pre(self, module, args):
        __tracebackhide__ = True
        c = self.shim._compiling
        if c is not None and c():
            return
        try:
            self._before(id(module))
        except Exception as e:
            self.shim._where_failed(e)  # never the program's call that raises it

    def _before(self, i):
        if self.call is not None and not self.begun:
            if i != self.call:
                # An evaluation that calls a method of the model (`model.embed(x)`) never calls the
                # module armed: after MAX_MISSED other calls the hooks go (every module's call takes
                # torch's hook path while they are there).
                self.missed += 1
                if self.missed > MAX_MISSED:
                    self.done(None)
                return
            t0 = time.perf_counter()
            self.begun = True
            # The call's own peak from here (the program's view and the next record keep the one before).
            self._restart(self._now())
            self.cost += time.perf_counter() - t0
        if i in self.names:
            t0 = time.perf_counter()
            self.before[i] = self.shim._cur(self._now(), "allocated_bytes")
            self.cost += time.perf_counter() - t0

    def _post(self, module, args, output):
        __tracebackhide__ = True
        c = self.shim._compiling
        if c is not None and c():
            return
        try:
            self._after(id(module), output)
        except Exception as e:
            self.shim._where_failed(e)  # never the program's call that raises it

    def _after(self, i, output):
        if self.call is not None and not self.begun:
            return
        row, root = i in self.names and i in self.before, i in self.roots and self.call is None
        if not (row or root or i == self.call):
            return
        t0 = time.perf_counter()
        try:
            if row:
                now = self.shim._cur(self._now(), "allocated_bytes")
                self.fwd[i] = self.fwd.get(i, 0) + now - self.before.pop(i)
            node = _grad_fn(output, self.torch)
            if i == self.call:
                self.cost += time.perf_counter() - t0
                t0 = time.perf_counter()
                with self.shim.OURS:
                    out = self.end_call(node)
                self.done(out)
            elif node is not None and hasattr(node, "register_prehook"):
                # Through the registry as every hook of the shim's: listed, and gone with the measure's
                # global hooks (a graph kept for a later backward runs none of gpudoc's code then).
                self.handles.append(self.shim._patches().hook(
                    node.register_prehook(_marker(self, i if row else None, root)), NODE_HOOK,
                    "where a measured step's backward is: its modules' outputs (for its duration)"))
        finally:
            self.cost += time.perf_counter() - t0

    def _restart(self, stats):
        """The peak starts again from now; the one it had until now is folded into what the step's record
        and the program read (they still see it). That peak."""
        shim, d = self.shim, self.device
        peak = shim._peak(stats, "allocated_bytes") if shim.S.reset_peaks else shim._cur(
            stats, "allocated_bytes")
        if shim.S.reset_peaks:
            shim._keep(d, stats)
            fold = shim.S.folded.get(d, (0, 0))
            shim.S.folded[d] = (max(fold[0], peak), max(fold[1], shim._peak(stats, "reserved_bytes")))
            shim.S.orig_reset(d)
        return peak

    def mark(self, i, root):
        """A module's backward starts (its output's node is about to run): the peak since the last mark
        belongs to the module whose backward ran until now; at the root's, the graph's saved tensors are
        what the forward left for backward."""
        t0 = time.perf_counter()
        stats = self._now()
        peak = self._restart(stats)
        if peak > self.top:
            self.top, self.peak_at = peak, len(self.bwd_order) - 1
        if self.current is not None:
            self.bwd[self.current] = max(self.bwd.get(self.current, 0), peak)
        if root and self.activations is None:
            # The node about to run (the engine's current one, in its pre-hooks): below it, every tensor
            # the forward saved for backward (the loss's nodes above it have run and let theirs go).
            self.activations = self._saved_below(_current_node(self.torch), True)
            self.at_backward = self.shim._cur(stats, "allocated_bytes")
        if i is not None:
            self.current = i
            self.bwd_order.append(i)
        self.cost += time.perf_counter() - t0

    def _saved_below(self, node, backward=False):
        """The tensors the graph below `node` saved for backward (a Parts), and per module of the table
        (self.saved); at backward's start, the gradients the parameters had then."""
        parts = Parts(self.torch, self.device)
        parts.known(self.weights, "parameters")
        graph = Graph([node], self.params, time.perf_counter() + WALK_S)
        self.saved = graph.saved(parts, graph.owners(self.order))
        self.hooked, self.unread = graph.hooked, graph.unread
        if backward:
            self.grads_before = sum(graph.grads.values())
        return parts

    def close(self):
        patches = self.shim._patches()
        for h in self.handles:
            try:
                patches.remove(h)
            except Exception:
                pass
        self.handles = []

    def finish(self, step, snapshot_to=None):
        """The step is over (the optimizer's step hook): the hooks go, and the result (None for a call that
        never came)."""
        self.close()
        if self.call is not None:
            return None
        t0 = time.perf_counter()
        shim, d = self.shim, self.device
        stats = self._now()
        last = shim._peak(stats, "allocated_bytes")
        if last > self.top:
            self.peak_at = len(self.bwd_order) - 1
        peak = max(self.top, last, shim.S.folded.get(d, (0, 0))[0])
        if self.current is not None:
            self.bwd[self.current] = max(self.bwd.get(self.current, 0), last)
        out = self._result(peak, self.activations, snapshot_to, self._at_peak)
        out["step"], out["at_backward"] = step, self.at_backward
        self.cost += time.perf_counter() - t0
        out["analysis_s"] = round(self.cost, 4)
        return out

    def end_call(self, node):
        """The measured call has returned (`node`: its output's autograd node, None without one): the hooks
        go, and the result at the call's peak."""
        self.close()
        t0 = time.perf_counter()
        stats = self._now()
        shim = self.shim
        peak = shim._peak(stats, "allocated_bytes") if shim.S.reset_peaks else shim._cur(
            stats, "allocated_bytes")
        saved = self._saved_below(node) if node is not None else None
        out = self._result(peak, saved, self.snapshot_to)
        self.cost += time.perf_counter() - t0
        out["analysis_s"] = round(self.cost, 4)
        return out

    def _at_peak(self, program, parts):
        """A step's parts, counted at its end (gradients) and at backward's start (activations), as they
        were at its peak, in the backward of the module self.peak_at names: the modules whose backward
        had ended had let go of what they saved, and only those whose backward had begun had their
        gradients (with those there before backward)."""
        names = [self.names[i] for i in self.bwd_order]
        ended, begun = set(names[:max(self.peak_at, 0)]), set(names[:self.peak_at + 1])
        b = parts.bytes
        b["activations"] = max(0, b["activations"] - sum(self.saved.get(n, 0) for n in ended))
        grads = self.grads_before
        for name, m in choose_rows(program):
            if name in begun:
                grads += sum(_storage(p.grad)[1] for p in m.parameters() if p.grad is not None
                             and p.is_cuda and p.device.index == self.device)
        b["gradients"] = min(b["gradients"], grads)

    def _result(self, peak, saved, snapshot_to, at_peak=None):
        """The record: the breakdown at `peak` (`saved`: the graph's saved tensors, a Parts; `at_peak`:
        what moves the parts counted to the peak's moment) and the table."""
        program = Program(self.torch, self.hunt, self.optimizer())
        parts = Parts(self.torch, self.device)
        program.count(parts)
        if saved is not None:
            # The weights a node saved are parameters, counted as such.
            parts.take(saved, "activations")
        if at_peak is not None:
            at_peak(program, parts)
        ids = dict((n, i) for i, n in self.names.items())
        rows = []
        for n in self.order:
            if ids[n] not in self.fwd and ids[n] not in self.bwd:
                continue
            row = {"name": n, "forward": self.fwd.get(ids[n], 0)}
            if self.call is None:
                row["backward_peak"] = self.bwd.get(ids[n], 0)
            if saved is not None:
                row["activations"] = self.saved.get(n, 0)
            rows.append(row)
        out = {"k": "where", "why": "peak", "phase": self.phase, "dev": self.device, "t": time.time(),
               "allocated": peak, "parts": parts.result(peak), "rows": rows}
        _saved_note(out, self.hooked, self.unread)
        if snapshot_to is not None:
            out["snapshot"] = snapshot_to()
        return out


# What the registry lists the measured step's hooks on its graph's nodes as.
NODE_HOOK = "torch.autograd.graph.Node prehook of a module's output"


def _marker(measure, i, root):
    def hook(grad_outputs):
        __tracebackhide__ = True
        c = measure.shim._compiling
        if c is not None and c():
            return None  # compiled autograd tracing the graph: nothing of gpudoc's in it
        try:
            measure.mark(i, root)
        except Exception:
            pass
        return None

    return hook


def _grad_fn(output, torch):
    Tensor = torch.Tensor
    for t in (output if type(output) in (tuple, list) else (output,)):
        if issubclass(type(t), Tensor) and getattr(t, "grad_fn", None) is not None:
            return t.grad_fn
    return None


# Entry points, called by the shim (_gpudoc_torch.py's _where) with the shim's module: its state (S), its
# allocator readers and its guard for gpudoc's own calls into torch (OURS).

class _State(object):
    measure = None
    snapshots = 0
    ooms = 0
    # The phases whose call was measured (or armed): evaluation, inference.
    phases = set()


W = _State()
# Snapshots written per process at most (each OOM's, then the measured step's), and OOMs looked at (a
# program that probes for its largest batch may fail many times: the first few).
MAX_SNAPSHOTS = 4
# Module calls that are not the armed one before a measured call gives up (see Measure._before).
MAX_MISSED = 64
MAX_OOMS = 8
# Events memory history keeps for --snapshot (each a few KB of host memory at most).
SNAPSHOT_ENTRIES = 100000


def on_oom(shim, device, allocated):
    """At an OOM (the shim's observer): where in the model, and what the device's memory held."""
    S = shim.S
    W.ooms += 1
    if W.ooms > MAX_OOMS:
        return
    with shim.OURS:
        out = at_oom(S.torch, shim._hunt_module(), device, allocated, _snapshot_to(shim))
    shim._send_big(out)


def arm(shim, optimizer, again=False):
    """A record past warm-up: the next step is measured (the hooks are in place until it ends); `again`:
    measured again, the steps since the last record having peaked higher than the one measured. Whether
    it was armed."""
    S = shim.S
    if S.hunt is not None or W.measure is not None:
        return False  # a hunt's window records now, or a call is measured: a later record
    S.measured = True
    if _dynamo_compiled():
        # A compiled program would recompile its graphs for hooks added and taken away (Dynamo guards
        # on the global hooks): no step is measured.
        _stop(shim)
        return False
    with shim.OURS:
        W.measure = Measure(S.torch, shim._hunt_module(), shim, optimizer, (shim._devices() or [0])[0],
                            shim.STEP[0])
    W.measure.again = again
    S.measuring = True
    shim.STEP[1] = shim.STEP[0] + 1
    return True


def finish(shim):
    """An optimizer step has run while measuring (before its record resets the peaks): the measured
    step's result; a call measured that has not returned (or never came) ends without one."""
    S = shim.S
    measure, W.measure = W.measure, None
    S.measuring = False
    first = measure.call is None and not measure.again
    try:
        with shim.OURS:
            out = measure.finish(shim.STEP[0], _snapshot_to(shim) if first else None)
    finally:
        measure.close()
        _stop(shim)
    if out is not None:
        S.where_peak = max(S.where_peak, out["allocated"])
        shim._send_big(out)


def arm_call(shim, module, phase):
    """The next call of `module` is measured, once per phase: `evaluation` (the program's first eval()
    after optimizer steps), `inference` (a forward-clock record past warm-up, no optimizer step yet).
    Whether the phase is done with (armed, or never to be): False while a hunt's window records or
    another measure runs (a later call may arm it)."""
    S = shim.S
    if phase in W.phases:
        return True
    if module is None or W.measure is not None or S.hunt is not None:
        return False
    W.phases.add(phase)
    if _dynamo_compiled():
        return True  # as arm's

    def done(out):
        measure, W.measure = W.measure, None
        S.measuring = False
        if measure is not None:
            measure.close()
        _stop(shim)
        if out is not None:
            shim._send_big(out)

    with shim.OURS:
        W.measure = Measure(S.torch, shim._hunt_module(), shim, None, (shim._devices() or [0])[0],
                            shim.STEP[0], phase, module, done)
    W.measure.snapshot_to = _snapshot_to(shim)
    S.measuring = True
    # The next optimizer step is a record's (the step hook's slow path): an evaluation's call that has
    # not come by then never will (see give_up_call).
    shim.STEP[1] = shim.STEP[0] + 1
    return True


def give_up_call(shim):
    """The evaluation is over (the program's train()) and the call armed has not begun: the program
    evaluated through a method of the model (`model.embed(x)`). The measure's two global hooks go now,
    not after MAX_MISSED module calls of the training that follows (every module call takes torch's hook
    path while they are there, and the model's next call would be a training call, no evaluation's)."""
    measure = W.measure
    if measure is not None and measure.call is not None and not measure.begun:
        measure.done(None)


def close(shim):
    """A failure while measuring: the hooks go."""
    measure, W.measure = W.measure, None
    if measure is not None:
        measure.close()
    _stop(shim)


def record(shim):
    """--snapshot, at CUDA's start: memory history (Python stacks) until the measured step ends, so that
    the snapshot of an OOM in the first steps shows where each block was allocated. Hidden from the
    program as a hunt's is; a program that records history itself is left alone."""
    S = shim.S
    if S.user_history or not shim._can_hunt():
        return
    shim._hide_history()
    with shim.OURS:
        S.torch.cuda.memory._record_memory_history(
            enabled="all", context="alloc", stacks="python", max_entries=SNAPSHOT_ENTRIES)
    S.where_history = True


def _stop(shim):
    """The recording for --snapshot ends (unless a hunt's window or the program records now)."""
    S = shim.S
    if S.where_history and S.hunt is None and not S.user_history:
        try:
            with shim.OURS:
                shim._remember(S.torch.cuda.memory._snapshot())
                S.torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass
    S.where_history = False


def _snapshot_to(shim):
    """With --snapshot: a function that writes the allocator's snapshot beside the pipe (its name)."""
    if shim.WHERE != "snapshot" or W.snapshots >= MAX_SNAPSHOTS:
        return None
    S = shim.S

    def write():
        W.snapshots += 1
        return snapshot(S.torch, os.path.dirname(S.out.path), os.getpid(), W.snapshots)

    return write


def _dynamo_compiled():
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(utils.counters["stats"]["unique_graphs"])
    except Exception:
        return False
