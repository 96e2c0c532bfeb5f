"""gpudoc in a notebook: `%load_ext gpudoc` in any IPython or Jupyter kernel (docs/notebook.md).

After each cell, one quiet line when its memory changed (PyTorch's allocated and reserved memory, the peak
inside the cell, the process's memory as NVML sees it, the time); what holds what the cell left (the
notebook's names, its output cache, the last exception's traceback); an OOM explained by gpudoc's engine
(`gpudoc report` on a trace of the moment: see _report.py); a cell whose every run grows memory, named by
the engine's rules. `%gpudoc` shows the state, `%gpudoc free` drops what holds memory for nobody, `%%gpudoc`
diagnoses one cell in full with the HTML report inline.

A cell costs this extension a few reads when nothing changed: torch's statistics through gpudoc's shim
(the one `gpudoc run` put in the kernel, or a copy loaded here that keeps the program's own peaks as
they would be) and NVML's process list once the kernel has a CUDA context. It never imports torch, never
initialises CUDA and starts no thread. It speaks to the shim through the shim's notebook API only
(`ShimApi`: _shim/_gpudoc_torch_notebook.py).

The parts: `Doctor` (one per shell: IPython's callbacks and what they read), `Kept` (the shim's messages
and each cell's runs, for the engine), the holders' lines (`cell_holders`, `holdings`), the engine's
verdicts (`diagnose`, `leak`), and the magics (`GpudocMagics`: `status`, `free`).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
from types import FrameType, TracebackType
from typing import Any, Dict, List, Literal, Optional, Protocol, Sequence, Set, Tuple, Union, cast

from IPython.core.magic import Magics, line_cell_magic, magics_class

from . import _nvml, _report

# What holds memory is searched for after a cell that left at least this much more allocated, for at most
# SEARCH_S (the search walks the notebook's names, never the whole heap). GREW and LEAK_RUNS are the rules'
# param.cell_grew_bytes and param.cell_leak_runs (src/params.rs; src/torch/cells.rs checks they agree).
GREW = 1 << 20
SEARCH_S = 0.1
# %gpudoc, asked for, and the cell that raised search longer: the notebook's names can reach a large data
# set, and what an autograd graph holds is only known once every name was searched.
STATUS_S = 2.0
# Runs of one cell, each growing, before the engine is asked whether the cell leaks.
LEAK_RUNS = 3
# Runs of each cell remembered, and messages of the shim's kept for the engine.
MAX_RUNS = 32
MAX_MESSAGES = 512
# The shim's module name (gpudoc run's, and the copy loaded here), and the version of its notebook API this
# extension speaks (the shim of another gpudoc version may speak another).
SHIM = "gpudoc._shim.torch"
API = 1
# The shim's folder, and its loader and writer (_shim/_gpudoc_pipe.py), which loads its modules, under the
# name gpudoc run's finder gives it.
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_shim")
LOADER = ("_gpudoc_pipe.py", "gpudoc._shim.pipe")

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")

# A message of the shim's, and a cell's record (the shim's cell_end: n, id, dev, a0, r0, a, r, pa, pr...).
Message = Dict[str, Any]
Record = Dict[str, Any]
# (device, allocated bytes, reserved bytes).
Allocator = List[Tuple[int, int, int]]
# The last cell that raised: its number, and the name of what it raised.
LastError = Optional[Tuple[Optional[int], str]]


class ShimApi(Protocol):
    """The shim's notebook API (_shim/_gpudoc_torch_notebook.py), as this extension calls it."""

    API: int
    # The key of a cell whose start went by unseen (the extension loading in it).
    UNSEEN: object

    def attach(self, torch: Any, here: str, hunts: bool = False) -> None: ...

    def cell_start(self, info: Any = None, fresh: bool = False, t0: Optional[float] = None) -> None: ...

    def cell_end(self, result: Any = None) -> List[Record]: ...

    def keep_messages(self) -> None: ...

    def take_messages(self) -> List[Message]: ...

    def close_cell(self) -> None: ...

    def cuda_ready(self) -> bool: ...

    def allocator(self) -> Allocator: ...

    def search(self, device: int, budget: float, enough: Optional[int] = None, value: Any = None,
               skip: Sequence[int] = ()) -> Any: ...

    def traceback_frames(self) -> int: ...


def fmt_bytes(n: int) -> str:
    """Bytes as gpudoc prints them (units::fmt_bytes)."""
    if abs(n) < 1024:
        return "%d B" % n
    value, unit = float(abs(n)), 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return "%s%.2f %s" % ("-" if n < 0 else "", value, UNITS[unit])


