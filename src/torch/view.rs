//! The framework view in the report: per process and GPU, PyTorch's allocated and reserved memory beside
//! NVML's figure for the same process, and the difference, non-PyTorch memory (CUDA context, cuBLAS and
//! NCCL workspaces, other libraries): the seed's "two views" in one place.

use super::hunt::Hunt;
use super::inside::Inside;
use super::{Step, TorchOom, TorchTimeline};
use crate::gpu::GpuInfo;
use crate::timeline::{Series, Timeline};
use serde::{Deserialize, Serialize};

/// The report's `torch` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TorchReport {
    /// The shim was put in place (not `--no-torch`).
    pub enabled: bool,
    pub processes: Vec<TorchProcReport>,
    /// The allocator's state at each OOM, from PyTorch's OOM observer.
    pub ooms: Vec<TorchOom>,
    /// Shim failures, in words; a process whose shim failed went quiet and its numbers stop there.
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TorchProcReport {
    /// In a report merged from several hosts (`gpudoc report a.json b.json`): the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: u32,
    /// Whose allocator this is: `torch` (PyTorch's caching allocator; absent), `jax` (XLA's), `cupy`
    /// (CuPy's memory pool), `tensorflow` (its BFC allocator), `rmm` (RAPIDS' memory manager). Allocated
    /// is what the framework's live arrays hold, reserved what its allocator holds from the device (absent
    /// for TensorFlow, which does not say: `tf.config.experimental.get_memory_info` gives in use and peak
    /// only).
    #[serde(default, skip_serializing_if = "super::framework::Framework::is_torch")]
    pub framework: super::framework::Framework,
    /// A framework other than PyTorch: its version and the allocator settings in its environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_hello: Option<super::framework::Hello>,
    /// Its allocator took its pool whole at its start (JAX's preallocation), by the settings in force;
    /// absent when not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub preallocated: bool,
    /// The allocator's limit (JAX: `bytes_limit`; CuPy: the pool's limit, where one is set), its largest
    /// free block and allocation count (JAX), its free blocks (CuPy); absent where not told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_block_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_blocks: Option<u64>,
    /// CuPy's pinned (host) memory pool: its free blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_free_blocks: Option<u64>,
    pub rank: Option<serde_json::Value>,
    pub local_rank: Option<serde_json::Value>,
    pub torch_version: Option<String>,
    /// torch's device index (after CUDA_VISIBLE_DEVICES).
    pub device: u32,
    /// NVML's index of the same GPU (matched by UUID).
    pub gpu: Option<u32>,
    pub peak_allocated_bytes: u64,
    /// What the allocator held from the device at its peak and at the end; absent where the framework
    /// does not say (TensorFlow; RMM without a pool below its statistics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    pub final_allocated_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_reserved_bytes: Option<u64>,
    /// Fragmentation: memory in split blocks that are not in use (PyTorch's; absent for the others).
    pub peak_inactive_split_bytes: Option<u64>,
    /// NVML's peak for this process on this GPU.
    pub nvml_peak_bytes: Option<u64>,
    /// NVML − PyTorch reserved, at NVML's peak: memory outside PyTorch's allocator (the framework's;
    /// absent for TensorFlow, which does not say what its allocator holds).
    pub non_pytorch_bytes: Option<u64>,
    /// PyTorch's counters (absent for the other frameworks, which keep none).
    pub alloc_retries: Option<u64>,
    pub ooms: Option<u64>,
    pub device_allocs: Option<u64>,
    pub device_frees: Option<u64>,
    /// Optimizer steps seen (JAX: calls of the jitted function called most; CuPy: none, its records are
    /// readings ten times a second), and the records of them (each covering `steps` steps; past 4096 records,
    /// every `step_stride`-th is kept).
    pub steps_total: u64,
    pub step_stride: u64,
    pub steps: Vec<Step>,
    /// Steps per record the shim settled on (1: every step), and its measured share of the step time.
    #[serde(default)]
    pub record_every: u64,
    #[serde(default)]
    pub shim_cost_pct: Option<f64>,
    /// Leak hunts in this process on this device, and what filled it at an OOM.
    #[serde(default)]
    pub hunts: Vec<Hunt>,
    /// Where the memory went inside the model: at each OOM, and on the measured step.
    #[serde(default, rename = "where", skip_serializing_if = "Vec::is_empty")]
    pub inside: Vec<Inside>,
    /// When the allocator was last read, seconds into the run: the shim's exit record when the program
    /// ended normally (or by an exception), after which only the process's teardown remains.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reading_s: Option<f64>,
    /// Notebook cells run in this process (a Jupyter kernel), in order; absent elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cells: Vec<super::cells::Cell>,
    /// When the program first did its work, seconds into the run: its first forward call of the
    /// outermost model or its first optimizer step, as the shim recorded them (see `TorchProcReport::
    /// started_work_s`); absent when neither was recorded, or from a shim that did not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_work_s: Option<f64>,
}

