"""The pipe to gpudoc and the allocator's readings: each message written by the shim's one writer (S.out,
_gpudoc_pipe.py's Pipe: whole, under PIPE_BUF, to a descriptor checked to still be gpudoc's pipe, with
SIGPIPE held off) and copied for the notebook extension while it keeps them; the allocator's numbers
per device in use.

Part of the module `gpudoc._shim.torch` (_gpudoc_torch.py runs its parts in its namespace)."""

import gc
import json
import os
import time

# The names this part uses of _gpudoc_torch.py and of the parts run before it (PARTS: its layers), for the
# linters (at run time they are this module's globals).
MYPY = False
if MYPY:
    from gpudoc._shim._gpudoc_torch import (CELL, RESCAN_EVERY, S, SHARED)


def _connect(path):
    """The messages go to the pipe at `path` (gpudoc run's; "" for none: each is dropped, and the
    writer goes quiet at the first)."""
    S.out = SHARED.Pipe(path)


def _send(body):
    """Writes one message (`body` without its closing brace; the writer adds who sent it)."""
    if CELL.copies is not None:
        _copy(body + S.out.tail)
    S.out.send(body)


# Messages kept for the notebook extension between two of its reads, at most.
MAX_COPIES = 256


def _copy(line):
    """Keeps a message for the notebook extension (not the pointer to a file: the message itself)."""
    if not line.startswith('{"k":"file"'):
        CELL.copies.append(line)
        if len(CELL.copies) > 2 * MAX_COPIES:
            del CELL.copies[:-MAX_COPIES]


def _fail(where, exc):
    """Says where the shim failed, and goes quiet."""
    S.out.fail(where, exc)


def _cur(stats, key):
    return stats.get(key, {}).get("all", {}).get("current", 0)


def _peak(stats, key):
    return stats.get(key, {}).get("all", {}).get("peak", 0)


def _numbers(stats, device, peaks=None):
    """The allocator's numbers, with the peaks over those a reset erased since the last record; `peaks`:
    another view's (a notebook cell's), None where not known."""
    if peaks is None:
        fold = S.folded.pop(device, (0, 0))
        peaks = (max(_peak(stats, "allocated_bytes"), fold[0]), max(_peak(stats, "reserved_bytes"), fold[1]))
        S.recorded_peak[device] = peaks[0]
    known = "".join(',"%s":%d' % (k, v) for k, v in zip(("pa", "pr"), peaks) if v is not None)
    return '"dev":%d,"t":%.6f,"a":%d,"r":%d%s,"i":%d,"nr":%d,"no":%d,"nda":%d,"ndf":%d' % (
        device,
        time.time(),
        _cur(stats, "allocated_bytes"),
        _cur(stats, "reserved_bytes"),
        known,
        _cur(stats, "inactive_split_bytes"),
        stats.get("num_alloc_retries", 0),
        stats.get("num_ooms", 0),
        stats.get("num_device_alloc", 0),
        stats.get("num_device_free", 0),
    )


def _uuid(device):
    if device not in S.uuids:
        try:
            u = str(S.torch.cuda.get_device_properties(device).uuid)
            S.uuids[device] = u if u.startswith("GPU-") else "GPU-" + u
        except Exception:
            S.uuids[device] = None
        if S.uuids[device]:
            return ',"uuid":"%s"' % S.uuids[device]
    return ""


def _devices():
    """The devices this process has allocated on (reading a device's statistics creates no context)."""
    if S.devices is None or S.records % RESCAN_EVERY == 0:
        stats = S.orig_stats
        S.devices = [
            d for d in range(S.torch.cuda.device_count()) if stats(d).get("num_device_alloc", 0)
        ]
    return S.devices


def _uncollected(record):
    """Runs `record`: what it allocates never starts a collection the program's gc.callbacks would see in
    its step: the collector is off meanwhile, and what was allocated is freed before it is on again."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        record()
    finally:
        if collecting:
            gc.enable()


def _send_big(obj):
    """A message that may not fit one pipe write: written to a file beside the pipe, which gpudoc reads."""
    body = json.dumps(obj, separators=(",", ":"))[:-1]
    out = S.out
    if len(body) + len(out.tail) < 4000:
        _send(body)
        return
    if CELL.copies is not None:
        _copy(body + out.tail)
    if out.dead or not out.path:
        return
    S.files += 1
    name = "hunt-%d-%d.json" % (os.getpid(), S.files)
    path = os.path.join(os.path.dirname(out.path), name)
    with open(path, "w") as f:
        f.write(body + out.tail)
    _send('{"k":"file","name":"%s"' % name)