def fmt_delta(n: int) -> str:
    return "+" + fmt_bytes(n) if n >= 0 else fmt_bytes(n)


class Shim(object):
    """gpudoc's shim in this kernel: `gpudoc run`'s, or a copy loaded here (`own`: in a kernel gpudoc run
    did not start)."""

    def __init__(self, api: ShimApi, own: bool) -> None:
        self.api, self.own = api, own


_OWN: Dict[str, Shim] = {}


def find_shim(torch: Any) -> Shim:
    """The shim gpudoc run loaded (in sys.modules since `import torch`), else one loaded here."""
    if "shim" in _OWN:
        return _OWN["shim"]
    module = sys.modules.get(SHIM)
    if module is not None:
        if getattr(module, "API", None) != API:
            raise RuntimeError("the shim gpudoc run loaded is another version's: run the kernel under "
                               "the gpudoc this package came with")
        return Shim(cast(ShimApi, module), False)
    api = cast(ShimApi, load_shim())
    # No leak hunt at the steps in a kernel gpudoc run did not start (see attach).
    api.attach(torch, HERE, hunts=False)
    _OWN["shim"] = Shim(api, True)
    return _OWN["shim"]


def load_shim() -> Any:
    """The shim's module (SHIM) loaded as gpudoc run's finder loads it: the shim's loader first (LOADER, in
    sys.modules under its name, its file named as the shim's are), then the module by that loader's
    `load` (in sys.modules too: Dynamo, tracing a compiled optimizer step into the step hook, finds the
    hook's globals by importing their __name__). Nothing is attached to torch yet."""
    filename, name = LOADER
    loader = sys.modules.get(name)
    if loader is None:
        import importlib.util

        path = os.path.join(HERE, filename)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError("the shim's loader is missing: %s" % path)
        loader = importlib.util.module_from_spec(spec)
        loader.__file__ = "<gpudoc> " + path  # never measured by coverage as the program's
        sys.modules[name] = loader
        spec.loader.exec_module(loader)
    return loader.load(HERE, "_gpudoc_torch.py", SHIM)


class Start(object):
    """What a cell's start saw: the time, this process's bytes per GPU (NVML), whether torch was there."""

    def __init__(self, mine: Dict[int, int], torch: bool) -> None:
        self.t0, self.perf = time.time(), time.perf_counter()
        self.mine, self.torch = mine, torch


class Kept(object):
    """What the engine is given of the kernel's past: the shim's messages (the last `hello`, the first and
    last step record of each process and device, the rest), and each cell's runs."""

    def __init__(self) -> None:
        self.messages: List[Message] = []
        self.hello: Optional[Message] = None
        # (pid, device) -> [first, last] step record: the engine places an OOM among the optimizer's steps
        # from them (the steps of earlier cells included), however many steps ran.
        self.steps: Dict[Tuple[Any, Any], List[Message]] = {}
        # (cell id, device) -> [(execution count, allocated at start, allocated at end)].
        self.runs: Dict[Tuple[str, int], List[Tuple[int, int, int]]] = {}

    def take(self, api: ShimApi) -> None:
        """Takes the shim's messages since the last call."""
        for m in api.take_messages():
            if m.get("k") == "hello":
                self.hello = m
            elif m.get("k") == "step":
                seen = self.steps.setdefault((m.get("pid"), m.get("dev")), [m, m])
                seen[1] = m
            else:
                self.messages.append(m)
        del self.messages[:-MAX_MESSAGES]

    def ran(self, recs: List[Record]) -> None:
        for rec in recs:
            runs = self.runs.setdefault((rec["id"], rec["dev"]), [])
            runs.append((rec["n"], rec["a0"], rec["a"]))
            del runs[:-MAX_RUNS]

    def for_cell(self, t0: float) -> Tuple[List[Message], float]:
        """The messages of a cell that began at `t0`, with the hello and the step records before them, and
        the time the engine's trace starts (the first step's, where steps came before the cell)."""
        msgs = [self.hello] if self.hello else []
        steps = [m for pair in self.steps.values() for m in _unique(pair)]
        msgs += sorted(steps, key=lambda m: m.get("t", 0))
        msgs += [m for m in self.messages if m.get("t", t0) >= t0 - 1e-3]
        return msgs, min([t0] + [m["t"] for m in steps if "t" in m])

    def leaking(self, rec: Record, t0: float) -> Optional[Tuple[List[Message], float]]:
        """The messages of a cell's runs, when its last LEAK_RUNS runs each left more allocated than they
        found (None otherwise), and the time the engine's trace starts."""
        runs = self.runs.get((rec["id"], rec["dev"]), [])
        last = runs[-LEAK_RUNS:]
        if len(last) < LEAK_RUNS or any(a - a0 < GREW for _, a0, a in last):
            return None
        ns = set(n for n, _, _ in runs)
        msgs = [self.hello] if self.hello else []
        msgs += [m for m in self.messages if m.get("k") == "cell" and m.get("n") in ns]
        return msgs, min(m.get("t0", t0) for m in msgs if m.get("k") == "cell")


