"""gpudoc's shim, the part loaded when the program imports torch (sitecustomize.py, beside it, watches
for that). It costs the program nothing it could measure:

- No thread, no timer. It samples PyTorch's caching allocator from the optimizer's step hook, at CUDA
  initialisation, at an out-of-memory failure (PyTorch's OOM observer) and at exit.
- Its cost is bounded by design: one statistics read per device in use per record, and records are taken
  every Nth step, N chosen from its own measured cost and the step time so that its share of the step time
  stays under BUDGET (from the ADAPT_AFTER-th record on: a record slowed once by a busy machine does not
  thin the first steps). Each record's peaks are exact over the steps it covers (the allocator's peak
  counters are reset at each record), and the program's own view of those counters is kept as if they
  were never reset.
- It never changes what the program sees: no exception, warning, signal or output of its own; writes go
  to gpudoc's pipe only, checked to still be that pipe, with SIGPIPE held off; any failure makes it go
  quiet and is reported to gpudoc. What a program can still see of it is listed in docs/framework.md.
- Leak hunting (_gpudoc_hunt.py, loaded only when a hunt starts): when allocated memory grows record
  after record past warm-up (or from warm-up on with hunt=on), PyTorch's memory history is recorded for a
  bounded window of steps, the leaking sites are read, and what holds them is searched for a few
  milliseconds a step. At an out-of-memory failure the same search names what filled the GPU. A program
  that records memory history itself is left alone.
- Where the memory went inside the model (_gpudoc_where.py, loaded at the first OOM or measured step):
  at an OOM the pass and module it happened in and what the memory held; on one step after warm-up the
  same breakdown at its peak and a per-module table; with --snapshot, the allocator's snapshot.

Loaded by GpudocFinder (sitecustomize.py) as the module `gpudoc._shim.torch`, in sys.modules so that Dynamo
finds the globals of the step hook when it compiles a step (docs/framework.md). This file holds its
settings, its state and the loading of the shim's other modules (through `gpudoc._shim.pipe`, loaded
before it: _gpudoc_pipe.py); the rest is in its parts, a file for what each watches (PARTS, at the end),
run in this module's namespace (docs/development.md).
"""
import os
import sys
from _thread import get_ident

# The shim's loader and the pipe's writer (_gpudoc_pipe.py), loaded before this module by whatever loaded
# it (GpudocFinder, the notebook extension): its `Pipe` writes the messages, its `load` loads the shim's
# modules loaded later, its `code` this one's parts.
SHARED = sys.modules["gpudoc._shim.pipe"]

