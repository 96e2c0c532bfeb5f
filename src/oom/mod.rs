//! Out-of-memory exits: what the output said ([`scan`], [`parse`]), what the host's kernel did (the
//! cgroup's `oom_kill` counter, the kernel log), and what NVML saw in the seconds before. [`classify`]
//! turns them into how the run ended and, for a GPU OOM, whose memory it was.

pub mod host;
pub mod parse;
pub mod scan;

use crate::supervise::ProcessEnd;
use crate::timeline::Micros;
use crate::timeline::Timeline;
use parse::Kind;
use scan::{FirstFailure, OomEvent, Scanner};
use serde::{Deserialize, Serialize};

/// Seconds of timeline kept before the OOM.
pub const WINDOW_S: f64 = 5.0;

/// How the run ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Not known: a report rebuilt from a trace, which does not record how the command ended.
    #[default]
    Unknown,
    Success,
    /// The output reported a GPU out-of-memory failure.
    GpuOom,
    /// The kernel's OOM killer ended a job process for host RAM: not a GPU problem.
    HostOomKill,
    /// Killed by a signal, not for memory.
    Signal,
    /// A non-zero exit without memory evidence.
    Failure,
}

/// Why the GPU ran out, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// One allocation larger than the GPU (or than what the process may use).
    TooBig,
    /// Other processes held memory that would have made the allocation fit.
    Others,
    /// PyTorch's cache held enough memory, but in pieces too small for the request.
    Fragmentation,
    /// The job itself grew to fill the GPU.
    SelfGrowth,
    /// Not enough numbers to say.
    Unknown,
}

/// A process on the OOM's GPU in the seconds before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Before {
    pub pid: u32,
    pub gpu: u32,
    pub in_job: bool,
    /// /proc has it (false inside a container that doesn't share the host's PID namespace).
    pub visible: bool,
    pub cmdline: String,
    pub uid: Option<u32>,
    /// Its memory 5 s before, at the OOM, and its highest in between.
    pub bytes_before: u64,
    pub bytes_at: u64,
    pub peak_bytes: u64,
}

/// The report's `oom` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    /// Which layer reported it (`torch_allocator`, `cuda_runtime`, `cuda_library`, `nccl`, `xla`,
    /// `tensorflow`).
    pub source: Kind,
    #[serde(flatten)]
    pub event: OomEvent,
    /// The GPU it happened on: from the text, else the only GPU the job used.
    pub gpu: Option<u32>,
    pub cause: Cause,
    /// The cause with its numbers, in words.
    pub explanation: String,
    /// Memory other processes held on that GPU: from the text's list, else NVML's at that moment.
    pub others_bytes: u64,
    /// torchrun's "first observed failure".
    pub first_failure: Option<FirstFailure>,
    /// Ranks that reported an OOM, in the order they did.
    pub ranks: Vec<u32>,
    /// OOM reports seen in all (the first is described here).
    pub reports: u64,
    /// Per process on that GPU, from NVML, over the 5 s before.
    pub before: Vec<Before>,
    /// Device memory in use (NVML) at that moment.
    pub device_used_bytes: Option<u64>,
    /// PyTorch's allocator at the OOM, from the shim's OOM observer (before the exception unwound).
    pub allocator: Option<crate::torch::TorchOom>,
}

/// Evidence that the kernel's OOM killer ended a job process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostOom {
    /// Increase of the cgroup's `memory.events` `oom_kill` counter over the run.
    pub cgroup_oom_kills: u64,
    /// Kernel log lines that name a job process.
    pub kernel_log: Vec<String>,
}

/// When a saved OOM text was printed, for a run rebuilt from its trace (which does not record it): the
/// job's last sample still holding memory (its process had not exited yet), or the end of the trace.
pub fn replay_time(t: &Timeline) -> f64 {
    let last_held = t
        .procs
        .values()
        .filter(|p| p.in_job)
        .filter_map(|p| {
            p.used
                .points()
                .iter()
                .rev()
                .find(|&&(_, v)| v > 0)
                .map(|&(t, _)| t)
        })
        .max();
    let end = t.gpus.iter().map(|g| g.used.last_at()).max().unwrap_or(0);
    last_held.unwrap_or(end) as f64 / 1e6
}

