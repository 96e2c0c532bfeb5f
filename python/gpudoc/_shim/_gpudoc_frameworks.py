"""gpudoc's shim for the frameworks other than PyTorch, loaded when the program imports JAX, CuPy,
TensorFlow (and Keras) or RMM (sitecustomize.py's finder watches for that; a program that imports none
pays nothing). It reads each
framework's own allocator and sends records of the same kind as PyTorch's (in use, reserved, peaks, steps),
tagged with the framework; what a framework cannot tell is left out of the record, never sent as zero.

- JAX (XLA's allocator): `device.memory_stats()` of each local GPU device, the preallocation settings in
  force, and steps: the calls of the jitted function the program calls most (`jax.jit` returns gpudoc's
  thin wrapper of jax's own). At a RESOURCE_EXHAUSTED error the allocator's numbers are recorded: from a
  jitted call before it reaches the program, and, since JAX dispatches asynchronously and a computation's
  error is raised where the program waits for its result (`block_until_ready()`, printing, copying it to
  the host), at an uncaught one through `sys.excepthook` (chained to the hook before it).
- CuPy: the default memory pool (used, total, free blocks; its limit where one is set) and the pinned
  pool's free blocks, read ten times a second by one thread of the shim's (CuPy has no step a hook could
  count: the readings stand for steps in the records, and the report counts no steps), and at exit.
- TensorFlow: `tf.config.experimental.get_memory_info` of each GPU (in use and its peak; TensorFlow does
  not say what its allocator holds), memory growth as set; steps: the batches of Keras's `Model.fit`
  (a callback of the shim's added to the fit's callbacks), elsewhere the calls of the `tf.function` the
  program calls most (a custom training loop's train step: counted at the class, `Function.__call__`,
  never on the program's function objects, which SavedModel saves); at a ResourceExhaustedError from fit
  or a `tf.function` the allocator's numbers before it reaches the program.
- RMM: where the current device resource is a StatisticsResourceAdaptor (`rmm.statistics`), its counts
  (current and peak bytes, allocations), and a pool memory resource's size as reserved; read as CuPy's.

Every record is taken every Nth step, N chosen so that its cost stays under BUDGET of the step time, as
PyTorch's (docs/framework.md). Loaded by GpudocFinder as the module `gpudoc._shim.frameworks`.
"""
import os
import sys
import time
import weakref

# Share of the step time the shim aims at; records further apart than MAX_STRIDE steps are not made; the
# stride adapts after ADAPT_AFTER records.
BUDGET = 0.003
MAX_STRIDE = 4096
ADAPT_AFTER = 5
# CuPy's pool is read this often (seconds): it keeps no peak of its own.
CUPY_EVERY = 0.1
__tracebackhide__ = True
# A bare `raise` re-raises an exception with its own __traceback__ (Python 3.11 and later).
RERAISE_OWN_TRACEBACK = sys.version_info >= (3, 11)
# The shim's loader and the pipe's writer (_gpudoc_pipe.py), loaded before this module by GpudocFinder.
SHARED = sys.modules["gpudoc._shim.pipe"]
PATCH = ("_gpudoc_patch.py", "gpudoc._shim.patch")


class _State(object):
    here = ""
    pipe = None
    registry = None
    # Framework name -> its reader, once imported.
    views = {}
    # The `args` of the last OOM error recorded, the tuple of its message (never the error itself: its
    # traceback holds the program's arrays): the same error met again on its way up is recorded once, and
    # the next one (a retry that freed this one, whose id it may get again) is recorded too.
    oom_args = None
    # Keras fits running: their batches are the steps, and the tf.function calls inside them are not.
    fitting = 0


S = _State()


def _patches():
    """The shim's registry of changes (_gpudoc_patch.py), shared with the PyTorch part."""
    if S.registry is None:
        S.registry = SHARED.load(S.here, *PATCH).PATCHES
    return S.registry


