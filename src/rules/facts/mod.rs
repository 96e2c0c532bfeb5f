//! The facts rules read, computed from a report (so a saved report can be diagnosed again). Every fact is
//! documented in [`DOC`]; a test checks that the example facts, every rule, the documentation and the
//! README agree.

use super::growth::fit;
use crate::report::{ProcessReport, Report};
use crate::torch::activity::Activity;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Facts of one run, as the rules see them. Integers are bytes or counts, `_s` seconds, `_pct` percent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Facts {
    pub run: RunFacts,
    pub oom: OomFacts,
    pub gpus: Vec<GpuFacts>,
    pub processes: Vec<ProcFacts>,
    pub torch_processes: Vec<TorchFacts>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFacts {
    pub duration_s: f64,
    pub exit_code: i64,
    pub signal: i64,
    pub classification: String,
    pub driver: String,
    pub cuda_driver_version: f64,
    pub cuda_runtime_version: f64,
    pub gpus: i64,
    pub job_gpus: i64,
    pub job_peak_max_bytes: i64,
    pub job_peak_min_bytes: i64,
    pub job_peak_max_gpu: i64,
    pub job_peak_min_gpu: i64,
    pub job_peak_max_label: String,
    pub job_peak_min_label: String,
    pub job_peak_max_at_s: f64,
    pub hosts: i64,
    pub imbalance_ratio: f64,
    pub orphans: i64,
    pub orphans_gpu_bytes: i64,
    pub orphan_list: String,
    pub host_oom: bool,
    pub has_torch: bool,
    pub server: String,
    pub server_label: String,
    pub server_flag: String,
    pub server_setting: String,
    pub server_fraction: f64,
    pub helpers: i64,
    pub helpers_bytes: i64,
    pub helper_list: String,
    pub live: bool,
    pub look: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct OomFacts {
    pub present: bool,
    pub cause: String,
    pub source: String,
    pub engine: String,
    pub at_start: bool,
    pub vendor: String,
    pub exception: String,
    pub complete: bool,
    pub gpu: i64,
    pub rank: i64,
    pub requested_bytes: i64,
    pub free_bytes: i64,
    pub total_bytes: i64,
    pub allocated_bytes: i64,
    pub reserved_bytes: i64,
    pub reserved_unallocated_bytes: i64,
    pub allowed_bytes: i64,
    pub others_bytes: i64,
    pub job_others_bytes: i64,
    pub others: String,
    pub job_peak_pct: f64,
    pub explanation: String,
    pub filled_by: Vec<String>,
    pub pass: String,
    pub module: String,
    pub largest_part: String,
    pub largest_part_pct: f64,
    pub host: String,
    pub label: String,
    pub at_s: f64,
    pub phase: String,
    pub steps: i64,
    pub since_last_step_s: f64,
    pub growth_bytes: i64,
    pub growth_rate_bytes_per_s: f64,
    pub growth_s: f64,
    pub graph_bytes: i64,
    pub graph_holder: String,
    pub graphs_kept: bool,
    pub waiting_forwards: i64,
    pub leak_total_bytes: i64,
    pub leak_bytes_per_step: f64,
    pub leak_r2: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuFacts {
    pub host: String,
    pub label: String,
    pub index: i64,
    pub name: String,
    pub total_bytes: i64,
    pub peak_used_bytes: i64,
    pub peak_used_pct: f64,
    pub start_used_bytes: i64,
    pub others_peak_bytes: i64,
    pub others_list: String,
    /// An inference server among the processes holding memory on this GPU (see `serving`).
    pub server: String,
    pub job_peak_bytes: i64,
    pub job_peak_pct: f64,
    pub job_final_bytes: i64,
    pub job_share: f64,
    pub steady_bytes: i64,
    pub steady_pct: f64,
    pub rise_s: f64,
    pub last_held_bytes: i64,
    pub spike_bytes: i64,
    pub spike_ratio: f64,
    pub spike_duration_s: f64,
    pub spike_at_s: f64,
    pub peak_used_at_s: f64,
    pub lost: bool,
    pub torch: bool,
    pub torch_phases: i64,
    pub peak_stretch: String,
    pub peak_since_last_step_s: f64,
    pub growth_bytes: i64,
    pub growth_rate_bytes_per_s: f64,
    pub growth_r2: f64,
    pub growth_s: f64,
    pub growth_from_s: f64,
    pub growth_after_step: i64,
    pub loading: bool,
    pub growth_live_bytes: i64,
    pub time_to_full_s: f64,
    pub growth_sites: Vec<String>,
    pub growth_holders: Vec<String>,
    pub growth_graph_bytes: i64,
    pub growth_graph_holder: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcFacts {
    pub host: String,
    pub pid: i64,
    pub cmdline: String,
    pub in_job: bool,
    pub rank: i64,
    pub local_rank: i64,
    pub gpus: i64,
    pub main_gpu: i64,
    pub main_bytes: i64,
    pub peak_bytes: i64,
    pub stray_gpus: Vec<i64>,
    pub stray_bytes: i64,
    pub parent_pid: i64,
    pub helper: bool,
    pub visible: bool,
    pub job_gpu: i64,
    pub job_gpu_label: String,
    pub job_gpu_bytes: i64,
    pub job_gpu_start_bytes: i64,
    pub job_gpu_high_from_s: f64,
    pub job_gpu_high_s: f64,
    pub user: String,
    pub verdict: String,
    pub reason: String,
    pub leftover: bool,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TorchFacts {
    pub host: String,
    pub label: String,
    pub pid: i64,
    pub rank: i64,
    pub gpu: i64,
    pub torch_version: String,
    pub reserved_peak_bytes: i64,
    pub allocated_peak_bytes: i64,
    pub final_reserved_bytes: i64,
    pub final_allocated_bytes: i64,
    pub steady_reserved_bytes: i64,
    pub steady_peak_allocated_bytes: i64,
    pub inactive_split_peak_bytes: i64,
    pub non_pytorch_bytes: i64,
    pub alloc_retries: i64,
    pub ooms: i64,
    pub device_allocs: i64,
    pub device_frees: i64,
    pub steps: i64,
    pub leak_bytes_per_step: f64,
    pub leak_r2: f64,
    pub leak_total_bytes: i64,
    pub device_allocs_per_step: f64,
    pub device_frees_per_step: f64,
    pub step_alloc_retries: i64,
    pub alloc_retries_per_step: f64,
    pub gpu_total_bytes: i64,
    pub steady_peak_reserved_bytes: i64,
    pub phase_peak_reserved_bytes: i64,
    pub phase_count: i64,
    pub phase_steps: Vec<i64>,
    pub phase_period_steps: i64,
    pub phase_span_steps: i64,
    pub hunted: bool,
    pub leak_sites: Vec<String>,
    pub leak_holders: Vec<String>,
    pub cells: i64,
    pub cell: String,
    pub cell_runs: i64,
    pub cell_numbers: String,
    pub cell_growth_bytes_per_run: f64,
    pub cell_growth_bytes: i64,
}

/// Every fact, its type and what it means: the reference for rule authors (`gpudoc rules explain`, README).
pub const DOC: &[(&str, &str, &str)] = &[
    ("run.duration_s", "double", "length of the run"),
    (
        "run.exit_code",
        "int",
        "what gpudoc run exits with (128+N for signal N), -1 if not recorded",
    ),
    (
        "run.signal",
        "int",
        "the signal that ended the command, 0 if none",
    ),
    (
        "run.classification",
        "string",
        "success, gpu_oom, host_oom_kill, signal, failure; unknown when not recorded",
    ),
    ("run.driver", "string", "NVIDIA driver version"),
    (
        "run.cuda_driver_version",
        "double",
        "highest CUDA version the driver supports (13.0), 0 if unknown",
    ),
    (
        "run.cuda_runtime_version",
        "double",
        "CUDA version the job's PyTorch was built for (from +cu130), 0 if unknown",
    ),
    ("run.gpus", "int", "GPUs on the machine"),
    ("run.job_gpus", "int", "GPUs on which the job held memory"),
    ("run.job_peak_max_bytes", "int", "largest per-GPU job peak"),
    (
        "run.job_peak_min_bytes",
        "int",
        "smallest per-GPU job peak among the GPUs the job used",
    ),
    (
        "run.job_peak_max_gpu",
        "int",
        "the GPU with the largest job peak",
    ),
    (
        "run.job_peak_min_gpu",
        "int",
        "the GPU with the smallest job peak (among those used)",
    ),
    (
        "run.job_peak_max_label",
        "string",
        "the GPU with the largest job peak, as messages name it",
    ),
    (
        "run.job_peak_max_at_s",
        "double",
        "when that GPU's job peak was, -1 if the job used none",
    ),
    (
        "run.job_peak_min_label",
        "string",
        "the GPU with the smallest job peak, as messages name it",
    ),
    (
        "run.hosts",
        "int",
        "hosts the run spans (more than 1 in a report merged from several nodes)",
    ),
    (
        "run.imbalance_ratio",
        "double",
        "largest / smallest per-GPU job peak (1.0 with one GPU)",
    ),
    (
        "run.orphans",
        "int",
        "job descendants still running after the command exited",
    ),
    ("run.orphans_gpu_bytes", "int", "GPU memory they held"),
    (
        "run.orphan_list",
        "string",
        "them, in words (pid, command, memory)",
    ),
    (
        "run.host_oom",
        "bool",
        "the kernel's OOM killer ended a job process",
    ),
    (
        "run.has_torch",
        "bool",
        "the PyTorch shim reported from at least one process",
    ),
    (
        "run.live",
        "bool",
        "the run is still going: the rule is judged live, on the run so far (`live = true`); false at its end",
    ),
    (
        "run.look",
        "bool",
        "the facts are of one look at the machine by `gpudoc watch` (`look = true`), not of a run: the job is the watcher's own processes (its uid), the others other users'; gpu.peak_used_*, the job's and the others' bytes are what is held now (gpu.peak_used_at_s 0); what only a run has (a timeline, steps, an OOM, an exit) is empty",
    ),
    (
        "run.server",
        "string",
        "an inference server that preallocates its share of the GPU on purpose, recognised from the command lines of the job and its processes: vllm, sglang, tensorrt_llm, tgi; empty if none",
    ),
    (
        "run.server_label",
        "string",
        "that server as messages name it (`vLLM`)",
    ),
    (
        "run.server_flag",
        "string",
        "the flag that sets its share (`--gpu-memory-utilization`)",
    ),
    (
        "run.server_setting",
        "string",
        "that flag and its value as a command line gives it (`--gpu-memory-utilization 0.8`); empty when none does",
    ),
    (
        "run.server_fraction",
        "double",
        "the share it takes: the value given, else its default; -1 where the default depends on the GPU (SGLang)",
    ),
    (
        "run.helpers",
        "int",
        "processes of the job holding a CUDA context they should not (see process.helper)",
    ),
    (
        "run.helpers_bytes",
        "int",
        "what they held, their peaks summed",
    ),
    (
        "run.helper_list",
        "string",
        "them, in words (pid, command, memory, GPU)",
    ),
    (
        "oom.present",
        "bool",
        "the command printed an out-of-memory report",
    ),
    (
        "oom.cause",
        "string",
        "too_big, cap, others, fragmentation, self_growth, unknown",
    ),
    (
        "oom.source",
        "string",
        "torch_allocator, cuda_runtime, cuda_library, nccl, xla, tensorflow, cupy, paddle, llama_cpp, vllm, onnxruntime, tensorrt, mxnet, exla",
    ),
    (
        "oom.engine",
        "string",
        "the inference server or engine that wrote the text, as its reader tells (vllm, sglang, tgi, tensorrt_llm, tensorrt, onnxruntime, llama_cpp, fastertransformer, turbomind): its own settings are the remedies; empty for a framework's allocator (PyTorch, JAX, TensorFlow, ...) or a CUDA call whose program the text does not name, where training advice may fit (oom::program)",
    ),
    (
        "oom.at_start",
        "bool",
        "the text says the program found less of the GPU free at its start than it was to take, before loading anything (vLLM's start-up check): its share is too large for what others left",
    ),
    (
        "oom.vendor",
        "string",
        "the GPU's vendor as the text shows it: nvidia, or amd (ROCm), intel (XPU) or apple (MPS), which NVML cannot see; empty without an OOM",
    ),
    ("oom.exception", "string", "the exception class, if printed"),
    ("oom.complete", "bool", "every field of the text was found"),
    ("oom.gpu", "int", "the GPU it happened on, -1 if unknown"),
    ("oom.rank", "int", "the rank that printed it, -1 if none"),
    (
        "oom.requested_bytes",
        "int",
        "the allocation that failed, -1 if unknown",
    ),
    (
        "oom.free_bytes",
        "int",
        "free memory on the GPU then, as printed, -1 if unknown",
    ),
    (
        "oom.total_bytes",
        "int",
        "the GPU's capacity, as printed, -1 if unknown",
    ),
    (
        "oom.allocated_bytes",
        "int",
        "PyTorch's live tensors then, -1 if unknown",
    ),
    (
        "oom.reserved_bytes",
        "int",
        "PyTorch's whole cache then, -1 if unknown",
    ),
    (
        "oom.reserved_unallocated_bytes",
        "int",
        "cached by PyTorch but unallocated then, -1 if unknown",
    ),
    (
        "oom.allowed_bytes",
        "int",
        "the process's cap (set_per_process_memory_fraction), -1 if none was printed",
    ),
    (
        "oom.others_bytes",
        "int",
        "memory processes outside the job held on that GPU",
    ),
    (
        "oom.job_others_bytes",
        "int",
        "memory the job's other processes held on that GPU",
    ),
    ("oom.others", "string", "those processes, in words"),
    (
        "oom.job_peak_pct",
        "double",
        "the job's peak on that GPU, % of its capacity",
    ),
    (
        "oom.explanation",
        "string",
        "the cause with its numbers, in words",
    ),
    (
        "oom.host",
        "string",
        "the host it happened on, in a merged report (empty otherwise)",
    ),
    (
        "oom.label",
        "string",
        "its GPU as messages name it (`GPU 1`, `GPU 1 on node-b`, `an unknown GPU`)",
    ),
    (
        "oom.at_s",
        "double",
        "when the OOM text was printed (seconds into the run), -1 without one",
    ),
    (
        "oom.filled_by",
        "list(string)",
        "where in the model it happened and what the memory held, what held it (the shim's search at the OOM): place, breakdown, holders, sites (empty when unknown)",
    ),
    (
        "oom.pass",
        "string",
        "`forward`, `backward`, `optimizer` or `other` (the shim's look at the OOM), \"\" when unknown",
    ),
    (
        "oom.module",
        "string",
        "the module it happened in (`model.layers.2.mlp`), \"\" when unknown",
    ),
    (
        "oom.largest_part",
        "string",
        "what held most of allocated memory then: `activations` (saved for backward), `parameters`, `gradients`, `optimizer_state`, `other`; \"\" when unknown",
    ),
    (
        "oom.largest_part_pct",
        "double",
        "its share of allocated memory, percent (0 when unknown)",
    ),
    (
        "oom.phase",
        "string",
        "what the program was doing, from the shim's evidence at the OOM (never from the time): loading (before its first forward call, backward or step), training_step (in backward, in optimizer.step(), or a forward under grad in train() mode with no earlier call waiting for its backward), evaluation (forward calls under no_grad or inference_mode, after eval(), or under grad with no backward following, in a program that has trained), inference (the same in one that never trained); empty where the evidence does not decide (a forward under grad during training, whose calls the shim does not count) or without the shim",
    ),
    (
        "oom.steps",
        "int",
        "optimizer steps ended by then, -1 if unknown",
    ),
    (
        "oom.since_last_step_s",
        "double",
        "seconds since the last of them, -1 before the first or if unknown",
    ),
    (
        "oom.growth_bytes",
        "int",
        "steady growth of the job's memory on its GPU up to the OOM, with no optimizer step to explain it (see gpu.growth_bytes), 0 if none",
    ),
    (
        "oom.growth_rate_bytes_per_s",
        "double",
        "its rate, bytes per second",
    ),
    ("oom.growth_s", "double", "how long it lasted"),
    (
        "oom.graph_bytes",
        "int",
        "of the live tensors at the OOM, the bytes no Python object refers to, behind held tensors that carry an autograd graph (grad_fn): what their forward passes saved and no backward has freed yet; 0 if none or unknown (the shim's search at the OOM), and in a training step's own forward or backward (see oom.graphs_kept)",
    ),
    (
        "oom.graph_holder",
        "string",
        "what holds those tensors (`list `outs` (eval.py, in evaluate), 150 items`), empty if none",
    ),
    (
        "oom.graphs_kept",
        "bool",
        "those graphs outlived the step or call that made them, so no backward will free them: the OOM came in an evaluation or inference (oom.phase), or in an optimizer's step (whose backward has freed the step's own graph); false in a training step's forward or backward, whose graph is its own activations (oom.graph_bytes is then 0), and when unknown",
    ),
    (
        "oom.waiting_forwards",
        "int",
        "forward calls of the outermost model since the last backward began (calls no backward followed), while the shim counted them (before the first optimizer step, in an evaluation after eval()); -1 when unknown",
    ),
    (
        "oom.leak_total_bytes",
        "int",
        "what the live tensors of the failing process grew by step after step before it (its torch.leak_total_bytes: the straight-line fit over its steps), 0 if none or unknown",
    ),
    ("oom.leak_bytes_per_step", "double", "that growth per step"),
    (
        "oom.leak_r2",
        "double",
        "R² of that fit (1: every step the same), 0 if unknown",
    ),
    (
        "gpu.host",
        "string",
        "its host, in a report merged from several (empty otherwise)",
    ),
    (
        "gpu.label",
        "string",
        "how messages name it: `GPU 0`, or `GPU 0 on node-a` in a merged report",
    ),
    ("gpu.index", "int", "NVML's index"),
    ("gpu.name", "string", "the GPU's name"),
    ("gpu.total_bytes", "int", "capacity"),
    (
        "gpu.peak_used_bytes",
        "int",
        "peak device memory in use (what nvidia-smi shows)",
    ),
    ("gpu.peak_used_pct", "double", "that, % of capacity"),
    (
        "gpu.start_used_bytes",
        "int",
        "memory in use before the job started (held by others)",
    ),
    (
        "gpu.others_peak_bytes",
        "int",
        "sum of the peaks of processes outside the job (in a look: what other users' processes hold now; one whose owner can't be read, a ghost, is neither the job's nor others')",
    ),
    (
        "gpu.others_list",
        "string",
        "those processes, in words, the most first: pid, command (in a look: its owner), memory",
    ),
    (
        "gpu.server",
        "string",
        "an inference server (as run.server: vllm, sglang, tensorrt_llm, tgi) whose processes are all that hold memory on this GPU, the job's or others'; empty if none, or if any other process holds memory there (it has only what the server left; in a look, the only way a server is known)",
    ),
    (
        "gpu.job_peak_bytes",
        "int",
        "peak of the job's processes' memory",
    ),
    ("gpu.job_peak_pct", "double", "that, % of capacity"),
    ("gpu.job_final_bytes", "int", "the job's memory at the end"),
    (
        "gpu.job_share",
        "double",
        "this GPU's job peak / the largest job peak over GPUs",
    ),
    (
        "gpu.steady_bytes",
        "int",
        "the job's usual level: the median of its timeline while it held memory",
    ),
    ("gpu.steady_pct", "double", "that, % of capacity"),
    (
        "gpu.last_held_bytes",
        "int",
        "the job's memory in the last part of the run while it still held some (before its processes exited)",
    ),
    (
        "gpu.rise_s",
        "double",
        "time from the job's first memory on this GPU to 90% of its peak (to the timeline's resolution)",
    ),
    ("gpu.spike_bytes", "int", "job peak − steady level"),
    ("gpu.spike_ratio", "double", "job peak / steady level"),
    (
        "gpu.spike_duration_s",
        "double",
        "how long the job stayed above halfway between steady level and peak",
    ),
    ("gpu.spike_at_s", "double", "when the job peaked"),
    (
        "gpu.peak_used_at_s",
        "double",
        "when the device's memory in use peaked",
    ),
    (
        "gpu.torch_phases",
        "int",
        "steps whose peak the framework view saw far above the others, on this GPU (see torch.phase_count)",
    ),
    (
        "gpu.lost",
        "bool",
        "the GPU stopped answering during the run",
    ),
    (
        "gpu.torch",
        "bool",
        "a PyTorch process reported from this GPU",
    ),
    (
        "gpu.peak_stretch",
        "string",
        "when the job's peak on it fell among the optimizer steps' records: before_steps, steps, after_steps (a time, not what ran then: see oom.phase); empty without the framework view",
    ),
    (
        "gpu.peak_since_last_step_s",
        "double",
        "seconds after the last optimizer step it came, -1 before the first or if unknown",
    ),
    (
        "gpu.growth_bytes",
        "int",
        "steady growth of the job's memory with no optimizer step to explain it (a run without steps, or after the last one), 0 if none: a straight rise to the program's end that never came back (docs/rules.md, Beyond the training step)",
    ),
    (
        "gpu.growth_rate_bytes_per_s",
        "double",
        "its rate (least squares), bytes per second",
    ),
    (
        "gpu.growth_r2",
        "double",
        "how well a straight line fits it (R², 0..1)",
    ),
    (
        "gpu.growth_s",
        "double",
        "how long it lasted, to the last moment the job held memory",
    ),
    ("gpu.growth_from_s", "double", "when it started, -1 if none"),
    (
        "gpu.growth_after_step",
        "int",
        "the last optimizer step before it, -1 in a run without steps",
    ),
    (
        "gpu.loading",
        "bool",
        "the job's PyTorch processes on this GPU have not yet called their model nor stepped (the shim recorded neither): what its memory does is loading; false where they have, or without the shim",
    ),
    (
        "gpu.growth_live_bytes",
        "int",
        "PyTorch's live tensors on this GPU at its last reading (the exit record), summed over processes; -1 without one",
    ),
    (
        "gpu.time_to_full_s",
        "double",
        "at that rate, seconds until the GPU is full (its capacity less the driver's reserve, other processes' peaks and the level reached), -1 if not growing",
    ),
    (
        "gpu.growth_sites",
        "list(string)",
        "where the memory that stayed alive was allocated, from the last leak hunt of a PyTorch process on this GPU (counted in forward calls of the outermost module in a program without steps), in words",
    ),
    (
        "gpu.growth_holders",
        "list(string)",
        "what kept it alive, in words, from the same hunt",
    ),
    (
        "gpu.growth_graph_bytes",
        "int",
        "of what that hunt found kept, the bytes behind held tensors' autograd graphs (see oom.graph_bytes), 0 if none",
    ),
    (
        "gpu.growth_graph_holder",
        "string",
        "what holds those tensors, empty if none",
    ),
    (
        "process.host",
        "string",
        "its host, in a report merged from several (empty otherwise)",
    ),
    ("process.pid", "int", "PID"),
    ("process.cmdline", "string", "command line"),
    (
        "process.in_job",
        "bool",
        "part of the job (in a look: the watcher's own, by its uid)",
    ),
    ("process.rank", "int", "RANK, -1 if unknown"),
    ("process.local_rank", "int", "LOCAL_RANK, -1 if unknown"),
    ("process.gpus", "int", "GPUs it held memory on"),
    (
        "process.main_gpu",
        "int",
        "its own GPU: its LOCAL_RANK's device when it is a PyTorch rank, else the GPU where it held the most",
    ),
    ("process.main_bytes", "int", "its peak there"),
    ("process.peak_bytes", "int", "sum of its peaks over GPUs"),
    (
        "process.stray_gpus",
        "list(int)",
        "other GPUs it held memory on (for a process without a rank: only where it held no more than a CUDA context's worth, 2 GiB or a tenth of its main GPU's)",
    ),
    ("process.stray_bytes", "int", "what it held on them"),
    ("process.parent_pid", "int", "its parent, -1 if unknown"),
    (
        "process.visible",
        "bool",
        "/proc has its PID: false inside a container that doesn't share the host's PID namespace, where NVML's PIDs can't be placed in or out of the job",
    ),
    (
        "process.job_gpu",
        "int",
        "of the GPUs the job held memory on, the one where this process held the most; -1 if it held none there",
    ),
    (
        "process.job_gpu_label",
        "string",
        "that GPU as messages name it, empty if none",
    ),
    ("process.job_gpu_bytes", "int", "its peak there"),
    (
        "process.job_gpu_start_bytes",
        "int",
        "what it held there at the run's start: at gpudoc's first look at the GPU's processes, a process first read within 0.1 s of it counted as there (the one definition, timeline::Timeline::at_first_look, which the OOM's window reads too); 0: it was not there yet, -1 if unknown",
    ),
    (
        "process.job_gpu_high_from_s",
        "double",
        "when its longest stretch there above half-way from that start to its peak began, -1 if unknown",
    ),
    (
        "process.job_gpu_high_s",
        "double",
        "how long that stretch lasted, without a break (to now, in a run still going): short for memory that came and went in a blip; 0 if unknown",
    ),
    (
        "process.user",
        "string",
        "its owner's name, in a look (empty in a run, and where /proc can't tell)",
    ),
    (
        "process.verdict",
        "string",
        "in a look, what `gpudoc orphans` makes of it: orphan, detached, zombie, ghost, service, live (empty in a run)",
    ),
    (
        "process.reason",
        "string",
        "in a look, why, in one line (`its parent died`; empty in a run)",
    ),
    (
        "process.leftover",
        "bool",
        "in a look, a leftover `gpudoc orphans --kill` would end: an orphan holding GPU memory, or what a `gpudoc run` recorded it left running that holds GPU memory or a device file (false in a run, whose leftovers are run.orphans)",
    ),
    (
        "process.helper",
        "bool",
        "a process that holds a CUDA context it should not: in the job, a child of a process of the job that itself holds GPU memory, not a rank of its own (no RANK from the shim, or its parent's) and holding no more than 1 GiB on any GPU (a context is ~500 MiB on an H200): a DataLoader worker or another helper that touched CUDA",
    ),
    (
        "torch.host",
        "string",
        "its host, in a report merged from several (empty otherwise)",
    ),
    (
        "torch.label",
        "string",
        "its GPU as messages name it (`GPU 0`, `GPU 0 on node-a`)",
    ),
    ("torch.pid", "int", "PID"),
    ("torch.rank", "int", "RANK, -1 if unknown"),
    (
        "torch.gpu",
        "int",
        "NVML's index of its device, -1 if unmatched",
    ),
    ("torch.torch_version", "string", "PyTorch's version"),
    (
        "torch.reserved_peak_bytes",
        "int",
        "the allocator's peak reserved (cache) memory",
    ),
    (
        "torch.allocated_peak_bytes",
        "int",
        "the allocator's peak live tensors",
    ),
    ("torch.final_reserved_bytes", "int", "reserved at the end"),
    ("torch.final_allocated_bytes", "int", "allocated at the end"),
    (
        "torch.steady_reserved_bytes",
        "int",
        "median reserved over the steps after warm-up (final reserved without steps)",
    ),
    (
        "torch.steady_peak_allocated_bytes",
        "int",
        "median per-step peak of live tensors after warm-up (peak allocated without steps)",
    ),
    (
        "torch.inactive_split_peak_bytes",
        "int",
        "peak memory in split blocks not in use (fragmentation)",
    ),
    (
        "torch.non_pytorch_bytes",
        "int",
        "NVML − reserved at NVML's peak (context, libraries)",
    ),
    (
        "torch.alloc_retries",
        "int",
        "times the allocator freed its cache and retried (cudaMalloc failed)",
    ),
    ("torch.ooms", "int", "OOMs the allocator raised"),
    ("torch.device_allocs", "int", "cudaMalloc calls"),
    ("torch.device_frees", "int", "cudaFree calls"),
    ("torch.steps", "int", "optimizer steps seen"),
    (
        "torch.leak_bytes_per_step",
        "double",
        "slope of allocated memory per step after warm-up (least squares)",
    ),
    (
        "torch.leak_r2",
        "double",
        "how well a straight line fits it (R², 0..1)",
    ),
    (
        "torch.leak_total_bytes",
        "int",
        "the slope times the steps it was fitted over",
    ),
    (
        "torch.device_allocs_per_step",
        "double",
        "slope of cudaMalloc calls per step after warm-up",
    ),
    (
        "torch.device_frees_per_step",
        "double",
        "slope of cudaFree calls per step after warm-up",
    ),
    (
        "torch.step_alloc_retries",
        "int",
        "allocation retries by the last step (not those of an OOM after it)",
    ),
    (
        "torch.alloc_retries_per_step",
        "double",
        "slope of allocation retries per step after warm-up",
    ),
    (
        "torch.gpu_total_bytes",
        "int",
        "capacity of its GPU, 0 if unmatched",
    ),
    (
        "torch.steady_peak_reserved_bytes",
        "int",
        "median per-step peak of reserved memory over the steps that are not phases",
    ),
    (
        "torch.phase_peak_reserved_bytes",
        "int",
        "the highest per-step peak of reserved memory among the phase steps (0 without any)",
    ),
    (
        "torch.phase_count",
        "int",
        "phase steps: a step record whose peak reserved memory is above the steady level (the lower quartile) by 2 GiB and half of it, in a run that comes back down after one (growth that never does is no phase)",
    ),
    (
        "torch.phase_steps",
        "list(int)",
        "their step numbers (the first 8; a record covering several steps gives its last)",
    ),
    (
        "torch.phase_period_steps",
        "int",
        "steps between phase steps when they come at a regular interval (3 or more), else 0",
    ),
    (
        "torch.phase_span_steps",
        "int",
        "the most steps one phase record covers (1: each is placed at its step; more: the shim recorded every Nth step)",
    ),
    (
        "torch.hunted",
        "bool",
        "a leak hunt recorded this process's memory history",
    ),
    (
        "torch.leak_sites",
        "list(string)",
        "where the memory that stayed alive in the hunt's window was allocated, in words (or why the hunt failed)",
    ),
    (
        "torch.leak_holders",
        "list(string)",
        "what keeps it alive, in words",
    ),
    (
        "torch.cells",
        "int",
        "notebook cells run in this process (a Jupyter kernel), 0 elsewhere",
    ),
    (
        "torch.cell",
        "string",
        "the cell whose last runs each left more allocated, the most in all: `its first line` (cell 12 when it has none)",
    ),
    (
        "torch.cell_runs",
        "int",
        "its last runs that each left at least 1 MiB more allocated than they found, in a row",
    ),
    (
        "torch.cell_numbers",
        "string",
        "their execution counts, in words: In [3], [5] and [7]",
    ),
    (
        "torch.cell_growth_bytes_per_run",
        "double",
        "allocated memory those runs left behind, on average",
    ),
    (
        "torch.cell_growth_bytes",
        "int",
        "allocated memory those runs left behind, in all",
    ),
];

const GIB: i64 = 1 << 30;

pub(super) fn pct(part: i64, whole: i64) -> f64 {
    if whole > 0 {
        part as f64 * 100.0 / whole as f64
    } else {
        0.0
    }
}

/// `2.11.0+cu130` → 13.0; 0.0 when there is no CUDA tag.
pub fn cuda_of_torch(version: &str) -> f64 {
    let Some(tag) = version.split("+cu").nth(1) else {
        return 0.0;
    };
    let digits: String = tag.chars().take_while(|c| c.is_ascii_digit()).collect();
    match digits.len() {
        3 => {
            digits[..2].parse::<f64>().unwrap_or(0.0)
                + digits[2..].parse::<f64>().unwrap_or(0.0) / 10.0
        }
        2 => {
            digits[..1].parse::<f64>().unwrap_or(0.0)
                + digits[1..].parse::<f64>().unwrap_or(0.0) / 10.0
        }
        _ => 0.0,
    }
}

fn median(mut v: Vec<i64>) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

impl Facts {
    /// Computes the facts of a report, in time linear in its size.
    pub fn of(r: &Report) -> Facts {
        let ranks = Ranks::of(r);
        let steps = super::when::Steps::of(r);
        let gpus = gpu_facts(r, &steps);
        let processes = process_facts(r, &ranks);
        let mut gpus = gpus;
        let torch_processes: Vec<TorchFacts> = r
            .torch
            .processes
            .iter()
            .map(|t| torch_facts(t, &ranks, &gpus))
            .collect();
        for g in &mut gpus {
            g.torch_phases = torch_processes
                .iter()
                .filter(|t| t.gpu == g.index && t.host == g.host)
                .map(|t| t.phase_count)
                .sum();
        }
        let mut oom = oom_facts(r, &gpus, &steps);
        oom_leak(&mut oom, &torch_processes);
        Facts {
            run: run_facts(r, &gpus, &processes),
            oom,
            gpus,
            processes,
            torch_processes,
        }
    }

    /// Facts with one of everything, every field set: what rules are checked against at load.
    pub fn example() -> Facts {
        Facts {
            run: RunFacts {
                classification: "success".into(),
                driver: "580.159.04".into(),
                ..Default::default()
            },
            oom: OomFacts {
                cause: "unknown".into(),
                source: "torch_allocator".into(),
                vendor: "nvidia".into(),
                gpu: -1,
                rank: -1,
                requested_bytes: -1,
                free_bytes: -1,
                total_bytes: -1,
                allocated_bytes: -1,
                reserved_bytes: -1,
                reserved_unallocated_bytes: -1,
                allowed_bytes: -1,
                filled_by: vec!["held by list `kept`".into(), "allocated at a.py:1".into()],
                ..Default::default()
            },
            gpus: vec![GpuFacts {
                name: "NVIDIA H200".into(),
                ..Default::default()
            }],
            processes: vec![ProcFacts {
                stray_gpus: vec![1],
                ..Default::default()
            }],
            torch_processes: vec![TorchFacts {
                phase_steps: vec![25, 50],
                leak_sites: vec!["allocated at a.py:1".into(), "allocated at b.py:2".into()],
                leak_holders: vec![
                    "kept alive by list `kept`".into(),
                    "kept alive by dict `c`".into(),
                ],
                ..Default::default()
            }],
        }
    }
}

/// RANK and LOCAL_RANK per PID, and each PID's PyTorch processes, from the framework view.
struct Ranks<'a> {
    by_pid: HashMap<Who, (i64, i64)>,
    torch: HashMap<Who, Vec<&'a crate::torch::view::TorchProcReport>>,
}

/// A process: its host (empty but in merged reports) and PID.
type Who = (String, u32);

fn host_of(h: &Option<String>) -> String {
    h.clone().unwrap_or_default()
}

/// How a GPU is named in messages: `GPU 0`, `GPU 0 on node-a` in a merged report.
pub fn gpu_label(host: &str, gpu: i64) -> String {
    match (gpu, host) {
        (g, _) if g < 0 => "an unknown GPU".into(),
        (g, "") => format!("GPU {g}"),
        (g, h) => format!("GPU {g} on {h}"),
    }
}

impl<'a> Ranks<'a> {
    fn of(r: &'a Report) -> Ranks<'a> {
        let n = |v: &Option<serde_json::Value>| {
            v.as_ref()
                .and_then(|x| x.as_i64().or_else(|| x.as_str()?.parse().ok()))
                .unwrap_or(-1)
        };
        let mut by_pid = HashMap::new();
        let mut torch: HashMap<Who, Vec<_>> = HashMap::new();
        for t in &r.torch.processes {
            let who = (host_of(&t.host), t.pid);
            by_pid
                .entry(who.clone())
                .or_insert((n(&t.rank), n(&t.local_rank)));
            torch.entry(who).or_default().push(t);
        }
        Ranks { by_pid, torch }
    }

    fn of_pid(&self, who: &Who) -> (i64, i64) {
        self.by_pid.get(who).copied().unwrap_or((-1, -1))
    }
}

fn gpu_facts(r: &Report, steps: &super::when::Steps) -> Vec<GpuFacts> {
    // Per GPU: the command lines of every process holding memory there, and those outside the job.
    let mut holding: HashMap<(String, u32), Vec<&str>> = HashMap::new();
    let mut others: HashMap<(String, u32), Vec<Other>> = HashMap::new();
    for p in r.processes.iter().filter(|p| p.peak_bytes > 0) {
        let on = (host_of(&p.host), p.gpu);
        if !p.in_job {
            let who = crate::units::shorten(&p.cmdline, 60);
            others
                .entry(on.clone())
                .or_default()
                .push((p.pid, who, p.peak_bytes));
        }
        holding.entry(on).or_default().push(&p.cmdline);
    }
    let mut gpus: Vec<GpuFacts> = r
        .gpus
        .iter()
        .map(|g| {
            let held = others.remove(&(host_of(&g.host), g.index));
            let mut f = one_gpu(r, g);
            (f.others_peak_bytes, f.others_list) = others_facts(held.unwrap_or_default());
            let on = holding
                .remove(&(host_of(&g.host), g.index))
                .unwrap_or_default();
            f.server = server_among(on);
            when_facts(r, g, steps, &mut f);
            f
        })
        .collect();
    let max_job = gpus.iter().map(|g| g.job_peak_bytes).max().unwrap_or(0);
    for g in &mut gpus {
        g.job_share = if max_job > 0 {
            g.job_peak_bytes as f64 / max_job as f64
        } else {
            0.0
        };
    }
    gpus
}

/// The inference server (its id) holding a GPU, from the command lines of the processes holding memory
/// there: `gpu.server`. Only when the server's processes are all there is: any other process (a training
/// job, a notebook) has only what the server left it, and its next allocation can run out.
pub(super) fn server_among<'a>(cmdlines: impl IntoIterator<Item = &'a str>) -> String {
    // Each line a server's, or none is named; among them, as `recognise` prefers: one that gives its
    // setting, else the first.
    let servers: Option<Vec<_>> = cmdlines
        .into_iter()
        .map(|l| super::serving::recognise([l]))
        .collect();
    let servers = servers.unwrap_or_default();
    servers
        .iter()
        .find(|s| s.setting.is_some())
        .or(servers.first())
        .map(|s| s.id.to_string())
        .unwrap_or_default()
}

/// A process outside the job on a GPU: its pid, who it is in words, and its memory there.
pub(super) type Other = (u32, String, u64);

/// What the processes outside the job hold on a GPU, summed, and in words, the most first
/// (`gpu.others_peak_bytes`, `gpu.others_list`).
pub(super) fn others_facts(mut others: Vec<Other>) -> (i64, String) {
    others.sort_by_key(|o| (std::cmp::Reverse(o.2), o.0));
    let list: Vec<String> = others
        .iter()
        .map(|(pid, who, b)| format!("pid {pid} ({who}) {}", crate::units::fmt_bytes(*b)))
        .collect();
    (others.iter().map(|o| o.2 as i64).sum(), list.join("; "))
}

fn one_gpu(r: &Report, g: &crate::report::GpuReport) -> GpuFacts {
    let total = g.total_bytes as i64;
    let held: Vec<i64> = g
        .job_timeline
        .iter()
        .map(|&(_, v)| v as i64)
        .filter(|&v| v > 0)
        .collect();
    let steady = median(held);
    let peak = g.job_peak_bytes as i64;
    let half = steady + (peak - steady) / 2;
    let width = if g.job_timeline.len() > 1 {
        g.job_timeline[1].0 - g.job_timeline[0].0
    } else {
        r.duration_s
    };
    let above = g
        .job_timeline
        .iter()
        .filter(|&&(_, v)| (v as i64) > half && peak > steady)
        .count();
    let first = g
        .job_timeline
        .iter()
        .find(|&&(_, v)| v > 0)
        .map(|&(t, _)| t);
    let high = g
        .job_timeline
        .iter()
        .find(|&&(_, v)| v as f64 >= 0.9 * peak as f64 && v > 0)
        .map(|&(t, _)| t);
    let host = host_of(&g.host);
    GpuFacts {
        label: gpu_label(&host, g.index as i64),
        host,
        index: g.index as i64,
        name: g.name.clone(),
        total_bytes: total,
        peak_used_bytes: g.peak_used_bytes as i64,
        peak_used_pct: pct(g.peak_used_bytes as i64, total),
        start_used_bytes: g.start_used_bytes as i64,
        job_peak_bytes: peak,
        job_peak_pct: pct(peak, total),
        job_final_bytes: g.job_final_bytes as i64,
        job_share: 0.0,
        steady_bytes: steady,
        steady_pct: pct(steady, total),
        last_held_bytes: g
            .job_timeline
            .iter()
            .rev()
            .map(|&(_, v)| v as i64)
            .find(|&v| v > 0)
            .unwrap_or(0),
        rise_s: first.zip(high).map_or(0.0, |(a, b)| b - a),
        spike_bytes: peak - steady,
        spike_ratio: if steady > 0 {
            peak as f64 / steady as f64
        } else {
            0.0
        },
        spike_duration_s: above as f64 * width,
        spike_at_s: g.job_peak_at_s,
        peak_used_at_s: g.peak_used_at_s,
        lost: g.lost.is_some(),
        torch: r
            .torch
            .processes
            .iter()
            .any(|t| t.gpu == Some(g.index) && t.host == g.host),
        torch_phases: 0,
        ..Default::default()
    }
}

/// Where the GPU's peak fell among the phases, and growth no step explains, with the time it leaves.
fn when_facts(
    r: &Report,
    g: &crate::report::GpuReport,
    steps: &super::when::Steps,
    f: &mut GpuFacts,
) {
    let w = super::when::gpu(steps, g, r.oom.as_ref());
    (f.peak_stretch, _, f.peak_since_last_step_s) = w.peak;
    let torch: Vec<_> = r
        .torch
        .processes
        .iter()
        .filter(|t| t.gpu == Some(g.index) && t.host == g.host)
        .collect();
    f.growth_live_bytes = match torch.is_empty() {
        true => -1,
        false => torch.iter().map(|t| t.final_allocated_bytes as i64).sum(),
    };
    f.growth_from_s = -1.0;
    f.time_to_full_s = -1.0;
    f.growth_after_step = w.growth_after_step;
    f.loading = !torch.is_empty() && torch.iter().all(|t| t.started_work_s().is_none());
    if let Some(h) = torch
        .iter()
        .flat_map(|t| &t.hunts)
        .filter(|h| h.why != "oom" && (h.error.is_some() || h.steps > 0))
        .max_by(|a, b| a.at_s.total_cmp(&b.at_s))
    {
        f.growth_sites = leak_sites(h);
        f.growth_holders = leak_holders(h);
        f.growth_graph_bytes = h.graphs().0 as i64;
        f.growth_graph_holder = h.graphs().1.to_string();
    }
    let Some(gr) = w.growth else { return };
    let room =
        f.total_bytes - g.driver_reserved_bytes as i64 - f.others_peak_bytes - gr.to_bytes as i64;
    f.growth_bytes = gr.bytes() as i64;
    f.growth_rate_bytes_per_s = gr.rate;
    f.growth_r2 = gr.r2;
    f.growth_s = gr.secs();
    f.growth_from_s = gr.from_s;
    f.time_to_full_s = room.max(0) as f64 / gr.rate;
}

/// Processes, merged over GPUs: one entry per PID.
fn process_facts(r: &Report, ranks: &Ranks) -> Vec<ProcFacts> {
    let mut by_pid: BTreeMap<Who, Vec<&ProcessReport>> = BTreeMap::new();
    for p in &r.processes {
        by_pid.entry((host_of(&p.host), p.pid)).or_default().push(p);
    }
    let holders: HashSet<Who> = by_pid
        .iter()
        .filter(|(_, rows)| rows.iter().any(|p| p.in_job && p.peak_bytes > 0))
        .map(|(who, _)| who.clone())
        .collect();
    by_pid
        .iter()
        .map(|(who, rows)| {
            let mut f = one_process(who.clone(), rows, ranks);
            f.helper = helper(who, rows, ranks, &holders);
            beside_job(r, rows, &mut f);
            f
        })
        .collect()
}

/// What a process held on the GPUs the job used: the one where it held the most, what it held there at
/// the start, and its longest stretch near its peak there.
fn beside_job(r: &Report, rows: &[&ProcessReport], f: &mut ProcFacts) {
    let job_gpu = |p: &ProcessReport| {
        r.gpus
            .iter()
            .any(|g| g.index == p.gpu && g.host == p.host && g.job_peak_bytes > 0)
    };
    let best = rows
        .iter()
        .filter(|p| p.peak_bytes > 0 && job_gpu(p))
        .max_by_key(|p| p.peak_bytes);
    f.visible = rows.iter().all(|p| p.visible);
    f.job_gpu = -1;
    f.job_gpu_start_bytes = -1;
    f.job_gpu_high_from_s = -1.0;
    let Some(p) = best else { return };
    f.job_gpu = p.gpu as i64;
    f.job_gpu_label = gpu_label(&host_of(&p.host), p.gpu as i64);
    f.job_gpu_bytes = p.peak_bytes as i64;
    if let (Some(start), Some(from), Some(len)) = (p.start_bytes, p.high_from_s, p.high_s) {
        f.job_gpu_start_bytes = start as i64;
        f.job_gpu_high_from_s = from;
        f.job_gpu_high_s = len;
    }
}

/// Most a helper holds on a GPU: a CUDA context (~500 MiB on an H200) and a little.
const HELPER_MAX: u64 = 1 << 30;

/// Whether `who` is a helper holding a CUDA context it should not: a child of a process of the job that
/// holds GPU memory itself (a torchrun rank's parent, the launcher, holds none), not a rank of its own
/// (DataLoader workers inherit their rank's RANK), holding no more than a context's worth on any GPU.
fn helper(who: &Who, rows: &[&ProcessReport], ranks: &Ranks, holders: &HashSet<Who>) -> bool {
    let Some(parent) = rows
        .iter()
        .find_map(|p| p.ppid)
        .map(|pp| (who.0.clone(), pp))
    else {
        return false;
    };
    let rank = ranks.of_pid(who).0;
    holders.contains(&parent)
        && (rank < 0 || rank == ranks.of_pid(&parent).0)
        && rows.iter().all(|p| p.in_job && p.peak_bytes <= HELPER_MAX)
}

/// The most a process without a rank may hold on a GPU not its own for it to count as a stray context (a
/// context is ~520 MiB on an H200; libraries loaded into it add some).
const CONTEXT_MAX: u64 = 2 << 30;

/// The facts of where a process holds memory (`held`: per GPU, its peak in a run, now in a look): its
/// GPUs, its own GPU and the stray ones; the index of its own GPU's entry, if any. One definition of a
/// stray context, for a run's processes and a look's (`gpudoc watch`). A rank's own GPU is `own`, its
/// LOCAL_RANK's device (as PyTorch numbers it, matched to NVML's index by UUID), where it holds memory;
/// anything it holds elsewhere is stray, whatever its size. Without one, the GPU where it holds the most
/// is its own, and only context-sized footprints elsewhere (2 GiB, or a tenth of its own GPU's) count as
/// stray. `None` when it holds nothing anywhere.
pub(super) fn place(held: &[(u32, u64)], own: Option<u32>, f: &mut ProcFacts) -> Option<usize> {
    f.gpus = held.iter().filter(|h| h.1 > 0).count() as i64;
    f.peak_bytes = held.iter().map(|h| h.1 as i64).sum();
    f.main_gpu = -1;
    let own = own.and_then(|g| held.iter().position(|&(gpu, b)| gpu == g && b > 0));
    let main = own.or_else(|| (0..held.len()).max_by_key(|&i| held[i].1))?;
    let limit = match own {
        Some(_) => u64::MAX,
        None => CONTEXT_MAX.max(held[main].1 / 10),
    };
    let stray = held
        .iter()
        .filter(|&&(gpu, b)| gpu != held[main].0 && b > 0 && b <= limit);
    f.main_gpu = held[main].0 as i64;
    f.main_bytes = held[main].1 as i64;
    f.stray_gpus = stray.clone().map(|&(gpu, _)| gpu as i64).collect();
    f.stray_bytes = stray.map(|&(_, b)| b as i64).sum();
    Some(main)
}

fn one_process(who: Who, rows: &[&ProcessReport], ranks: &Ranks) -> ProcFacts {
    let (rank, local_rank) = ranks.of_pid(&who);
    let own = ranks
        .torch
        .get(&who)
        .into_iter()
        .flatten()
        .find(|t| local_rank >= 0 && t.device as i64 == local_rank)
        .and_then(|t| t.gpu);
    let held: Vec<(u32, u64)> = rows.iter().map(|p| (p.gpu, p.peak_bytes)).collect();
    let mut f = ProcFacts {
        pid: who.1 as i64,
        host: who.0,
        rank,
        local_rank,
        parent_pid: rows.iter().find_map(|p| p.ppid).map_or(-1, i64::from),
        ..Default::default()
    };
    // A process's rows are never empty: it is listed because NVML saw it on a GPU.
    let main = rows[place(&held, own, &mut f).unwrap_or(0)];
    f.cmdline = main.cmdline.clone();
    f.in_job = main.in_job;
    f
}

fn torch_facts(
    t: &crate::torch::view::TorchProcReport,
    ranks: &Ranks,
    gpus: &[GpuFacts],
) -> TorchFacts {
    let warm = (t.steps.len() / 10).max(5).min(t.steps.len());
    let after = &t.steps[warm..];
    let slope = |f: fn(&crate::torch::Step) -> u64| {
        fit(&after
            .iter()
            .map(|s| (s.step as f64, f(s) as f64))
            .collect::<Vec<_>>())
    };
    let (leak, r2) = slope(|s| s.allocated_bytes);
    let span = after
        .last()
        .zip(after.first())
        .map_or(0, |(l, f)| l.step.saturating_sub(f.step));
    let phases = phases(t.steps.get(2..).unwrap_or_default());
    let hunt = t
        .hunts
        .iter()
        .rev()
        .find(|h| h.why != "oom" && (h.error.is_some() || h.steps > 0));
    let (steady_reserved, steady_peak) = if after.len() >= 3 {
        (
            median(after.iter().map(|s| s.reserved_bytes as i64).collect()),
            median(
                after
                    .iter()
                    .map(|s| s.peak_allocated_bytes as i64)
                    .collect(),
            ),
        )
    } else {
        (t.final_reserved_bytes as i64, t.peak_allocated_bytes as i64)
    };
    let host = host_of(&t.host);
    TorchFacts {
        label: gpu_label(&host, t.gpu.map_or(-1, |g| g as i64)),
        rank: ranks.of_pid(&(host.clone(), t.pid)).0,
        host,
        pid: t.pid as i64,
        gpu: t.gpu.map_or(-1, |g| g as i64),
        torch_version: t.torch_version.clone().unwrap_or_default(),
        reserved_peak_bytes: t.peak_reserved_bytes as i64,
        allocated_peak_bytes: t.peak_allocated_bytes as i64,
        final_reserved_bytes: t.final_reserved_bytes as i64,
        final_allocated_bytes: t.final_allocated_bytes as i64,
        steady_reserved_bytes: steady_reserved,
        steady_peak_allocated_bytes: steady_peak,
        inactive_split_peak_bytes: t.peak_inactive_split_bytes as i64,
        non_pytorch_bytes: t.non_pytorch_bytes.unwrap_or(0) as i64,
        alloc_retries: t.alloc_retries as i64,
        ooms: t.ooms as i64,
        device_allocs: t.device_allocs as i64,
        device_frees: t.device_frees as i64,
        steps: t.steps_total as i64,
        leak_bytes_per_step: leak,
        leak_r2: r2,
        leak_total_bytes: (leak * span as f64) as i64,
        device_allocs_per_step: slope(|s| s.device_allocs).0,
        device_frees_per_step: slope(|s| s.device_frees).0,
        step_alloc_retries: t.steps.last().map_or(0, |s| s.alloc_retries as i64),
        alloc_retries_per_step: slope(|s| s.alloc_retries).0,
        gpu_total_bytes: t
            .gpu
            .and_then(|i| {
                gpus.iter()
                    .find(|g| g.index == i as i64 && g.host == host_of(&t.host))
            })
            .map_or(0, |g| g.total_bytes),
        steady_peak_reserved_bytes: phases.steady,
        phase_peak_reserved_bytes: phases.peak,
        phase_count: phases.steps.len() as i64,
        phase_steps: phases.steps.iter().take(8).copied().collect(),
        phase_period_steps: phases.period,
        phase_span_steps: phases.span,
        hunted: hunt.is_some(),
        leak_sites: hunt.map(leak_sites).unwrap_or_default(),
        leak_holders: hunt.map(leak_holders).unwrap_or_default(),
        cells: t.cells.len() as i64,
        ..cell_facts(&t.cells)
    }
}

/// The notebook cell that leaks most (`torch.cell*`).
fn cell_facts(cells: &[crate::torch::cells::Cell]) -> TorchFacts {
    let Some(l) = crate::torch::cells::leak(cells) else {
        return TorchFacts::default();
    };
    let mut numbers: Vec<String> = l.numbers.iter().map(|n| format!("[{n}]")).collect();
    let last = numbers.pop().unwrap_or_default();
    TorchFacts {
        cell: l.label,
        cell_runs: l.runs as i64,
        cell_numbers: if numbers.is_empty() {
            format!("In {last}")
        } else {
            format!("In {} and {last}", numbers.join(", "))
        },
        cell_growth_bytes_per_run: l.bytes_per_run,
        cell_growth_bytes: l.total_bytes as i64,
        ..TorchFacts::default()
    }
}

/// The hunt's sites in words; why it failed, when it did.
fn leak_sites(h: &crate::torch::hunt::Hunt) -> Vec<String> {
    if let Some(e) = &h.error {
        return vec![format!("the leak hunt could not run: {e}")];
    }
    let mut out = h.site_lines();
    if out.is_empty() {
        out.push(format!(
            "the leak hunt ({}) found no allocation site that kept its memory alive",
            h.span()
        ));
    }
    out
}

/// What holds the leak, in words; said when it could not be found.
fn leak_holders(h: &crate::torch::hunt::Hunt) -> Vec<String> {
    if h.error.is_some() || h.sites.is_empty() {
        return Vec::new();
    }
    let out = h.holder_lines("kept alive by");
    if out.is_empty() {
        return vec![
            "what keeps it alive was not found: no Python object refers to these blocks' tensors, and no \
             autograd graph in the program's variables spans the steps"
                .into(),
        ];
    }
    out
}

/// Steps whose peak stands far above the steady per-step peak: an evaluation, a checkpoint.
#[derive(Debug, Default, PartialEq)]
struct Phases {
    /// Median per-step peak of reserved memory.
    steady: i64,
    /// Highest peak among the phase steps.
    peak: i64,
    steps: Vec<i64>,
    /// Regular interval between them (3 or more), else 0.
    period: i64,
    /// The most steps one of their records covers.
    span: i64,
}

/// The phase records of `recs` (the step records but the first two): a peak above the steady level (the
/// lower quartile of the records' peaks) by at least 2 GiB and half of it, in a run that comes back down
/// to the steady level after at least one of them. Growth that never comes back (a leak, a job filling the
/// GPU) is no phase. A record covering several steps places its phase only to within those steps.
fn phases(recs: &[crate::torch::Step]) -> Phases {
    if recs.len() < 3 {
        return Phases::default();
    }
    let peak = |s: &crate::torch::Step| s.peak_reserved_bytes as i64;
    let mut sorted: Vec<i64> = recs.iter().map(peak).collect();
    sorted.sort_unstable();
    let bar = sorted[sorted.len() / 4] + (2 * GIB).max(sorted[sorted.len() / 4] / 2);
    let high: Vec<usize> = (0..recs.len()).filter(|&i| peak(&recs[i]) > bar).collect();
    let steady = median(recs.iter().map(peak).filter(|&p| p <= bar).collect());
    let comes_back = high
        .iter()
        .any(|&i| recs.get(i + 1).is_some_and(|n| peak(n) <= bar));
    if !comes_back {
        return Phases {
            steady,
            ..Default::default()
        };
    }
    let steps: Vec<i64> = high.iter().map(|&i| recs[i].step as i64).collect();
    let gaps: Vec<i64> = steps.windows(2).map(|w| w[1] - w[0]).collect();
    let span = high
        .iter()
        .map(|&i| recs[i].steps as i64)
        .max()
        .unwrap_or(1);
    // A period is said only when the records place each phase well within it.
    let period = match gaps.first() {
        Some(&g)
            if steps.len() >= 3
                && span * 4 <= g
                && gaps.iter().all(|&x| (x - g).abs() <= span.max(g / 10)) =>
        {
            median(gaps.clone())
        }
        _ => 0,
    };
    Phases {
        steady,
        peak: high.iter().map(|&i| peak(&recs[i])).max().unwrap_or(0),
        steps,
        period,
        span,
    }
}

/// The processes an OOM text names, in words; else those NVML saw holding memory then.
fn oom_others(o: &crate::oom::OomReport) -> String {
    let t = &o.event.text;
    let with_cmd = |pid: u32, cmdline: &str, bytes: u64| {
        let cmd = if cmdline.is_empty() {
            String::new()
        } else {
            format!(" ({cmdline})")
        };
        format!("pid {pid}{cmd} {}", crate::units::fmt_bytes(bytes))
    };
    let mut others: Vec<String> = t
        .other_processes
        .iter()
        .map(|p| {
            let cmd = o
                .before
                .iter()
                .find(|b| b.pid == p.pid)
                .map_or("", |b| b.cmdline.as_str());
            with_cmd(p.pid, cmd, p.bytes)
        })
        .collect();
    if others.is_empty() {
        others = o
            .before
            .iter()
            .filter(|b| !b.in_job && b.visible && b.bytes_at > 0)
            .map(|b| with_cmd(b.pid, &b.cmdline, b.bytes_at))
            .collect();
    }
    others.join("; ")
}

pub(super) fn name_of<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

fn oom_facts(r: &Report, gpus: &[GpuFacts], steps: &super::when::Steps) -> OomFacts {
    let (_, steps, since_last_step_s) = super::when::oom(steps, r);
    let Some(o) = &r.oom else {
        return OomFacts {
            steps,
            since_last_step_s,
            ..OomFacts::absent()
        };
    };
    let t = &o.event.text;
    let g = |v: Option<u64>| v.map_or(-1, |x| x as i64);
    let host = host_of(&o.host);
    let on = o
        .gpu
        .and_then(|i| gpus.iter().find(|x| x.index == i as i64 && x.host == host));
    let inside = oom_inside(r).filter(|w| w.saw_model());
    let pass = inside.and_then(|w| w.pass.clone());
    let activity = o.allocator.as_ref().and_then(|a| a.activity);
    let phase = super::phase::Phase::at_oom(activity.as_ref(), pass.as_deref());
    let graphs_kept = kept_graphs(phase, pass.as_deref(), activity.as_ref());
    // A training step's own graph is its activations, told per module (oom.largest_part, filled_by).
    let own = matches!(
        phase,
        Some(super::phase::Phase::TrainingStep | super::phase::Phase::Loading)
    );
    let (graph_bytes, graph_holder) = oom_hunt(r)
        .map(|h| h.graphs())
        .filter(|_| graphs_kept || !own)
        .map_or((0, String::new()), |(b, h)| (b as i64, h.to_string()));
    OomFacts {
        phase: phase.map_or("", |p| p.name()).into(),
        waiting_forwards: activity
            .and_then(|a| a.forwards_without_backward)
            .map_or(-1, |n| n as i64),
        // The shim's own count at the OOM where it gave one: steps ended by then, exactly.
        steps: activity.and_then(|a| a.steps).map_or(steps, |n| n as i64),
        since_last_step_s,
        growth_bytes: on.map_or(0, |x| x.growth_bytes),
        growth_rate_bytes_per_s: on.map_or(0.0, |x| x.growth_rate_bytes_per_s),
        growth_s: on.map_or(0.0, |x| x.growth_s),
        graph_bytes,
        graph_holder,
        graphs_kept,
        label: oom_label(o, &host),
        host: host.clone(),
        present: true,
        cause: name_of(o.cause),
        source: name_of(o.source),
        engine: crate::oom::program::engine(t).unwrap_or_default().into(),
        at_start: crate::oom::program::at_start(t),
        vendor: name_of(t.vendor),
        exception: t.exception.clone().unwrap_or_default(),
        complete: t.complete,
        gpu: o.gpu.map_or(-1, |x| x as i64),
        rank: o.event.rank.map_or(-1, |x| x as i64),
        requested_bytes: g(t.requested_bytes),
        free_bytes: g(t.free_bytes),
        total_bytes: g(t.total_bytes),
        allocated_bytes: g(t.allocated_bytes),
        reserved_bytes: g(t.reserved_bytes),
        reserved_unallocated_bytes: g(t.reserved_unallocated_bytes),
        allowed_bytes: g(t.allowed_bytes),
        others_bytes: o.others_bytes as i64,
        job_others_bytes: o.job_others_bytes as i64,
        others: oom_others(o),
        job_peak_pct: on.map_or(0.0, |x| x.job_peak_pct),
        explanation: o.explanation.clone(),
        filled_by: filled_by(r),
        pass: pass.unwrap_or_default(),
        module: inside.and_then(|w| w.module.clone()).unwrap_or_default(),
        largest_part: inside.map_or("", |w| w.parts.largest()).into(),
        largest_part_pct: inside.map_or(0.0, |w| {
            let top = w.parts.ranked().first().map_or(0, |p| p.1);
            top as f64 * 100.0 / w.parts.sum().max(1) as f64
        }),
        at_s: o.event.at_s,
        ..Default::default()
    }
}

/// Whether the autograd graphs behind held tensors at an OOM outlived the step or call that made them, so
/// that no backward will free them: in an evaluation or inference (forward calls no backward followed),
/// and in an optimizer's step (the step's own backward has freed its graph by then). In a training step's
/// forward or backward the live graph is that step's own, whose backward frees it: not counted as kept.
fn kept_graphs(
    phase: Option<super::phase::Phase>,
    pass: Option<&str>,
    act: Option<&Activity>,
) -> bool {
    use super::phase::Phase;
    let stepping =
        pass == Some("optimizer") || act.is_some_and(|a| a.in_optimizer_step == Some(true));
    let backward = pass == Some("backward") || act.is_some_and(|a| a.in_backward == Some(true));
    match phase {
        Some(Phase::Evaluation | Phase::Inference) => true,
        Some(Phase::TrainingStep) => stepping && !backward,
        Some(Phase::Loading) | None => false,
    }
}

/// The step-by-step growth of the failing process's live tensors before the OOM: the PyTorch process on
/// its GPU (and host) that grew the most.
fn oom_leak(oom: &mut OomFacts, torch: &[TorchFacts]) {
    let failing = torch
        .iter()
        .filter(|t| oom.present && t.gpu == oom.gpu && t.host == oom.host)
        .max_by_key(|t| t.leak_total_bytes);
    if let Some(t) = failing.filter(|t| t.leak_total_bytes > 0) {
        oom.leak_total_bytes = t.leak_total_bytes;
        oom.leak_bytes_per_step = t.leak_bytes_per_step;
        oom.leak_r2 = t.leak_r2;
    }
}

impl OomFacts {
    /// The facts of no OOM: its GPU, rank, moment and steps unknown.
    pub(super) fn absent() -> OomFacts {
        OomFacts {
            gpu: -1,
            rank: -1,
            label: gpu_label("", -1),
            at_s: -1.0,
            steps: -1,
            since_last_step_s: -1.0,
            ..Default::default()
        }
    }
}

/// The OOM's GPU as messages name it; a GPU NVML cannot see (AMD, Intel, Apple, a TPU) by its vendor and
/// the text's device number ("Intel GPU 0 (XPU)").
fn oom_label(o: &crate::oom::OomReport, host: &str) -> String {
    let t = &o.event.text;
    if t.vendor.nvml_sees() {
        return gpu_label(host, o.gpu.map_or(-1, |x| x as i64));
    }
    let on = if host.is_empty() {
        String::new()
    } else {
        format!(" on {host}")
    };
    let platform = t.vendor.names().1;
    let device = t
        .gpu
        .map_or_else(|| t.vendor.one(), |d| t.vendor.numbered(d));
    format!("{device}{on} ({platform})")
}

/// The failing process (or any, when it is not known which), and the time of the OOM the report is about
/// (the one nearest to it: a program may have caught earlier ones).
fn oom_when(r: &Report) -> (Option<u32>, f64) {
    let o = r.oom.as_ref();
    let pid = o.and_then(|o| o.allocator.as_ref().map(|a| a.pid).or(o.this_pid));
    let at = o.map_or(f64::MAX, |o| {
        o.allocator.as_ref().map_or(o.event.at_s, |a| a.at_s)
    });
    (pid, at)
}

/// Where in the model the OOM happened (the shim's look at it).
fn oom_inside(r: &Report) -> Option<&crate::torch::inside::Inside> {
    let (pid, at) = oom_when(r);
    r.torch
        .processes
        .iter()
        .filter(|p| pid.is_none_or(|x| x == p.pid))
        .flat_map(|p| &p.inside)
        .filter(|w| w.why == "oom" && w.error.is_none())
        .min_by(|a, b| (a.at_s - at).abs().total_cmp(&(b.at_s - at).abs()))
}

/// The shim's search at the OOM the report is about, in the process that failed (or any, if it is not
/// known which).
fn oom_hunt(r: &Report) -> Option<&crate::torch::hunt::Hunt> {
    let (pid, at) = oom_when(r);
    r.torch
        .processes
        .iter()
        .filter(|p| pid.is_none_or(|x| x == p.pid))
        .flat_map(|p| &p.hunts)
        .filter(|h| h.why == "oom" && h.error.is_none())
        .min_by(|a, b| (a.at_s - at).abs().total_cmp(&(b.at_s - at).abs()))
}

/// What filled the GPU at the OOM: where in the model it happened and what the memory held (the shim's
/// look), then what held it (the shim's search then).
fn filled_by(r: &Report) -> Vec<String> {
    let mut out = oom_inside(r).map(|w| w.lines()).unwrap_or_default();
    out.extend(oom_holders(r));
    out
}

/// What held the GPU at the OOM, from the shim's search then.
fn oom_holders(r: &Report) -> Vec<String> {
    let Some(h) = oom_hunt(r) else {
        return Vec::new();
    };
    let mut out = h.holder_lines("held by");
    if let (Some(n), Some(b)) = (h.tensors, h.tensor_bytes)
        && n > 0
    {
        out.push(format!(
            "{n} Python tensors on the GPU held {} in all",
            crate::units::fmt_bytes(b)
        ));
    }
    out.extend(h.site_lines());
    out
}

/// The inference server the job runs, if a command line shows one (`serving`).
fn server_facts(r: &Report, f: &mut RunFacts) {
    let command = r.command.join(" ");
    let lines = std::iter::once(command.as_str()).chain(
        r.processes
            .iter()
            .filter(|p| p.in_job)
            .map(|p| p.cmdline.as_str()),
    );
    f.server_fraction = -1.0;
    let Some(s) = super::serving::recognise(lines) else {
        return;
    };
    f.server = s.id.into();
    f.server_label = s.label.into();
    f.server_flag = s.flag.into();
    f.server_setting = s.setting.unwrap_or_default();
    f.server_fraction = s.fraction.unwrap_or(-1.0);
}

/// The helpers holding contexts (see `helper`), in words: a multiprocessing child is named as one, other
/// command lines are cut at 60 characters.
fn helper_facts(ps: &[ProcFacts], f: &mut RunFacts) {
    let helpers: Vec<&ProcFacts> = ps.iter().filter(|p| p.helper).collect();
    let cmd = |c: &str| {
        if c.contains("multiprocessing.spawn") || c.contains("multiprocessing.forkserver") {
            "a multiprocessing child".to_string()
        } else if c.chars().count() > 60 {
            format!("{}...", c.chars().take(60).collect::<String>())
        } else {
            c.to_string()
        }
    };
    f.helpers = helpers.len() as i64;
    f.helpers_bytes = helpers.iter().map(|p| p.peak_bytes).sum();
    f.helper_list = helpers
        .iter()
        .map(|p| {
            let on = gpu_label(&p.host, p.main_gpu);
            let b = crate::units::fmt_bytes(p.peak_bytes as u64);
            format!("pid {} ({}) {b} on {on}", p.pid, cmd(&p.cmdline))
        })
        .collect::<Vec<_>>()
        .join("; ");
}

fn run_facts(r: &Report, gpus: &[GpuFacts], ps: &[ProcFacts]) -> RunFacts {
    let mut f = run_basics(r, gpus);
    f.live = r.live;
    server_facts(r, &mut f);
    helper_facts(ps, &mut f);
    f
}

/// The job's GPUs: how many, the largest and smallest of its per-GPU peaks, and their ratio.
pub(super) fn job_facts(gpus: &[GpuFacts], f: &mut RunFacts) {
    let used: Vec<&GpuFacts> = gpus.iter().filter(|g| g.job_peak_bytes > 0).collect();
    let max_g = used.iter().max_by_key(|g| g.job_peak_bytes);
    let min_g = used.iter().min_by_key(|g| g.job_peak_bytes);
    f.gpus = gpus.len() as i64;
    f.job_gpus = used.len() as i64;
    f.job_peak_max_bytes = max_g.map_or(0, |g| g.job_peak_bytes);
    f.job_peak_min_bytes = min_g.map_or(0, |g| g.job_peak_bytes);
    f.job_peak_max_gpu = max_g.map_or(-1, |g| g.index);
    f.job_peak_min_gpu = min_g.map_or(-1, |g| g.index);
    f.job_peak_max_label = max_g.map_or_else(|| gpu_label("", -1), |g| g.label.clone());
    f.job_peak_min_label = min_g.map_or_else(|| gpu_label("", -1), |g| g.label.clone());
    f.job_peak_max_at_s = max_g.map_or(-1.0, |g| g.spike_at_s);
    f.imbalance_ratio = match (max_g, min_g) {
        (Some(a), Some(b)) if b.job_peak_bytes > 0 => {
            a.job_peak_bytes as f64 / b.job_peak_bytes as f64
        }
        _ => 1.0,
    };
}

fn run_basics(r: &Report, gpus: &[GpuFacts]) -> RunFacts {
    let cuda_runtime = r
        .torch
        .processes
        .iter()
        .filter_map(|t| t.torch_version.as_deref())
        .map(cuda_of_torch)
        .fold(0.0, f64::max);
    let orphan_bytes =
        |o: &crate::report::Orphan| -> u64 { o.gpu_bytes.iter().map(|&(_, b)| b).sum() };
    let mut f = RunFacts {
        duration_s: r.duration_s,
        exit_code: r.exit.code.map_or(-1, i64::from),
        signal: r.exit.signal.unwrap_or(0) as i64,
        classification: name_of(r.exit.classification),
        driver: r.nvml.driver.clone().unwrap_or_default(),
        cuda_driver_version: r
            .nvml
            .cuda_driver
            .as_deref()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        cuda_runtime_version: cuda_runtime,
        hosts: r.hosts.len().max(1) as i64,
        orphans: r.orphans.len() as i64,
        orphans_gpu_bytes: r.orphans.iter().map(|o| orphan_bytes(o) as i64).sum(),
        orphan_list: r
            .orphans
            .iter()
            .map(|o| {
                let b = crate::units::fmt_bytes(orphan_bytes(o));
                let on = o
                    .host
                    .as_deref()
                    .map(|h| format!(" on {h}"))
                    .unwrap_or_default();
                format!("pid {}{on} ({}) {b}", o.pid, o.cmdline)
            })
            .collect::<Vec<_>>()
            .join("; "),
        host_oom: r.exit.classification == crate::oom::Ending::HostOomKill,
        has_torch: !r.torch.processes.is_empty(),
        ..Default::default()
    };
    job_facts(gpus, &mut f);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_are_measured_on_the_gpus_the_job_used_only() {
        let mut r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/others/fake_arrived.report.json"
        )))
        .unwrap();
        let other = |f: &Facts| f.processes.iter().find(|p| !p.in_job).unwrap().clone();
        let f = other(&Facts::of(&r));
        assert_eq!((f.job_gpu, f.job_gpu_label.as_str()), (0, "GPU 0"));
        assert_eq!((f.job_gpu_bytes, f.job_gpu_start_bytes), (20 * GIB, 0));
        assert!(f.visible && f.job_gpu_high_s >= 15.0 && f.job_gpu_high_from_s >= 1.9);
        // On a GPU the job did not use, it is none of the job's business.
        for p in r.processes.iter_mut().filter(|p| !p.in_job) {
            p.gpu = 1;
        }
        let f = other(&Facts::of(&r));
        assert_eq!(
            (f.job_gpu, f.job_gpu_start_bytes, f.job_gpu_high_s),
            (-1, -1, 0.0)
        );
        // A report from before the start was recorded: unknown, never a zero.
        for p in &mut r.processes {
            (p.gpu, p.start_bytes, p.high_from_s, p.high_s) = (0, None, None, None);
        }
        let f = other(&Facts::of(&r));
        assert_eq!((f.job_gpu, f.job_gpu_start_bytes), (0, -1));
    }

    #[test]
    fn cuda_version_from_torch_tag() {
        assert_eq!(cuda_of_torch("2.11.0+cu130"), 13.0);
        assert_eq!(cuda_of_torch("2.4.1+cu121"), 12.1);
        assert_eq!(cuda_of_torch("1.13.1+cu117"), 11.7);
        assert_eq!(cuda_of_torch("2.11.0"), 0.0);
    }

    fn step(step: u64, peak_gib: f64) -> crate::torch::Step {
        crate::torch::Step {
            step,
            steps: 1,
            at_s: step as f64,
            peak_reserved_bytes: (peak_gib * GIB as f64) as u64,
            ..crate::torch::Step::default()
        }
    }

    #[test]
    fn an_evaluation_every_25_steps_is_a_periodic_phase() {
        let steps: Vec<_> = (1..=100)
            .map(|i| step(i, if i % 25 == 0 { 66.0 } else { 5.5 }))
            .collect();
        let p = phases(&steps);
        assert_eq!(p.steps, vec![25, 50, 75, 100]);
        assert_eq!(p.period, 25);
        assert_eq!(p.peak, 66 * GIB);
        assert_eq!(p.steady, (5.5 * GIB as f64) as i64);
    }

    #[test]
    fn phases_need_a_clear_margin_and_must_come_back_down() {
        // 1.5 GiB above the steady 5.5 GiB: below the 2 GiB margin.
        let small: Vec<_> = (1..=50)
            .map(|i| step(i, if i % 10 == 0 { 7.0 } else { 5.5 }))
            .collect();
        assert!(phases(&small).steps.is_empty());
        // Growth that never comes back (a leak, a job filling the GPU) is no phase.
        let growth: Vec<_> = (1..=50).map(|i| step(i, i as f64)).collect();
        assert!(phases(&growth).steps.is_empty());
        // One phase: no period.
        let once: Vec<_> = (1..=50)
            .map(|i| step(i, if i == 30 { 55.0 } else { 5.0 }))
            .collect();
        let p = phases(&once);
        assert_eq!((p.steps, p.period, p.span), (vec![30], 0, 1));
        // Irregular: listed, no period.
        let odd: Vec<_> = (1..=60)
            .map(|i| step(i, if [10, 17, 41].contains(&i) { 30.0 } else { 5.0 }))
            .collect();
        let p = phases(&odd);
        assert_eq!((p.steps, p.period), (vec![10, 17, 41], 0));
    }

    #[test]
    fn phases_are_found_in_records_that_cover_many_steps() {
        // The H200's periodic evaluation (fixtures/runs/periodic_eval): the shim recorded every ~40 steps,
        // so half the records hold an evaluation.
        let recs = [
            (31, 29, 60.7),
            (40, 9, 0.7),
            (87, 47, 60.7),
            (94, 7, 0.7),
            (144, 50, 60.7),
            (151, 7, 60.7),
            (154, 3, 0.7),
            (194, 40, 60.7),
        ];
        let steps: Vec<_> = recs
            .iter()
            .map(|&(n, covered, gib)| crate::torch::Step {
                steps: covered,
                ..step(n, gib)
            })
            .collect();
        let p = phases(&steps);
        assert_eq!(p.steps, vec![31, 87, 144, 151, 194]);
        assert_eq!((p.period, p.span), (0, 50));
        assert_eq!(p.steady, (0.7 * GIB as f64) as i64);
    }
}
