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
finds the globals of the step hook when it compiles a step (docs/framework.md).
"""
import functools
import gc
import json
import os
import signal
import sys
import time
from _thread import get_ident

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
    dead = False
    cuda = False
    torch = None
    pipe = ""
    reset_peaks = True
    # The shim's folder (the hunt's module is read from there).
    here = ""
    fd = None
    fd_id = None
    tail = ""
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


def _rank_field(name, value):
    if value is None:
        return ""
    if value and all("0" <= c <= "9" for c in value):
        return ',"%s":%d' % (name, int(value))
    return ',"%s":%s' % (name, json.dumps(value))


def _identify():
    """The fields every message carries: who sent it."""
    S.tail = (
        ',"pid":%d' % os.getpid()
        + _rank_field("rank", os.environ.get("RANK"))
        + _rank_field("local_rank", os.environ.get("LOCAL_RANK"))
        + "}\n"
    )


def _open():
    fd = os.open(S.pipe, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 3:
        # A standard descriptor the program closed stays closed for it (its writes fail as they would,
        # its next file gets that number): the pipe moves above them.
        import fcntl

        low = fd
        try:
            fd = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 3)
        finally:
            os.close(low)
    st = os.fstat(fd)
    S.fd, S.fd_id = fd, (st.st_dev, st.st_ino)


def _still_ours():
    """The descriptor is still gpudoc's pipe: a program may close it and open its own file in its place."""
    try:
        st = os.fstat(S.fd)
        return (st.st_dev, st.st_ino) == S.fd_id
    except OSError:
        return False


def _send(body):
    """Writes one message (under PIPE_BUF, so processes writing at once never interleave)."""
    if CELL.copies is not None:
        _copy(body + S.tail)
    if S.dead:
        return
    data = (body + S.tail).encode()
    if len(data) > 4000:
        return
    try:
        if S.fd is None or not _still_ours():
            _open()
    except OSError:
        S.dead = True
        return
    # A program that restored SIGPIPE's default would die writing to a pipe gpudoc has left: the signal
    # is held off while writing, and the one a failed write raised is taken back, even when the program
    # holds SIGPIPE off itself (it would be delivered once the program lets it through). One already
    # pending is the program's own: a second one is the same one, and it is left.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    theirs = signal.SIGPIPE in old and signal.SIGPIPE in signal.sigpending()
    try:
        os.write(S.fd, data)
    except BlockingIOError:
        pass  # gpudoc is behind: this record is dropped, the program is never held up
    except OSError:
        S.dead = True
        if not theirs:
            signal.sigtimedwait({signal.SIGPIPE}, 0)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _fail(where, exc):
    try:
        _send('{"k":"error","where":%s,"error":%s' % (
            json.dumps(where), json.dumps("%s: %s" % (type(exc).__name__, exc))))
    except Exception:
        pass
    S.dead = True


def _peaks(stats, path=()):
    """Every peak in the nested statistics, by path."""
    out = {}
    for k, v in stats.items():
        if type(v) is dict:
            if "peak" in v:
                out[path + (k,)] = v["peak"]
            else:
                out.update(_peaks(v, path + (k,)))
    return out


def _keep(device, stats):
    """Remembers the peaks a reset is about to erase, for the program's view. The program may read them
    from another thread meanwhile (_user_stats): a new dict replaces the old, never changed after."""
    held = dict(S.held.get(device, ()))
    for path, peak in _peaks(stats).items():
        if peak > held.get(path, 0):
            held[path] = peak
    S.held[device] = held


def _cur(stats, key):
    return stats.get(key, {}).get("all", {}).get("current", 0)


def _peak(stats, key):
    return stats.get(key, {}).get("all", {}).get("peak", 0)


def _numbers(stats, device, peaks=None):
    """The allocator's numbers, with the peaks over those a reset erased since the last record; `peaks`:
    another view's (a notebook cell's), None where not known."""
    if peaks is None:
        fold = S.folded.pop(device, (0, 0))
        peaks = (max(_peak(stats, "allocated_bytes"), fold[0]), max(_peak(stats, "reserved_bytes"), fold[1]))
        S.recorded_peak[device] = peaks[0]
    known = "".join(',"%s":%d' % (k, v) for k, v in zip(("pa", "pr"), peaks) if v is not None)
    return '"dev":%d,"t":%.6f,"a":%d,"r":%d%s,"i":%d,"nr":%d,"no":%d,"nda":%d,"ndf":%d' % (
        device,
        time.time(),
        _cur(stats, "allocated_bytes"),
        _cur(stats, "reserved_bytes"),
        known,
        _cur(stats, "inactive_split_bytes"),
        stats.get("num_alloc_retries", 0),
        stats.get("num_ooms", 0),
        stats.get("num_device_alloc", 0),
        stats.get("num_device_free", 0),
    )


def _uuid(device):
    if device not in S.uuids:
        try:
            u = str(S.torch.cuda.get_device_properties(device).uuid)
            S.uuids[device] = u if u.startswith("GPU-") else "GPU-" + u
        except Exception:
            S.uuids[device] = None
        if S.uuids[device]:
            return ',"uuid":"%s"' % S.uuids[device]
    return ""


def _devices():
    """The devices this process has allocated on (reading a device's statistics creates no context)."""
    if S.devices is None or S.records % RESCAN_EVERY == 0:
        stats = S.orig_stats
        S.devices = [
            d for d in range(S.torch.cuda.device_count()) if stats(d).get("num_device_alloc", 0)
        ]
    return S.devices


def _record(step, covered, kind="step", fwd=None):
    """One record per device in use: the numbers now and the peaks over the steps since the last one. With
    `fwd` (the forward clock's count, see _on_forward), a reading at a forward call: an `s` record with
    its count, over the calls `covered` since the last."""
    clocked = kind == "step" or fwd is not None
    for d in _devices():
        stats = S.orig_stats(d)
        if fwd is None:
            head, cost, period = '{"k":"%s","step":%d,"n":%d,' % (kind, step, covered), S.last_cost, S.period
        else:
            head, cost, period = '{"k":"s","step":%d,"fwd":%d,"n":%d,' % (step, fwd, covered), F.last_cost, \
                F.period
        body = head + '%s%s,"c":%d,"p":%d' % (_numbers(stats, d), _uuid(d), cost * 1e6, period * 1e6)
        if S.reset_peaks and clocked:
            _keep(d, stats)
            if CELL.open:
                _fold(CELL.erased, d, stats)
            S.orig_reset(d)
        _send(body)
        if clocked:
            seen = S.growth.setdefault(d, [])
            seen.append(_cur(stats, "allocated_bytes"))
            del seen[:-GROWTH_WINDOW]



def _on_step(optimizer, args, kwargs):
    """The optimizer's step post-hook. Most steps only count; every Nth is recorded."""
    __tracebackhide__ = True
    if _compiling is not None and _compiling():
        # Dynamo traces this into a compiled step: the count alone, a list's item, which it replays
        # after each run of the compiled code (no guard on it, no graph break, no recompile: torch 2.15,
        # tests/python/test_shim_compiled.py). The records wait for a step run in Python, the forward
        # clock sees that steps ran (_on_forward), and the exit record has them all. The step has ended
        # (its pre-hook said it runs: see _activity).
        STEP[0] += 1
        AUTOGRAD[3] = False
        return
    STEP[0] += 1
    AUTOGRAD[3] = False
    if F.evaluating:
        # Training resumed after an evaluation without a train(): the clock ends at this step.
        _count_forwards()
    if STEP[0] < STEP[1]:
        return
    if F.on:
        # Optimizer steps are the program's clock from its first on.
        _count_forwards()
    if S.dead or not S.cuda:
        STEP[1] = STEP[0] + 1
        return
    try:
        _uncollected(lambda: _step_where(optimizer))
    except Exception as e:
        _fail("step hook", e)  # never the program's `opt.step()` that raises it