def find_spec(finder, name, path, target, here, setting):
    """GpudocFinder's answer when the program imports one of the frameworks: the spec the finders after it
    give, whose loader runs `_after_import` once the framework's module has run."""
    if S.pipe is None:
        S.here = here
        S.pipe = SHARED.Pipe(setting.partition("pipe=")[2])
    return SHARED.spec_after(
        finder, name, path, target, lambda module: _after_import(name, module))


def _after_import(name, module):
    try:
        if name not in S.views:
            S.views[name] = INSTALL[name](module)
    except Exception as e:
        S.pipe.fail("start " + name, e)


def _field(key, value):
    return ',"%s":%d' % (key, value) if isinstance(value, int) and value >= 0 else ""


class View(object):
    """One framework's records: `read()` gives, per device, (index, uuid or None, {field: bytes}), the
    fields as PyTorch's records name them (a: in use, r: reserved, pa/pr: their peaks, lim: the
    allocator's limit, lfb: its largest free block, na: allocations); one it cannot tell is absent."""

    def __init__(self, fw, read):
        self.fw, self.read = fw, read
        self.steps = 0
        self.next = 1
        self.records = 0
        self.last_step = 0
        self.last_t = 0.0
        self.cost = 0.0
        self.period = 0.0
        self.hello = None

    def record(self, kind, covered, extra=""):
        """One record per device: the numbers now (`kind`: s, step, oom)."""
        if callable(self.hello):
            # Said at the first record: what a framework tells of its settings may be set until then.
            self.hello = self.hello()
        if self.hello is not None:
            S.pipe.send(self.hello)
            self.hello = None
        t = time.time()
        for dev, uuid, numbers in self.read():
            body = '{"k":"%s","fw":"%s","step":%d,"n":%d,"dev":%d,"t":%.6f,"c":%d,"p":%d' % (
                kind, self.fw, self.steps, covered, dev, t, self.cost * 1e6, self.period * 1e6)
            if uuid:
                body += ',"uuid":"%s"' % uuid
            for key in ("a", "r", "pa", "pr", "lim", "lfb", "na", "nfb", "pfb"):
                body += _field(key, numbers.get(key))
            S.pipe.send(body + extra)

    def tick(self):
        """One step ended: every Nth is recorded."""
        self.steps += 1
        if self.steps < self.next or S.pipe.dead:
            return
        t0 = time.perf_counter()
        covered = self.steps - self.last_step
        if self.last_t:
            self.period = (t0 - self.last_t) / covered
        try:
            self.record("step", covered)
        except Exception as e:
            S.pipe.fail("step", e)
            return
        t1 = time.perf_counter()
        self.cost = t1 - t0
        self.records += 1
        self.last_step, self.last_t = self.steps, t1
        stride = 1
        if self.records > ADAPT_AFTER and self.period > 0:
            stride = min(MAX_STRIDE, int(self.cost / (BUDGET * self.period)) + 1)
        self.next = self.steps + stride

    def at_exit(self):
        try:
            if self.records and not S.pipe.dead:
                self.record("s", self.steps - self.last_step)
        except Exception as e:
            S.pipe.fail("exit", e)


def _hello(fw, version, settings):
    import json

    return '{"k":"hello","fw":"%s","version":%s,"settings":%s,"budget":%s' % (
        fw, json.dumps(str(version)), json.dumps(settings, sort_keys=True), BUDGET)


def _watch_process(view):
    """The last record at exit; a forked child's messages are its own."""
    import atexit

    atexit.register(view.at_exit)
    _patches().callback("atexit", "the last record at exit", lambda: atexit.unregister(view.at_exit))
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=S.pipe.forked)
        _patches().callback("os.register_at_fork", "a forked child's messages are its own")


# -- JAX ------------------------------------------------------------------------------------------------
# XLA's client reads these when it makes the GPU backend (docs.jax.dev, GPU memory allocation).
JAX_SETTINGS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                "XLA_PYTHON_CLIENT_ALLOCATOR")
# memory_stats()'s keys (xla's PjRtDevice memory_stats), as the records name them.
JAX_KEYS = (("a", "bytes_in_use"), ("pa", "peak_bytes_in_use"), ("r", "pool_bytes"),
            ("pr", "peak_pool_bytes"), ("lim", "bytes_limit"), ("lfb", "largest_free_block_bytes"),
            ("na", "num_allocs"))