/// The shim's record of the allocator at the OOM printed at `at_s`: its observer fires just before the
/// exception's text is printed.
pub fn allocator_at(ooms: &[crate::torch::TorchOom], at_s: f64) -> Option<crate::torch::TorchOom> {
    ooms.iter()
        .find(|t| t.at_s >= at_s - WINDOW_S && t.at_s <= at_s + 1.0)
        .cloned()
}

/// Everything classification reads.
pub struct Evidence<'a> {
    pub end: ProcessEnd,
    pub scanner: &'a Scanner,
    pub timeline: &'a Timeline,
    pub host: HostOom,
}

/// How the run ended, with the OOM (if any) explained.
pub fn classify(ev: &Evidence) -> (Ending, Option<OomReport>, Option<HostOom>) {
    let host_killed = ev.host.cgroup_oom_kills > 0 || !ev.host.kernel_log.is_empty();
    let sigkill = matches!(ev.end, ProcessEnd::Signaled { signal: 9, .. })
        || ev.end == ProcessEnd::Exited(137)
        || ev.scanner.first_failure.as_ref().and_then(|f| f.exitcode) == Some(-9);
    let oom = ev.scanner.first().map(|e| explain(e, ev));
    let ending = if oom.is_some() && ev.end != ProcessEnd::Exited(0) {
        Ending::GpuOom
    } else if host_killed && (sigkill || ev.end != ProcessEnd::Exited(0)) {
        Ending::HostOomKill
    } else if ev.end == ProcessEnd::Exited(0) {
        Ending::Success
    } else if matches!(ev.end, ProcessEnd::Signaled { .. }) {
        Ending::Signal
    } else {
        Ending::Failure
    };
    (ending, oom, host_killed.then(|| ev.host.clone()))
}