def _step_where(optimizer):
    """A recorded step: a measured step ends before the record (which resets the peaks it reads); one
    after warm-up is armed after it."""
    if S.measuring:
        _where("finish")
    _step_record()
    if WHERE == "off" or STEP[0] <= WARMUP_STEPS:
        return
    if not S.measured:
        _where("arm", optimizer)
    elif _higher_peak() and _where("arm", optimizer, True):
        S.remeasured += 1


def _higher_peak():
    """The steps of the record just sent peaked well above the highest measured step's peak: the next
    step is worth measuring again (the record's own reading: no call of its own into torch)."""
    if not S.where_peak or WHERE != "on" or S.remeasured >= MAX_REMEASURES:
        return False
    peak = S.recorded_peak.get((_devices() or [0])[0], 0)
    return peak > S.where_peak * REMEASURE_ABOVE


def _uncollected(record):
    """Runs `record`: what it allocates never starts a collection the program's gc.callbacks would see in
    its step: the collector is off meanwhile, and what was allocated is freed before it is on again."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        record()
    finally:
        if collecting:
            gc.enable()


def _step_record():
    t0 = time.perf_counter()
    try:
        covered = _covered(S, STEP, t0)
        _record(STEP[0], covered)
        S.records += 1
    except Exception as e:
        _fail("step hook", e)
        return
    _paced(S, STEP, t0)


def _covered(p, clock, t0):
    """The calls of `clock` (STEP or FWD) since the last record, and the time each took (`p`: S or F, that
    clock's pace)."""
    covered = clock[0] - p.last_step
    if p.last_step:
        p.period = (t0 - p.last_t) / covered
    return covered


def _paced(p, clock, t0):
    """After a record at `clock`'s count begun at `t0`: its cost, and the next record's count, every Nth
    call so that records take under BUDGET of the program's time; then the hunt's part."""
    t1 = time.perf_counter()
    cost = t1 - t0
    # The first record pays once for what later ones don't (the device list, its UUID): not counted.
    if p.records > 1:
        p.cost = cost if p.cost == 0 else 0.8 * p.cost + 0.2 * cost
        p.last_cost = cost
    stride = 1
    if p.period > 0 and p.records > ADAPT_AFTER:
        stride = min(MAX_STRIDE, max(1, int(p.cost / (BUDGET * p.period)) + 1))
    p.last_step, p.last_t = clock[0], t1
    clock[1] = clock[0] + stride
    _hunt_tick(clock, t1)


def _hunt_tick(clock, t1):
    """The hunt's part of a record at `clock`'s count (STEP or FWD): a window starts or ends, and a search
    in progress gets its slice (then every call is a record, so that slices come at the calls)."""
    if HUNT == "off":
        return
    try:
        _hunt_step(clock[0], clock)
        if S.searches:
            clock[1] = clock[0] + 1
            if t1 - S.last_slice >= SLICE_EVERY:
                _search(SLICE_S)
                S.last_slice = time.perf_counter()
    except Exception as e:
        _hunt_failed(e)


def _on_forward():
    """The outermost module's forward call has returned (its class's `__call__`, _clocked_call). The
    forward clock of a program without optimizer steps (inference, generation, serving, evaluation):
    most calls only count; every Nth is a reading of the allocator, N chosen as the step hook's is; a
    leak hunt runs at the same place. Fast loops it cannot keep under budget, and every program once its
    first optimizer step ends, go without it."""
    __tracebackhide__ = True
    FWD[0] += 1
    if F.counting:
        return  # training: the calls are only counted, for an OOM's phase (see _count_forwards)
    if STEP[0] != F.step:
        # Optimizer steps ran since the clock began (compiled ones, which call no Python of the shim's
        # and so could not end it): training, whose clock they are; its calls are counted from now on.
        _count_forwards()
        return
    if FWD[0] < FWD[1]:
        return
    if S.dead or not S.cuda:
        FWD[1] = FWD[0] + 1
        return
    _uncollected(_forward_record)


def _forward_record():
    t0 = time.perf_counter()
    try:
        covered = _covered(F, FWD, t0)
        if F.records > 2 and F.period < MIN_FORWARD_S * F.calls:
            # The wrapper's own call, paid at every forward, would be over budget (told from the third
            # record on: past ADAPT_AFTER the next record may be MAX_STRIDE calls away). An evaluation's
            # calls after training go back to being counted, as the training's are.
            if F.evaluating:
                _count_forwards()
            else:
                _forward_clock_off()
            return
        _record(STEP[0], covered, fwd=FWD[0])
        F.records += 1
    except Exception as e:
        _fail("forward clock", e)
        _forward_clock_off()
        return
    _paced(F, FWD, t0)
    if WHERE != "off" and FWD[0] > WARMUP_STEPS and not S.inferred and not S.measuring \
            and F.root is not None:
        root = F.root()
        if _has_grads(root):
            # Gradients before any optimizer step: training that accumulates them over many forwards,
            # whose steps are measured once they come; no call of it is inference.
            S.inferred = True
        else:
            # A program without optimizer steps: its next call past warm-up is measured (once).
            S.inferred = _where("arm_call", root, "inference") is not False


def _has_grads(module):
    """Whether the module's first trainable parameter has a gradient (a backward has run into it)."""
    try:
        for p in module.parameters():
            if p.requires_grad:
                return p.grad is not None
    except Exception:
        pass
    return False


def _clocked_call(self, *args, **kwargs):
    """The `__call__` of the outermost module's class while the forward clock runs (see _wrap): torch's
    Module.__call__, then the clock when `self` is that module. Nothing is put into the module itself:
    a copy, a `__dict__` clone, a DataParallel replica or a pickle of it computes as the program's own
    (a copy calls this too, and is told apart by identity). Its cost at a call that is no record: see
    MIN_FORWARD_S."""
    __tracebackhide__ = True
    try:
        out = S.module_call(self, *args, **kwargs)
    except BaseException as e:
        _unframed(e)
        raise
    root = F.root
    if root is not None and root() is self and (_compiling is None or not _compiling()):
        try:
            _on_forward()
        except Exception as e:
            _fail("forward clock", e)
            _forward_clock_off()
    return out


def _unframed(e):
    """`e`, raised through the program's call by the wrapper of gpudoc's that called this (its except
    clause, which re-raises it bare), without that wrapper's entry in its traceback: the program's
    traceback, and `traceback.extract_tb` of what it catches, are what they are without gpudoc (the same
    exception object, its traceback torch's from the wrapper down). Python 3.8-3.10 show the frame."""
    tb = e.__traceback__
    if RERAISE_OWN_TRACEBACK and tb is not None and tb.tb_frame is sys._getframe(1):
        e.__traceback__ = tb.tb_next


def _outermost(module, args, output):
    """The global forward hook, from CUDA's start until the first outermost forward call has returned:
    that module (no other module's call below it on the stack) becomes the clock's. Every module's call
    runs torch's hook path meanwhile: the first forward pass only."""
    __tracebackhide__ = True
    if _compiling is not None and _compiling():
        # Dynamo traces the hook (folded to this) and guards on the global hooks: taking it away would
        # recompile the program's graphs, so it stays, doing nothing once done. A list's item, which
        # Dynamo replays as a side effect, where an attribute of the shim's object might break the graph.
        TRACED[0] = True
        return
    if F.discover is None:
        return
    try:
        code = S.call_impl
        f, calls = sys._getframe(1), 0
        while f is not None and calls < 2:
            calls += f.f_code is code
            f = f.f_back
        del f
        if calls > 1:
            return
        _adopt(module)
    except Exception as e:
        _fail("forward clock", e)
        _forward_clock_off()


def _unhook():
    """The discovery hook goes, unless a compiled graph was traced with it (see _outermost)."""
    if F.discover is not None and not TRACED[0]:
        _patches().remove(F.discover)
    F.discover = None


def _adopt(module):
    """The outermost module's first call has returned: it is the clock's from now, that call counted."""
    _unhook()
    _remember_model(module)
    if _wrap(module):
        _on_forward()


def _wrap(module):
    """The clock counts `module`'s calls (its class's `__call__` is _clocked_call); whether it does."""
    cls = type(module)
    d = object.__getattribute__(module, "__dict__")
    if type(d) is not dict or d.get("_compiled_call_impl") is not None \
            or cls.__call__ is not S.module_call or "__call__" in cls.__dict__:
        # Compiled with Module.compile, or called its own way: the clock leaves it alone.
        F.on = False
        return False
    import weakref

    try:
        F.calls = sum(1 for m in module.modules() if type(m) is cls)
        F.step = STEP[0]
        F.root, F.cls = weakref.ref(module), weakref.ref(cls)
        _patches().replace(cls, "__call__", _clocked_call, "the forward clock: the outermost module's calls "
                           "(a program without optimizer steps, an evaluation)", shown="type(model).__call__")
    except Exception:
        F.root = F.cls = None
        F.on = False
        return False
    return True


def _count_forwards():
    """Optimizer steps run (or an evaluation ended): the clock stops recording and hunting, and its
    wrapper stays on the outermost module, where there is one, only to count its calls (the fast path of
    _on_forward: a list's increment and comparison), for an OOM's phase; without one, the clock ends."""
    module = F.root() if F.root is not None else None
    if module is None or not S.backward_watched:
        _forward_clock_off()
        return
    _unhook()
    F.on = F.evaluating = False
    F.counting = True
    FWD[1] = 1 << 62


def _forward_clock_off():
    """The clock ends: the discovery hook goes, the outermost module's class calls as torch's again
    (when its `__call__` is still the shim's)."""
    F.on = F.evaluating = F.counting = False
    _unhook()
    cls = F.cls() if F.cls is not None else None
    F.root = F.cls = None
    patch = _patches().find(cls, "__call__") if cls is not None else None
    if patch is not None:
        try:
            _patches().remove(patch)
        except Exception:
            pass


def _forward_clock_on(torch):
    """Looks for the outermost module from now on (at CUDA's start), where torch calls modules the way
    the clock needs (2.2 and later: Module.__call__ is `_wrapped_call_impl`)."""
    try:
        module = torch.nn.modules.module
        Module = module.Module
        if HUNT == "off" or STEP[0] or not hasattr(Module, "_compiled_call_impl"):
            return
        S.call_impl = Module._call_impl.__code__
        S.module_call = Module.__call__
        F.on = True
        F.discover = _patches().hook(module.register_module_forward_hook(_outermost),
                                     "torch.nn.modules.module global forward hook",
                                     "the forward clock looks for the outermost module (its first call)")
    except Exception:
        F.on = False


def _growing():
    """Allocated memory grew past warm-up on some device: its floor (the least level of the records from
    each one on) rose at least GROWTH_RISES times over the last GROWTH_WINDOW records, by GROWTH_BYTES or
    more, and it is at its highest now. A leak every step rises record after record; one
    every few steps (a validation every 5 steps that keeps its losses' graphs) rises as stairs, flat
    between; a level that goes up and comes back (a step's activations, a cache that is emptied) leaves
    its floor where it was."""
    for seen in S.growth.values():
        if len(seen) < GROWTH_RECORDS or seen[-1] != max(seen):
            continue
        floor, low = [], seen[-1]
        for level in reversed(seen):
            low = min(low, level)
            floor.append(low)
        floor.reverse()
        rises = sum(1 for a, b in zip(floor, floor[1:]) if b > a)
        if rises >= GROWTH_RISES and floor[-1] - floor[0] >= GROWTH_BYTES:
            return True
    return False


def _allocated():
    return dict((d, seen[-1]) for d, seen in S.growth.items() if seen)


def _hunt_step(step, clock=STEP, ending=False):
    """Starts, or ends, a window of memory-history recording, counted in `clock`'s units (optimizer steps,
    or forward calls where there are none)."""
    if S.hunt is not None:
        if S.hunt.clock is not clock:
            # Steps began during a window of forward calls: it ends with the calls it recorded.
            step, clock, ending = FWD[0], FWD, True
        if ending or S.hunt.due(step):
            hunt, S.hunt = S.hunt, None
            with OURS:
                snap, results = hunt.end(step, _allocated(), skip=(id(S),))
            _remember(snap)
            del snap
            for result, search, leaked in results:
                if search is None:
                    _send_big(result)
                else:
                    S.searches.append((result, search, leaked))
            # The search's first slice comes at a later step than the snapshot's reading.
            S.last_slice = time.perf_counter()
        else:
            clock[1] = min(clock[1], S.hunt.from_step + _hunt_module().WINDOW_STEPS)
        return
    if S.hunts >= MAX_HUNTS or S.user_history:
        return
    if step <= WARMUP_STEPS:
        if HUNT == "on":
            # A hunt asked for starts when warm-up ends, whatever the records' stride.
            clock[1] = min(clock[1], WARMUP_STEPS + 1)
        return
    if HUNT == "on" or _growing():
        if S.hunt_module is None:
            # Loading it (compiling it, without a cached .pyc) is a pause of its own: the hunt starts at
            # the next record.
            _hunt_module()
            clock[1] = min(clock[1], step + 1)
            return
        S.hunts += 1
        why = "on" if HUNT == "on" else "auto"
        if not _can_hunt():
            _send_big({"k": "hunt", "why": why, "dev": (_devices() or [0])[0], "t": time.time(),
                       "error": "torch %s has no memory history with Python stacks (2.1 or later has it)"
                       % getattr(S.torch, "__version__", "?")})
            return
        _hide_history()
        with OURS:
            S.hunt = _hunt_module().Hunt(S.torch, why, step, _devices(), _allocated(),
                                         "forwards" if clock is FWD else "steps")
        S.hunt.clock = clock
        clock[1] = min(clock[1], step + 1)


def _search(budget):
    """Runs the pending searches for at most `budget` seconds; those that end are sent."""
    end = time.perf_counter() + budget
    while S.searches:
        left = end - time.perf_counter()
        if left <= 0:
            return
        result, search, leaked = S.searches[0]
        if not search.run(left):
            return
        del S.searches[0]
        _send_big(_hunt_module().finish(result, search, leaked))


def _hunt_module():
    """_gpudoc_hunt.py, beside this file, loaded as this one is (by path, under its own name)."""
    if S.hunt_module is None:
        S.hunt_module = _load(S.here, *LATER[0])
    return S.hunt_module


# The shim's modules loaded later, on a step (_load): compiled at `import torch` (_precompile).
LATER = (("_gpudoc_hunt.py", "gpudoc._shim.hunt"), ("_gpudoc_where.py", "gpudoc._shim.where"))


def _precompile():
    """The shim's modules loaded later are compiled into their folder's __pycache__ now, at `import
    torch`, also under PYTHONDONTWRITEBYTECODE (which is about the program's files; this folder is
    gpudoc's; the start-up part's `cache`): loading one on a step reads its bytecode instead of compiling
    it (17 ms of the step that first loaded them). Nothing is run."""
    cache = globals().get("_cache")
    ext = sys.modules["_frozen_importlib_external"]
    for filename, name in LATER:
        try:
            loader = ext.SourceFileLoader(name, os.path.join(S.here, filename))
            code = loader.get_code(name)
            if sys.dont_write_bytecode and cache is not None:
                cache(loader, code)
        except Exception:
            pass


def _load(here, filename, name):
    """A module of the shim's, from its folder: compiled once into its __pycache__ where that can be
    written. Its __file__ is no real file's name, so coverage never measures it as the program's; its
    code keeps the real one, for tracebacks and profilers."""
    path = os.path.join(here, filename)
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader(name, path)
    code = loader.get_code(name)
    cache = globals().get("_cache")
    if sys.dont_write_bytecode and cache is not None:
        cache(loader, code)  # as _precompile's (the registry's module is loaded at every `import torch`)
    module = type(sys)(name)
    module.__file__ = "<gpudoc> " + path
    sys.modules[name] = module  # where Dynamo finds the globals of a function it traces
    exec(code, module.__dict__)
    return module


def _where(name, *args):
    """_gpudoc_where.py's `name`, called with this module (loaded at the first call, as the hunt's is).
    A failure is said once, and nothing more is measured."""
    try:
        if S.where_module is None:
            S.where_module = _load(S.here, *LATER[1])
        return getattr(S.where_module, name)(sys.modules[__name__], *args)
    except Exception as e:
        _where_failed(e)


def _where_failed(e):
    """Measuring failed (in _where, or in a hook of a Measure's): its hooks go, the failure is said once,
    and nothing more is measured."""
    S.measured, S.where_peak = True, 0
    if S.measuring:
        S.measuring = False
        _where("close")
    try:
        _send('{"k":"where","error":%s,"dev":%d,"t":%.6f' % (
            json.dumps("%s: %s" % (type(e).__name__, e)), (S.devices or [0])[0], time.time()))
    except Exception:
        pass


def _can_hunt():
    v = getattr(S.torch, "__version__", "0").split("+")[0].split(".")
    try:
        return (int(v[0]), int(v[1])) >= (2, 1)
    except (ValueError, IndexError):
        return False


def _hunt_failed(e):
    """A hunt that fails is said, and no other is tried; recording it started is stopped."""
    S.hunts = MAX_HUNTS
    hunt, S.hunt = S.hunt, None
    S.searches = []
    if hunt is not None:
        try:
            with OURS:
                S.torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass
    try:
        _send('{"k":"hunt","error":%s,"dev":%d,"t":%.6f' % (
            json.dumps("%s: %s" % (type(e).__name__, e)), (S.devices or [0])[0], time.time()))
    except Exception:
        pass


def _send_big(obj):
    """A message that may not fit one pipe write: written to a file beside the pipe, which gpudoc reads."""
    body = json.dumps(obj, separators=(",", ":"))[:-1]
    if len(body) + len(S.tail) < 4000:
        _send(body)
        return
    if CELL.copies is not None:
        _copy(body + S.tail)
    if S.dead or not S.pipe:
        return
    S.files += 1
    name = "hunt-%d-%d.json" % (os.getpid(), S.files)
    path = os.path.join(os.path.dirname(S.pipe), name)
    with open(path, "w") as f:
        f.write(body + S.tail)
    _send('{"k":"file","name":"%s"' % name)


def _watch_history(real):
    """torch._C's memory-history switch as the program calls it: a program that records history itself is
    left alone, and its history starts as it would without gpudoc (a window of gpudoc's still recording
    ends here, its events cleared, and that hunt is given up)."""

    def record_memory_history(*args, **kwargs):
        __tracebackhide__ = True
        if S.ours != get_ident():
            S.user_history = True
            if S.hunt is not None or S.where_history:
                _give_way()
        return real(*args, **kwargs)

    return record_memory_history


def _give_way():
    S.hunt = None
    S.where_history = False
    try:
        with OURS:
            _remember(S.torch.cuda.memory._snapshot())
            S.torch.cuda.memory._record_memory_history(enabled=None)
    except Exception:
        pass


def _hide_history():
    """From gpudoc's first recording on, the program's snapshots are shown as they would be without it."""
    if S.recorded:
        return
    S.recorded = True
    C = S.torch._C
    real = getattr(C, "_cuda_memorySnapshot", None)
    if real is not None:
        _patches().replace(C, "_cuda_memorySnapshot", _like(real, _watch_snapshot(real)),
                           "the program's snapshots without gpudoc's recording (once a hunt recorded)")


def _watch_snapshot(real):
    """torch._C's snapshot as the program takes it: without the frames gpudoc's recording attached to
    blocks and segments, and, while the program has never recorded history, without any events."""

    def memory_snapshot(*args, **kwargs):
        __tracebackhide__ = True
        snap = real(*args, **kwargs)
        if S.ours != get_ident():
            try:
                _forget(snap)
            except Exception:
                pass
        return snap

    return memory_snapshot


def _forget(snap):
    for seg in snap.get("segments", ()):
        _unframe(seg, "s", seg.get("address"))
        for b in seg.get("blocks", ()):
            _unframe(b, "b", b.get("address"))
    if not S.user_history and "device_traces" in snap:
        snap["device_traces"] = [[] for _ in snap["device_traces"]]


def _unframe(d, kind, address):
    frames = d.get("frames")
    if frames and (not S.user_history or S.our_frames.get((kind, address)) == frames):
        d["frames"] = []


def _remember(snap):
    """The frames gpudoc's recording left on live blocks and segments (a program that records history
    later still sees none of them)."""
    ours = {}
    for seg in snap.get("segments", ()):
        if seg.get("frames"):
            ours[("s", seg.get("address"))] = seg["frames"]
        for b in seg.get("blocks", ()):
            if b.get("frames"):
                ours[("b", b.get("address"))] = b["frames"]
    S.our_frames = ours


def _user_stats(device):
    """torch._C._cuda_memoryStats as the program sees it: peaks since its own last reset."""
    __tracebackhide__ = True
    stats = S.orig_stats(device)
    if _compiling is not None and _compiling():
        return stats
    held = S.held.get(device)
    if held:
        for path, peak in held.items():
            node = stats
            for k in path:
                node = node.get(k) if type(node) is dict else None
                if node is None:
                    break
            if type(node) is dict and peak > node.get("peak", 0):
                node["peak"] = peak
    return stats


def _user_reset(device):
    """torch._C._cuda_resetPeakMemoryStats as the program calls it: its view starts again; gpudoc's
    record in progress keeps what the reset erases."""
    __tracebackhide__ = True
    if _compiling is not None and _compiling():
        return S.orig_reset(device)
    try:
        stats = S.orig_stats(device)
        _fold(S.folded, device, stats)
        if CELL.open:
            _fold(CELL.erased, device, stats)
        S.held.pop(device, None)
    except Exception:
        pass
    return S.orig_reset(device)


def _fold(erased, device, stats):
    """Keeps in `erased` (a view's peaks that resets by others erased) the peaks a reset is about to erase."""
    before = erased.get(device, (0, 0))
    erased[device] = (
        max(before[0], _peak(stats, "allocated_bytes")),
        max(before[1], _peak(stats, "reserved_bytes")),
    )


def _on_oom(device, alloc, device_allocated, device_free):
    """PyTorch's OOM observer, called before the exception unwinds."""
    try:
        stats = S.orig_stats(device)
        _send('{"k":"oom","alloc":%d,"device_allocated":%d,"device_free":%d,"act":%s,%s%s' % (
            alloc, device_allocated, device_free, _activity(), _numbers(stats, device), _uuid(device)))
    except Exception as e:
        _fail("oom observer", e)
        return
    if WHERE != "off":
        _where("on_oom", device, _cur(stats, "allocated_bytes"))
    if HUNT == "off" or S.oom_hunts >= MAX_OOM_HUNTS:
        return
    S.oom_hunts += 1
    try:
        with OURS:
            result, search = _hunt_module().at_oom(S.torch, device, S.hunt, skip=(id(S),),
                                                   allocated=_cur(stats, "allocated_bytes"))
        S.searches.insert(0, (result, search, None))
        _search(OOM_S)
    except Exception as e:
        _hunt_failed(e)


def _on_cuda_init():
    """Runs once PyTorch has initialised CUDA (queued with torch.cuda._lazy_call). Never raises: an error
    here would surface in the program as a failed CUDA call."""
    try:
        torch = S.torch
        S.cuda = True
        try:
            torch._C._cuda_attach_out_of_memory_observer(_on_oom)
            _patches().callback("torch._C._cuda_attach_out_of_memory_observer",
                                "an OOM's numbers, before the exception unwinds")
        except Exception:
            pass  # no observer in this torch: the OOM text still reaches gpudoc
        _send('{"k":"hello","torch":%s,"budget":%s' % (
            json.dumps(getattr(torch, "__version__", "?")), BUDGET))
        if WHERE == "snapshot":
            _where("record")
    except Exception as e:
        _fail("cuda init", e)
        return
    _forward_clock_on(torch)
    if WHERE != "off" or HUNT != "off":
        _watch_eval(torch)


def _watch_eval(torch):
    """torch.nn.Module.train under gpudoc's wrapper, for the evaluation phase: an eval() (train(False)) on
    a module after optimizer steps have run is an evaluation's start (_evaluation). It runs at the
    program's train() and eval() calls only (once per submodule: torch's train() calls its children's),
    never on a step's path. The wrapper has torch's parameters (see _same_parameters)."""
    try:
        Module = torch.nn.modules.module.Module
        real = Module.__dict__["train"]
        wrapped = _same_parameters(real, _TRAIN, [0], _trained)
    except Exception:
        return
    _patches().replace(Module, "train", wrapped, "an eval() after optimizer steps starts an evaluation")


def _trained(args, kwargs, depth):
    """After the program's train(self, mode): the evaluation's start, or its end."""
    self, mode = args[0], args[1] if len(args) > 1 else kwargs.get("mode", True)
    try:
        if depth[0] == 0 and STEP[0] and not S.measuring and mode is False:
            _uncollected(lambda: _evaluation(self))
        elif depth[0] == 0 and mode is not False:
            if S.measuring:
                # train(): an evaluation's call armed that never came is given up (its hooks go).
                _where("give_up_call")
            if F.evaluating:
                # train(): the evaluation is over, and its forward clock with it (before the training
                # step's forward, which the step hook counts): the calls are counted from now on.
                _count_forwards()
    except Exception as e:
        _fail("evaluation", e)  # never the program's `eval()` that raises it


# The wrapper of Module.train, made with torch's own parameters ({params}: `self, mode`), so that what a
# program reads of it (inspect.signature, its defaults and annotations) is torch's, with no __wrapped__.
_TRAIN = """
def _make(_real, _depth, _after):
    def train({params}):
        __tracebackhide__ = True
        if _compiling is not None and _compiling():
            return _real({call})
        _depth[0] += 1
        try:
            return _real({call})
        except BaseException as e:
            _unframed(e)
            raise
        finally:
            _depth[0] -= 1
            _after({args}, {kwargs}, _depth)
    return train
"""


# The wrapper of torch.autograd.backward (see _watch_autograd), made with torch's own parameters as _TRAIN's
# is: it counts the backward calls and says when one runs.
_BACKWARD = """
def _make(_real):
    def backward({params}):
        __tracebackhide__ = True
        if _compiling is not None and _compiling():
            return _real({call})
        AUTOGRAD[0] += 1
        AUTOGRAD[1] += 1
        AUTOGRAD[4] = max(AUTOGRAD[4], FWD[0] - AUTOGRAD[2])
        PER_BACKWARD[min(FWD[0] - AUTOGRAD[2], 16)] += 1
        AUTOGRAD[2] = FWD[0]
        # A step that raised never ran its post-hook: a backward is a new step's.
        AUTOGRAD[3] = False
        try:
            return _real({call})
        except BaseException as e:
            _unframed(e)
            raise
        finally:
            AUTOGRAD[1] -= 1
    return backward
"""


def _same_parameters(real, template, *make):
    """A wrapper of the Python function `real` with its parameters (names, kinds, defaults, annotations),
    its name, module and doc, from `template`'s `_make(real, *make)`; its source is in linecache under a
    name of gpudoc's, for a traceback through it and inspect.getsource."""
    import linecache

    code = real.__code__
    n, k, names = code.co_argcount, code.co_kwonlyargcount, code.co_varnames
    pos, kw = list(names[:n]), list(names[n:n + k])
    star = names[n + k] if code.co_flags & 0x04 else None
    stars = names[n + k + bool(star)] if code.co_flags & 0x08 else None
    params = pos[:code.co_posonlyargcount] + (["/"] if code.co_posonlyargcount else []) \
        + pos[code.co_posonlyargcount:] + (["*" + star] if star else ["*"] if kw else []) + kw \
        + (["**" + stars] if stars else [])
    keywords = ["%s=%s" % (x, x) for x in kw] + (["**" + stars] if stars else [])
    call = pos + (["*" + star] if star else []) + keywords
    src = template.format(params=", ".join(params), call=", ".join(call),
                          args="(%s)" % "".join(x + ", " for x in pos) + (" + " + star if star else ""),
                          kwargs="dict(%s)" % ", ".join(keywords))
    filename = "<gpudoc's wrapper of %s.%s>" % (real.__module__, real.__qualname__)
    ns = {}
    exec(compile(src, filename, "exec"), globals(), ns)
    fn = _like(real, ns["_make"](real, *make))
    for key in ("__defaults__", "__kwdefaults__", "__annotations__", "__type_params__"):
        if hasattr(real, key):
            setattr(fn, key, getattr(real, key))
    fn.__dict__.update(real.__dict__)
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    return fn


def _evaluation(module):
    """The program's eval() on `module` after optimizer steps: its next call is measured (once per run,
    see arm_call), and the forward clock counts its calls until the next optimizer step, so that an
    evaluation that keeps what its calls make is hunted at them, as a program without steps is (the step
    hook, its clock, has stopped)."""
    if WHERE != "off":
        _where("arm_call", module, "evaluation")
    if HUNT == "off" or F.on or S.dead or S.hunt is not None or S.module_call is None \
            or STEP[0] < S.evaluated + WARMUP_STEPS:
        # A window of steps in progress ends with its steps; the clock never ran (see
        # _forward_clock_on); a program that calls eval() every few steps is training, not evaluating.
        return
    S.evaluated = STEP[0]
    counted = F.root() if F.counting and F.root is not None else None
    if counted is not module:
        # The calls counted are another module's: that count ends, this module's clock starts.
        _forward_clock_off()
    F.on = True
    if counted is not module and not _wrap(module):
        return
    F.evaluating = True
    # Its calls are the clock's again (records, a hunt at them), no longer only counted for an OOM's phase;
    # steps run from here on end it (see _on_forward).
    F.counting, F.step = False, STEP[0]
    # The evaluation's call is measured above: none of its calls is an inference program's.
    S.inferred = True
    FWD[1] = FWD[0] + 1


def _remember_model(module):
    """The outermost module, weakly, for its training flag at an OOM (see _activity)."""
    try:
        import weakref

        MODEL[0] = weakref.ref(module)
    except Exception:
        MODEL[0] = None


def _watch_autograd(torch):
    """torch.autograd.backward (which Tensor.backward calls) under a wrapper that counts the backward calls
    and says when one runs, and an optimizer step pre-hook that says when a step runs: what an OOM's
    phase is read from (_activity). Each costs a few list operations once per step, never per module."""
    try:
        autograd = torch.autograd
        wrapped = _same_parameters(autograd.backward, _BACKWARD)
    except Exception:
        return
    _patches().replace(autograd, "backward", wrapped, "counts backward calls, for an OOM's phase")
    S.backward_watched = True
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _patches().hook(register_optimizer_step_pre_hook(_on_step_start), "torch.optim global step pre-hook",
                        "says when an optimizer step runs, for an OOM's phase")
        S.step_watched = True
    except Exception:
        pass


def _on_step_start(optimizer, args, kwargs):
    """The optimizer's step pre-hook: a step runs until the post-hook (_on_step) or the next backward."""
    AUTOGRAD[3] = True


def _activity():
    """What the program was doing at an OOM, as JSON: grad mode and inference mode on the failing thread,
    a backward or an optimizer step running, the backward calls and optimizer steps so far, the forward
    clock's calls while it counts (all, those since the last backward's start, the most that ever
    preceded one backward, and the count most backwards had: a step may call its model more than once),
    and the outermost module's training flag. What the shim cannot tell is null: the phase is read from
    this (src/rules/phase.rs)."""
    torch, watched = S.torch, S.backward_watched
    out = {"bw": AUTOGRAD[1] > 0 if watched else None, "bws": AUTOGRAD[0] if watched else None,
           "opt": AUTOGRAD[3] if S.step_watched else None, "steps": STEP[0],
           "grad": None, "inf": None, "fwd": None, "fg": None, "fpb": None, "fps": None, "train": None}
    try:
        out["grad"] = bool(torch.is_grad_enabled())
        out["inf"] = bool(torch.is_inference_mode_enabled())
    except Exception:
        pass
    if F.on or F.counting:
        out["fwd"] = FWD[0]
        if watched:
            out["fg"] = FWD[0] - AUTOGRAD[2]
            out["fpb"] = AUTOGRAD[4]
            out["fps"] = _calls_per_step()
    try:
        model = MODEL[0]() if MODEL[0] is not None else None
        if model is not None:
            out["train"] = bool(model.training)
    except Exception:
        pass
    return json.dumps(out, separators=(",", ":"))


def _calls_per_step():
    """The count of forward calls that most backwards had before them (the larger on a tie: a step that
    calls its model twice and once in turn is counted at its most), 0 before the first backward."""
    if not any(PER_BACKWARD):
        return 0
    return max(range(len(PER_BACKWARD)), key=lambda n: (PER_BACKWARD[n], n))


def _on_exit():
    """A last record at exit: what the program holds at its end, and its peaks; a hunt in progress ends
    with the steps it recorded."""
    try:
        if S.cuda and not S.dead:
            _record(STEP[0], STEP[0] - S.last_step, "s")
    except Exception as e:
        _fail("exit", e)
        return
    try:
        if S.hunt is not None and S.hunt.clock[0] > S.hunt.from_step:
            _hunt_step(S.hunt.clock[0], S.hunt.clock, ending=True)
        _search(EXIT_S)
        # What the searches left found in the time they had.
        for result, search, leaked in S.searches:
            _send_big(_hunt_module().finish(result, search, leaked))
        S.searches = []
    except Exception as e:
        _hunt_failed(e)


def _on_fork():
    """A forked child is a process of its own: its own messages, its own descriptor, its own steps."""
    try:
        if S.fd is not None and _still_ours():
            os.close(S.fd)
    except OSError:
        pass
    S.fd = S.fd_id = None
    STEP[0], STEP[1] = 0, 1
    FWD[0], FWD[1] = 0, 1
    AUTOGRAD[:] = [0, 0, 0, False, 0]
    F.last_step = F.records = 0
    F.period = F.cost = F.last_cost = 0.0
    S.last_step = S.records = 0
    S.devices = None
    S.growth = {}
    S.hunt = None
    S.searches = []
    S.hunts = S.oom_hunts = S.files = S.evaluated = 0
    _identify()


def _install_peaks(torch):
    """torch and its statistics' functions; the program's view of the peaks kept over gpudoc's resets."""
    global _compiling
    S.torch = torch
    _compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    _identify()
    C = torch._C
    S.orig_stats = C._cuda_memoryStats
    S.orig_reset = C._cuda_resetPeakMemoryStats
    if S.reset_peaks:
        patches = _patches()
        patches.replace(C, "_cuda_memoryStats", _like(S.orig_stats, _user_stats),
                        "the program's peaks kept over gpudoc's resets (not with --keep-torch-peaks)")
        patches.replace(C, "_cuda_resetPeakMemoryStats", _like(S.orig_reset, _user_reset),
                        "the program's reset of its peaks keeps gpudoc's (not with --keep-torch-peaks)")


def _install(torch):
    """Puts the hooks in place once torch is imported."""
    _install_peaks(torch)
    if HUNT != "off" or WHERE != "off":
        _precompile()
    C = torch._C
    if HUNT != "off":
        for name in ("_cuda_record_memory_history", "_cuda_record_memory_history_legacy",
                     "_cuda_recordMemoryHistory"):
            if hasattr(C, name):
                real = getattr(C, name)
                _patches().replace(C, name, _like(real, _watch_history(real)),
                                   "a program that records memory history itself is left alone")
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _patches().hook(register_optimizer_step_post_hook(_on_step), *STEP_HOOK)
    except Exception:
        pass  # torch < 2.0: no global step hook; init, OOM and exit are still seen
    _watch_autograd(torch)
    _lazy_cuda_init(torch)
    import atexit

    atexit.register(_on_exit)
    _patches().callback("atexit", "the last record at exit", lambda: atexit.unregister(_on_exit))
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_on_fork)
        _patches().callback("os.register_at_fork", "a forked child's messages are its own")
    # A notebook kernel: each cell's numbers, so the report can say which cell ran out or peaked.
    shell = _ipython()
    if shell is not None:
        watch_cells(shell)