def _jax_reader(jax):
    devices = []

    def read():
        if not devices:
            devices.extend(d for d in jax.local_devices() if getattr(d, "platform", "") == "gpu")
        for d in devices:
            stats = d.memory_stats()
            if not stats:
                continue
            index = getattr(d, "local_hardware_id", None)
            yield (d.id if index is None else index), None, dict((k, stats.get(name)) for k, name in JAX_KEYS)

    return read


def _is_oom(e):
    return "RESOURCE_EXHAUSTED" in str(e)[:200]


class _Jitted(object):
    """What `jax.jit` returns under gpudoc: jax's own jitted function, called through this. Its calls are
    counted (the function the program calls most gives the steps); any other attribute is jax's."""

    __slots__ = ("_gpudoc_real", "calls", "__weakref__")

    def __init__(self, real):
        object.__setattr__(self, "_gpudoc_real", real)
        object.__setattr__(self, "calls", 0)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        try:
            out = self._gpudoc_real(*args, **kwargs)
        except Exception as e:
            _failed(e, _is_oom, "jax")
            raise
        calls = self.calls + 1
        object.__setattr__(self, "calls", calls)
        view = S.views.get("jax")
        if view is not None and calls > view.steps:
            view.tick()
        return out

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        import functools

        return functools.partial(self, obj)

    def __getattr__(self, name):
        return getattr(self._gpudoc_real, name)

    def __setattr__(self, name, value):
        setattr(self._gpudoc_real, name, value)

    def __repr__(self):
        return repr(self._gpudoc_real)


def _failed(error, is_oom, fw):
    """What a wrapper of the shim's does with the program's error before it raises it on, unchanged: the
    allocator's numbers recorded at an out-of-memory error of `fw`'s, and the wrapper's own frame taken
    off its traceback."""
    try:
        if is_oom(error):
            _oom_record(error, fw)
    except Exception:
        pass  # the program's own error goes on as it is
    if RERAISE_OWN_TRACEBACK and error.__traceback__ is not None:
        error.__traceback__ = error.__traceback__.tb_next


def _like(new, real):
    """`new` reads as `real`: its names, doc and `__wrapped__` (inspect.signature follows it to `real`'s
    parameters)."""
    for key in ("__module__", "__name__", "__qualname__", "__doc__"):
        try:
            setattr(new, key, getattr(real, key))
        except AttributeError:
            pass
    new.__wrapped__ = real


def _oom_record(error, fw="jax"):
    """The allocator's numbers at an out-of-memory error (JAX's RESOURCE_EXHAUSTED, TensorFlow's
    ResourceExhaustedError), once per error, while the arrays it found are still alive."""
    try:
        view = S.views.get(fw)
        if view is not None and not S.pipe.dead and S.oom_args is not error.args:
            S.oom_args = error.args
            view.record("oom", view.steps - view.last_step)
    except Exception as e:
        S.pipe.fail("oom", e)


def _excepthook(previous):
    """sys.excepthook that records an uncaught RESOURCE_EXHAUSTED error's allocator numbers (its traceback
    still holds the frames, and so the arrays, that filled the GPU), then hands the error to `previous`;
    and what makes it a pass-through to `previous` (taken back while a hook the program installed after
    it is the current one: theirs stays, and may call this one)."""
    armed = [True]

    def excepthook(kind, value, tb):
        try:
            if armed[0] and _is_oom(value):
                _oom_record(value)
        except Exception:
            pass  # the program's error is printed as it would be without gpudoc
        return previous(kind, value, tb)

    def disarm():
        armed[0] = False

    return excepthook, disarm


