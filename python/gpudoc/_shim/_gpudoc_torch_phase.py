"""What the program is doing, for an OOM's phase and for the evaluation clock: backward calls (a wrapper of
torch.autograd.backward), optimizer steps running (a step pre-hook), eval() and train() (a wrapper of
Module.train).

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import json

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (AUTOGRAD, F, FWD, HUNT, MODEL, PER_BACKWARD, S, STEP,
        WARMUP_STEPS, WHERE, _like, _patches)
    from gpudoc._shim._gpudoc_torch_pipe import (_fail, _uncollected)
    from gpudoc._shim._gpudoc_torch_leaks import _where
    from gpudoc._shim._gpudoc_torch_clock import (_count_forwards, _forward_clock_off, _wrap)


def _watch_eval(torch):
    """torch.nn.Module.train under gpudoc's wrapper, for the evaluation phase: an eval() (train(False)) on
    a module after optimizer steps have run is an evaluation's start (_evaluation). It runs at the
    program's train() and eval() calls only (once per submodule: torch's train() calls its children's),
    never on a step's path. The wrapper has torch's parameters (see _same_parameters)."""
    try:
        Module = torch.nn.modules.module.Module
        real = Module.__dict__["train"]
        wrapped = _same_parameters(real, _TRAIN, [0], _trained)
    except Exception:
        return
    _patches().replace(Module, "train", wrapped, "an eval() after optimizer steps starts an evaluation")


def _trained(args, kwargs, depth):
    """After the program's train(self, mode): the evaluation's start, or its end."""
    self, mode = args[0], args[1] if len(args) > 1 else kwargs.get("mode", True)
    try:
        if depth[0] == 0 and STEP[0] and not S.measuring and mode is False:
            _uncollected(lambda: _evaluation(self))
        elif depth[0] == 0 and mode is not False:
            if S.measuring:
                # train(): an evaluation's call armed that never came is given up (its hooks go).
                _where("give_up_call")
            if F.evaluating:
                # train(): the evaluation is over, and its forward clock with it (before the training
                # step's forward, which the step hook counts): the calls are counted from now on.
                _count_forwards()
    except Exception as e:
        _fail("evaluation", e)  # never the program's `eval()` that raises it


# The wrapper of Module.train, made with torch's own parameters ({params}: `self, mode`), so that what a
# program reads of it (inspect.signature, its defaults and annotations) is torch's, with no __wrapped__.
_TRAIN = """
def _make(_real, _depth, _after):
    def train({params}):
        __tracebackhide__ = True
        if _compiling is not None and _compiling():
            return _real({call})
        _depth[0] += 1
        try:
            return _real({call})
        except BaseException as e:
            _unframed(e)
            raise
        finally:
            _depth[0] -= 1
            _after({args}, {kwargs}, _depth)
    return train
"""


# The wrapper of torch.autograd.backward (see _watch_autograd), made with torch's own parameters as _TRAIN's
# is: it counts the backward calls and says when one runs.
_BACKWARD = """
def _make(_real):
    def backward({params}):
        __tracebackhide__ = True
        if _compiling is not None and _compiling():
            return _real({call})
        AUTOGRAD[0] += 1
        AUTOGRAD[1] += 1
        AUTOGRAD[4] = max(AUTOGRAD[4], FWD[0] - AUTOGRAD[2])
        PER_BACKWARD[min(FWD[0] - AUTOGRAD[2], 16)] += 1
        AUTOGRAD[2] = FWD[0]
        # A step that raised never ran its post-hook: a backward is a new step's.
        AUTOGRAD[3] = False
        try:
            return _real({call})
        except BaseException as e:
            _unframed(e)
            raise
        finally:
            AUTOGRAD[1] -= 1
    return backward
"""


def _same_parameters(real, template, *make):
    """A wrapper of the Python function `real` with its parameters (names, kinds, defaults, annotations),
    its name, module and doc, from `template`'s `_make(real, *make)`; its source is in linecache under a
    name of gpudoc's, for a traceback through it and inspect.getsource."""
    import linecache

    code = real.__code__
    n, k, names = code.co_argcount, code.co_kwonlyargcount, code.co_varnames
    pos, kw = list(names[:n]), list(names[n:n + k])
    star = names[n + k] if code.co_flags & 0x04 else None
    stars = names[n + k + bool(star)] if code.co_flags & 0x08 else None
    params = pos[:code.co_posonlyargcount] + (["/"] if code.co_posonlyargcount else []) \
        + pos[code.co_posonlyargcount:] + (["*" + star] if star else ["*"] if kw else []) + kw \
        + (["**" + stars] if stars else [])
    keywords = ["%s=%s" % (x, x) for x in kw] + (["**" + stars] if stars else [])
    call = pos + (["*" + star] if star else []) + keywords
    src = template.format(params=", ".join(params), call=", ".join(call),
                          args="(%s)" % "".join(x + ", " for x in pos) + (" + " + star if star else ""),
                          kwargs="dict(%s)" % ", ".join(keywords))
    filename = "<gpudoc's wrapper of %s.%s>" % (real.__module__, real.__qualname__)
    ns = {}
    exec(compile(src, filename, "exec"), globals(), ns)
    fn = _like(real, ns["_make"](real, *make))
    for key in ("__defaults__", "__kwdefaults__", "__annotations__", "__type_params__"):
        if hasattr(real, key):
            setattr(fn, key, getattr(real, key))
    fn.__dict__.update(real.__dict__)
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    return fn