def _lazy_cuda_init(torch):
    """_on_cuda_init queued for CUDA's start (run once, then gone from torch's queue)."""
    torch.cuda._lazy_call(_on_cuda_init)
    _patches().callback("torch.cuda._lazy_call", "the allocator's first reading at CUDA's start")


# The registry every change of the shim's goes through (_gpudoc_patch.py, loaded by _patches).
PATCH = ("_gpudoc_patch.py", "gpudoc._shim.patch")
_REGISTRY = []
# The step hook as the registry lists it (the run's _on_step, or the notebook's _attached_step).
STEP_HOOK = ("torch.optim global step post-hook", "the allocator's record every Nth optimizer step")


def _patches():
    """The registry of what the shim changes in the process (_gpudoc_patch.py's PATCHES)."""
    if not _REGISTRY:
        _REGISTRY.append(_load(S.here, *PATCH).PATCHES)
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


def _after_import(module, finder):
    """torch's module has run: the hooks go in, and the finder that waited for it leaves sys.meta_path."""
    try:
        for i, f in enumerate(sys.meta_path):
            if f is finder:
                del sys.meta_path[i]
                break
        _install(module)
    except Exception as e:
        _fail("start", e)


# The loader's methods run torch's module through these; their frames are importlib's own to Python, so a
# failing `import torch` shows the program exactly the traceback it would without gpudoc. torch's spec
# and module get their own loader back before any of torch's code runs.
_HIDDEN_EXEC = """
def _call_with_frames_removed(real, spec, after, module):
    wrapper, spec.loader = spec.loader, real
    if getattr(module, "__loader__", None) is wrapper:
        module.__loader__ = real
    real.exec_module(module)
    after(module)
"""
_HIDDEN_LOAD = """
def _call_with_frames_removed(real, spec, after, fullname):
    spec.loader = real
    module = real.load_module(fullname)
    after(module)
    return module
"""
_HIDDEN_CREATE = """
def _call_with_frames_removed(real, spec):
    return real.create_module(spec)
"""


