"""gpudoc's own NVML reader (python/gpudoc/_nvml.py, the notebook's outside view) against the fake
libnvidia-ml.so: what it reads, and what it says when NVML cannot answer."""
import os

import pytest

from gpudoc import _nvml
from conftest import GIB, MIB


def test_a_process_reads_what_it_holds_on_each_gpu(fake_gpus):
    fake_gpus.hold(os.getpid(), 3 * GIB)
    fake_gpus.hold(4000001, 5 * GIB, ghost=True)
    nvml = _nvml.Nvml()
    assert nvml.mine() == {0: 3 * GIB}
    assert nvml.processes(nvml.handles[0][1]) == {os.getpid(): 3 * GIB, 4000001: 5 * GIB}


def test_more_processes_than_the_first_buffer_holds_are_all_read(fake_gpus):
    for i in range(_nvml.ROOM + 6):
        fake_gpus.hold(4000000 + i, (i + 1) * MIB, ghost=True)
    nvml = _nvml.Nvml()
    procs = nvml.processes(nvml.handles[0][1])
    assert len(procs) == _nvml.ROOM + 6
    assert procs[4000000 + _nvml.ROOM + 5] == (_nvml.ROOM + 6) * MIB


def test_memory_is_nvidia_smis_used_with_the_drivers_reserve_apart(fake_gpus):
    fake_gpus.hold(4000001, 10 * GIB, ghost=True)
    nvml = _nvml.Nvml()
    assert nvml.memory(nvml.handles[0][1]) == (143771 * MIB, 10 * GIB, 615 * MIB)


def test_an_old_driver_without_v2_memory_falls_back_to_v1(fake_gpus):
    # NVML_ERROR_FUNCTION_NOT_FOUND (13) from the _v2 call, as a driver before it answers.
    fake_gpus.fail("nvmlDeviceGetMemoryInfo_v2", 13)
    fake_gpus.hold(4000001, 10 * GIB, ghost=True)
    nvml = _nvml.Nvml()
    # v1's used counts the driver's reserve; the reserve itself is unknown there.
    assert nvml.memory(nvml.handles[0][1]) == (143771 * MIB, 10 * GIB + 615 * MIB, 0)


def test_a_failing_process_listing_is_unknown_not_empty(fake_gpus):
    fake_gpus.fail("nvmlDeviceGetComputeRunningProcesses_v3", 999)
    nvml = _nvml.Nvml()
    assert nvml.processes(nvml.handles[0][1]) is None
    assert nvml.mine() == {}


def test_the_report_names_the_driver_and_the_cuda_version(fake_gpus):
    status = _nvml.Nvml().status()
    assert status["driver"] == "580.159.04"
    assert status["cuda_driver"] == "13.0"
    assert status["library"] == fake_gpus.lib


def test_a_missing_library_is_an_error_that_names_it(monkeypatch):
    monkeypatch.setenv("GPUDOC_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
    with pytest.raises(_nvml.NvmlError, match="/nonexistent/libnvidia-ml.so.1"):
        _nvml.Nvml()


def test_a_failing_init_names_the_call_and_the_code(fake_gpus):
    fake_gpus.fail("nvmlInit_v2", 9)
    with pytest.raises(_nvml.NvmlError, match="nvmlInit_v2 failed with NVML error 9"):
        _nvml.Nvml()
