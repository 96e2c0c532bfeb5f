"""The step hook (the optimizer's global step post-hook): most steps only count; every Nth is a record, N
chosen from the shim's measured cost so that records take under BUDGET of the step time.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import time

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (AUTOGRAD, F, MAX_REMEASURES, REMEASURE_ABOVE, S, STEP,
        WARMUP_STEPS, WHERE, _compiling)
    from gpudoc._shim._gpudoc_torch_pipe import (_devices, _fail, _uncollected)
    from gpudoc._shim._gpudoc_torch_peaks import _record
    from gpudoc._shim._gpudoc_torch_leaks import _where
    from gpudoc._shim._gpudoc_torch_clock import (_count_forwards, _covered, _paced)


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
