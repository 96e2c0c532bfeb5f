//! The OOM's facts (`oom.*`): what the text said, where it happened, what filled the GPU, and the phase.

use super::hunt::{HolderRecord, HuntRecord, SiteRecord};
use super::inside::InsideRecord;
use super::{GpuFacts, Holder, TorchFacts, gpu_label, name_of};
use crate::report::Report;
use crate::rules::phase::Phase;
use crate::torch::activity::Activity;
use serde::Serialize;

facts! {
#[derive(Debug, Clone, Default, Serialize)]
pub struct OomFacts {
    /// the command printed an out-of-memory report
    pub present: bool,
    /// too_big, cap, others, fragmentation, self_growth, unknown; null without an OOM
    pub cause: Option<String>,
    /// the program that wrote the text, by its id (pytorch, vllm, llama_cpp, cuda for a CUDA call whose
    /// program the text does not name, ...: docs/oom.md's programs); null for a format this gpudoc does not
    /// know
    pub source: Option<String>,
    /// oom.source where it is an inference server or engine (vllm, sglang, tgi, tensorrt_llm, tensorrt,
    /// onnxruntime, llama_cpp, fastertransformer, turbomind): its own settings are the remedies; null for a
    /// framework's allocator (PyTorch, JAX, TensorFlow, ...), a library or a CUDA call whose program the text
    /// does not name, where training advice may fit (oom::program)
    pub engine: Option<String>,
    /// the text says the program found less of the GPU free at its start than it was to take, before loading
    /// anything (vLLM's start-up check): its share is too large for what others left
    pub at_start: bool,
    /// the GPU's vendor as the text shows it: nvidia, or amd (ROCm), intel (XPU) or apple (MPS), which NVML
    /// cannot see; null without an OOM
    pub vendor: Option<String>,
    /// the exception class, null if not printed
    pub exception: Option<String>,
    /// the options of PyTorch's caching allocator (PYTORCH_CUDA_ALLOC_CONF) the PyTorch that printed the
    /// text accepts, as its wording dates it: expandable_segments (2.1 and later), max_split_size_mb (1.10
    /// and later; 1.4-2.0 print one wording); both where the wording does not date it; empty without an OOM
    pub alloc_options: Vec<String>,
    /// every field of the text was found
    pub complete: bool,
    /// the GPU it happened on (NVML's index), null if unknown
    pub gpu: Option<i64>,
    /// the rank that printed it, null if none
    pub rank: Option<i64>,
    /// the allocation that failed, null if the text did not say
    pub requested_bytes: Option<i64>,
    /// free memory on the GPU then, as printed, null if the text did not say
    pub free_bytes: Option<i64>,
    /// the GPU's capacity, as printed, null if the text did not say
    pub total_bytes: Option<i64>,
    /// PyTorch's live tensors then, null if the text did not say
    pub allocated_bytes: Option<i64>,
    /// PyTorch's whole cache then, null if the text did not say
    pub reserved_bytes: Option<i64>,
    /// cached by PyTorch but unallocated then, null if the text did not say
    pub reserved_unallocated_bytes: Option<i64>,
    /// the process's cap (set_per_process_memory_fraction), null if none was printed
    pub allowed_bytes: Option<i64>,
    /// memory processes outside the job held on that GPU
    pub others_bytes: i64,
    /// memory the job's other processes held on that GPU
    pub job_others_bytes: i64,
    /// those processes: each a holder (pid, who: its command line, null where unknown; bytes), those the text
    /// names, else those NVML saw holding memory then
    pub others: Vec<Holder>,
    /// the job's peak on that GPU, % of its capacity; null where its GPU is not one NVML saw
    pub job_peak_pct: Option<f64>,
    /// the cause with its numbers, in words; null without an OOM
    pub explanation: Option<String>,
    /// where in the model it happened and what the memory held (the shim's look at the OOM): an inside
    /// record, which `inside_lines('inside', oom.inside)` says; null where no look saw a model
    pub inside: Option<InsideRecord>,
    /// the shim's search at the OOM (what held the GPU), a hunt record as torch.leak_hunt; null without one
    pub hunt: Option<HuntRecord>,
    /// what held the GPU then, the one that held the most first, each with the autograd graphs behind its
    /// tensors right after it: holders, as torch.leak_holders
    pub holders: Vec<HolderRecord>,
    /// where the memory alive then was allocated: sites, as torch.leak_sites
    pub sites: Vec<SiteRecord>,
    /// `forward`, `backward`, `optimizer` or `other` (the shim's look at the OOM), null when unknown
    pub pass: Option<String>,
    /// the module it happened in (`model.layers.2.mlp`), null when unknown
    pub module: Option<String>,
    /// what held most of allocated memory then: `activations` (saved for backward), `parameters`,
    /// `gradients`, `optimizer_state`, `other`; null when unknown
    pub largest_part: Option<String>,
    /// its share of allocated memory, percent (null when unknown)
    pub largest_part_pct: Option<f64>,
    /// the host it happened on, in a merged report (null otherwise)
    pub host: Option<String>,
    /// its GPU as messages name it (`GPU 1`, `GPU 1 on node-b`, `an unknown GPU`)
    pub label: String,
    /// when the OOM text was printed (seconds into the run), null without one
    pub at_s: Option<f64>,
    /// what the program was doing, from the shim's evidence at the OOM (never from the time): loading (before
    /// its first forward call, backward or step), training_step (in backward, in optimizer.step(), or a
    /// forward under grad in train() mode with no earlier call waiting for its backward, or with any number
    /// before the first backward in a program that made an optimizer: micro-batches waiting for one
    /// backward), evaluation (forward
    /// calls under no_grad or inference_mode, after eval(), or under grad with no backward following, in a
    /// program that has trained), inference (the same in one that never trained); empty where the evidence
    /// does not decide (a forward under grad during training, whose calls the shim does not count) or without
    /// the shim: null
    pub phase: Option<String>,
    /// optimizer steps ended by then, null if unknown
    pub steps: Option<i64>,
    /// seconds since the last of them, null before the first or if unknown
    pub since_last_step_s: Option<f64>,
    /// steady growth of the job's memory on its GPU up to the OOM, with no optimizer step to explain it (see
    /// gpu.growth_bytes), null if none was found
    pub growth_bytes: Option<i64>,
    /// its rate, bytes per second, null if none
    pub growth_rate_bytes_per_s: Option<f64>,
    /// how long it lasted, null if none
    pub growth_s: Option<f64>,
    /// of the live tensors at the OOM, the bytes no Python object refers to, behind held tensors that carry
    /// an autograd graph (grad_fn): what their forward passes saved and no backward has freed yet (the
    /// shim's search at the OOM); 0 if it found none, and in a training step's own forward or backward (see
    /// oom.graphs_kept); null without that search
    pub graph_bytes: Option<i64>,
    /// what holds those tensors (`list `outs` (eval.py, in evaluate), 150 items`), null if none
    pub graph_holder: Option<String>,
    /// those graphs outlived the step or call that made them, so no backward will free them: the OOM came in
    /// an evaluation or inference (oom.phase), or in an optimizer's step (whose backward has freed the step's
    /// own graph); false in a training step's forward or backward, whose graph is its own activations
    /// (oom.graph_bytes is then 0), and when unknown
    pub graphs_kept: bool,
    /// forward calls of the outermost model since the last backward began (calls no backward followed), while
    /// the shim counted them (before the first optimizer step, in an evaluation after eval()); null when
    /// unknown
    pub waiting_forwards: Option<i64>,
    /// grad mode on the failing thread at the OOM (`torch.is_grad_enabled()`): false under torch.no_grad()
    /// or torch.inference_mode(), whose forward calls save nothing for backward; null when unknown
    pub grad: Option<bool>,
    /// the program had made an optimizer (a torch.optim.Optimizer of any kind) by the OOM: it trains, or is
    /// about to; null when unknown (the shim's reading, act.optim)
    pub optimizer_made: Option<bool>,
    /// what the live tensors of the failing process grew by step after step before it (its
    /// torch.leak_total_bytes: the straight-line fit over its steps); null if it did not grow, or no PyTorch
    /// process of the OOM's GPU is known
    pub leak_total_bytes: Option<i64>,
    /// that growth per step, null as leak_total_bytes
    pub leak_bytes_per_step: Option<f64>,
    /// R² of that fit (1: every step the same), null as leak_total_bytes
    pub leak_r2: Option<f64>,
}
}

