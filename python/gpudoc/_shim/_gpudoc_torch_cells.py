"""Notebook cells (IPython's pre_run_cell and post_run_cell; docs/notebook.md): the allocator at each
cell's start and end, and its peaks inside the cell.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import functools
import json
import sys
import time

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (CELL, S, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_cur, _devices, _fail, _numbers, _peak, _send, _uuid)
    from gpudoc._shim._gpudoc_torch_peaks import (_fold, _keep)
    from gpudoc._shim._gpudoc_torch_steps import _on_step


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
        if n is None or not S.cuda or S.torch is None or S.out.dead and CELL.copies is None:
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
    """The step hook without gpudoc run: _on_step stops recording once the pipe is gone (S.out.dead), and
    here there is none; its records go to the extension's copy (_send marks it gone again, cheaply)."""
    __tracebackhide__ = True
    dead, S.out.dead = S.out.dead, False
    try:
        _on_step(optimizer, args, kwargs)
    finally:
        S.out.dead = dead