fn explain(e: &OomEvent, ev: &Evidence) -> OomReport {
    let t = &e.text;
    let at = (e.at_s * 1e6) as Micros;
    let gpu = t.gpu.or_else(|| {
        let used: Vec<u32> = ev
            .timeline
            .procs
            .values()
            .filter(|p| p.in_job && p.used.peak() > 0)
            .map(|p| p.gpu)
            .collect();
        if !used.is_empty() && used.iter().all(|&g| g == used[0]) {
            return Some(used[0]);
        }
        // A one-GPU machine: it can only be that one.
        (ev.timeline.gpus.len() == 1).then(|| ev.timeline.gpus[0].info.index)
    });
    let lo = at.saturating_sub((WINDOW_S * 1e6) as Micros);
    let mut before: Vec<Before> = ev
        .timeline
        .procs
        .values()
        .filter(|p| gpu.is_none_or(|g| p.gpu == g))
        .filter_map(|p| {
            let peak = p.used.max_in(lo, at)?;
            (peak > 0).then(|| Before {
                pid: p.pid,
                gpu: p.gpu,
                in_job: p.in_job,
                visible: p.visible,
                cmdline: p.cmdline.clone(),
                uid: p.uid,
                bytes_before: p.used.value_at(lo).unwrap_or(0),
                bytes_at: p.used.value_at(at).unwrap_or(0),
                peak_bytes: peak,
            })
        })
        .collect();
    before.sort_by(|a, b| {
        b.in_job
            .cmp(&a.in_job)
            .then(b.peak_bytes.cmp(&a.peak_bytes))
    });
    let device = gpu.and_then(|g| ev.timeline.gpus.iter().find(|x| x.info.index == g));
    let device_used_bytes = device.and_then(|d| d.used.value_at(at));
    let nvml_others: u64 = before
        .iter()
        .filter(|b| !b.in_job && b.visible)
        .map(|b| b.bytes_at)
        .sum();
    let text_others: u64 = text_others(t);
    let others_bytes = text_others.max(nvml_others);
    let total = t.total_bytes.or(device.map(|d| d.info.total_bytes));
    let (cause, explanation) = cause_of(t, total, others_bytes, device_used_bytes);
    let mut ranks = Vec::new();
    for r in ev.scanner.events.iter().filter_map(|e| e.rank) {
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    OomReport {
        source: t.kind,
        event: e.clone(),
        gpu,
        cause,
        explanation,
        others_bytes,
        first_failure: ev.scanner.first_failure.clone(),
        ranks,
        reports: ev.scanner.events.len() as u64 + ev.scanner.dropped,
        before,
        device_used_bytes,
        allocator: None,
    }
}

/// Memory the text says other processes held. PyTorch names the failing process "this process"; when it
/// can't (inside a container NVML's PIDs are the host's), the failing process is listed as "Process N"
/// like the others: the entry that holds at least PyTorch's reserved memory is taken to be it.
fn text_others(t: &parse::OomText) -> u64 {
    let all: u64 = t.other_processes.iter().map(|p| p.bytes).sum();
    if t.process_bytes.is_some() {
        return all;
    }
    let own = t.reserved_bytes.unwrap_or(u64::MAX);
    match t
        .other_processes
        .iter()
        .filter(|p| p.bytes >= own)
        .max_by_key(|p| p.bytes)
    {
        Some(me) => all - me.bytes,
        None => all,
    }
}

fn cause_of(
    t: &parse::OomText,
    total: Option<u64>,
    others: u64,
    used: Option<u64>,
) -> (Cause, String) {
    use crate::units::fmt_bytes as b;
    let limit = t.allowed_bytes.or(total);
    if let (Some(req), Some(limit)) = (t.requested_bytes, limit)
        && req > limit
    {
        let what = if t.allowed_bytes.is_some() {
            "the memory fraction this process may use"
        } else {
            "the whole GPU"
        };
        return (
            Cause::TooBig,
            format!(
                "one allocation of {} is larger than {what} ({})",
                b(req),
                b(limit)
            ),
        );
    }
    if let (Some(req), Some(free)) = (t.requested_bytes, t.free_bytes)
        && others > 0
        && free + others >= req
    {
        return (
            Cause::Others,
            format!(
                "other processes held {} of the GPU; with it free, the {} asked for would have fit ({} was free)",
                b(others),
                b(req),
                b(free)
            ),
        );
    }
    if let (Some(req), Some(unalloc)) = (t.requested_bytes, t.reserved_unallocated_bytes)
        && unalloc >= req
    {
        return (
            Cause::Fragmentation,
            format!(
                "PyTorch held {} reserved but unallocated, more than the {} asked for, in pieces too small to use",
                b(unalloc),
                b(req)
            ),
        );
    }
    if let Some(req) = t.requested_bytes
        && t.allocated_bytes.is_some()
    {
        let held = t.process_bytes.or(t.reserved_bytes).unwrap_or(0);
        return (
            Cause::SelfGrowth,
            format!(
                "the job itself held {} when it asked for {} more",
                b(held),
                b(req)
            ),
        );
    }
    // Without the allocator's numbers, NVML's view decides between others and the job.
    if let (Some(total), Some(_)) = (total, used)
        && others * 2 > total
    {
        return (
            Cause::Others,
            format!(
                "other processes held {} of the GPU's {}",
                b(others),
                b(total)
            ),
        );
    }
    if let (Some(total), Some(used)) = (total, used)
        && used * 10 > total * 9
    {
        return (
            Cause::SelfGrowth,
            format!(
                "the GPU was {} full, mostly by the job",
                crate::units::fmt_pct(used, total)
            ),
        );
    }
    (
        Cause::Unknown,
        "the output does not carry the allocator's numbers".into(),
    )
}