def _hidden(src):
    ns = {}
    exec(compile(src, "<frozen importlib._bootstrap>", "exec"), ns)
    return ns["_call_with_frames_removed"]


class TorchLoader(object):
    """gpudoc's, in torch's spec only while `import torch` runs: it hands torch's own loader (an object,
    a class, anything) back, runs torch's module with it and then puts gpudoc's hooks in place. Nothing
    of the loader's is changed."""

    def __init__(self, real, spec, after):
        if hasattr(real, "exec_module"):
            self.exec_module = functools.partial(_hidden(_HIDDEN_EXEC), real, spec, after)
            if hasattr(real, "create_module"):
                self.create_module = functools.partial(_hidden(_HIDDEN_CREATE), real)
        else:
            self.load_module = functools.partial(_hidden(_HIDDEN_LOAD), real, spec, after)


def find_spec(finder, name, path, target, here, setting):
    """GpudocFinder's answer when the program imports torch: the spec the finders after it give, with
    TorchLoader in it. `setting` is GPUDOC_TORCH:
    `hunt=MODE;peaks=reset|keep;where=on|snapshot|off;warmup=STEPS;pipe=PATH`."""
    global HUNT, WHERE, WARMUP_STEPS
    # The pipe's path is last and may hold any character.
    head, _, pipe = setting.partition("pipe=")
    conf = dict(part.partition("=")[::2] for part in head.split(";") if part)
    S.pipe, S.here = pipe, here
    S.reset_peaks = conf.get("peaks") != "keep"
    HUNT = conf.get("hunt", "auto")
    WHERE = conf.get("where", "on")
    if conf.get("warmup", "").isdigit():
        WARMUP_STEPS = int(conf["warmup"])
    finders = list(sys.meta_path)
    mine = [i for i, f in enumerate(finders) if f is finder]
    finder.busy = True
    try:
        for f in finders[mine[0] + 1 if mine else 0:]:
            if getattr(f, "_gpudoc", False) or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is None:
                continue
            loader = spec.loader
            if hasattr(loader, "exec_module") or hasattr(loader, "load_module"):
                spec.loader = TorchLoader(loader, spec, lambda module: _after_import(module, finder))
            return spec
        return None
    finally:
        finder.busy = False