/// The processes an OOM text names; else those NVML saw holding memory then.
fn oom_others(o: &crate::oom::OomReport) -> Vec<Holder> {
    let t = &o.event.text;
    let with_cmd = |pid: u32, cmdline: &str, bytes: u64| Holder {
        pid: i64::from(pid),
        who: Some(cmdline.to_string()).filter(|c| !c.is_empty()),
        bytes: bytes as i64,
        ..Holder::default()
    };
    let mut others: Vec<Holder> = t
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
    others
}

pub(super) fn oom_facts(
    r: &Report,
    gpus: &[GpuFacts],
    steps: &crate::rules::when::Steps,
) -> OomFacts {
    let (_, steps, since_last_step_s) = crate::rules::when::oom(steps, r);
    let Some(o) = &r.oom else {
        return OomFacts {
            steps,
            since_last_step_s,
            ..OomFacts::absent()
        };
    };
    let t = &o.event.text;
    let g = |v: Option<u64>| v.map(|x| x as i64);
    let host = o.host.clone();
    let on = o
        .gpu
        .and_then(|i| gpus.iter().find(|x| x.index == i as i64 && x.host == host));
    let inside = oom_inside(r).filter(|w| w.saw_model());
    let pass = inside.and_then(|w| w.pass.clone());
    let activity = o.allocator.as_ref().and_then(|a| a.activity);
    let phase = Phase::at_oom(activity.as_ref(), pass.as_deref());
    let graphs_kept = kept_graphs(phase, pass.as_deref(), activity.as_ref());
    // A training step's own graph is its activations, told per module (oom.largest_part, inside).
    let own = matches!(phase, Some(Phase::TrainingStep | Phase::Loading));
    let mut f = OomFacts {
        phase: phase.map(|p| p.name().into()),
        waiting_forwards: activity
            .and_then(|a| a.forwards_without_backward)
            .map(|n| n as i64),
        optimizer_made: activity.and_then(|a| a.optimizer),
        grad: activity.and_then(|a| match (a.grad, a.inference_mode) {
            (_, Some(true)) => Some(false),
            (g, _) => g,
        }),
        // The shim's own count at the OOM where it gave one: steps ended by then, exactly.
        steps: activity.and_then(|a| a.steps).map(|n| n as i64).or(steps),
        since_last_step_s,
        growth_bytes: on.and_then(|x| x.growth_bytes),
        growth_rate_bytes_per_s: on.and_then(|x| x.growth_rate_bytes_per_s),
        growth_s: on.and_then(|x| x.growth_s),
        graphs_kept,
        label: oom_label(o, host.as_deref()),
        host: host.clone(),
        present: true,
        cause: Some(name_of(o.cause)),
        source: crate::oom::program::program(t).map(|p| p.id().into()),
        engine: crate::oom::program::engine(t).map(|p| p.id().into()),
        at_start: crate::oom::program::at_start(t),
        vendor: Some(name_of(t.vendor)),
        exception: t.exception.clone(),
        alloc_options: crate::oom::program::alloc_options(t)
            .iter()
            .map(|o| o.to_string())
            .collect(),
        complete: t.complete,
        gpu: o.gpu.map(i64::from),
        rank: o.event.rank.map(|x| x as i64),
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
        job_peak_pct: on.map(|x| x.job_peak_pct),
        explanation: Some(o.explanation.clone()),
        inside: inside.map(InsideRecord::of),
        pass,
        module: inside.and_then(|w| w.module.clone()),
        largest_part: inside
            .map(|w| w.parts.largest())
            .filter(|p| !p.is_empty())
            .map(String::from),
        largest_part_pct: inside.filter(|w| w.parts.sum() > 0).map(|w| {
            let top = w.parts.ranked().first().map_or(0, |p| p.1);
            top as f64 * 100.0 / w.parts.sum() as f64
        }),
        at_s: Some(o.event.at_s),
        ..Default::default()
    };
    searched(r, graphs_kept || !own, &mut f);
    f
}