class Doctor(object):
    """The extension's state in one shell, and its IPython callbacks."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.shim: Optional[Shim] = None
        # NVML's reader once the kernel has a CUDA context; False: it could not be opened.
        self.nvml: Union[None, Literal[False], _nvml.Nvml] = None
        # Why NVML could not be read, once it failed (said in the engine's report).
        self.nvml_error: Optional[str] = None
        self.start: Optional[Start] = None
        # %%gpudoc: this cell gets the full diagnosis; %gpudoc free or %gpudoc ran in it, and said it all.
        self.full = False
        self.quiet = False
        self.kept = Kept()
        # device -> {holder: bytes} at the last search: a cell's line names what grew.
        self.held: Dict[int, Dict[str, int]] = {}
        # The last cell that raised: (its number, what it raised).
        self.error: LastError = None
        self.said: Set[str] = set()
        # The callbacks are registered (%load_ext; %unload_ext takes them back, and this is kept for the
        # next load: the steps and runs of earlier cells still count).
        self.loaded = False
        # Cells the running cell runs (%%capture's body): part of it; the first error one raised.
        self.nested: Set[int] = set()
        self.inner: Optional[BaseException] = None

    # -- the callbacks -------------------------------------------------------------------------------

    def pre(self, info: Any = None, loading: bool = False) -> None:
        """pre_run_cell; or, `loading`, %load_ext in a cell whose start went by before the callbacks came:
        that cell counts from the load (its end, whichever it is, closes it)."""
        __tracebackhide__ = True
        try:
            self._pre(info, loading)
        except KeyboardInterrupt:
            # An interrupt while gpudoc works drops that work, silently: raised out of a callback, IPython
            # prints it as the callback's error and makes it the last exception (sys.last_value, %tb,
            # %debug) in place of the user's.
            pass
        except Exception as e:
            self._broken("pre_run_cell", e)

    def _pre(self, info: Any, loading: bool) -> None:
        raw = getattr(info, "raw_cell", None)
        if type(raw) is str and is_full(raw.splitlines()):
            self.full = True
        if self.start is not None and not loading and getattr(info, "store_history", True) is False:
            # A cell the running cell runs (%%capture runs its body as one, which IPython numbers as the
            # next cell): its memory is the running cell's, said at that cell's end.
            self.nested.add(id(info))
            return
        torch = _torch()
        api = self.api(torch)
        if api is not None:
            api.cell_start(api.UNSEEN if loading else info)
        self.start = Start(self.mine(torch), torch is not None)

    def post(self, result: Any = None) -> None:
        __tracebackhide__ = True
        try:
            if self._nested(result):
                return
            try:
                start, self.start = self.start, None
                if start is not None:
                    self._post(result, start)
            finally:
                self.full = self.quiet = False
                self.inner = None
        except KeyboardInterrupt:
            pass  # as in pre: gpudoc's work is dropped, silently
        except Exception as e:
            self._broken("post_run_cell", e)

    def _nested(self, result: Any) -> bool:
        """Whether `result` is the end of a cell the running cell ran (see _pre); what it raised is the
        running cell's to explain (an OOM in %%capture's body)."""
        key = id(getattr(result, "info", None))
        if key not in self.nested:
            return False
        self.nested.discard(key)
        self.inner = self.inner or getattr(result, "error_in_exec", None)
        return True

    def unloaded(self) -> None:
        """%unload_ext: the running cell's end will not be seen here; the shim loaded here, fed by these
        callbacks only, closes it (gpudoc run's own callbacks still see it end)."""
        self.loaded, self.start = False, None
        self.nested.clear()
        if self.shim is not None and self.shim.own:
            self.shim.api.close_cell()

    def _post(self, result: Any, start: Start) -> None:
        torch = _torch()
        api = self.api(torch)
        recs: List[Record] = []
        if api is not None:
            if not start.torch:
                # torch came in this cell: all it allocated is the cell's, its counters count from then.
                api.cell_start(getattr(result, "info", None), fresh=True, t0=start.t0)
            recs = api.cell_end(result)
            self.kept.take(api)
        mine = self.mine(torch)
        n = getattr(result, "execution_count", None)
        error = getattr(result, "error_in_exec", None) or self.inner
        self.kept.ran(recs)
        line = None if self.quiet else cell_line(n, recs, start, mine)
        if line is None and error is None and not self.full:
            return
        if line is not None:
            print(line)
        if error is not None:
            self.error = (n, type(error).__name__)
        if n is not None and (is_oom(error) or self.full):
            diagnose(self, n, start, error)
        if not self.quiet and api is not None:
            # After an error the traceback's frames are searched too, and the user reads a traceback.
            budget = SEARCH_S if error is None else STATUS_S
            for text in cell_holders(self, api, recs, budget, everything=self.full):
                print("  " + text)
        for rec in recs:
            leak(self, rec, start)

    # -- reading --------------------------------------------------------------------------------------

    def api(self, torch: Any) -> Optional[ShimApi]:
        """The shim's API, once torch is imported (None before, or when no shim could be had: said once)."""
        if torch is None:
            return None
        if self.shim is None:
            try:
                self.shim = find_shim(torch)
            except Exception as e:
                self._say_once("shim", "gpudoc: PyTorch's numbers are off in this kernel: %s" % e)
                return None
            self.shim.api.keep_messages()
        return self.shim.api

    def cuda(self) -> Optional[ShimApi]:
        """The shim's API once torch has CUDA memory in this kernel, else None."""
        api = self.api(_torch())
        return api if api is not None and api.cuda_ready() else None

    def mine(self, torch: Any) -> Dict[int, int]:
        """This process's bytes per GPU as NVML sees them, once the kernel has a CUDA context."""
        if self.nvml is None:
            try:
                if torch is None or not torch.cuda.is_initialized():
                    return {}
            except Exception:
                return {}
            try:
                self.nvml = _nvml.Nvml()
            except Exception as e:
                self.nvml = False
                self.nvml_error = str(e)
                self._say_once("nvml", "gpudoc: the process's GPU memory is not read: %s" % e)
        return self.nvml.mine() if self.nvml else {}

    def skip(self) -> Tuple[int, ...]:
        """The extension's own objects, never holders of the notebook's memory."""
        return (id(self),)

    # -- saying ----------------------------------------------------------------------------------------

    def _say_once(self, key: str, text: str) -> None:
        if key not in self.said:
            self.said.add(key)
            print(text)

    def _broken(self, where: str, e: BaseException) -> None:
        """A failure of gpudoc's own never reaches the notebook as an error: said once, then quiet."""
        self._say_once("broken:" + where, "gpudoc: %s failed (%s: %s); the cell itself is unaffected" % (
            where, type(e).__name__, e))


def _torch() -> Any:
    return sys.modules.get("torch")


# -- what the engine says --------------------------------------------------------------------------------

def diagnose(doctor: Doctor, n: int, start: Start, error: Optional[BaseException]) -> None:
    """The engine's report of a cell: for an OOM the run's own explanation, for %%gpudoc the full report
    and its HTML page inline."""
    msgs, t0 = doctor.kept.for_cell(start.t0)
    output = None
    if error is not None:
        output = "".join(traceback.format_exception_only(type(error), error))
    rows = _report.rows(t0, time.time(), [front_door()], doctor.nvml or None, msgs, doctor.nvml_error)
    try:
        verdict = _report.report(rows, output=output, html=doctor.full, name="cell-%d" % n)
    except Exception as e:
        print("gpudoc: the engine could not be asked: %s" % e)
        return
    print(verdict.text.rstrip("\n"))
    if verdict.html is not None:
        show_html(verdict.html)


def leak(doctor: Doctor, rec: Record, start: Start) -> None:
    """A cell whose last runs each left more allocated than they found: the engine's rules say whether it
    leaks."""
    found = doctor.kept.leaking(rec, start.t0)
    if found is None:
        return
    msgs, t0 = found
    rows = _report.rows(t0, time.time(), [front_door()], doctor.nvml or None, msgs, doctor.nvml_error)
    try:
        verdict = _report.report(rows, name="cells")
    except Exception as e:
        doctor._say_once("engine", "gpudoc: the engine could not be asked: %s" % e)
        return
    for d in verdict.report.get("diagnoses", []):
        if d.get("rule") == "cell-leak":
            print(diagnosis_text(d))


# -- holders -----------------------------------------------------------------------------------------------

def cell_holders(doctor: Doctor, api: ShimApi, recs: List[Record], budget: float,
                 everything: bool = False) -> List[str]:
    """Lines for what holds the memory each device's cell left: what grew since the last search
    (`everything`: all that holds memory)."""
    lines: List[str] = []
    for rec in recs:
        if rec["a"] - rec["a0"] < GREW and not everything:
            continue
        # A cell's line names what holds what grew: once every live tensor is found, a data set of a
        # million items further on the notebook's names is not walked.
        s = api.search(rec["dev"], budget, enough=None if everything else rec["a"], skip=doctor.skip())
        found = holdings(s, rec["a"], doctor.error)
        before = doctor.held.get(rec["dev"], {})
        doctor.held[rec["dev"]] = dict((key, b) for key, b, _ in found)
        lines += [text for key, b, text in found if everything or b - before.get(key, 0) >= GREW][:5]
    return lines


def holdings(s: Any, allocated: int, error: LastError) -> List[Tuple[str, int, str]]:
    """What a search found, most first: (key, bytes, the line that says it): each of the notebook's names,
    the output cache as one, the last traceback as one (`error`: the last cell that raised, its number and
    what). Of the device's `allocated` bytes, what no Python tensor refers to (what autograd graphs saved:
    a failed forward's activations) is counted to the largest holder whose tensors carry graphs, and
    said."""
    found = []  # (key, bytes, graphs, the line's words before its bytes, after them)
    for e in s.names():
        if e["kind"] in ("global", "local") and e["bytes"] > 0:
            label = "`%s`" % e["name"] if e["kind"] == "global" else "`%s` (%s)" % (e["name"], e["where"])
            fix = " (del %s when done with it)" % e["name"] if e["kind"] == "global" else ""
            found.append((label, e["bytes"], e["graphs"], label + " holds ", fix))
    cache, _, graphs = s.total("output")
    if cache > 0:
        names = [output_label(e["name"]) for e in s.names() if e["kind"] == "output" and e["bytes"] > 0]
        # Out[7] says where; Out alone only when no entry's own name is left.
        numbered = sorted((x for x in names if x.startswith("Out[")), key=lambda x: int(x[4:-1]))
        names = numbered + [x for x in names if x.startswith("_")] + (["Out"] if not numbered else [])
        found.append(("output", cache, graphs, "the output cache holds ",
                      " (%s): %%gpudoc free drops it" % ", ".join(names)))
    tb, functions, graphs = s.total("traceback")
    if tb > 0:
        found.append(("traceback", tb, graphs) + traceback_words(error, functions))
    found.sort(key=lambda x: -x[1])
    hidden = s.unreached(allocated)
    owner = next((f for f in found if f[2] > 0), None) if hidden else None
    out = []
    for key, b, _, head, tail in found:
        note = ""
        if owner is not None and key == owner[0]:
            b += hidden
            note = " (%s of it in the autograd graphs behind its tensors)" % fmt_bytes(hidden)
        out.append((key, b, head + fmt_bytes(b) + note + tail))
    out.sort(key=lambda x: -x[1])
    return out


def traceback_words(error: LastError, functions: List[str]) -> Tuple[str, str]:
    """The traceback's line, before its bytes and after them."""
    n, what = error or (None, "exception")
    what = "the OOM" if what.endswith("OutOfMemoryError") else "the %s" % what
    where = " in cell %d" % n if n is not None else ""
    frames = ", ".join("%s()" % f for f in functions[:4] if f) or "its functions"
    return ("the traceback of %s%s still holds " % (what, where),
            ": the frames of %s; run %%gpudoc free to drop it" % frames)


# -- the magics ------------------------------------------------------------------------------------------

@magics_class
class GpudocMagics(Magics):  # type: ignore[misc]  # IPython's class: Any to mypy
    """%gpudoc and %%gpudoc, for one shell's Doctor."""

    def __init__(self, shell: Any, doctor: Doctor) -> None:
        super().__init__(shell)
        self.doctor = doctor

    @line_cell_magic  # type: ignore[untyped-decorator]
    def gpudoc(self, line: str, cell: Optional[str] = None) -> None:
        """%gpudoc: GPU memory now and what holds it. %gpudoc free: drops what holds GPU memory for
        nobody (the last traceback, the output cache). %%gpudoc: runs the cell, then gpudoc's full
        diagnosis of it, its HTML report inline."""
        __tracebackhide__ = True
        if cell is not None:
            # Reached only where IPython did not run the body as the cell itself (see unwrap): run as
            # %%capture runs its body, a cell of its own, part of this one.
            self.doctor.full = True
            self.shell.run_cell(cell, store_history=False)
        elif line.strip() == "free":
            free(self.doctor)
        elif line.strip() == "":
            status(self.doctor)
        else:
            print("gpudoc: %gpudoc takes nothing or `free`; %%gpudoc diagnoses the cell below it")


def status(doctor: Doctor) -> None:
    """%gpudoc: the memory now and everything that holds it."""
    doctor.quiet = True
    api = doctor.cuda()
    if api is None:
        print("gpudoc: torch has no CUDA memory in this kernel yet")
        return
    mine = doctor.mine(_torch())
    for dev, a, r in api.allocator():
        print("gpudoc: cuda:%d allocated %s, reserved %s" % (dev, fmt_bytes(a), fmt_bytes(r)))
        s = api.search(dev, STATUS_S, skip=doctor.skip())
        for _, _, text in holdings(s, a, doctor.error)[:10]:
            print("  " + text)
    if mine:
        print("gpudoc: the process holds %s (NVML)" % fmt_bytes(sum(mine.values())))


def free(doctor: Doctor) -> None:
    """%gpudoc free: drops the last traceback's frames and the output cache's entries that hold GPU
    memory, never the user's variables; then PyTorch's cache; says what came back."""
    import gc

    doctor.quiet = True
    api, torch = doctor.cuda(), _torch()
    if api is None:
        print("gpudoc: torch has no CUDA memory in this kernel: nothing to free")
        return
    before, mine0 = api.allocator(), doctor.mine(torch)
    dropped = []
    frames, keepers = drop_traceback(doctor.shell, api.traceback_frames())
    gc.collect()
    after_tb = api.allocator()
    if frames:
        dropped.append(("the last traceback's frames", _total(before) - _total(after_tb)))
    outputs = drop_outputs(doctor.shell, lambda value: _holds(doctor, api, value))
    gc.collect()
    after_out = api.allocator()
    if outputs:
        dropped.append((", ".join(outputs), _total(after_tb) - _total(after_out)))
    reserved = sum(r for _, _, r in after_out)
    torch.cuda.empty_cache()
    after = api.allocator()
    print(free_text(dropped, reserved - sum(r for _, _, r in after), after, mine0, doctor.mine(torch)))
    if keepers is not None:
        names = ", ".join("`%s`" % k for k in keepers)
        print("  the last traceback's frames are kept: %s holds it (%s)" % (
            names or "an object of the notebook's",
            "del %s to drop them" % ", ".join(keepers) if keepers else "%gpudoc names it"))
    for held in doctor.held.values():
        held.pop("traceback", None)
        held.pop("output", None)


def drop_outputs(shell: Any, holds: Any) -> List[str]:
    """Removes the output cache's entries that hold tensors on a device in use (`holds(value)`), as
    IPython's own flush does but entry by entry (Out[N] and _N, the displayhook's _, __ and ___ where they
    are its own, not the user's); their names."""
    ns, hidden = shell.user_ns, getattr(shell, "user_ns_hidden", {})
    out = ns.get("_oh") if isinstance(ns.get("_oh"), dict) else {}
    hook = getattr(shell, "displayhook", None)
    names = []
    for k in sorted(out):
        value = out[k]
        if holds(value):
            for d in (ns, hidden):
                if d.get("_%s" % k) is value:
                    del d["_%s" % k]
            del out[k]
            names.append("Out[%s]" % k)
    for name in ("_", "__", "___"):
        value = getattr(hook, name, None)
        if value is None or isinstance(value, str) or not holds(value):
            continue
        for d in (ns, hidden):
            if d.get(name) is value:
                d[name] = ""
        setattr(hook, name, "")
        names.append(name)
    # The last cell's result, kept by IPython until the next one ends, is the value it displayed.
    last = getattr(shell, "last_execution_result", None)
    if last is not None and getattr(last, "result", None) is not None and holds(last.result):
        last.result = None
    return names


def _holds(doctor: Doctor, api: ShimApi, value: Any) -> bool:
    """Whether `value` holds a tensor on a device in use (searched from a root of its own)."""
    for dev, _, _ in api.allocator():
        if api.search(dev, 1.0, value=value, skip=doctor.skip()).storages:
            return True
    return False


def _unique(pair: List[Message]) -> List[Message]:
    return pair[:1] if pair[0] is pair[1] else pair


def _total(rows: Allocator) -> int:
    return sum(a for _, a, _ in rows)


def front_door() -> str:
    """The command a report of this kernel's cells names."""
    return "notebook" if "ipykernel" in sys.modules else "ipython"


def cell_line(n: Optional[int], recs: List[Record], start: Start, mine: Dict[int, int]) -> Optional[str]:
    """The line after a cell, or None when nothing changed: per device its allocated and reserved memory
    (change, now), the peak inside the cell, the process's memory as NVML sees it, the time."""
    parts: List[str] = []
    for rec in recs:
        da, dr = rec["a"] - rec["a0"], rec["r"] - rec["r0"]
        transient = rec["pa"] is not None and rec["pa"] > max(rec["a0"], rec["a"])
        if not (da or dr or transient):
            continue
        dev = "cuda:%d " % rec["dev"] if len(recs) > 1 else ""
        text = "%sallocated %s (%s) · reserved %s (%s)" % (
            dev, fmt_delta(da), fmt_bytes(rec["a"]), fmt_delta(dr), fmt_bytes(rec["r"]))
        if rec["pa"] is not None:
            text += " · peak %s" % fmt_bytes(rec["pa"])
        parts.append(text)
    now, was = sum(mine.values()), sum(start.mine.values())
    if mine and now != was:
        parts.append("process %s (%s, NVML)" % (fmt_delta(now - was), fmt_bytes(now)))
    if not parts:
        return None
    cell = "cell %d" % n if n is not None else "this cell"
    return "gpudoc: %s: %s · %.2f s" % (cell, " · ".join(parts), time.perf_counter() - start.perf)


def output_label(name: str) -> str:
    """An entry of IPython's output cache as the notebook shows it."""
    if name in ("Out", "_oh"):
        return "Out"
    return name if name in ("_", "__", "___") else "Out[%s]" % name[1:]


def is_oom(error: Optional[BaseException]) -> bool:
    """An out-of-memory error of PyTorch's (torch.OutOfMemoryError; RuntimeError on old releases)."""
    if error is None:
        return False
    if type(error).__name__.endswith("OutOfMemoryError"):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error)


