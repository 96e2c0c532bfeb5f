"""What every framework part of gpudoc's shim needs and none owns: the writer of messages to gpudoc's pipe,
and the loader that runs code of the shim's right after a framework's module has run.

Loaded by _gpudoc_frameworks.py as `gpudoc._shim.pipe` (JAX, CuPy, TensorFlow). _gpudoc_torch.py has its
own copy of both (its `_send` and `TorchLoader`), to be moved here.
"""
import functools
import json
import os
import signal
import sys
import time

__tracebackhide__ = True


class Pipe(object):
    """gpudoc's named pipe, opened by path at the first message (so every process of the job reaches it,
    also a subprocess whose inherited descriptors were closed). A write that would block is dropped, never
    waited for; any failure makes the writer go quiet."""

    def __init__(self, path):
        self.path = path
        self.fd = None
        self.fd_id = None
        self.dead = False
        self.tail = ""
        self.identify()

    def identify(self):
        """The fields every message ends with: who sent it."""
        self.tail = ',"pid":%d%s%s}\n' % (
            os.getpid(), _rank_field("rank", os.environ.get("RANK")),
            _rank_field("local_rank", os.environ.get("LOCAL_RANK")))

    def forked(self):
        """In a forked child: a process of its own, with its own descriptor."""
        try:
            if self.fd is not None and self._still_ours():
                os.close(self.fd)
        except OSError:
            pass
        self.fd = self.fd_id = None
        self.identify()

    def _open(self):
        fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 3:
            # A standard descriptor the program closed stays closed for it: the pipe moves above them.
            import fcntl

            low = fd
            try:
                fd = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 3)
            finally:
                os.close(low)
        st = os.fstat(fd)
        self.fd, self.fd_id = fd, (st.st_dev, st.st_ino)

    def _still_ours(self):
        try:
            st = os.fstat(self.fd)
            return (st.st_dev, st.st_ino) == self.fd_id
        except OSError:
            return False

    def send(self, body):
        """Writes one message, `body` without its closing brace (under PIPE_BUF: processes writing at
        once never interleave)."""
        if self.dead:
            return
        data = (body + self.tail).encode()
        if len(data) > 4000:
            return
        try:
            if self.fd is None or not self._still_ours():
                self._open()
        except OSError:
            self.dead = True
            return
        # SIGPIPE held off while writing; the one a write to a gone gpudoc raised is taken back (see
        # _gpudoc_torch.py's _send).
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
        theirs = signal.SIGPIPE in old and signal.SIGPIPE in signal.sigpending()
        try:
            os.write(self.fd, data)
        except BlockingIOError:
            pass  # gpudoc is behind: this message is dropped, the program is never held up
        except OSError:
            self.dead = True
            if not theirs:
                signal.sigtimedwait({signal.SIGPIPE}, 0)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def fail(self, where, exc):
        """Says where the framework view was lost, and goes quiet."""
        try:
            self.send('{"k":"error","where":%s,"error":%s,"t":%.6f' % (
                json.dumps(where), json.dumps("%s: %s" % (type(exc).__name__, exc)), time.time()))
        except Exception:
            pass
        self.dead = True


def _rank_field(name, value):
    if value is None:
        return ""
    if value and all("0" <= c <= "9" for c in value):
        return ',"%s":%d' % (name, int(value))
    return ',"%s":%s' % (name, json.dumps(value))


# The loader's methods run the framework's module through these; their frames are importlib's own to
# Python, so a failing import shows the program the traceback it would without gpudoc.
_HIDDEN_EXEC = """
def _call_with_frames_removed(real, spec, after, module):
    wrapper, spec.loader = spec.loader, real
    if getattr(module, "__loader__", None) is wrapper:
        module.__loader__ = real
    real.exec_module(module)
    after(module)
"""
_HIDDEN_CREATE = """
def _call_with_frames_removed(real, spec):
    return real.create_module(spec)
"""


def _hidden(src):
    ns = {}
    exec(compile(src, "<frozen importlib._bootstrap>", "exec"), ns)
    return ns["_call_with_frames_removed"]


class AfterLoader(object):
    """gpudoc's, in a framework's spec only while its import runs: the framework's own loader is handed
    back before any of its code runs, and `after(module)` runs once the module has."""

    def __init__(self, real, spec, after):
        self.exec_module = functools.partial(_hidden(_HIDDEN_EXEC), real, spec, after)
        if hasattr(real, "create_module"):
            self.create_module = functools.partial(_hidden(_HIDDEN_CREATE), real)


def spec_after(finder, name, path, target, after):
    """The spec the finders after `finder` give for `name`, its loader wrapped so that `after(module)`
    runs once the module has run; None where none has it (or its loader is an old-style one)."""
    finders = list(sys.meta_path)
    mine = [i for i, f in enumerate(finders) if f is finder]
    finder.busy = True
    try:
        for f in finders[mine[0] + 1 if mine else 0:]:
            if getattr(f, "_gpudoc", False) or not hasattr(f, "find_spec"):
                continue
            spec = f.find_spec(name, path, target)
            if spec is None:
                continue
            if hasattr(spec.loader, "exec_module"):
                spec.loader = AfterLoader(spec.loader, spec, after)
            return spec
        return None
    finally:
        finder.busy = False
