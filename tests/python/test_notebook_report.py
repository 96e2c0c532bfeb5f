"""The notebook's moment, as the engine is asked about it (gpudoc/_report.py): what the report says of a
single NVML reading, of an OOM text handed over, and of NVML that could not be read."""
import os

import pytest

from conftest import GIB, ROOT
from gpudoc import _report

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 18.31 GiB. GPU 0 has a total capacity "
       "of 79.18 GiB of which 3.32 GiB is free. Including non-PyTorch memory, this process has 75.85 GiB "
       "memory in use. Of the allocated memory 75.27 GiB is allocated by PyTorch, and 768.00 KiB is reserved "
       "by PyTorch but unallocated.\n")


class OneReading(object):
    """An NVML reader as the notebook holds one: `n` H100s with this kernel on each."""

    def __init__(self, n=1):
        self.n = n

    def devices(self):
        return [{"index": i, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-%d" % i, "total": 80 * GIB,
                 "used": 10 * GIB, "reserved": 0, "processes": {os.getpid(): 10 * GIB}}
                for i in range(self.n)]

    def status(self):
        return {"available": True, "library": "libnvidia-ml.so.1", "driver": "580.159.04",
                "cuda_driver": "13.0", "error": None}


@pytest.fixture
def engine(monkeypatch):
    path = os.path.join(ROOT, "target/debug/gpudoc")
    if not os.path.exists(path):
        pytest.fail("%s is missing: build it with `cargo test --workspace --no-run`" % path)
    monkeypatch.setattr(_report, "binary", lambda: path)


@pytest.mark.parametrize("gpus", [1, 2])
def test_a_moments_single_reading_draws_no_line_over_time(engine, gpus):
    rows = _report.rows(1000.0, 1002.0, ["python3", "-m", "ipykernel_launcher"], OneReading(gpus), [])
    text = _report.report(rows).text
    assert text.count("job peak 10.00 GiB") == gpus, text
    assert "over the run" not in text, text


def test_an_oom_text_handed_over_is_read_and_names_no_file_that_is_gone(engine):
    rows = _report.rows(1000.0, 1002.0, ["python3", "-m", "ipykernel_launcher"], OneReading(), [])
    verdict = _report.report(rows, output=OOM)
    assert "asked for 18.31 GiB with 3.32 GiB free" in verdict.text, verdict.text
    assert "OOM text read from standard input" in verdict.text
    # Nothing of the folder the engine was given its trace in (gone once it answered).
    assert "gpudoc-cell" not in verdict.text and "error.txt" not in verdict.text, verdict.text


def test_nvml_that_could_not_be_read_is_said_as_it_failed(engine):
    why = "libnvidia-ml.so.1: cannot open shared object file"
    rows = _report.rows(1000.0, 1002.0, ["python3"], None, [], why)
    assert rows[0]["nvml"]["error"] == why
    verdict = _report.report(rows, output=OOM)
    assert why in verdict.text, verdict.text
    assert "CUDA context" not in verdict.text
