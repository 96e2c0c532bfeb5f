"""Putting the shim in place at `import torch`: GpudocFinder's spec (find_spec) hands torch's own loader
back (_gpudoc_pipe.py's spec_after), and once torch's module has run, _install puts every hook in place
(through the registry).

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import os

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (HUNT, S, SHARED, STEP_HOOK, WHERE, _like, _patches,
        _precompile, _readable_parts)
    from gpudoc._shim._gpudoc_torch_pipe import (_connect, _fail)
    from gpudoc._shim._gpudoc_torch_peaks import (_user_reset, _user_stats)
    from gpudoc._shim._gpudoc_torch_leaks import _watch_history
    from gpudoc._shim._gpudoc_torch_steps import _on_step
    from gpudoc._shim._gpudoc_torch_phase import _watch_autograd
    from gpudoc._shim._gpudoc_torch_events import (_on_cuda_init, _on_exit, _on_fork)
    from gpudoc._shim._gpudoc_torch_cells import (_ipython, watch_cells)


def _install_peaks(torch):
    """torch and its statistics' functions; the program's view of the peaks kept over gpudoc's resets."""
    global _compiling
    S.torch = torch
    _readable_parts(S.here)
    _compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    S.out.identify()
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


def _after_import(module, finder):
    """torch's module has run: the hooks go in. The finder that waited for it stays in sys.meta_path for
    the other frameworks (a program may import jax after torch), and answers torch's import no more."""
    try:
        finder.done = ("torch",)
        _install(module)
    except Exception as e:
        _fail("start", e)


def find_spec(finder, name, path, target, here, setting):
    """GpudocFinder's answer when the program imports torch: the spec the finders after it give, whose
    loader runs _after_import once torch's module has run. `setting` is GPUDOC_TORCH:
    `hunt=MODE;peaks=reset|keep;where=on|snapshot|off;warmup=STEPS;pipe=PATH`."""
    global HUNT, WHERE, WARMUP_STEPS
    # The pipe's path is last and may hold any character.
    head, _, pipe = setting.partition("pipe=")
    conf = dict(part.partition("=")[::2] for part in head.split(";") if part)
    _connect(pipe)
    S.here = here
    S.reset_peaks = conf.get("peaks") != "keep"
    HUNT = conf.get("hunt", "auto")
    WHERE = conf.get("where", "on")
    if conf.get("warmup", "").isdigit():
        WARMUP_STEPS = int(conf["warmup"])
    return SHARED.spec_after(finder, name, path, target, lambda module: _after_import(module, finder))