# -- notebook cells (IPython's callbacks; docs/notebook.md) ----------------------------------------
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
# Messages kept for the notebook extension between two of its reads, at most.
MAX_COPIES = 256


def _copy(line):
    """Keeps a message for the notebook extension (not the pointer to a file: the message itself)."""
    if not line.startswith('{"k":"file"'):
        CELL.copies.append(line)
        if len(CELL.copies) > 2 * MAX_COPIES:
            del CELL.copies[:-MAX_COPIES]


def cell_start(info=None, fresh=False, t0=None):
    """IPython's pre_run_cell: the allocator now, and its peaks start again for the cell (the program's
    view and the step record in progress keep what the reset erases). Twice for one cell is once.
    `fresh`: the cell started before torch was imported (all torch holds is the cell's; its counters
    count from then), at `t0`."""
    __tracebackhide__ = True
    try:
        key = info if info is _ANY else id(info)
        if CELL.open and (CELL.key == key or key is _ANY):
            return  # this cell's start was seen (by gpudoc run's hook, when the extension comes later)
        if CELL.open and getattr(info, "store_history", True) is False:
            # A cell the running cell runs (%%capture's body; IPython numbers it as the next cell): it is
            # part of the running cell, which its end does not close.
            CELL.nested = CELL.nested | {key}
            return
        CELL.open, CELL.key, CELL.t0 = True, key, time.time() if t0 is None else t0
        CELL.start, CELL.erased = {}, {}
        if fresh or not S.cuda or S.torch is None:
            return
        # The devices in use as the last cell's end found them: one that gets its first allocation in
        # this cell had nothing before it, which its end record says. A start that went by unseen (the
        # extension loading) may come after cells no callback saw: the devices are read again.
        if key is _ANY:
            S.devices = None
        for d in S.devices if S.devices is not None else _devices():
            stats = S.orig_stats(d)
            a, r = _cur(stats, "allocated_bytes"), _cur(stats, "reserved_bytes")
            CELL.start[d] = (a, r, _peak(stats, "allocated_bytes"), _peak(stats, "reserved_bytes"))
            if S.reset_peaks:
                _keep(d, stats)
                _fold(S.folded, d, stats)
                S.orig_reset(d)
    except KeyboardInterrupt:
        # An interrupt during gpudoc's callback drops its work, silently: raised, IPython would print it as
        # the callback's error and make it the last exception (%tb, %debug) in place of the user's.
        CELL.open = False
    except Exception as e:
        _fail("cell start", e)


