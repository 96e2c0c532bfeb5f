"""The notebook extension's API: notebook.py calls these, and nothing else of the shim's (its `ShimApi`).
UNSEEN, cell_start and cell_end (_gpudoc_torch_cells.py) are part of it.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import json
import time

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (CELL, MAX_HUNTS, S, STEP_HOOK, _hunt_module, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_connect, _cur)
    from gpudoc._shim._gpudoc_torch_phase import _watch_autograd
    from gpudoc._shim._gpudoc_torch_events import _on_cuda_init
    from gpudoc._shim._gpudoc_torch_cells import (_attached_step, _in_use)
    from gpudoc._shim._gpudoc_torch_start import (_install_peaks, _lazy_cuda_init)


# -- the notebook extension's API (notebook.py calls these, and nothing else of the shim's) ---------------
# The version of this API; a kernel whose shim (gpudoc run's) speaks another is told so. UNSEEN, cell_start
# and cell_end (above) are part of it.
API = 1


def attach(torch, here, hunts=False):
    """For the notebook extension in a kernel gpudoc run did not start (no pipe): the peaks' wrappers,
    the OOM observer and the step hook, no exit or fork callback; the messages go to the extension's
    copy only (keep_messages). `hunts`: leak hunts at the steps (off: they would record the allocator's
    history in the user's kernel, unasked; what filled the GPU at an OOM is still searched)."""
    _connect("")
    S.here = here
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
