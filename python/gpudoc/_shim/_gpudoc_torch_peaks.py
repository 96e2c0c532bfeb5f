"""The records of the allocator and its peaks: a record per device in use (_record), whose peaks are over
the steps since the last, as gpudoc resets them at each; the program's own view of them, which it reads
(torch.cuda.max_memory_allocated) as if nobody but itself ever had.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (CELL, F, GROWTH_WINDOW, S, _compiling)
    from gpudoc._shim._gpudoc_torch_pipe import (_cur, _devices, _numbers, _peak, _send, _uuid)


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