def cell_end(result=None):
    """IPython's post_run_cell: one record per device in use, the allocator now, at the cell's start and
    its peaks inside the cell; returned too (a list of dicts), for the notebook extension. Twice for one
    cell gives the same records; a cell whose start was not seen (the hooks came during it) gives none."""
    __tracebackhide__ = True
    try:
        info = getattr(result, "info", None)
        key = id(info)
        if key in CELL.nested:
            CELL.nested = CELL.nested - {key}
            return []
        if CELL.ended == key and not CELL.open:
            return CELL.last
        if not CELL.open or CELL.key not in (key, _ANY):
            CELL.open = False
            return []
        CELL.open, CELL.ended, CELL.last = False, key, []
        n = getattr(result, "execution_count", None)
        if n is None or not S.cuda or S.torch is None or S.dead and CELL.copies is None:
            return CELL.last
        ok = 1 if getattr(result, "success", True) else 0
        cell = getattr(info, "cell_id", None) or getattr(info, "raw_cell", None) or ""
        src = _first_line(getattr(info, "raw_cell", None) or "")
        for d, stats in _in_use():
            CELL.last.append(_cell_record(d, stats, n, ok, cell, src))
        return CELL.last
    except KeyboardInterrupt:
        return []  # as in cell_start
    except Exception as e:
        _fail("cell end", e)
        return []


