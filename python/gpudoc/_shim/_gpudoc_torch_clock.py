"""The forward clock, for a program without optimizer steps (inference, serving, an evaluation): the
outermost module's calls, counted through its class's `__call__`, are its steps. The pace of the records
at either clock (_covered, _paced: the step hook's too).

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import sys
import time

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (ADAPT_AFTER, BUDGET, F, FWD, HUNT, MAX_STRIDE, MIN_FORWARD_S,
        MODEL, RERAISE_OWN_TRACEBACK, S, STEP, TRACED, WARMUP_STEPS, WHERE, _compiling, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_fail, _uncollected)
    from gpudoc._shim._gpudoc_torch_peaks import _record
    from gpudoc._shim._gpudoc_torch_leaks import (_hunt_tick, _where)


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
    if S.out.dead or not S.cuda:
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


def _remember_model(module):
    """The outermost module, weakly, for its training flag at an OOM (see _activity)."""
    try:
        import weakref

        MODEL[0] = weakref.ref(module)
    except Exception:
        MODEL[0] = None


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


# -- the records' pace, at either clock (STEP and S, FWD and F) -------------------------------------------
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
