"""The frameworks' part of the shim (_gpudoc_frameworks.py) in-process, against the fake frameworks of
fixtures/fake_frameworks: what it changes in the program's process is taken back without undoing what the
program did after it (JAX's `sys.excepthook`)."""
import sys

import pytest
from shim_env import HERE, ROOT

FRAMEWORKS = "gpudoc._shim.frameworks"
FAKES = ROOT + "/fixtures/fake_frameworks"
OOM = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 268435456 bytes."


@pytest.fixture
def frameworks(shim, monkeypatch):
    """The frameworks' part loaded as GpudocFinder loads it, its pipe the shim's file, its registry the
    torch part's (one registry per process)."""
    fw = shim.torch.SHARED.load(HERE, "_gpudoc_frameworks.py", FRAMEWORKS)
    monkeypatch.setattr(fw.S, "here", HERE)
    monkeypatch.setattr(fw.S, "pipe", shim.torch.S.out)
    monkeypatch.setattr(fw.S, "registry", None)
    monkeypatch.setattr(fw.S, "views", {})
    monkeypatch.syspath_prepend(FAKES)
    try:
        yield fw
    finally:
        sys.modules.pop(FRAMEWORKS, None)


def _jax(fw, monkeypatch):
    """The fake jax with the shim's part in place, as `import jax` under gpudoc run leaves it."""
    for name in [m for m in sys.modules if m == "jax" or m.startswith("jax.")]:
        monkeypatch.delitem(sys.modules, name)
    import jax

    fw.S.views["jax"] = fw._install_jax(jax)
    return jax


def _ooms(shim):
    return [m for m in shim.messages() if m.get("k") == "oom" and m.get("fw") == "jax"]


def test_jaxs_excepthook_taken_back_leaves_a_hook_the_program_installed_after_it(shim, frameworks,
                                                                                   monkeypatch):
    """The program's hook, installed after gpudoc's, stays the current one; gpudoc's, which it may call,
    then only passes the error on (a hook the program chained to gpudoc's records no OOM any more)."""
    printed = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: printed.append(("first", str(value))))
    _jax(frameworks, monkeypatch)
    ours = sys.excepthook

    def theirs(kind, value, tb):
        printed.append(("theirs", str(value)))
        ours(kind, value, tb)

    sys.excepthook = theirs
    error = RuntimeError(OOM)
    sys.excepthook(RuntimeError, error, None)
    assert len(_ooms(shim)) == 1, "armed: the uncaught RESOURCE_EXHAUSTED error's numbers are recorded"
    frameworks._patches().remove_all()
    assert sys.excepthook is theirs
    assert "sys.excepthook" not in [p["target"] for p in frameworks._patches().listing()]
    printed.clear()
    other = RuntimeError(OOM)
    sys.excepthook(RuntimeError, other, None)
    assert printed == [("theirs", OOM), ("first", OOM)], "the chain passes the error on as before"
    assert len(_ooms(shim)) == 1, "taken back: gpudoc's hook records nothing"


def test_jaxs_excepthook_still_current_is_taken_back_to_the_one_it_found(shim, frameworks, monkeypatch):
    def first(kind, value, tb):
        pass

    monkeypatch.setattr(sys, "excepthook", first)
    _jax(frameworks, monkeypatch)
    ours = sys.excepthook
    assert ours is not first
    frameworks._patches().remove_all()
    assert sys.excepthook is first
    ours(RuntimeError, RuntimeError(OOM), None)  # a copy the program kept: a pass-through now
    assert _ooms(shim) == []