/// What the shim's search at the OOM found (`oom.hunt`, `oom.holders`, `oom.sites`), and of it the
/// autograd graphs behind held tensors (`oom.graph_bytes`, `oom.graph_holder`): 0 where they are a
/// training step's own (`!graphs_told`), whose backward frees them.
fn searched(r: &Report, graphs_told: bool, f: &mut OomFacts) {
    let hunt = oom_hunt(r);
    let graphs = hunt
        .map(|h| h.graphs())
        .map(|g| if graphs_told { g } else { (0, "") });
    f.graph_bytes = graphs.map(|(b, _)| b as i64);
    f.graph_holder = graphs
        .filter(|(b, h)| *b > 0 && !h.is_empty())
        .map(|(_, h)| h.to_string());
    (f.hunt, f.sites, f.holders) = super::hunt::of(hunt);
}

/// Whether the autograd graphs behind held tensors at an OOM outlived the step or call that made them, so
/// that no backward will free them: in an evaluation or inference (forward calls no backward followed),
/// and in an optimizer's step (the step's own backward has freed its graph by then). In a training step's
/// forward or backward the live graph is that step's own, whose backward frees it: not counted as kept.
fn kept_graphs(phase: Option<Phase>, pass: Option<&str>, act: Option<&Activity>) -> bool {
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
pub(super) fn oom_leak(oom: &mut OomFacts, torch: &[TorchFacts]) {
    let failing = torch
        .iter()
        .filter(|t| oom.present && t.gpu == oom.gpu && t.host == oom.host)
        .max_by_key(|t| t.leak_total_bytes);
    if let Some(t) = failing.filter(|t| t.leak_total_bytes > 0) {
        oom.leak_total_bytes = Some(t.leak_total_bytes);
        oom.leak_bytes_per_step = Some(t.leak_bytes_per_step);
        oom.leak_r2 = Some(t.leak_r2);
    }
}

impl OomFacts {
    /// The facts of no OOM: its GPU, rank, moment and steps unknown.
    pub(in crate::rules) fn absent() -> OomFacts {
        OomFacts {
            label: gpu_label(None, -1),
            ..Default::default()
        }
    }
}

/// The OOM's GPU as messages name it; a GPU NVML cannot see (AMD, Intel, Apple, a TPU) by its vendor and
/// the text's device number ("Intel GPU 0 (XPU)").
fn oom_label(o: &crate::oom::OomReport, host: Option<&str>) -> String {
    let t = &o.event.text;
    if t.vendor.nvml_sees() {
        return gpu_label(host, o.gpu.map_or(-1, |x| x as i64));
    }
    let on = host.map(|h| format!(" on {h}")).unwrap_or_default();
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