def _install_jax(jax):
    settings = dict((k, os.environ[k]) for k in JAX_SETTINGS if k in os.environ)
    view = View("jax", _jax_reader(jax))
    view.hello = _hello("jax", getattr(jax, "__version__", "?"), settings)
    real = jax.jit

    def jit(*args, **kwargs):
        out = real(*args, **kwargs)
        if args or "fun" in kwargs:
            return _Jitted(out)
        # `jax.jit(static_argnames=...)` without the function: a decorator.
        return lambda fun: _Jitted(out(fun))

    _like(jit, real)
    _patches().replace(jax, "jit", jit, "counts the calls of jitted functions: the steps of a JAX program")
    hook, disarm = _excepthook(sys.excepthook)
    _patches().replace(sys, "excepthook", hook,
                       "records XLA's allocator at an uncaught RESOURCE_EXHAUSTED error (JAX raises it where "
                       "the program waits for a result), then calls the hook before it", disarm=disarm)
    _watch_process(view)
    return view


# -- CuPy -----------------------------------------------------------------------------------------------
def _readings(view, name, readable):
    """A thread of the shim's reads `view` every CUPY_EVERY seconds once `readable()` (a framework with no
    step a hook could count: its readings stand for steps in the records). A reading is a few C calls
    under the GIL, microseconds."""
    import threading

    def sample():
        while not S.pipe.dead:
            time.sleep(CUPY_EVERY)
            try:
                if readable():
                    view.steps += 1
                    view.record("step", 1)
                    view.records += 1
                    view.last_step = view.steps
            except Exception as e:
                S.pipe.fail(name, e)

    threading.Thread(target=sample, name="gpudoc-" + name, daemon=True).start()


def _cupy_reader(cupy):
    runtime = cupy.cuda.runtime
    uuids = {}

    def read():
        # The pool of the current device (CuPy's MemoryPool answers for it); its numbers now: CuPy keeps
        # no peak, so a reading's peaks are its own values.
        pool = cupy.get_default_memory_pool()
        used, total = pool.used_bytes(), pool.total_bytes()
        dev = runtime.getDevice()
        if dev not in uuids:
            try:
                raw = runtime.getDeviceProperties(dev).get("uuid")
                uuids[dev] = "GPU-" + _uuid(raw) if raw else None
            except Exception:
                uuids[dev] = None
        yield dev, uuids[dev], {"a": used, "r": total, "pa": used, "pr": total,
                                "nfb": pool.n_free_blocks(), "lim": pool.get_limit() or None,
                                "pfb": cupy.get_default_pinned_memory_pool().n_free_blocks()}

    return read


def _uuid(raw):
    h = raw.hex() if isinstance(raw, bytes) else "".join("%02x" % (ord(b) & 0xFF) for b in raw)
    return "-".join((h[:8], h[8:12], h[12:16], h[16:20], h[20:32]))


def _install_cupy(cupy):
    view = View("cupy", _cupy_reader(cupy))
    view.hello = _hello("cupy", getattr(cupy, "__version__", "?"), {})
    # From the pool's first allocation on: a program that imports CuPy and never allocates is never read.
    _readings(view, "cupy", lambda: cupy.get_default_memory_pool().total_bytes())
    _watch_process(view)
    return view


# -- TensorFlow -----------------------------------------------------------------------------------------
# What sets how TensorFlow's GPU allocator takes memory (tensorflow.org/guide/gpu).
TF_SETTINGS = ("TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_ALLOCATOR")


def _tf_reader(tf):
    def read():
        # The logical GPUs exist once TensorFlow's context has started: the shim reads only after a
        # batch ran or at an error from one, never before (reading would start it, and take the GPU).
        for d in tf.config.list_logical_devices("GPU"):
            info = tf.config.experimental.get_memory_info(d.name)
            yield int(d.name.rsplit(":", 1)[1]), None, {"a": info.get("current"), "pa": info.get("peak")}

    return read


def _tf_hello(tf):
    settings = dict((k, os.environ[k]) for k in TF_SETTINGS if k in os.environ)
    try:
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            growth = all(tf.config.experimental.get_memory_growth(g) for g in gpus)
            settings["memory_growth"] = "true" if growth else "false"
    except Exception:
        pass  # not told: absent
    return _hello("tensorflow", getattr(tf, "__version__", "?"), settings)


