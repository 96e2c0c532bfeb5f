//! The NVML backend: loads the library (from `GPUDOC_NVML_LIB` or `libnvidia-ml.so.1`) and reads what a
//! run needs. Everything here tolerates a missing library, a missing symbol and a lost GPU: the wrapped
//! command never depends on NVML.

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use serde::{Deserialize, Serialize};

/// Environment variable naming the NVML library to load.
pub const LIB_ENV: &str = "GPUDOC_NVML_LIB";
/// What the driver installs; the unversioned name only exists with development packages.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// What is known of NVML for a run (the report's `nvml` object).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NvmlStatus {
    pub available: bool,
    /// The library path gpudoc tried.
    pub library: String,
    pub driver: Option<String>,
    /// CUDA version the driver supports, `major.minor`.
    pub cuda_driver: Option<String>,
    /// Why NVML is not available, when it is not.
    pub error: Option<String>,
}

/// A GPU's fixed facts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuInfo {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub total_bytes: u64,
}

/// Loads NVML from `library` and lists the GPUs. Without NVML (no driver, no library, a broken one) it
/// returns `None` and a status that says why.
pub fn open(library: &str) -> (Option<Nvml>, NvmlStatus, Vec<GpuInfo>) {
    let mut status = NvmlStatus {
        library: library.to_string(),
        ..Default::default()
    };
    let nvml = match Nvml::builder().lib_path(library.as_ref()).init() {
        Ok(n) => n,
        Err(e) => {
            status.error = Some(describe_init_error(library, &e));
            return (None, status, Vec::new());
        }
    };
    status.driver = nvml.sys_driver_version().ok();
    status.cuda_driver = nvml
        .sys_cuda_driver_version()
        .ok()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    let count = match nvml.device_count() {
        Ok(c) => c,
        Err(e) => {
            status.error = Some(format!("cannot count GPUs: {e}"));
            return (None, status, Vec::new());
        }
    };
    let mut gpus = Vec::new();
    for index in 0..count {
        match nvml.device_by_index(index) {
            Ok(d) => gpus.push(GpuInfo {
                index,
                name: d.name().unwrap_or_else(|_| "unknown GPU".into()),
                uuid: d.uuid().unwrap_or_default(),
                total_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            }),
            // A GPU that cannot be opened is left out; the others still count.
            Err(e) => status.error = Some(format!("GPU {index} cannot be opened: {e}")),
        }
    }
    status.available = true;
    (Some(nvml), status, gpus)
}

fn describe_init_error(library: &str, e: &NvmlError) -> String {
    match e {
        // The default name not found: no driver, or one installed where the loader does not look.
        NvmlError::LibloadingError(inner) if library == DEFAULT_LIB => {
            format!(
                "cannot load {library}: {inner} (no NVIDIA driver here? set {LIB_ENV} to its path)"
            )
        }
        // The user's own path: telling them to set the variable they set would send them in a circle.
        NvmlError::LibloadingError(inner) => {
            format!("cannot load {library}, which {LIB_ENV} names: {inner}")
        }
        NvmlError::DriverNotLoaded => format!("{library}: the NVIDIA driver is not loaded"),
        NvmlError::NoPermission => format!("{library}: no permission to talk to the driver"),
        other => format!("{library}: {other}"),
    }
}

/// How a failed call is handled in the hot loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// This query can't work here (old driver, missing symbol, vGPU): stop asking, keep the GPU.
    Unsupported,
    /// The GPU is gone or broken: stop sampling it.
    Lost,
}

/// Classifies an NVML error for the sampler.
pub fn failure_kind(e: &NvmlError) -> Failure {
    match e {
        NvmlError::NotSupported
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::FunctionNotFound
        | NvmlError::NoPermission => Failure::Unsupported,
        _ => Failure::Lost,
    }
}

/// An NVML error for people: the library's words and its error's name (`... (GpuLost)`).
pub fn describe(e: &NvmlError) -> String {
    let name = format!("{e:?}");
    let name = name.split(['(', ' ', '{']).next().unwrap_or("");
    format!("{e} ({name})")
}

/// The GPUs a job is given by `CUDA_VISIBLE_DEVICES` (indices or UUIDs, as CUDA reads them: up to the first
/// entry it cannot use). An empty, unset or unreadable value (a MIG instance, say) leaves all of them.
pub fn visible(gpus: Vec<GpuInfo>, spec: Option<&str>) -> Vec<GpuInfo> {
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
        return gpus;
    };
    let mut keep: Vec<GpuInfo> = Vec::new();
    for entry in spec.split(',').map(str::trim) {
        match named(&gpus, entry) {
            Some(g) if !keep.iter().any(|k| k.index == g.index) => keep.push(g.clone()),
            Some(_) => {}
            None => break,
        }
    }
    if keep.is_empty() {
        return gpus;
    }
    keep.sort_by_key(|g| g.index);
    keep
}