impl TorchProcReport {
    /// When the program first did its work: its first forward call or optimizer step (`first_work_s`),
    /// else, in a report from before the shim recorded forward calls, its first step record; `None` when
    /// neither was recorded (a program that never called a model nor stepped, or no such records).
    pub fn started_work_s(&self) -> Option<f64> {
        self.first_work_s.or(self.steps.first().map(|s| s.at_s))
    }
}

impl TorchReport {
    /// The notebook cell running at `at_s` in process `pid` (any process, when not known) on NVML's GPU
    /// `gpu` (any, when not known; a process whose GPU NVML did not give may be on any).
    pub fn cell_at(
        &self,
        pid: Option<u32>,
        gpu: Option<u32>,
        at_s: f64,
    ) -> Option<&super::cells::Cell> {
        self.processes
            .iter()
            .filter(|p| pid.is_none_or(|x| x == p.pid))
            .filter(|p| gpu.is_none_or(|g| p.gpu.is_none_or(|pg| pg == g)))
            .find_map(|p| super::cells::at(&p.cells, at_s))
    }
}

/// Window, in µs, over which the two views are matched.
const ALIGN: u64 = 100_000;

/// The peak reserved memory of the step record whose span (from the record before it to its own time)
/// holds `at`: when the shim records every Nth step, reserved memory is not sampled near NVML's peak, but
/// that record's peak is exact over it.
fn covering_peak(steps: &[Step], at: u64) -> Option<u64> {
    let t = at as f64 / 1e6;
    let i = steps.iter().position(|s| s.at_s >= t)?;
    let from = if i > 0 { steps[i - 1].at_s } else { 0.0 };
    (t > from || i == 0).then_some(steps[i].peak_reserved_bytes)?
}

/// NVML's memory less PyTorch's reserved memory at the change of reserved memory nearest `at`, both
/// views measured there. Where the shim read nothing near NVML's peak (an evaluation after training: no
/// step, no forward call recorded), the reserved memory carried in from its last reading is seconds old
/// and far below what PyTorch held at the peak: NVML's peak less it would count the evaluation's tensors
/// as non-PyTorch memory (133.72 GiB of 139.70 on the H200's eval_oom).
fn at_nearest_reading(reserved: &Series, used: &Series, at: u64) -> Option<u64> {
    let (t, r) = reserved.nearest(at)?;
    let nvml = used.max_in(t.saturating_sub(ALIGN), t + ALIGN)?;
    Some(nvml.saturating_sub(r))
}

/// The GPU of a process whose framework gave no UUID (JAX's devices have none): the one GPU NVML saw
/// that process hold memory on, when it held memory on one only.
fn only_gpu_of(p: &super::TorchProc, nvml: &Timeline) -> Option<u32> {
    let mut on = nvml
        .procs
        .iter()
        .filter(|((_, pid), s)| *pid == p.pid && s.used.peak() > 0)
        .map(|((g, _), _)| *g);
    let first = on.next()?;
    on.all(|g| g == first).then_some(first)
}

