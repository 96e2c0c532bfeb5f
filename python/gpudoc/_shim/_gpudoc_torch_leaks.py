"""Leak hunts: a window of memory-history recording when allocated memory grows record after record (the
search itself is _gpudoc_hunt.py, loaded when a hunt starts), and the program's own memory history and
snapshots left as they would be without gpudoc; the calls into where the memory went (_gpudoc_where.py,
loaded at its first), which records memory history too.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import json
import sys
import time
from _thread import get_ident

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (FWD, GROWTH_BYTES, GROWTH_RECORDS, GROWTH_RISES, HUNT, LATER,
        MAX_HUNTS, OURS, S, SHARED, SLICE_EVERY, SLICE_S, STEP, WARMUP_STEPS, _hunt_module, _like, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_devices, _send, _send_big)


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


# -- where the memory went (_gpudoc_where.py) -----------------------------------------------------------
def _where(name, *args):
    """_gpudoc_where.py's `name`, called with this module (loaded at the first call, as the hunt's is).
    A failure is said once, and nothing more is measured."""
    try:
        if S.where_module is None:
            S.where_module = SHARED.load(S.here, *LATER[1])
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