def drop_traceback(shell: Any, limit: int) -> Tuple[int, Optional[List[str]]]:
    """Forgets the last exception as IPython and Python keep it for %debug and %tb, and clears the frames of
    its traceback (their locals: the functions have returned) unless the notebook holds it too (a
    traceback or exception the user saved: its frames are the user's). The number of frames cleared, and
    the notebook's names that keep it (None: nothing of the user's does). At most `limit` frames, the
    innermost first, as the holders' search walks them (the shim's traceback_frames)."""
    last = getattr(sys, "last_value", None)
    chain: List[Any] = [last] if last is not None else []
    tb: Optional[TracebackType] = getattr(sys, "last_traceback", None)
    while tb is not None and len(chain) < limit:
        chain.append(tb)
        tb = tb.tb_next
    # IPython's traceback printer keeps the last traceback it printed (AutoFormattedTB.tb, for %debug,
    # which reads sys.last_traceback when it is gone): with it, the frames would outlive their clearing,
    # and a frame keeps its function, whose closure cells keep the call's arguments (torch's
    # Module._call_impl passes them to its `inner` closure).
    for printer in (getattr(shell, "InteractiveTB", None), getattr(shell, "SyntaxTB", None)):
        if printer is not None and getattr(printer, "tb", None) is not None:
            try:
                printer.tb = None
            except Exception:
                pass
    for name in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, name):
            delattr(sys, name)
    keepers = _kept_by_notebook(shell, chain)
    if keepers is not None:
        return 0, keepers
    cleared = 0
    # (No closure here refers to `last`: its cell would hold the exception from this frame, unseen.)
    for f in [t.tb_frame for t in chain[1 if last is not None else 0:]]:
        if not f.f_code.co_flags & 0x2:
            continue  # a module's or a cell's own frame: its names are the notebook's
        # Before Python 3.13 a frame whose f_locals was read (IPython's traceback does) keeps a copy of its
        # locals in a dict that frame.clear() leaves alone: emptied too.
        copy = f.f_locals if sys.version_info < (3, 13) else None
        try:
            f.clear()
        except RuntimeError:
            continue  # still running
        if type(copy) is dict:
            copy.clear()
        cleared += 1
    return cleared, None


