"""The shim's messages are the published schema's (docs/schema/shim-message.schema.json, `gpudoc schema
shim-message`; issue 45, item 4): each writer of the shim's, run against real CPU torch with the
allocator's readings played, writes messages that conform, and together they write every kind the schema
has. The Rust side reads the same schema (src/torch/message.rs, tests/schema.rs)."""
import json
import os

import pytest
from schema_check import errors, published

torch = pytest.importorskip("torch")


class _Info(object):
    store_history, cell_id, raw_cell = True, "cell-1", "y = model(x)\n"


class _Result(object):
    execution_count, success = 3, True

    def __init__(self, info):
        self.info = info


def _stats(device=0):
    """The allocator's statistics as a device in use has them (no CUDA here)."""
    return {"allocated_bytes": {"all": {"current": 3 << 20, "peak": 5 << 20}},
            "reserved_bytes": {"all": {"current": 8 << 20, "peak": 8 << 20}},
            "inactive_split_bytes": {"all": {"current": 1 << 10}}, "num_alloc_retries": 0, "num_ooms": 1,
            "num_device_alloc": 2, "num_device_free": 0}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(6)])


def _messages(shim):
    """The pipe's messages, a message too large for it read from its file as gpudoc reads it."""
    out = []
    for m in shim.messages():
        if m["k"] == "file":
            with open(os.path.join(os.path.dirname(shim.pipe), m["name"])) as f:
                out.append(json.loads(f.read()))
        out.append(m)
    return out


@pytest.fixture
def written(shim, cuda, monkeypatch):
    """What the shim's writers sent, each called as a run calls it."""
    T = cuda
    monkeypatch.setattr(T.S, "orig_stats", _stats)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "a")
    T.S.out.identify()
    T._on_cuda_init()  # hello
    for _ in range(3):
        T._on_step(None, (), {})  # step
    T._record(T.STEP[0], 2, fwd=7)  # s, the forward clock's
    model, x = _model(), torch.randn(2, 4)
    assert T._where("arm_call", model, "inference") is True
    model(x)  # where, a measured call's peak
    T._on_oom(0, 1 << 30, 80 << 30, 1 << 20)  # oom, and what filled the GPU: where, hunt
    T.cell_start(_Info())
    T.cell_end(_Result(_Info()))  # cell
    T._send_big({"k": "hunt", "why": "on", "dev": 0, "t": 1.0, "sites": [], "holders": [],
                 "pad": "x" * 5000})  # file
    T._hunt_failed(ValueError("no history"))  # hunt, its error
    T._where_failed(ValueError("no graph"))  # where, its error
    T._on_exit()  # s, at exit
    T._fail("test", ValueError("gone"))  # error
    return _messages(shim)


def test_every_message_the_shim_writes_conforms_to_the_published_schema(written):
    schema = published("shim-message")
    for m in written:
        assert errors(schema, m) == [], m


def test_the_shims_writers_cover_every_kind_of_the_schema(written):
    schema = published("shim-message")
    # The PyTorch part's messages (the frameworks' part is tests/python/test_shim_pipe.py's).
    kinds = sorted(v["properties"]["k"]["const"] for v in schema["$defs"]["ShimMessage"]["oneOf"])
    assert sorted(set(m["k"] for m in written)) == kinds
    # Both kinds of `where` and of `hunt` (a result and a failure), and the ranks as the environment has them.
    for kind in ("where", "hunt"):
        assert {"error" in m for m in written if m["k"] == kind} == {False, True}, kind
    assert all(m["rank"] == 1 and m["local_rank"] == "a" for m in written if "pid" in m)


def test_a_message_the_schema_does_not_know_is_refused():
    schema = published("shim-message")
    assert errors(schema, {"k": "step", "step": 1, "pid": 7})  # no reading
    assert errors(schema, {"k": "later", "pid": 7})
    assert errors(schema, {"k": "hello", "torch": "2.11", "budget": 0.003}) != []  # no pid