# Share of the step time the shim aims at, with room under the 0.5% gpudoc promises.
BUDGET = 0.003
# Records further apart than this many steps are not made.
MAX_STRIDE = 4096
# Records measured before the stride adapts.
ADAPT_AFTER = 5
# Forward calls closer together than this go without the forward clock: its `__call__`'s own cost, paid at
# every forward call of the outermost module (O(1): a call, a weakref, a counter; 0.7-1.3 us measured on
# the 2-core dev machine with Python 3.8-3.12), would be over BUDGET (1.3 us of 300 us is 0.43%). Each
# submodule of the model's own class pays its identity check too (a Sequential of Sequentials): this
# much more apart per such module (bench/clock_call.py).
MIN_FORWARD_S = 0.0003
# The devices in use are looked for again every this many records.
RESCAN_EVERY = 64
# Leak hunting: auto (when memory grows), on (from warm-up on), off. Set from GPUDOC_TORCH.
HUNT = "auto"
# Steps (or forward calls) of warm-up, before which growth is no leak and nothing is measured: gpudoc run
# tells it (GPUDOC_TORCH's warmup=, from src/torch/warmup.rs, its one definition); this is for a copy
# loaded without it (the notebook extension's), and tests/python checks the two agree. Then the least
# records that can show growth, the records looked back over (a leak every few steps rises as stairs,
# flat between), the rises of their floor that make growth (a leak every step gives one a record; one
# every 5 steps, at a record a step, 6 in 32 records) and the least growth over them.
WARMUP_STEPS = 10
GROWTH_RECORDS = 8
GROWTH_WINDOW = 32
GROWTH_RISES = 3
GROWTH_BYTES = 64 << 20
# Hunts per process: one window, and what filled the GPU at each out-of-memory failure (a program that
# probes for its largest batch may fail many times: the first few are searched).
MAX_HUNTS = 1
MAX_OOM_HUNTS = 8
# The search for what holds leaking memory runs in slices of SLICE_S at steps at least SLICE_EVERY apart
# (at most a third of the program's time, a pause of a few milliseconds whatever its heap), for OOM_S at
# an out-of-memory failure (the tensors that filled the GPU may be gone once it unwinds), and at most
# EXIT_S at exit.
SLICE_S = 0.008
SLICE_EVERY = 0.024
OOM_S = 0.25
EXIT_S = 0.5
# Where the memory went inside the model: on (at OOMs, and one measured step after warm-up), snapshot (the
# same, and the allocator's snapshot with memory history from CUDA's start to the measured step), off.
WHERE = "on"
# The step measured stands for the run's peak step: when the steps of a later record peak this much above
# it (longer sequences, a phase that holds more), the next step is measured again, at most MAX_REMEASURES
# times (each a measured step's cost: hooks on the model's modules for one step, and a walk of its graph).
# Not with --snapshot (snapshot): its snapshot is of the step measured first, with memory history to it.
REMEASURE_ABOVE = 1.10
MAX_REMEASURES = 3
# pytest and IPython leave out frames that say so.
__tracebackhide__ = True
# A bare `raise` re-raises an exception with its own __traceback__, adding no entry for the frame it leaves
# (Python 3.11 and later; 3.8-3.10 re-raise the traceback they caught): see _unframed.
RERAISE_OWN_TRACEBACK = sys.version_info >= (3, 11)


class _State(object):
    period = 0.0
    last_cost = 0.0
    cuda = False
    torch = None
    # The writer of the messages (_connect): its `dead` is the shim gone quiet.
    out = None
    reset_peaks = True
    # The shim's folder (the hunt's module is read from there).
    here = ""
    records = 0
    last_step = 0
    last_t = 0.0
    cost = 0.0
    devices = None
    uuids = {}
    # Per device: the peaks since the program last reset them, over gpudoc's own resets.
    held = {}
    # Per device: (allocated, reserved) peaks the program's own reset would have erased mid-record.
    folded = {}
    # Per device: allocated memory at the last records, to see growth.
    growth = {}
    hunt = None
    hunts = 0
    oom_hunts = 0
    files = 0
    # The program records memory history itself (then no hunt touches it).
    user_history = False
    # The thread making gpudoc's own calls into torch, now: the wrappers let its calls through.
    ours = None
    hunt_module = None
    # Searches for holders still running: (result, Search, bytes leaked).
    searches = []
    last_slice = 0.0
    # Memory history gpudoc recorded: the program's snapshots are shown without it.
    recorded = False
    # The frames gpudoc's recording left on live blocks and segments: ("b"|"s", address) -> frames.
    our_frames = {}
    where_module = None
    # A step is being measured; one was (or will never be); memory history is recorded for --snapshot.
    measuring = False
    measured = False
    where_history = False
    # The highest peak a measured step had (0: none measured, or measuring failed), and the steps
    # measured again at a higher one.
    where_peak = 0
    remeasured = 0
    # Per device, the allocated peak the last step record sent.
    recorded_peak = {}
    # A call of a program without steps was measured (or will never be).
    inferred = False
    # torch's Module._call_impl code and Module.__call__, once the forward clock looked (see
    # _forward_clock_on): None when it never did.
    call_impl = None
    module_call = None
    # The optimizer step at which an evaluation last got the forward clock (see _evaluation).
    evaluated = 0
    # torch.autograd.backward is the shim's wrapper, and the optimizer's step pre-hook is in place (see
    # _watch_autograd): without them, what they would tell is unknown.
    backward_watched = False
    step_watched = False


