"""The notebook's verdicts come from gpudoc's own engine, never from Python: the moment is written as a trace
in the documented format (docs/schema/trace-row.schema.json: a start row, NVML's devices and processes,
the shim's messages as `torch` rows, an end row) and `gpudoc report TRACE --output ERROR` rebuilds the
report from it, as for a run's own trace: the same OOM reading, causes, holders and rules."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    from ._nvml import Device, Nvml, Status

# A trace row, a report (JSON objects).
Row = Dict[str, Any]

SCHEMA = "gpudoc.trace/2"
# Longest wait for the engine.
TIMEOUT_S = 60


def binary() -> str:
    """The gpudoc binary: the one pip installed beside this package, else the one on PATH."""
    try:
        from gpudoc.__main__ import find_gpudoc

        return find_gpudoc()
    except (ImportError, OSError):
        pass
    found = shutil.which("gpudoc")
    if found is None:
        raise FileNotFoundError("the gpudoc binary was found neither beside this package nor on PATH")
    return found


def _who(pid: int) -> Row:
    """A process's first row: its command line and owner, read from /proc where this process can."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        uid = None
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    uid = int(line.split()[1])
        return {"cmdline": cmdline, "uid": uid, "visible": True}
    except (OSError, ValueError, IndexError):
        return {"cmdline": "", "uid": None, "visible": False}


def rows(t0: float, t1: float, command: List[str], nvml: Optional[Nvml],
         messages: List[Row], nvml_error: Optional[str] = None) -> List[Row]:
    """The trace of a moment, from `t0` to `t1` (Unix seconds): what NVML saw at `t1` (`nvml`: the reader,
    or None, then `nvml_error` says why: NVML failed, or was never read), and the shim's `messages`
    (dicts). NVML is read once, at the end: a cell is no run whose start says what was there before it
    (the kernel's earlier cells hold what they hold)."""
    devs = nvml.devices() if nvml is not None else []
    status: Status = nvml.status() if nvml is not None else {
        "available": False, "library": "", "driver": None, "cuda_driver": None,
        "error": nvml_error or "NVML was not read: the kernel had no CUDA context when gpudoc looked"}
    out = [{"kind": "start", "schema": SCHEMA, "unix_s": t0, "command": command,
            "origin": {"host": socket.gethostname(),
                       "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")},
            "gpus": [{"index": d["index"], "name": d["name"], "uuid": d["uuid"], "total_bytes": d["total"]}
                     for d in devs],
            "nvml": status}]
    t = round(max(0.0, t1 - t0), 6)
    pid = os.getpid()
    for d in devs:
        out.append({"kind": "device", "t": t, "gpu": d["index"], "used": d["used"], "total": d["total"]})
        # The job's (this kernel's) memory then: a trace of one instant has no earlier row to sum from.
        out.append({"kind": "job", "t": t, "gpu": d["index"], "used": d["processes"].get(pid, 0)})
        for p, used in sorted(d["processes"].items()):
            row = {"kind": "process", "t": t, "gpu": d["index"], "pid": p, "used": used, "in_job": p == pid}
            out.append(dict(row, **_who(p)))
    out.extend({"kind": "torch", "m": m} for m in messages)
    out.append({"kind": "end", "end": _end(t, status, devs)})
    return out


def _end(duration: float, status: Status, devs: List[Device]) -> Row:
    """The end row: what a moment knows (its length, NVML, each GPU's driver reserve). What only a
    process's end has (an exit code, a signal, leftovers, the sampler's own numbers) is left out, and the
    engine reads it as absent (docs/schema/trace-row.schema.json: the end row's fields are optional)."""
    read = 1 if devs else 0  # NVML read once, every GPU in that one reading
    return {"duration_s": duration, "nvml": status, "torch_enabled": True, "device_samples": read,
            "process_samples": read,
            "gpus": [{"index": d["index"], "driver_reserved_bytes": d["reserved"]} for d in devs]}


class Verdict(object):
    """What the engine said: its summary (text), its report (JSON) and, when asked for, its HTML page."""

    def __init__(self, text: str, report: Row, html: Optional[str]) -> None:
        self.text, self.report, self.html = text, report, html


def report(trace_rows: List[Row], output: Optional[str] = None, html: bool = False,
           name: str = "cell") -> Verdict:
    """Runs `gpudoc report` on the rows; `output`: the text the moment printed (an error's), read for an
    OOM as the command's output is."""
    with tempfile.TemporaryDirectory(prefix="gpudoc-%s-" % name) as d:
        trace = os.path.join(d, "trace.jsonl")
        with open(trace, "w") as f:
            for row in trace_rows:
                f.write(json.dumps(row) + "\n")
        args = [binary(), "report", trace, "--json", os.path.join(d, "report.json")]
        if output is not None:
            # On standard input: the report names no file of this folder, gone once it is read.
            args += ["--output", "-"]
        if html:
            args += ["--html", os.path.join(d, "report.html")]
        done = subprocess.run(args, input=(output or "").encode("utf-8", "replace"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=TIMEOUT_S, env=dict(os.environ, NO_COLOR="1"))
        if done.returncode != 0:
            raise RuntimeError("gpudoc report failed: %s" % done.stderr.decode("utf-8", "replace").strip())
        with open(os.path.join(d, "report.json")) as f:
            rep: Row = json.load(f)
        page = None
        if html:
            with open(os.path.join(d, "report.html")) as f:
                page = f.read()
        return Verdict(done.stdout.decode("utf-8", "replace"), rep, page)