def _tensorflow(fw, monkeypatch):
    """The fake tensorflow and keras with the shim's parts in place, as their imports under gpudoc run
    leave them."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras")]:
        monkeypatch.delitem(sys.modules, name)
    import keras
    import tensorflow

    fw.S.views["tensorflow"] = fw._install_tensorflow(tensorflow)
    fw._install_keras(keras)
    return tensorflow, keras


def test_a_custom_loops_steps_are_the_calls_of_the_tf_function_it_calls_most(shim, frameworks, monkeypatch):
    tf, keras = _tensorflow(frameworks, monkeypatch)
    cls = sys.modules["tensorflow.python.eager.polymorphic_function.polymorphic_function"].Function
    ours = vars(cls)["__call__"]
    real = ours.__wrapped__  # TensorFlow's, as the shim found it (traceback_utils' wrapper)
    assert ours is not real and real.__qualname__ == ours.__qualname__ == "Function.__call__"
    train = tf.function(lambda batch: batch + 1)
    evaluate = tf.function(lambda batch: batch)
    for batch in range(30):
        assert train(batch) == batch + 1
        if batch % 10 == 9:
            evaluate(batch)
    view = frameworks.S.views["tensorflow"]
    assert view.steps == 30, "the train step's calls, not the evaluation's"
    records = [m for m in shim.messages() if m.get("fw") == "tensorflow" and m.get("k") == "step"]
    assert records and records[-1]["a"] >= 0

    class Model(keras.Model):
        def train_step(self, batch):
            return {"loss": 0.5}

    Model().fit(12, batch_size=1)
    assert view.steps == 42, "fit's 12 batches, once: its train function's calls are not counted too"
    frameworks._patches().remove_all()
    assert vars(cls)["__call__"] is real, "taken back: TensorFlow's own __call__"
    train(0)
    assert view.steps == 42


def test_tf_functions_made_anew_at_each_call_are_counted_in_bounded_memory(shim, frameworks, monkeypatch):
    """A program that makes a tf.function per call (TensorFlow warns of its retracing) keeps no count of
    each for ever; a train step called after them is still the steps."""
    tf, _ = _tensorflow(frameworks, monkeypatch)
    cls = sys.modules["tensorflow.python.eager.polymorphic_function.polymorphic_function"].Function
    cells = vars(cls)["__call__"].__closure__
    counted = [c.cell_contents for c in cells if isinstance(c.cell_contents, dict)][0]
    kept = []
    for batch in range(3 * frameworks.MAX_FUNCTIONS):
        once = tf.function(lambda batch: batch)
        once(batch)
        kept.append(once)  # alive: no id is reused
        assert len(counted) <= frameworks.MAX_FUNCTIONS
    train = tf.function(lambda batch: batch)
    for batch in range(50):
        train(batch)
    assert counted[id(train)][1] == 50
    assert frameworks.S.views["tensorflow"].steps == 50


def test_a_tf_function_made_where_a_dropped_one_was_starts_its_count_again(shim, frameworks, monkeypatch):
    """A function made anew per call often gets the address of the one the program just dropped: it
    inherits no calls, so no call after the first is a step."""
    tf, _ = _tensorflow(frameworks, monkeypatch)
    ids = set()
    for batch in range(20):
        once = tf.function(lambda batch: batch)
        once(batch)
        ids.add(id(once))
        del once
    assert len(ids) < 20, "CPython gave an address again (else this test shows nothing)"
    # The first call of the first is step 1, as any function's first call is (JAX's jitted ones too);
    # none after it, each a new function's first call.
    assert frameworks.S.views["tensorflow"].steps == 1


def test_each_oom_of_a_retry_loop_is_recorded_once(shim, frameworks, monkeypatch):
    """A loop that catches an OOM and tries again smaller frees each error, and the next may get its
    address: every one is recorded; the same error met twice on its way up (a jitted call, then the
    excepthook) once."""
    _jax(frameworks, monkeypatch)
    for _ in range(3):
        error = RuntimeError(OOM)
        frameworks._oom_record(error)
        frameworks._oom_record(error)
        del error
    assert len(_ooms(shim)) == 3


def test_a_fit_without_the_tensorflow_view_gets_no_callback_of_the_shims(shim, frameworks, monkeypatch):
    """Keras 3 on JAX or PyTorch: its batches are no TensorFlow steps, and a callback with its own
    on_train_batch_end would cost them their asynchronous dispatch."""
    _, keras = _tensorflow(frameworks, monkeypatch)
    del frameworks.S.views["tensorflow"]
    seen = []

    class Model(keras.Model):
        def train_step(self, batch):
            return {"loss": 0.5}

    class Mine(keras.callbacks.Callback):
        def set_model(self, model):
            seen.append(type(self).__name__)

    real_set_model = keras.callbacks.Callback.set_model
    monkeypatch.setattr(keras.callbacks.Callback, "set_model",
                        lambda self, model: seen.append(type(self).__name__) or real_set_model(self, model))
    Model().fit(4, batch_size=1, callbacks=[Mine()])
    assert seen == ["Mine"], seen