S = _State()
S.out = SHARED.Pipe("")  # none until gpudoc run's is named (_connect): a message is dropped


class _Forwards(object):
    """The forward clock, for a program without optimizer steps (see _on_forward)."""

    on = False
    # The global forward hook looking for the outermost module, while it looks.
    discover = None
    # The outermost module and its class, whose `__call__` is the shim's meanwhile (weakly: the clock
    # never keeps the program's model alive).
    root = None
    cls = None
    # The calls of that class's `__call__` in one forward call of the model (see MIN_FORWARD_S).
    calls = 1
    # The optimizer steps counted when the clock began (see _on_forward).
    step = 0
    # The clock was given an evaluated module (see _evaluation): a train() ends it.
    evaluating = False
    # Once optimizer steps run, the clock's wrapper stays on the outermost module only to count its calls
    # (no record, no hunt): what an OOM's phase is read from (see _count_forwards, _activity).
    counting = False
    # Its pace, as _State's for steps (see _covered, _paced): `last_step` is the call of the last record.
    last_step = 0
    last_t = 0.0
    period = 0.0
    records = 0
    cost = 0.0
    last_cost = 0.0


F = _Forwards()


class _Cell(object):
    """Notebook cells (IPython's pre_run_cell and post_run_cell): the allocator at each cell's start and
    end, and its peaks inside the cell, kept over the resets of the program and of the step records as
    theirs are kept over the cells'."""

    # IPython's callbacks are registered (by the shim under gpudoc run, or by the notebook extension).
    hooked = False
    # A cell is running: a reset by others keeps the peaks it erases in `erased`.
    open = False
    # Which cell is running (id of IPython's ExecutionInfo), since when, and the allocator at its start:
    # device -> (allocated, reserved, allocated peak, reserved peak).
    key = None
    t0 = 0.0
    start = {}
    erased = {}
    # The last cell that ended (its key) and its records, for whoever asks again (both callbacks may).
    ended = None
    last = []
    # The keys of cells the running cell runs (%%capture runs its body as a cell of its own).
    nested = frozenset()
    # The notebook extension's copy of every message (a list; None: no copy kept).
    copies = None


CELL = _Cell()


class _Ours(object):
    """gpudoc's own calls into torch, on this thread (another thread's, meanwhile, are the program's)."""

    def __enter__(self):
        S.ours = get_ident()

    def __exit__(self, *exc):
        S.ours = None


OURS = _Ours()
# [steps seen, step of the next record]: a list, so the hook's fast path is two index operations.
STEP = [0, 1]
# The same for forward calls of the outermost module (the clock where there are no optimizer steps), and
# whether Dynamo traced the hook that looks for that module (see _outermost).
FWD = [0, 1]
TRACED = [False]
# What the program was doing, read at an OOM (see _activity): [backward calls begun, backward calls
# running now, the forward clock's count at the last backward's start, inside optimizer.step(), the most
# forward calls that preceded one backward], and the outermost module the forward clock found (a weak
# reference).
AUTOGRAD = [0, 0, 0, False, 0]
# How many backwards each count of forward calls preceded (index: the calls, 16 for 16 or more): the count
# most backwards had is what one step calls its model, which calls no backward followed (a validation every
# few steps) do not change, as they change the most (see _activity).
PER_BACKWARD = [0] * 17
MODEL = [None]
# torch.compiler.is_compiling, where torch has it (2.3 and later). Dynamo folds it to a constant while it
# traces: a hook that returns when it is true adds nothing to a compiled graph, no graph break, no warning,
# and is not run by the compiled code (the step hook counts a compiled step all the same: see _on_step).
_compiling = None


# -- the shim's modules loaded later ------------------------------------------------------------------
# The shim's modules loaded later, on a step (SHARED.load): compiled at `import torch` (_precompile).
LATER = (("_gpudoc_hunt.py", "gpudoc._shim.hunt"), ("_gpudoc_where.py", "gpudoc._shim.where"))