/// Builds the report object; `gpus` maps UUIDs to NVML indices.
pub fn build(t: &TorchTimeline, nvml: &Timeline, gpus: &[GpuInfo], enabled: bool) -> TorchReport {
    let processes = t
        .procs
        .values()
        .map(|p| {
            let gpu = p
                .uuid
                .as_ref()
                .and_then(|id| gpus.iter().find(|g| &g.uuid == id))
                .map(|g| g.index)
                .or_else(|| only_gpu_of(p, nvml));
            let nv = gpu.and_then(|g| nvml.procs.get(&(g, p.pid)));
            let nvml_peak = nv.map(|s| s.used.peak());
            // The two views are sampled separately, each every few milliseconds: take PyTorch's reserved
            // memory around NVML's peak, not at one instant, so a sample that lags by one step doesn't
            // count the step as non-PyTorch memory.
            // A framework that does not say what it holds (TensorFlow) has no outside to tell: no
            // reading of reserved memory, so none near the peak.
            let non_pytorch = nv.and_then(|s| {
                let at = s.used.peak_at();
                let near = p.reserved.max_in(at.saturating_sub(ALIGN), at + ALIGN);
                let reserved = near.max(covering_peak(&p.steps.steps, at))?;
                let at_peak = s.used.peak().saturating_sub(reserved);
                Some(
                    at_nearest_reading(&p.reserved, &s.used, at)
                        .map_or(at_peak, |n| n.min(at_peak)),
                )
            });
            let torch_only = |x: u64| p.framework.is_torch().then_some(x);
            let hello = t.frameworks.get(&(p.pid, p.framework)).cloned();
            TorchProcReport {
                host: None,
                pid: p.pid,
                framework: p.framework,
                preallocated: hello
                    .as_ref()
                    .is_some_and(|h| p.framework.preallocates(&h.settings)),
                framework_hello: hello,
                limit_bytes: p.limit,
                largest_free_block_bytes: p.largest_free_block,
                allocations: p.allocations,
                free_blocks: p.free_blocks,
                pinned_free_blocks: p.pinned_free_blocks,
                rank: p.rank.clone(),
                local_rank: p.local_rank.clone(),
                torch_version: p
                    .framework
                    .is_torch()
                    .then(|| t.versions.get(&p.pid).cloned())
                    .flatten(),
                device: p.device,
                gpu,
                peak_allocated_bytes: p.peak_allocated,
                peak_reserved_bytes: p.peak_reserved,
                final_allocated_bytes: p.allocated.last().unwrap_or(0),
                final_reserved_bytes: p.reserved.last(),
                peak_inactive_split_bytes: torch_only(p.inactive_split.peak()),
                nvml_peak_bytes: nvml_peak,
                non_pytorch_bytes: non_pytorch,
                alloc_retries: torch_only(p.alloc_retries),
                ooms: torch_only(p.ooms),
                device_allocs: torch_only(p.device_allocs),
                device_frees: torch_only(p.device_frees),
                steps_total: if p.framework.counts_steps() {
                    p.last_step.max(p.steps.total)
                } else {
                    0
                },
                step_stride: p.steps.stride.max(1),
                steps: p.steps.steps.clone(),
                record_every: p.record_every.max(1),
                shim_cost_pct: (p.covered_us > 0)
                    .then(|| p.shim_cost_us as f64 * 100.0 / p.covered_us as f64),
                last_reading_s: (!p.allocated.is_empty())
                    .then(|| p.allocated.last_at() as f64 / 1e6),
                hunts: t
                    .hunts
                    .iter()
                    .filter(|h| h.pid == p.pid && h.device == p.device)
                    .cloned()
                    .collect(),
                cells: p.cells.clone(),
                first_work_s: p.first_work_s,
                inside: t
                    .inside
                    .iter()
                    .filter(|w| w.pid == p.pid && w.device == p.device)
                    .cloned()
                    .collect(),
            }
        })
        .collect();
    TorchReport {
        enabled,
        processes,
        ooms: t.ooms.clone(),
        errors: t
            .errors
            .iter()
            .map(|(pid, w, e)| format!("pid {pid}: {w}: {e}"))
            .collect(),
    }
}