def _evaluation(module):
    """The program's eval() on `module` after optimizer steps: its next call is measured (once per run,
    see arm_call), and the forward clock counts its calls until the next optimizer step, so that an
    evaluation that keeps what its calls make is hunted at them, as a program without steps is (the step
    hook, its clock, has stopped)."""
    if WHERE != "off":
        _where("arm_call", module, "evaluation")
    if HUNT == "off" or F.on or S.out.dead or S.hunt is not None or S.module_call is None \
            or STEP[0] < S.evaluated + WARMUP_STEPS:
        # A window of steps in progress ends with its steps; the clock never ran (see
        # _forward_clock_on); a program that calls eval() every few steps is training, not evaluating.
        return
    S.evaluated = STEP[0]
    counted = F.root() if F.counting and F.root is not None else None
    if counted is not module:
        # The calls counted are another module's: that count ends, this module's clock starts.
        _forward_clock_off()
    F.on = True
    if counted is not module and not _wrap(module):
        return
    F.evaluating = True
    # Its calls are the clock's again (records, a hunt at them), no longer only counted for an OOM's phase;
    # steps run from here on end it (see _on_forward).
    F.counting, F.step = False, STEP[0]
    # The evaluation's call is measured above: none of its calls is an inference program's.
    S.inferred = True
    FWD[1] = FWD[0] + 1


def _watch_autograd(torch):
    """torch.autograd.backward (which Tensor.backward calls) under a wrapper that counts the backward calls
    and says when one runs, and an optimizer step pre-hook that says when a step runs: what an OOM's
    phase is read from (_activity). Each costs a few list operations once per step, never per module."""
    try:
        autograd = torch.autograd
        wrapped = _same_parameters(autograd.backward, _BACKWARD)
    except Exception:
        return
    _patches().replace(autograd, "backward", wrapped, "counts backward calls, for an OOM's phase")
    S.backward_watched = True
    try:
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        _patches().hook(register_optimizer_step_pre_hook(_on_step_start), "torch.optim global step pre-hook",
                        "says when an optimizer step runs, for an OOM's phase")
        S.step_watched = True
    except Exception:
        pass


def _on_step_start(optimizer, args, kwargs):
    """The optimizer's step pre-hook: a step runs until the post-hook (_on_step) or the next backward."""
    AUTOGRAD[3] = True


def _activity():
    """What the program was doing at an OOM, as JSON: grad mode and inference mode on the failing thread,
    a backward or an optimizer step running, the backward calls and optimizer steps so far, the forward
    clock's calls while it counts (all, those since the last backward's start, the most that ever
    preceded one backward, and the count most backwards had: a step may call its model more than once),
    the outermost module's training flag, and whether the program made an optimizer. What the shim cannot
    tell is null: the phase is read from this (src/rules/phase.rs)."""
    torch, watched = S.torch, S.backward_watched
    out = {"bw": AUTOGRAD[1] > 0 if watched else None, "bws": AUTOGRAD[0] if watched else None,
           "opt": AUTOGRAD[3] if S.step_watched else None, "steps": STEP[0],
           "grad": None, "inf": None, "fwd": None, "fg": None, "fpb": None, "fps": None, "train": None,
           "optim": None}
    try:
        out["grad"] = bool(torch.is_grad_enabled())
        out["inf"] = bool(torch.is_inference_mode_enabled())
        if out["grad"] is False and not out["inf"] and _in_function_forward(torch):
            # Inside an autograd.Function's forward (a compiled module's, a custom Function's, reentrant
            # checkpointing's) torch turns grad off whatever the program's mode: not known.
            out["grad"] = None
    except Exception:
        pass
    try:
        out["optim"] = _optimizer_made(torch)
    except Exception:
        pass
    if F.on or F.counting:
        out["fwd"] = FWD[0]
        if watched:
            out["fg"] = FWD[0] - AUTOGRAD[2]
            out["fpb"] = AUTOGRAD[4]
            out["fps"] = _calls_per_step()
    try:
        model = MODEL[0]() if MODEL[0] is not None else None
        if model is not None:
            out["train"] = bool(model.training)
    except Exception:
        pass
    return json.dumps(out, separators=(",", ":"))


def _in_function_forward(torch):
    """Whether the failing thread runs inside the forward of an autograd.Function: a frame of a `forward`
    whose `ctx` is the Function's context (torch.compile's CompiledFunction, a custom Function)."""
    import sys

    ctx_type = torch.autograd.function.FunctionCtx
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "forward" and "ctx" in f.f_code.co_varnames \
                and isinstance(f.f_locals.get("ctx"), ctx_type):
            return True
        f = f.f_back
    return False


def _optimizer_made(torch):
    """Whether the program has made a torch.optim.Optimizer (any subclass: torch's, bitsandbytes',
    apex's): an optimizer's first construction wraps its class's step and marks it `hooked`
    (Optimizer._patch_step_function), which is read here, at an OOM, without a hook of gpudoc's."""
    return _hooked_below(torch.optim.Optimizer)


def _hooked_below(root):
    """Whether `root` or a class below it has a constructed optimizer's `hooked` step."""
    seen, todo = set(), [root]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        if getattr(cls.__dict__.get("step"), "hooked", False):
            return True
        todo.extend(cls.__subclasses__())
    return False


def _calls_per_step():
    """The count of forward calls that most backwards had before them (the larger on a tie: a step that
    calls its model twice and once in turn is counted at its most), 0 before the first backward."""
    if not any(PER_BACKWARD):
        return 0
    return max(range(len(PER_BACKWARD)), key=lambda n: (PER_BACKWARD[n], n))
