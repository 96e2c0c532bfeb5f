"""The notebook's trace of a moment (_report.py) read by gpudoc's own engine (`gpudoc report`, the binary
the workspace built): its end row holds only what a moment knows, and the engine reads the rest as absent
(no Python copy of the run's end row)."""
import os
import time

import pytest
from conftest import ROOT, MIB

from gpudoc import _nvml, _report


@pytest.fixture
def engine(monkeypatch):
    binary = os.path.join(ROOT, "target", "debug", "gpudoc")
    if not os.path.exists(binary):
        pytest.fail("%s is missing: build it with `cargo test --workspace --no-run`" % binary)
    monkeypatch.setattr(_report, "binary", lambda: binary)


def test_a_moments_trace_is_read_by_the_engine_with_no_exit_of_a_process(fake_gpus, engine):
    fake_gpus.hold(os.getpid(), 1200 * MIB)
    nvml = _nvml.Nvml()
    t1 = time.time()
    rows = _report.rows(t1 - 2.0, t1, ["notebook"], nvml, [])
    end = rows[-1]["end"]
    assert set(end) == {"duration_s", "nvml", "torch_enabled", "device_samples", "process_samples", "gpus"}
    report = _report.report(rows, name="moment").report
    assert report["exit"]["code"] is None and report["exit"]["signal"] is None
    assert report["duration_s"] == pytest.approx(2.0, abs=0.01)
    assert [g["name"] for g in report["gpus"]] == ["NVIDIA H200"]
    assert report["processes"][0]["peak_bytes"] == 1200 * MIB