def _kept_by_notebook(shell: Any, chain: List[Any]) -> Optional[List[str]]:
    """The notebook's names that hold the exception or an entry of its traceback (`chain`), once Python's
    and IPython's own references are gone; [] when something else of the user's does (a list, another
    exception's __context__); None when nothing does. One pass over the heap (gc.get_referrers), as the
    collection %gpudoc free runs after it."""
    import gc

    if not chain:
        return None
    ours = set(id(o) for o in chain)
    running = set()
    f: Optional[FrameType] = sys._getframe()
    while f is not None:
        running.add(id(f))
        f = f.f_back
    held = []
    for r in gc.get_referrers(*chain):
        if id(r) in ours or id(r) in running or r is chain:
            continue  # the chain itself (an exception's traceback, an entry's next), gpudoc's frames
        if type(r).__name__ == "ExecutionResult":
            continue  # IPython's record of the cell that raised (shell.last_execution_result)
        held.append(r)
    if not held:
        return None
    ns = getattr(shell, "user_ns", None) or {}
    return [k for k, v in list(ns.items()) if id(v) in ours and not k.startswith("_")]


def free_text(dropped: List[Tuple[str, int]], cache: int, after: Allocator, mine0: Dict[int, int],
              mine: Dict[int, int]) -> str:
    parts = ["%s (%s)" % (what, fmt_bytes(b)) for what, b in dropped]
    text = "gpudoc: dropped " + ", ".join(parts) if parts else "gpudoc: nothing held memory for nobody"
    text += "; PyTorch's cache gave back %s" % fmt_bytes(cache)
    now = ", ".join("cuda:%d allocated %s, reserved %s" % (d, fmt_bytes(a), fmt_bytes(r))
                    for d, a, r in after)
    text += "; now " + now
    if mine:
        text += "; the process holds %s (NVML), was %s" % (
            fmt_bytes(sum(mine.values())), fmt_bytes(sum(mine0.values())))
    return text