def _is_tf_oom(e):
    return type(e).__name__ == "ResourceExhaustedError" or "OOM when allocating" in str(e)[:400]


# Where `tf.function`'s class is: TensorFlow 2.11 and later, then before (def_function).
TF_FUNCTION_MODULES = ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
                       "tensorflow.python.eager.def_function")
# Distinct tf.function objects whose calls are counted at once (a program that makes one per call counts
# no steps by them; past this, only the most called are kept).
MAX_FUNCTIONS = 1024


def _install_tensorflow(tf):
    view = View("tensorflow", _tf_reader(tf))
    view.hello = lambda: _tf_hello(tf)
    _count_tf_functions()
    _watch_process(view)
    return view


def _tf_function_class():
    """`tf.function`'s class, from the modules `import tensorflow` loaded (never imported here)."""
    for name in TF_FUNCTION_MODULES:
        cls = getattr(sys.modules.get(name), "Function", None)
        if isinstance(cls, type) and "__call__" in vars(cls):
            return cls
    return None


def _count_tf_functions():
    """A custom training loop calls one `tf.function` (its train step) again and again, as a JAX program
    its jitted step: the calls of the one called most are the steps (outside Keras's fit, whose batches
    are). Counted at the class, `Function.__call__`, by the object's id: nothing is put into the program's
    function objects (SavedModel saves them, a copy or a pickle carries what they hold)."""
    cls = _tf_function_class()
    if cls is None:
        return
    real = vars(cls)["__call__"]
    counts = {}

    def __call__(self, *args, **kwds):
        __tracebackhide__ = True
        try:
            out = real(self, *args, **kwds)
        except Exception as e:
            _failed(e, _is_tf_oom, "tensorflow")
            raise
        if not S.fitting:
            try:
                _tf_function_called(counts, self)
            except Exception as e:
                S.pipe.fail("tf.function", e)
        return out

    _like(__call__, real)
    _patches().replace(cls, "__call__", __call__,
                       "counts the calls of tf.functions: the steps of a custom training loop")


def _tf_function_called(counts, function):
    """Counts a call of `function` under its id, with a weak reference that tells it from a function made
    later at the same address (the program dropped the first): that one's count starts again."""
    key = id(function)
    known = counts.get(key)
    same = known is not None and (known[0] is None or known[0]() is function)
    calls = known[1] + 1 if same else 1
    if calls == 1 and len(counts) >= MAX_FUNCTIONS:
        # The most called are kept; functions called once each (made anew per call) are none of a loop's.
        top = max(c for _, c in counts.values())
        for k in [k for k, (_, c) in counts.items() if c < top or top == 1]:
            del counts[k]
        if len(counts) >= MAX_FUNCTIONS:
            counts.clear()
    counts[key] = (known[0] if calls > 1 else _weak(function), calls)
    view = S.views.get("tensorflow")
    if view is not None and calls > view.steps:
        view.tick()


def _weak(function):
    """A weak reference to `function`; None where it takes none (its id is then all that tells it)."""
    try:
        return weakref.ref(function)
    except TypeError:
        return None


