"""The program's own view of the allocator's peaks: gpudoc resets them at each record, and the program
reads them (torch.cuda.max_memory_allocated) as if nobody but itself ever had.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

# The names of the module's other parts this one uses, for the linters (at run time they are this
# module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (S, _compiling)
    from gpudoc._shim._gpudoc_torch_pipe import _peak
    from gpudoc._shim._gpudoc_torch_cells import CELL


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