def diagnosis_text(d: Dict[str, Any]) -> str:
    lines = ["gpudoc: %s %s [%s]" % (d.get("severity", ""), d.get("title", ""), d.get("rule", "")),
             "  " + d.get("message", "")]
    lines += ["    " + x for x in d.get("details", [])]
    lines += ["  → " + a for a in d.get("advice", [])]
    return "\n".join(lines)


def show_html(page: str) -> None:
    """The report's page inline, in a frame of its own (its styles stay its own)."""
    import html

    from IPython.display import HTML, display

    frame = '<iframe srcdoc="%s" style="width:100%%;height:720px;border:0"></iframe>' % html.escape(page)
    display(HTML("<div>%s</div>" % frame))


# One per shell, kept after %unload_ext for the next load (%reload_ext): what earlier cells taught it.
_DOCTORS: Dict[int, Doctor] = {}


def load(shell: Any) -> None:
    """%load_ext gpudoc: registers the magics and the callbacks (again: nothing more)."""
    known = _DOCTORS.get(id(shell))
    if known is not None and known.loaded:
        return
    doctor = known if known is not None else _DOCTORS.setdefault(id(shell), Doctor(shell))
    doctor.loaded = True
    shell.register_magics(GpudocMagics(shell, doctor))
    shell.events.register("pre_run_cell", doctor.pre)
    shell.events.register("post_run_cell", doctor.post)
    cleanup = getattr(shell, "input_transformers_cleanup", None)
    if cleanup is not None and unwrap not in cleanup:
        cleanup.append(unwrap)
    # Loaded in a cell (the one that builds the model, often): its line counts from here. Loaded at the
    # kernel's start (IPython's `extensions` setting), the first cell's start replaces this one.
    doctor.pre(loading=True)


