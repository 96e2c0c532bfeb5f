"""The events the shim answers outside steps: CUDA's start (the first reading, the OOM observer), an
out-of-memory failure (its numbers before the exception unwinds, the where-walk, what filled the GPU),
the program's exit, and a fork.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import json

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (AUTOGRAD, BUDGET, EXIT_S, F, FWD, HUNT, MAX_OOM_HUNTS, OOM_S,
        OURS, S, STEP, WHERE, _hunt_module, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_cur, _fail, _numbers, _send, _send_big, _uuid)
    from gpudoc._shim._gpudoc_torch_peaks import _record
    from gpudoc._shim._gpudoc_torch_leaks import (_hunt_failed, _hunt_step, _search, _where)
    from gpudoc._shim._gpudoc_torch_clock import _forward_clock_on
    from gpudoc._shim._gpudoc_torch_phase import (_activity, _watch_eval)


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


def _on_exit():
    """A last record at exit: what the program holds at its end, and its peaks; a hunt in progress ends
    with the steps it recorded."""
    try:
        if S.cuda and not S.out.dead:
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
    S.out.forked()
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