def _in_use():
    """(device, its statistics) for each device this process has allocated on, read once; the devices'
    list is renewed."""
    found = []
    for d in range(S.torch.cuda.device_count()):
        stats = S.orig_stats(d)
        if stats.get("num_device_alloc", 0):
            found.append((d, stats))
    S.devices = [d for d, _ in found]
    return found


def _cell_record(d, stats, n, ok, cell, src):
    # A device not in use at the start had nothing allocated, and its counters count from then.
    a0, r0, pa0, pr0 = CELL.start.get(d, (0, 0, 0, 0))
    fold = CELL.erased.pop(d, (0, 0))
    peaks = max(_peak(stats, "allocated_bytes"), fold[0]), max(_peak(stats, "reserved_bytes"), fold[1])
    if not S.reset_peaks and d in CELL.start:
        # Counters never reset (--keep-torch-peaks): a peak that rose in the cell is the cell's; one that
        # did not says nothing of it.
        peaks = peaks[0] if peaks[0] > pa0 else None, peaks[1] if peaks[1] > pr0 else None
    ident = "%08x" % (hash(cell) & 0xFFFFFFFF)
    # Every cell record names its device's UUID: a report of a few cells must find the GPU without the
    # process's first message.
    _uuid(d)
    uuid = ',"uuid":"%s"' % S.uuids[d] if S.uuids.get(d) else ""
    _send('{"k":"cell","n":%d,"ok":%d,"id":"%s","src":%s,"t0":%.6f,"a0":%d,"r0":%d,%s%s' % (
        n, ok, ident, json.dumps(src), CELL.t0, a0, r0, _numbers(stats, d, peaks), uuid))
    return {"n": n, "ok": ok, "id": ident, "src": src, "dev": d, "t0": CELL.t0, "t": time.time(),
            "a0": a0, "r0": r0, "a": _cur(stats, "allocated_bytes"), "r": _cur(stats, "reserved_bytes"),
            "pa": peaks[0], "pr": peaks[1], "uuid": S.uuids.get(d)}