def unload(shell: Any) -> None:
    """%unload_ext gpudoc: the callbacks go (the magics stay, as IPython keeps every extension's)."""
    doctor = _DOCTORS.get(id(shell))
    if doctor is not None and doctor.loaded:
        shell.events.unregister("pre_run_cell", doctor.pre)
        shell.events.unregister("post_run_cell", doctor.post)
        cleanup = getattr(shell, "input_transformers_cleanup", None)
        if cleanup is not None and unwrap in cleanup:
            cleanup.remove(unwrap)
        doctor.unloaded()


# The first line of a cell gpudoc diagnoses in full.
FULL = "%%gpudoc"


def is_full(lines: List[str]) -> bool:
    """Whether a cell (its lines) is a %%gpudoc cell: its first line that is not blank is %%gpudoc alone."""
    first = next((x for x in lines if x.strip()), "")
    return first.strip() == FULL


def unwrap(lines: List[str]) -> List[str]:
    """IPython's input transformer for %%gpudoc (IPython's `input_transformers_cleanup`, which runs before
    it reads a cell magic): the %%gpudoc line becomes an empty one, and IPython runs the body as any cell,
    itself: its last expression displayed (Out), top-level await, its own tracebacks and line numbers.
    pre_run_cell reads the %%gpudoc from the raw cell."""
    if not is_full(lines):
        return lines
    at = next(i for i, x in enumerate(lines) if x.strip())
    return lines[:at] + ["\n"] + lines[at + 1:]


# IPython's check of whether a cell is complete (a terminal's Enter) passes over transformers with side
# effects: it still sees %%gpudoc, a cell magic's header, and waits for the blank line that ends one.
unwrap.has_side_effects = True  # type: ignore[attr-defined]