/// The GPU an entry of `CUDA_VISIBLE_DEVICES` names: an index or a UUID (or its start).
fn named<'g>(gpus: &'g [GpuInfo], entry: &str) -> Option<&'g GpuInfo> {
    match entry.parse::<u32>() {
        Ok(i) => gpus.iter().find(|g| g.index == i),
        Err(_) if entry.starts_with("GPU-") => gpus.iter().find(|g| g.uuid.starts_with(entry)),
        Err(_) => None,
    }
}

/// In words, when `CUDA_VISIBLE_DEVICES` names something that is no GPU here: CUDA then gives the job
/// the GPUs before it, or none. `None` when every entry is a GPU of this machine, or a MIG instance
/// (`MIG-...`, which gpudoc does not resolve).
pub fn visible_note(gpus: &[GpuInfo], spec: Option<&str>) -> Option<String> {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty())?;
    let entries: Vec<&str> = spec.split(',').map(str::trim).collect();
    let bad = entries
        .iter()
        .position(|e| !e.starts_with("MIG-") && named(gpus, e).is_none())?;
    let list = |v: &[&GpuInfo]| {
        let i: Vec<String> = v.iter().map(|g| g.index.to_string()).collect();
        if i.is_empty() {
            "none".into()
        } else {
            i.join(", ")
        }
    };
    let here = list(&gpus.iter().collect::<Vec<_>>());
    let given: Vec<&GpuInfo> = entries[..bad]
        .iter()
        .filter_map(|e| named(gpus, e))
        .collect();
    let then = if given.is_empty() {
        "CUDA gives the job no GPU, and gpudoc samples all of them".to_string()
    } else {
        format!("CUDA stops there: the job has GPU {} only", list(&given))
    };
    Some(format!(
        "CUDA_VISIBLE_DEVICES={spec}: `{}` is no GPU of this machine (GPUs {here}): {then}",
        entries[bad]
    ))
}

#[cfg(test)]
mod visible_tests {
    use super::*;

    /// GPUs 0..n, GPU i with the UUID `GPU-iaaa`.
    fn gpus(n: u32) -> Vec<GpuInfo> {
        (0..n)
            .map(|i| GpuInfo {
                index: i,
                name: "H200".into(),
                uuid: format!("GPU-{i}aaa"),
                total_bytes: 1,
            })
            .collect()
    }

    #[test]
    fn cuda_visible_devices_picks_the_gpus() {
        let gpus = gpus(4);
        let idx = |v: Vec<GpuInfo>| v.iter().map(|g| g.index).collect::<Vec<_>>();
        assert_eq!(idx(visible(gpus.clone(), Some("2,1"))), vec![1, 2]);
        assert_eq!(idx(visible(gpus.clone(), Some("GPU-3"))), vec![3]);
        assert_eq!(
            idx(visible(gpus.clone(), Some("1,9,2"))),
            vec![1],
            "CUDA stops at 9"
        );
        assert_eq!(idx(visible(gpus.clone(), Some("MIG-x"))), vec![0, 1, 2, 3]);
        assert_eq!(idx(visible(gpus.clone(), None)), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_library_path_the_user_set_is_not_answered_with_set_the_variable() {
        let (_, status, _) = open("/nonexistent/libnvidia-ml.so");
        let e = status.error.unwrap();
        assert!(
            e.starts_with(
                "cannot load /nonexistent/libnvidia-ml.so, which GPUDOC_NVML_LIB names: "
            ),
            "{e}"
        );
        assert!(!e.contains("set GPUDOC_NVML_LIB"), "{e}");
    }

    #[test]
    fn a_cuda_visible_devices_naming_no_gpu_here_is_said() {
        let gpus = gpus(2);
        assert_eq!(
            visible_note(&gpus, Some("7")).unwrap(),
            "CUDA_VISIBLE_DEVICES=7: `7` is no GPU of this machine (GPUs 0, 1): CUDA gives the job no GPU, and gpudoc samples all of them"
        );
        assert!(visible_note(&gpus, Some("1,abc,0")).unwrap().ends_with(
            "`abc` is no GPU of this machine (GPUs 0, 1): CUDA stops there: the job has GPU 1 only"
        ));
        for fine in [None, Some(""), Some("1,0"), Some("GPU-1"), Some("MIG-x")] {
            assert_eq!(visible_note(&gpus, fine), None, "{fine:?}");
        }
    }
}
