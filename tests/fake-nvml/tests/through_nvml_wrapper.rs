//! The fake library, loaded the way gpudoc loads NVML, reports what its state file says.

use fake_nvml::state::{GIB, Injected, Proc, State};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;

fn lib() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    // Cargo leaves the cdylib beside the test binaries, in target/<profile>/deps.
    exe.parent().unwrap().join("libfake_nvml.so")
}

#[test]
fn reports_devices_processes_and_injected_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let mut state = State::h200s(2);
    state.procs.push(Proc {
        pid: std::process::id(),
        gpu: 1,
        bytes: 3 * GIB,
        graphics: false,
        ghost: false,
    });
    state.procs.push(Proc {
        pid: 999_999_999,
        gpu: 1,
        bytes: GIB,
        graphics: false,
        ghost: false,
    });
    state.errors.push(Injected {
        func: "nvmlDeviceGetMemoryInfo_v2".into(),
        gpu: Some(0),
        code: 15,
    });
    state.store(&path).unwrap();
    // SAFETY: this test binary runs this one test; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("FAKE_NVML_STATE", &path) };

    let nvml = Nvml::builder().lib_path(lib().as_os_str()).init().unwrap();
    assert_eq!(nvml.device_count().unwrap(), 2);
    assert_eq!(nvml.sys_driver_version().unwrap(), "580.159.04");
    let d1 = nvml.device_by_index(1).unwrap();
    assert_eq!(d1.name().unwrap(), "NVIDIA H200");
    let mem = d1.memory_info().unwrap();
    assert_eq!(mem.used, 3 * GIB, "a PID that does not exist holds nothing");
    assert_eq!(mem.reserved, 615 << 20);
    let procs = d1.running_compute_processes().unwrap();
    assert_eq!(procs.len(), 1);
    assert_eq!(procs[0].used_gpu_memory, UsedGpuMemory::Used(3 * GIB));
    let d0 = nvml.device_by_index(0).unwrap();
    assert!(matches!(d0.memory_info(), Err(NvmlError::GpuLost)));
    drop(nvml);
    let calls: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("state.json.calls")).unwrap())
            .unwrap();
    assert_eq!(calls["nvmlDeviceGetMemoryInfo_v2"], 2);
}
