"""The shim's one writer of messages to gpudoc's pipe (_gpudoc_pipe.py's Pipe; issue 45's review findings
D1/D3): the torch part and the frameworks' part both write through it, so both keep what it promises. Their
messages are the published schema's; a program that closes the pipe's descriptor and opens a file of its
own under that number never gets gpudoc's messages in its file; once gpudoc is gone a write neither raises
nor lets SIGPIPE through, and the writer goes quiet. Real torch on the CPU, a real FIFO."""
import json
import os
import signal
import sys

import pytest
from schema_check import errors, published
from shim_env import HERE

torch = pytest.importorskip("torch")
FRAMEWORKS = "gpudoc._shim.frameworks"


class Fifo(object):
    """gpudoc's end of the pipe: a FIFO read without blocking, as the binary reads it."""

    def __init__(self, path):
        self.path = path
        os.mkfifo(path)
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)

    def messages(self):
        data = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return [json.loads(line) for line in data.decode().splitlines()]

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _stats(device=0):
    return {"allocated_bytes": {"all": {"current": 3 << 20, "peak": 5 << 20}},
            "reserved_bytes": {"all": {"current": 8 << 20, "peak": 8 << 20}},
            "inactive_split_bytes": {"all": {"current": 0}}, "num_alloc_retries": 0, "num_ooms": 0,
            "num_device_alloc": 1, "num_device_free": 0}


class TorchPart(object):
    """The torch part's writer: a step record, as its step hook sends one."""

    name = "torch"

    def __init__(self, shim, monkeypatch, path):
        self.T = shim.torch
        monkeypatch.setattr(self.T.S, "orig_stats", _stats)
        monkeypatch.setattr(self.T.S, "orig_reset", lambda device=0: None)
        monkeypatch.setattr(self.T.S, "cuda", True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        self.T._connect(path)

    @property
    def writer(self):
        return self.T.S.out

    def send(self):
        self.T._record(self.T.STEP[0], 1)


class FrameworksPart(object):
    """The frameworks' part's writer: a JAX-style step record of a View, its readings played."""

    name = "frameworks"

    def __init__(self, shim, monkeypatch, path):
        fw = shim.torch.SHARED.load(HERE, "_gpudoc_frameworks.py", FRAMEWORKS)
        monkeypatch.setattr(fw.S, "here", HERE)
        monkeypatch.setattr(fw.S, "pipe", fw.SHARED.Pipe(path))
        self.fw = fw
        self.view = fw.View("jax", lambda: iter([(0, None, {"a": 3 << 20, "r": 8 << 20, "pa": 5 << 20})]))

    @property
    def writer(self):
        return self.fw.S.pipe

    def send(self):
        self.view.record("step", 1)


@pytest.fixture(params=[TorchPart, FrameworksPart], ids=lambda p: p.name)
def part(request, shim, monkeypatch, tmp_path):
    """Each part of the shim with its writer to a FIFO, which the test reads as gpudoc does."""
    fifo = Fifo(str(tmp_path / "torch.pipe"))
    part = None
    try:
        part = request.param(shim, monkeypatch, fifo.path)
        yield part, fifo
    finally:
        if part is not None:
            part.writer.forked()  # its descriptor closed, as in a forked child
        fifo.close()
        sys.modules.pop(FRAMEWORKS, None)


def _conforms(part, message):
    """The published schema's (its PyTorch messages or its frameworks' messages, which name their `fw`)."""
    return errors(published("shim-message"), message)


def test_both_parts_send_messages_of_the_published_schema(part):
    part, fifo = part
    part.send()
    sent = fifo.messages()
    assert [m["k"] for m in sent] == ["step"]
    assert sent[0]["pid"] == os.getpid()
    assert _conforms(part, sent[0]) == []


def test_a_descriptor_the_program_closed_and_reused_never_gets_gpudocs_messages(part, tmp_path):
    part, fifo = part
    part.send()
    fd = part.writer.fd
    assert fd is not None and fd > 2
    os.close(fd)
    own = os.open(str(tmp_path / "program.log"), os.O_WRONLY | os.O_CREAT)
    try:
        if own != fd:
            os.dup2(own, fd)  # the program's file under the pipe's old number, as the lowest free one is
            os.close(own)
        part.send()
        assert os.path.getsize(str(tmp_path / "program.log")) == 0
        assert [m["k"] for m in fifo.messages()] == ["step", "step"]
        assert part.writer.fd != fd and not part.writer.dead
    finally:
        os.close(fd)  # the program's file


def test_once_gpudoc_is_gone_a_write_lets_no_sigpipe_through_and_the_writer_goes_quiet(part):
    part, fifo = part
    part.send()
    fifo.messages()
    fifo.close()  # gpudoc's end is gone: the next write fails with EPIPE, and raises SIGPIPE
    raised = []
    old = signal.signal(signal.SIGPIPE, lambda signum, frame: raised.append(signum))
    try:
        part.send()
        assert part.writer.dead
        part.send()  # quiet: not even tried
    finally:
        signal.signal(signal.SIGPIPE, old)
    assert raised == []


def test_gpudoc_patches_lists_both_parts_changes_whichever_framework_was_imported_first(shim, monkeypatch):
    """One loader of the shim's modules: the part loaded second finds the registry the first one loaded
    (a second registry in its place hid the first one's changes from `gpudoc.patches()`)."""
    import gpudoc

    T = shim.torch
    T._patches().remove_all()
    sys.modules.pop("gpudoc._shim.patch")
    monkeypatch.setattr(T, "_REGISTRY", [])
    fw = T.SHARED.load(HERE, "_gpudoc_frameworks.py", FRAMEWORKS)
    try:
        monkeypatch.setattr(fw.S, "here", HERE)
        monkeypatch.setattr(fw.S, "registry", None)
        fw._patches().callback("atexit", "the last record at exit")  # the program imported jax first
        T._install_peaks(torch)  # then torch
        listed = [(p["target"], p["why"]) for p in gpudoc.patches()]
        assert ("atexit", "the last record at exit") in listed
        assert "torch._C._cuda_memoryStats" in [target for target, _ in listed]
    finally:
        sys.modules.pop(FRAMEWORKS, None)
