//! Facts of the framework view that only the frameworks other than PyTorch give: whose allocator a
//! process's numbers are (`torch.framework`), whether it took its pool whole at its start
//! (`torch.preallocated`), and per GPU what a preallocating framework (JAX, TensorFlow) reserved there
//! against what its arrays really used, with the fraction or limit to set instead (`gpu.framework*`, read
//! by `jax-preallocation`), and what each framework's live memory is called (`torch.noun`,
//! `gpu.framework_noun`: `torch::framework::Framework::noun`, the one owner of these words).

use crate::report::{GpuReport, Report};
use crate::torch::view::TorchProcReport;

/// What the fraction or limit to set leaves over the peak in use: `param.framework_headroom_pct`.
fn headroom() -> f64 {
    1.0 + crate::params::FRAMEWORK_HEADROOM.float() / 100.0
}

/// What a preallocating framework held on one GPU (`gpu.framework*`): the largest such process there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OnGpu {
    /// The framework's name (`JAX`), none when no preallocating framework's view is on the GPU.
    pub name: Option<String>,
    /// What its live memory is made of (`arrays`), none likewise.
    pub noun: Option<String>,
    pub reserved_bytes: i64,
    pub used_peak_bytes: i64,
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION` that holds the peak in use with the headroom, rounded up to
    /// 0.05; 0 when unknown.
    pub fraction: f64,
    /// The memory limit in MiB that holds the peak in use with the same headroom, rounded up to a GiB
    /// (TensorFlow's `memory_limit`).
    pub limit_mib: i64,
}

/// The preallocating framework's view of GPU `g` (its host's), if one is there.
pub fn on_gpu(r: &Report, g: &GpuReport) -> OnGpu {
    let Some(p) = r
        .torch
        .processes
        .iter()
        .filter(|p| p.preallocated && p.gpu == Some(g.index) && p.host == g.host)
        .max_by_key(|p| p.peak_reserved_bytes.max(p.nvml_peak_bytes))
    else {
        return OnGpu::default();
    };
    // A framework that does not say what its allocator holds (TensorFlow): what NVML saw the process
    // hold is the pool, its CUDA context with it.
    let held = p.peak_reserved_bytes.or(p.nvml_peak_bytes).unwrap_or(0);
    OnGpu {
        name: Some(p.framework.name().to_string()),
        noun: Some(p.framework.noun().to_string()),
        reserved_bytes: held as i64,
        used_peak_bytes: p.peak_allocated_bytes as i64,
        fraction: fraction_to_set(p.peak_allocated_bytes, g.total_bytes),
        limit_mib: limit_to_set(p.peak_allocated_bytes),
    }
}

/// The memory limit in MiB that holds `peak` with the headroom, rounded up to a GiB.
pub fn limit_to_set(peak: u64) -> i64 {
    let gib = (peak as f64 * headroom() / (1u64 << 30) as f64)
        .ceil()
        .max(1.0);
    gib as i64 * 1024
}

/// The fraction of a GPU of `total` bytes that holds `peak` with the headroom, rounded up to 0.05 (at
/// least 0.05, at most 0.95); 0 when the GPU's size is unknown.
pub fn fraction_to_set(peak: u64, total: u64) -> f64 {
    if total == 0 {
        return 0.0;
    }
    let need = peak as f64 * headroom() / total as f64;
    ((need * 20.0).ceil() / 20.0).clamp(0.05, 0.95)
}

/// `torch.framework`: the name of the framework whose allocator a process's numbers are.
pub fn name(t: &TorchProcReport) -> String {
    t.framework.name().to_string()
}

/// `torch.noun`: what that framework's live memory is made of, as messages name it.
pub fn noun(t: &TorchProcReport) -> String {
    t.framework.noun().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn the_fraction_to_set_holds_the_peak_with_headroom_in_steps_of_five_percent() {
        // 20 GiB of a 140 GiB GPU: 25 GiB with headroom is 17.9%, set as 0.20.
        assert_eq!(fraction_to_set(20 * GIB, 140 * GIB), 0.20);
        assert_eq!(fraction_to_set(1, 140 * GIB), 0.05);
        assert_eq!(fraction_to_set(139 * GIB, 140 * GIB), 0.95);
        assert_eq!(fraction_to_set(GIB, 0), 0.0);
    }

    #[test]
    fn the_limit_to_set_holds_the_peak_with_headroom_in_whole_gib() {
        // 1.17 GiB with headroom is 1.46 GiB: a limit of 2 GiB.
        assert_eq!(limit_to_set(1_256_000_000), 2048);
        assert_eq!(limit_to_set(0), 1024);
        assert_eq!(limit_to_set(8 * GIB), 10 * 1024);
    }
}
