//! A fake `libnvidia-ml.so` for gpudoc's tests. Loaded through `GPUDOC_NVML_LIB`, it exports the NVML
//! subset gpudoc calls; every call reads the state file named by `FAKE_NVML_STATE` (see [`state`]), so a
//! test scripts devices, per-PID memory and injected error codes while gpudoc runs.
//!
//! On `nvmlShutdown` it writes how often each function was called to `<state>.calls`, so a test can check
//! that gpudoc stops calling what failed as unsupported.

pub mod state;

use state::{STATE_ENV, State};
use std::ffi::{c_char, c_int, c_uint};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

const SUCCESS: c_int = 0;
const ERROR_UNINITIALIZED: c_int = 1;
const ERROR_INVALID_ARGUMENT: c_int = 2;
const ERROR_INSUFFICIENT_SIZE: c_int = 7;
const ERROR_DRIVER_NOT_LOADED: c_int = 9;
const ERROR_UNKNOWN: c_int = 999;

static INITIALIZED: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<Vec<(&'static str, u64)>> = Mutex::new(Vec::new());

#[repr(C)]
pub struct MemoryV1 {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: u64,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// Opaque device handle: index + 1, so that null stays invalid.
type Handle = usize;

fn count(func: &'static str) {
    let mut calls = CALLS.lock().unwrap();
    match calls.iter_mut().find(|(f, _)| *f == func) {
        Some((_, n)) => *n += 1,
        None => calls.push((func, 1)),
    }
}

fn state_path() -> Option<std::path::PathBuf> {
    std::env::var_os(STATE_ENV).map(Into::into)
}

/// Runs one NVML entry point: counts it, loads the state, applies an injected error, then `body`.
fn call(func: &'static str, gpu: Option<u32>, body: impl FnOnce(&State) -> c_int) -> c_int {
    count(func);
    if !INITIALIZED.load(Ordering::SeqCst) {
        return ERROR_UNINITIALIZED;
    }
    let Some(path) = state_path() else {
        return ERROR_DRIVER_NOT_LOADED;
    };
    let Ok(state) = State::load(&path) else {
        return ERROR_UNKNOWN;
    };
    if let Some(d) = state.delay(func) {
        std::thread::sleep(d);
    }
    if let Some(code) = state.injected(func, gpu) {
        return code;
    }
    if gpu.is_some_and(|g| g as usize >= state.devices.len()) {
        return ERROR_INVALID_ARGUMENT;
    }
    body(&state)
}

fn gpu_of(handle: Handle) -> Option<u32> {
    handle.checked_sub(1).map(|i| i as u32)
}

unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> c_int {
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return ERROR_INSUFFICIENT_SIZE;
    }
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> c_int {
    count("nvmlInit_v2");
    let Some(path) = state_path() else {
        return ERROR_DRIVER_NOT_LOADED;
    };
    let Ok(state) = State::load(&path) else {
        return ERROR_DRIVER_NOT_LOADED;
    };
    if let Some(d) = state.delay("nvmlInit_v2") {
        std::thread::sleep(d);
    }
    match state.injected("nvmlInit_v2", None) {
        Some(code) => code,
        None => {
            INITIALIZED.store(true, Ordering::SeqCst);
            SUCCESS
        }
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> c_int {
    nvmlInit_v2()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_int {
    count("nvmlShutdown");
    INITIALIZED.store(false, Ordering::SeqCst);
    if let Some(path) = state_path() {
        let calls = CALLS.lock().unwrap();
        let map: serde_json::Map<String, serde_json::Value> = calls
            .iter()
            .map(|(f, n)| (f.to_string(), (*n).into()))
            .collect();
        let mut out = path.into_os_string();
        out.push(".calls");
        let _ = std::fs::write(out, serde_json::to_vec_pretty(&map).unwrap());
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlErrorString(code: c_int) -> *const c_char {
    let s: &'static [u8] = match code {
        0 => b"Success\0",
        1 => b"Uninitialized\0",
        2 => b"Invalid Argument\0",
        3 => b"Not Supported\0",
        4 => b"Insufficient Permissions\0",
        7 => b"Insufficient Size\0",
        9 => b"Driver Not Loaded\0",
        15 => b"GPU is lost\0",
        _ => b"Unknown Error\0",
    };
    s.as_ptr() as *const c_char
}

/// # Safety
/// `buf` must hold `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> c_int {
    call("nvmlSystemGetDriverVersion", None, |s| unsafe {
        write_str(&s.driver, buf, len)
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(out: *mut c_int) -> c_int {
    call("nvmlSystemGetCudaDriverVersion_v2", None, |s| {
        unsafe { *out = s.cuda };
        SUCCESS
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(out: *mut c_uint) -> c_int {
    call("nvmlDeviceGetCount_v2", None, |s| {
        unsafe { *out = s.devices.len() as c_uint };
        SUCCESS
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, out: *mut Handle) -> c_int {
    call("nvmlDeviceGetHandleByIndex_v2", Some(index), |_| {
        unsafe { *out = index as usize + 1 };
        SUCCESS
    })
}

/// # Safety
/// `buf` must hold `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(dev: Handle, buf: *mut c_char, len: c_uint) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetName", gpu, |s| unsafe {
        write_str(&s.devices[gpu.unwrap() as usize].name, buf, len)
    })
}

/// # Safety
/// `buf` must hold `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(dev: Handle, buf: *mut c_char, len: c_uint) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetUUID", gpu, |s| unsafe {
        write_str(&s.devices[gpu.unwrap() as usize].uuid, buf, len)
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetIndex(dev: Handle, out: *mut c_uint) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetIndex", gpu, |_| {
        unsafe { *out = gpu.unwrap() };
        SUCCESS
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(dev: Handle, out: *mut MemoryV1) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetMemoryInfo", gpu, |s| {
        let g = gpu.unwrap();
        let d = &s.devices[g as usize];
        // v1 `used` counts the driver's reserve (DESIGN.md: v1 used = v2 used + v2 reserved).
        let used = s.used(g) + d.reserved;
        unsafe {
            *out = MemoryV1 {
                total: d.total,
                free: d.total.saturating_sub(used),
                used,
            }
        };
        SUCCESS
    })
}

/// # Safety
/// `out` must be valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(dev: Handle, out: *mut MemoryV2) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetMemoryInfo_v2", gpu, |s| {
        let g = gpu.unwrap();
        let d = &s.devices[g as usize];
        let used = s.used(g);
        unsafe {
            let version = (*out).version;
            *out = MemoryV2 {
                version,
                total: d.total,
                reserved: d.reserved,
                free: d.total.saturating_sub(used + d.reserved),
                used,
            }
        };
        SUCCESS
    })
}

unsafe fn list_procs(
    s: &State,
    gpu: u32,
    graphics: bool,
    count: *mut c_uint,
    out: *mut ProcessInfo,
) -> c_int {
    let procs: Vec<_> = s
        .listed_procs(gpu)
        .filter(|p| p.graphics == graphics)
        .collect();
    let room = unsafe { *count } as usize;
    unsafe { *count = procs.len() as c_uint };
    if procs.len() > room || (out.is_null() && !procs.is_empty()) {
        return ERROR_INSUFFICIENT_SIZE;
    }
    for (i, p) in procs.iter().enumerate() {
        unsafe {
            *out.add(i) = ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.bytes,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            }
        };
    }
    SUCCESS
}

/// # Safety
/// `count` valid; `out` null or holding `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: Handle,
    count: *mut c_uint,
    out: *mut ProcessInfo,
) -> c_int {
    let gpu = gpu_of(dev);
    call("nvmlDeviceGetComputeRunningProcesses_v3", gpu, |s| unsafe {
        list_procs(s, gpu.unwrap(), false, count, out)
    })
}

/// # Safety
/// `count` valid; `out` null or holding `*count` entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    dev: Handle,
    count: *mut c_uint,
    out: *mut ProcessInfo,
) -> c_int {
    let gpu = gpu_of(dev);
    call(
        "nvmlDeviceGetGraphicsRunningProcesses_v3",
        gpu,
        |s| unsafe { list_procs(s, gpu.unwrap(), true, count, out) },
    )
}