# Line magics that run the rest of their line as the cell's code: a cell's first line of code may be one.
_CODE_MAGICS = ("%time ", "%timeit ", "%prun ", "%run ")


def _first_line(text):
    """A cell's name: its first line of code; a comment, a cell magic's line (%%gpudoc, %%capture) and a
    line magic that runs none of the cell's code (%load_ext) are none."""
    for line in text.splitlines():
        line = line.strip()
        if line and (not line.startswith(("#", "%")) or line.startswith(_CODE_MAGICS)):
            return line[:60]
    return ""


def watch_cells(shell):
    """Registers cell_start and cell_end with IPython's `shell` (once, whoever asks). The cell running
    now, if one is (torch imported in it), is recorded from now: torch's memory all came in it."""
    events = getattr(shell, "events", None)
    if events is None or CELL.hooked:
        return
    for event, fn in (("pre_run_cell", cell_start), ("post_run_cell", cell_end)):
        events.register(event, fn)
        _patches().callback("IPython %s event" % event, "a notebook's cells (docs/notebook.md)",
                            functools.partial(events.unregister, event, fn))
    CELL.hooked = True
    if not CELL.open:
        cell_start(_ANY, fresh=True)


# The key of a cell whose start was not seen: its end, whichever it is, closes it.
_ANY = object()
UNSEEN = _ANY


def _ipython():
    """IPython's shell in this process, if one runs (read from its class: nothing is imported)."""
    mod = sys.modules.get("IPython.core.interactiveshell")
    cls = getattr(mod, "InteractiveShell", None)
    try:
        return cls.initialized() and cls.instance() or None
    except Exception:
        return None


def _attached_step(optimizer, args, kwargs):
    """The step hook without gpudoc run: _on_step stops recording once the pipe is gone (S.dead), and
    here there is none; its records go to the extension's copy (_send marks it gone again, cheaply)."""
    __tracebackhide__ = True
    dead, S.dead = S.dead, False
    try:
        _on_step(optimizer, args, kwargs)
    finally:
        S.dead = dead


# -- the notebook extension's API (notebook.py calls these, and nothing else of the shim's) ---------------
# The version of this API; a kernel whose shim (gpudoc run's) speaks another is told so. UNSEEN, cell_start
# and cell_end (above) are part of it.
API = 1


def attach(torch, here, hunts=False):
    """For the notebook extension in a kernel gpudoc run did not start (no pipe): the peaks' wrappers,
    the OOM observer and the step hook, no exit or fork callback; the messages go to the extension's
    copy only (keep_messages). `hunts`: leak hunts at the steps (off: they would record the allocator's
    history in the user's kernel, unasked; what filled the GPU at an OOM is still searched)."""
    S.pipe, S.here = "", here
    if not hunts:
        S.hunts = MAX_HUNTS
    _install_peaks(torch)
    # The optimizer's steps: where an OOM falls among them (training, or an evaluation after it) is read
    # from their records, as in a run.
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        _patches().hook(register_optimizer_step_post_hook(_attached_step), *STEP_HOOK)
    except Exception:
        pass
    # What the program is doing at an OOM (its phase), as in a run.
    _watch_autograd(torch)
    if torch.cuda.is_initialized():
        _on_cuda_init()
    else:
        _lazy_cuda_init(torch)


def keep_messages():
    """From now on every message the shim sends is also kept for take_messages (at most 2 * MAX_COPIES
    between two calls)."""
    if CELL.copies is None:
        CELL.copies = []


def take_messages():
    """The messages sent since the last call (dicts, oldest first; a message too large for the pipe is
    kept whole, not as the pointer to its file)."""
    if CELL.copies is None:
        return []
    taken, CELL.copies[:] = list(CELL.copies), []
    out = []
    for line in taken:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def close_cell():
    """The running cell's end will not be seen (the extension unloaded in it): it is over."""
    CELL.open = False


def cuda_ready():
    """Whether torch has initialised CUDA in this process (and the shim has seen it)."""
    return bool(S.cuda)


def allocator():
    """(device, allocated bytes, reserved bytes) for each device this process has allocated on."""
    return [(d, _cur(st, "allocated_bytes"), _cur(st, "reserved_bytes")) for d, st in _in_use()]


def search(device, budget, enough=None, value=None, skip=()):
    """What holds tensors on `device`, searched for at most `budget` CPU seconds from the notebook's names
    (its variables, its output cache, the last traceback's frames) or, given `value`, from that object alone;
    `enough`: the device's live bytes, when the names that hold them all are enough. The hunt's Search:
    its `names()`, `total(kind)`, `unreached(allocated)` and `storages` say what it found; `done`, whether
    it searched everything. `skip`: ids of the caller's objects, never holders."""
    hunt = _hunt_module()
    skip = tuple(skip) + (id(S),)
    roots = None
    if value is not None:
        box = {"value": value}
        root = hunt._Root("m", ("m", id(box)), "value", obj=box)

        def roots(skip):
            return [root]
    s = hunt.Search(S.torch, device, None, skip=skip, roots=roots)
    s.enough = enough
    # The budget is the notebook thread's CPU time: on a loaded machine a cell waits longer, and finds
    # what it would have found on an idle one.
    s.clock = getattr(time, "thread_time", time.perf_counter)
    s.run(budget)
    return s


def traceback_frames():
    """The frames of a traceback a search walks, at most (the innermost past them are not searched)."""
    return _hunt_module().MAX_TB_FRAMES