def _hunt_module():
    """_gpudoc_hunt.py, beside this file, loaded as this one is (by path, under its own name)."""
    if S.hunt_module is None:
        S.hunt_module = SHARED.load(S.here, *LATER[0])
    return S.hunt_module


def _precompile():
    """The shim's modules loaded later are compiled into their folder's __pycache__ now, at `import
    torch` (_code): loading one on a step reads its bytecode instead of compiling it (17 ms of the step
    that first loaded them). Nothing is run."""
    for filename, name in LATER:
        try:
            SHARED.code(S.here, filename, name)
        except Exception:
            pass


# The registry every change of the shim's goes through (_gpudoc_patch.py, loaded by _patches).
PATCH = ("_gpudoc_patch.py", "gpudoc._shim.patch")
_REGISTRY = []
# The step hook as the registry lists it (the run's _on_step, or the notebook's _attached_step).
STEP_HOOK = ("torch.optim global step post-hook", "the allocator's record every Nth optimizer step")


def _patches():
    """The registry of what the shim changes in the process (_gpudoc_patch.py's PATCHES)."""
    if not _REGISTRY:
        _REGISTRY.append(SHARED.load(S.here, *PATCH).PATCHES)
    return _REGISTRY[0]


def _like(real, fn):
    """`fn` under `real`'s name, module and doc: what the program reads of torch._C's function is torch's."""
    out = type(fn)(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    for key in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(out, key, getattr(real, key))
        except (AttributeError, TypeError):
            pass
    return out


# -- the module's other parts -------------------------------------------------------------------------
# The rest of this module, in files of one concern each, run in its namespace in this order when it loads
# (each compiled once into __pycache__, by SHARED.code). One module, not several: the hooks' fast paths read
# the state above as globals, Dynamo finds every hook's globals under this one module's name, and the
# where-walk, the notebook extension and the tests reach every name on one object. The order is their
# layers': a part uses the names of this file and of the parts before it, never those of a part after it
# (nor does this file use any part's), so that no two call each other (tests/python/test_shim_layers.py).
PARTS = (
    "_gpudoc_torch_pipe.py",  # the pipe to gpudoc, the allocator's readings
    "_gpudoc_torch_peaks.py",  # the records, which reset the peaks; the program's own view of them
    "_gpudoc_torch_leaks.py",  # leak hunts, the program's memory history left alone; the where-walk's calls
    "_gpudoc_torch_clock.py",  # the records' pace at either clock; the forward clock
    "_gpudoc_torch_steps.py",  # the step hook
    "_gpudoc_torch_phase.py",  # backward, optimizer steps, eval() and train()
    "_gpudoc_torch_events.py",  # CUDA's start, an OOM, exit, fork
    "_gpudoc_torch_cells.py",  # notebook cells
    "_gpudoc_torch_start.py",  # putting it all in place at `import torch`
    "_gpudoc_torch_notebook.py",  # the notebook extension's API
)


def _run_parts():
    """Each part's code is named `<gpudoc> PATH`, as this module's __file__ is: coverage measures no code
    whose name is no real file's (it tells this file's by its __file__, which is the parts' too, and would
    take theirs for the program's). A traceback still shows their lines (_readable_parts)."""
    here = os.path.dirname(sys._getframe().f_code.co_filename)
    fix = sys.modules["_imp"]._fix_co_filename
    for filename in PARTS:
        code = SHARED.code(here, filename, __name__)
        fix(code, "<gpudoc> " + os.path.join(here, filename))
        exec(code, globals())


def _readable_parts(here):
    """The parts' source for linecache, read only when a traceback or a debugger asks for it (at
    `import torch`, once torch has imported linecache: nothing is imported here)."""
    linecache = sys.modules.get("linecache")
    if linecache is None:
        return
    ext = sys.modules["_frozen_importlib_external"]
    for filename in PARTS:
        path = os.path.join(here, filename)
        linecache.lazycache("<gpudoc> " + path, {"__name__": __name__,
                                                  "__loader__": ext.SourceFileLoader(__name__, path)})


_run_parts()
del _run_parts