def _install_keras(keras):
    """Keras's `Model.fit` gets a callback of the shim's among its callbacks: each batch's end is a step
    of the TensorFlow view. The program's own list of callbacks is left as it was (the fit gets a copy);
    a CallbackList of the program's is left alone (no steps are counted then), and so is a fit without the
    TensorFlow view (Keras 3 on JAX or PyTorch)."""
    base = keras.callbacks.Callback

    class GpudocSteps(base):
        def __init__(self):
            base.__init__(self)
            # Keras 2 hands a callback that says so its logs as tensors: no copy to the host per batch.
            self._supports_tf_logs = True

        def on_train_batch_end(self, batch, logs=None):
            view = S.views.get("tensorflow")
            if view is not None:
                view.tick()

    real = keras.Model.fit

    def fit(self, *args, **kwargs):
        __tracebackhide__ = True
        try:
            # Only where its batches are TensorFlow's steps: under Keras 3 on another backend (JAX,
            # PyTorch) the callback would count nothing and could cost its batches their asynchronous
            # dispatch (a callback with its own on_train_batch_end turns it off).
            if S.views.get("tensorflow") is not None:
                args, kwargs = _with_callback(args, kwargs, GpudocSteps)
        except Exception:
            pass  # the fit runs as the program asked, uncounted
        S.fitting += 1
        try:
            return real(self, *args, **kwargs)
        except Exception as e:
            _failed(e, _is_tf_oom, "tensorflow")
            raise
        finally:
            S.fitting -= 1

    _like(fit, real)
    why = "counts the batches of Model.fit: the steps of a Keras program"
    _patches().replace(keras.Model, "fit", fit, why)
    return None


def _with_callback(args, kwargs, kind):
    """fit's arguments with one callback of `kind` more; `callbacks` is fit's sixth parameter (x, y,
    batch_size, epochs, verbose, callbacks) in Keras 2 and 3."""
    positional = len(args) > 5
    given = args[5] if positional else kwargs.get("callbacks")
    if given is None:
        given = []
    elif not isinstance(given, (list, tuple)):
        return args, kwargs
    callbacks = list(given) + [kind()]
    if positional:
        return args[:5] + (callbacks,) + args[6:], kwargs
    kwargs = dict(kwargs)
    kwargs["callbacks"] = callbacks
    return args, kwargs


# -- RMM ------------------------------------------------------------------------------------------------
def _rmm_counts(rmm):
    """The statistics of RMM's current device resource, where it keeps them (a StatisticsResourceAdaptor:
    `rmm.statistics.enable_statistics()`; the shim never puts one in), and its pool's size."""
    mr = rmm.mr.get_current_device_resource()
    counts = None
    if isinstance(mr, rmm.mr.StatisticsResourceAdaptor):
        counts = mr.allocation_counts
        if isinstance(counts, dict):  # RMM before 24.08 gave a dict of the same names
            counts = type("Counts", (), counts)
    pool, seen = None, 0
    while mr is not None and seen < 16:
        if isinstance(mr, rmm.mr.PoolMemoryResource):
            pool = mr.pool_size()
            break
        if isinstance(mr, rmm.mr.CudaMemoryResource) and counts is not None:
            # cudaMalloc and cudaFree as asked: what RMM holds is what is allocated.
            pool = counts.current_bytes
            break
        mr, seen = getattr(mr, "upstream_mr", None), seen + 1
    return counts, pool


def _rmm_reader(rmm):
    last_peak = [0]

    def read():
        counts, pool = _rmm_counts(rmm)
        numbers = {"r": pool, "pr": pool}
        if counts is not None:
            # RMM's peak is since the statistics began: a reading's peak is that peak where it rose since
            # the reading before (it was reached in between), else what is allocated now.
            rose = counts.peak_bytes > last_peak[0]
            last_peak[0] = counts.peak_bytes
            numbers.update(a=counts.current_bytes, na=counts.total_count,
                           pa=counts.peak_bytes if rose else counts.current_bytes)
        yield _rmm_device(rmm), None, numbers

    return read


def _rmm_device(rmm):
    try:
        return rmm._cuda.gpu.getDevice()
    except Exception:
        return 0


def _install_rmm(rmm):
    view = View("rmm", _rmm_reader(rmm))
    view.hello = _hello("rmm", getattr(rmm, "__version__", "?"), {})

    def readable():
        counts, pool = _rmm_counts(rmm)
        return (counts is not None and counts.total_count > 0) or bool(pool)

    _readings(view, "rmm", readable)
    _watch_process(view)
    return view


INSTALL = {"jax": _install_jax, "cupy": _install_cupy, "tensorflow": _install_tensorflow,
           "keras": _install_keras, "rmm": _install_rmm}
