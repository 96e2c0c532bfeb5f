"""What every framework part of gpudoc's shim shares, one owner each: the writer of messages to gpudoc's
pipe (Pipe), the loader of the shim's modules and of the torch module's parts (load, code), and the
loader that hands a framework its own import back and runs the shim's code once the framework's module
has run (spec_after).

Loaded first, as `gpudoc._shim.pipe`, by whatever loads a part of the shim: the start-up's GpudocFinder
(_gpudoc_site.py, which gives it its bytecode writer as `_cache`), the notebook extension, the tests. The
torch part (_gpudoc_torch.py) and the frameworks' (_gpudoc_frameworks.py) each find it in sys.modules.
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
            # A standard descriptor the program closed stays closed for it (its writes fail as they would,
            # its next file gets that number): the pipe moves above them.
            import fcntl

            low = fd
            try:
                fd = fcntl.fcntl(low, fcntl.F_DUPFD_CLOEXEC, 3)
            finally:
                os.close(low)
        st = os.fstat(fd)
        self.fd, self.fd_id = fd, (st.st_dev, st.st_ino)

    def _still_ours(self):
        """The descriptor is still gpudoc's pipe: a program may close it and open its own file in its
        place."""
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
        # A program that restored SIGPIPE's default would die writing to a pipe gpudoc has left: the signal
        # is held off while writing, and the one a failed write raised is taken back, even when the
        # program holds SIGPIPE off itself (it would be delivered once the program lets it through). One
        # already pending is the program's own: a second one is the same one, and it is left.
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


# -- the shim's modules ------------------------------------------------------------------------------
def code(here, filename, name):
    """The code of a file of the shim's folder `here`, compiled once into its __pycache__ where that can
    be written, also under PYTHONDONTWRITEBYTECODE (which is about the program's files; this folder is
    gpudoc's: the start-up's writer, given to this module as `_cache`)."""
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader(name, os.path.join(here, filename))
    out = loader.get_code(name)
    cache = globals().get("_cache")
    if sys.dont_write_bytecode and cache is not None:
        cache(loader, out)
    return out


def load(here, filename, name):
    """The module `name` of the shim's, run from `filename` in `here`, or the one loaded already (one
    registry of changes, one hunt, whichever framework's part asks first). In sys.modules: Dynamo, tracing
    a compiled step into one of the shim's hooks, finds the hook's globals by importing their __name__.
    Its __file__ is no real file's name, so coverage never measures it as the program's; its code keeps
    the real one, for tracebacks and profilers."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    compiled = code(here, filename, name)
    module = type(sys)(name)
    module.__file__ = "<gpudoc> " + os.path.join(here, filename)
    sys.modules[name] = module
    try:
        exec(compiled, module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


# -- a framework's import ------------------------------------------------------------------------------
# The loader's methods run the framework's module through these; their frames are importlib's own to
# Python, so a failing import shows the program exactly the traceback it would without gpudoc. The
# framework's spec and module get their own loader back before any of its code runs.
_HIDDEN_EXEC = """
def _call_with_frames_removed(real, spec, after, module):
    wrapper, spec.loader = spec.loader, real
    if getattr(module, "__loader__", None) is wrapper:
        module.__loader__ = real
    real.exec_module(module)
    after(module)
"""
_HIDDEN_LOAD = """
def _call_with_frames_removed(real, spec, after, fullname):
    spec.loader = real
    module = real.load_module(fullname)
    after(module)
    return module
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
    """gpudoc's, in a framework's spec only while its import runs: it hands the framework's own loader (an
    object, a class, anything) back, runs the module with it, and then `after(module)`. Nothing of the
    loader's is changed."""

    def __init__(self, real, spec, after):
        if hasattr(real, "exec_module"):
            self.exec_module = functools.partial(_hidden(_HIDDEN_EXEC), real, spec, after)
            if hasattr(real, "create_module"):
                self.create_module = functools.partial(_hidden(_HIDDEN_CREATE), real)
        else:
            self.load_module = functools.partial(_hidden(_HIDDEN_LOAD), real, spec, after)


def spec_after(finder, name, path, target, after):
    """The spec the finders after `finder` (GpudocFinder) give for `name`, its loader wrapped so that
    `after(module)` runs once the module has run; None where none has it."""
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
            loader = spec.loader
            if hasattr(loader, "exec_module") or hasattr(loader, "load_module"):
                spec.loader = AfterLoader(loader, spec, after)
            return spec
        return None
    finally:
        finder.busy = False
