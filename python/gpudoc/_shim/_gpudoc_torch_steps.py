"""The step hook (the optimizer's global step post-hook): most steps only count; every Nth is a record, N
chosen from the shim's measured cost so that records take under BUDGET of the step time.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import time

# The names of the module's other parts this one uses, for the linters (at run time they are this
# module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (ADAPT_AFTER, AUTOGRAD, BUDGET, F, HUNT, MAX_REMEASURES,
        MAX_STRIDE, REMEASURE_ABOVE, S, SLICE_EVERY, SLICE_S, STEP, WARMUP_STEPS, WHERE, _compiling, _where)
    from gpudoc._shim._gpudoc_torch_pipe import (_devices, _fail, _record, _uncollected)
    from gpudoc._shim._gpudoc_torch_clock import _count_forwards
    from gpudoc._shim._gpudoc_torch_leaks import (_hunt_failed, _hunt_step, _search)


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
    if S.out.dead or not S.cuda:
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
