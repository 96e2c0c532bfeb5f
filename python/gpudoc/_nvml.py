"""NVML through ctypes for the notebook extension: a few calls, no thread, no import beyond ctypes. Opened
only once the kernel has a CUDA context of its own (gpudoc never makes one); `GPUDOC_NVML_LIB` names the
library as for `gpudoc run` (default libnvidia-ml.so.1)."""
from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

# What a report's device says (devices()), and the `nvml` object (status()).
Device = Dict[str, Any]
Status = Dict[str, Union[bool, str, None]]

# NVML's codes this reader tells apart.
SUCCESS = 0
INSUFFICIENT_SIZE = 7
# Processes read per GPU in one call (more: read again with room for all).
ROOM = 64


class _Process(ctypes.Structure):
    # nvmlProcessInfo_t of nvmlDeviceGetComputeRunningProcesses_v3.
    _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong), ("gi", ctypes.c_uint),
                ("ci", ctypes.c_uint)]


class _MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class NvmlError(Exception):
    pass


class Nvml(object):
    """The GPUs as NVML sees them: what this process holds on each (the per-cell reading), and for a
    report the devices, their memory and every process on them."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path or os.environ.get("GPUDOC_NVML_LIB") or "libnvidia-ml.so.1"
        try:
            self.lib = ctypes.CDLL(self.path)
        except OSError as e:
            raise NvmlError("cannot load %s: %s" % (self.path, e)) from None
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        count = ctypes.c_uint(0)
        self._check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount_v2")
        self.handles: List[Tuple[int, ctypes.c_void_p]] = []
        for i in range(count.value):
            h = ctypes.c_void_p()
            if self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) == SUCCESS:
                self.handles.append((i, h))
        self.room = (_Process * ROOM)()
        self.pid = os.getpid()

    @staticmethod
    def _check(code: int, what: str) -> None:
        if code != SUCCESS:
            raise NvmlError("%s failed with NVML error %d" % (what, code))

    def processes(self, handle: ctypes.c_void_p) -> Optional[Dict[int, int]]:
        """pid -> bytes of the compute processes on a GPU (None when NVML cannot say)."""
        n = ctypes.c_uint(len(self.room))
        code = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(n), self.room)
        room: ctypes.Array[_Process] = self.room
        if code == INSUFFICIENT_SIZE:
            room = (_Process * (n.value + 8))()
            n = ctypes.c_uint(len(room))
            code = self.lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(n), room)
        if code != SUCCESS:
            return None
        return dict((int(room[i].pid), int(room[i].used)) for i in range(n.value))

    def mine(self) -> Dict[int, int]:
        """NVML index -> bytes this process holds, on the GPUs where it holds any."""
        out: Dict[int, int] = {}
        for i, h in self.handles:
            used = (self.processes(h) or {}).get(self.pid)
            if used is not None:
                out[i] = used
        return out

    def _text(self, fn: Callable[..., int], *args: Any) -> Optional[str]:
        buf = ctypes.create_string_buffer(96)
        if fn(*(args + (buf, ctypes.c_uint(96)))) != SUCCESS:
            return None
        value: bytes = buf.value
        return value.decode("utf-8", "replace")

    def memory(self, handle: ctypes.c_void_p) -> Optional[Tuple[int, int, int]]:
        """(total, used as nvidia-smi shows it, the driver's reserve) of a GPU, or None."""
        m = _MemoryV2()
        m.version = ctypes.sizeof(_MemoryV2) | (2 << 24)
        fn = getattr(self.lib, "nvmlDeviceGetMemoryInfo_v2", None)
        if fn is not None and fn(handle, ctypes.byref(m)) == SUCCESS:
            return int(m.total), int(m.used), int(m.reserved)
        v1 = _MemoryV1()
        if self.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(v1)) == SUCCESS:
            return int(v1.total), int(v1.used), 0
        return None

    def status(self) -> Status:
        """The report's `nvml` object."""
        cuda = ctypes.c_int(0)
        fn = getattr(self.lib, "nvmlSystemGetCudaDriverVersion_v2", None)
        cuda_driver = None
        if fn is not None and fn(ctypes.byref(cuda)) == SUCCESS:
            cuda_driver = "%d.%d" % (cuda.value // 1000, (cuda.value % 1000) // 10)
        return {"available": True, "library": self.path, "error": None, "cuda_driver": cuda_driver,
                "driver": self._text(self.lib.nvmlSystemGetDriverVersion)}

    def devices(self) -> List[Device]:
        """Each GPU: index, name, uuid, total, used, the driver's reserve, and its processes."""
        out: List[Device] = []
        for i, h in self.handles:
            mem = self.memory(h) or (0, 0, 0)
            out.append({"index": i, "name": self._text(self.lib.nvmlDeviceGetName, h) or "unknown GPU",
                        "uuid": self._text(self.lib.nvmlDeviceGetUUID, h) or "", "total": mem[0],
                        "used": mem[1], "reserved": mem[2], "processes": self.processes(h) or {}})
        return out
