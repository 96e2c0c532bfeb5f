//! Out-of-memory exits: what the output said ([`scan`], [`parse`]), what the host's kernel did (the
//! cgroup's `oom_kill` counter, the kernel log), and what NVML saw in the seconds before. [`classify`]
//! turns them into how the run ended and, for a GPU OOM, whose memory it was.

pub mod bfc;
pub mod cause;
pub mod engines;
pub mod formats;
pub mod host;
pub mod parse;
pub mod program;
mod rows;
pub mod scan;
pub mod text;
mod then;
pub mod wording;

use crate::supervise::ProcessEnd;
use crate::timeline::Micros;
use crate::timeline::Timeline;
use parse::Kind;
use scan::{FirstFailure, OomEvent, Scanner};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;

/// Seconds of timeline kept before the OOM.
pub const WINDOW_S: f64 = 5.0;

/// How the run ended.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
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

pub use cause::Cause;

/// A process on the OOM's GPU in the seconds before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Before {
    pub pid: u32,
    pub gpu: u32,
    pub in_job: bool,
    /// /proc has it (false inside a container that doesn't share the host's PID namespace).
    pub visible: bool,
    pub cmdline: String,
    pub uid: Option<u32>,
    /// Its memory 5 s before, at the OOM, and its highest in between. When the window starts before
    /// gpudoc's first look (an OOM in the run's first 5 s) and the process was there at that look,
    /// `bytes_before` is what it held then, and `held_from_start` is true.
    pub bytes_before: u64,
    pub bytes_at: u64,
    pub peak_bytes: u64,
    /// It already held `bytes_before` at gpudoc's first look, when the job had just started: memory
    /// taken before the window (and the job) began, not in it.
    #[serde(default)]
    pub held_from_start: bool,
}

/// The memory a process held at the window's start `lo`, and whether that is what it held at gpudoc's
/// first look at its GPU's processes ([`Timeline::at_first_look`]: the window starts before any reading
/// of it, but it was there from the start).
fn held_at(t: &Timeline, p: &crate::timeline::ProcTimeline, lo: Micros) -> (u64, bool) {
    if let Some(v) = p.used.value_at(lo) {
        return (v, false);
    }
    match t.at_first_look(p) {
        Some(v) => (v, true),
        None => (0, false),
    }
}

/// The report's `oom` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OomReport {
    /// In a report merged from several hosts (`gpudoc report a.json b.json`): the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Which layer or engine reported it (`torch_allocator`, `cuda_runtime`, `cuda_library`, `nccl`,
    /// `xla`, `tensorflow`, `cupy`, `paddle`, `llama_cpp`, `vllm`, `onnxruntime`, `tensorrt`, `mxnet`,
    /// `exla`, `sglang`, `tgi`).
    pub source: Kind,
    /// The text and where it was read. Its own `gpu` (the device the text names, numbered as the failing
    /// process saw them) is `text_gpu` here, beside the report's `gpu`.
    #[serde(flatten, with = "event_fields")]
    #[schemars(schema_with = "event_fields::schema")]
    pub event: OomEvent,
    /// The GPU it happened on (NVML's index): the text's device mapped through the job's visible GPUs,
    /// else the only GPU the job used; `null` for an AMD, Intel or Apple GPU or a TPU, which NVML cannot
    /// see.
    pub gpu: Option<u32>,
    pub cause: Cause,
    /// The cause with its numbers, in words: `finding` worded by the rules (`rules/words/oom-cause.toml`,
    /// `rules::words`), as the report is diagnosed; a report that has no `finding` keeps its own.
    pub explanation: String,
    /// What the numbers showed (the finding's kind and the figures behind it), which `explanation` words;
    /// absent in reports from before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<cause::Found>,
    /// Memory other processes held on that GPU: from the text's list, else NVML's at that moment.
    pub others_bytes: u64,
    /// Memory the job's own other processes held, as the text names them (a child it started).
    #[serde(default)]
    pub job_others_bytes: u64,
    /// The "Process N" entry taken to be the failing process, when the text has no "this process" line
    /// (inside a container); `this_pid_guessed`: more than one entry could have been it.
    #[serde(default)]
    pub this_pid: Option<u32>,
    #[serde(default)]
    pub this_pid_guessed: bool,
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

/// The OOM event's fields inside the report, with the text's `gpu` as `text_gpu` (one JSON object must
/// not have `gpu` twice).
mod event_fields {
    use super::OomEvent;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(e: &OomEvent, s: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::to_value(e).map_err(serde::ser::Error::custom)?;
        if let Some(m) = v.as_object_mut()
            && let Some(g) = m.remove("gpu")
        {
            m.insert("text_gpu".into(), g);
        }
        v.serialize(s)
    }

    /// The event's schema, its `gpu` as `text_gpu`.
    pub fn schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let mut s = <OomEvent as schemars::JsonSchema>::json_schema(g);
        if let Some(props) = s.get_mut("properties").and_then(|p| p.as_object_mut())
            && let Some(mut gpu) = props.remove("gpu")
        {
            gpu["description"] =
                "The device the OOM text names, numbered as the failing process saw \
                                  them (after CUDA_VISIBLE_DEVICES); `gpu` is NVML's index of it."
                    .into();
            props.insert("text_gpu".into(), gpu);
        }
        if let Some(req) = s.get_mut("required").and_then(|r| r.as_array_mut()) {
            for r in req.iter_mut().filter(|r| *r == "gpu") {
                *r = "text_gpu".into();
            }
        }
        s
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OomEvent, D::Error> {
        let mut v = serde_json::Value::deserialize(d)?;
        if let Some(m) = v.as_object_mut()
            && let Some(g) = m.remove("text_gpu")
        {
            m.insert("gpu".into(), g);
        }
        serde_json::from_value(v).map_err(serde::de::Error::custom)
    }
}

/// Evidence that the kernel's OOM killer ended a job process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// The shim's records of the allocator at each OOM.
    pub torch_ooms: &'a [crate::torch::TorchOom],
    /// `CUDA_VISIBLE_DEVICES` as the job was started.
    pub cuda_visible_devices: Option<&'a str>,
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

/// The moment of an OOM, for NVML's readings: the shim's record of it, made in the process as the
/// allocation failed, when there is one; else when its text reached gpudoc, which may be late (a loaded
/// machine, a buffered stream), after the process had let go of its memory or exited. Never before NVML's
/// first reading (`first_read`): a moment read once, after the fact (a notebook cell's), is read then.
fn moment(
    text_at_s: f64,
    allocator: Option<&crate::torch::TorchOom>,
    first_read: Option<Micros>,
) -> Micros {
    let text = (text_at_s * 1e6) as Micros;
    let shim = allocator.map_or(text, |a| ((a.at_s * 1e6) as Micros).min(text));
    shim.max(first_read.unwrap_or(0).min(text))
}

fn explain(e: &OomEvent, ev: &Evidence) -> OomReport {
    let t = &e.text;
    let allocator = allocator_at(ev.torch_ooms, e.at_s);
    let first_read = ev
        .timeline
        .gpus
        .iter()
        .filter_map(|g| g.used.points().first().map(|p| p.0))
        .min();
    let at = moment(e.at_s, allocator.as_ref(), first_read);
    // NVML sees NVIDIA GPUs only: the device number of an AMD, Intel or Apple GPU or a TPU names none of
    // them, and NVML's view of the GPUs it does see says nothing of the one that ran out.
    let unseen = !t.vendor.nvml_sees();
    let gpu = (!unseen)
        .then(|| gpu_of_text(t.gpu, allocator.as_ref(), ev))
        .flatten();
    let before = if unseen {
        Vec::new()
    } else {
        before(ev.timeline, gpu, at)
    };
    let device = gpu.and_then(|g| ev.timeline.gpus.iter().find(|x| x.info.index == g));
    let device_used_bytes = device.and_then(|d| d.used.value_at(at));
    let nvml_others: u64 = before
        .iter()
        .filter(|b| !b.in_job && b.visible)
        .map(|b| b.bytes_at)
        .sum();
    let job_pids: HashSet<u32> = ev
        .timeline
        .procs
        .values()
        .filter(|p| p.in_job)
        .map(|p| p.pid)
        .collect();
    let holders = cause::holders(t, &job_pids);
    let total = device.map(|d| d.info.total_bytes);
    let mut figures = cause::Figures::of(t, &holders, nvml_others, total, device_used_bytes);
    if let Some(a) = &allocator {
        framework_figures(&mut figures, a);
    }
    bfc_free(&mut figures, t);
    let found = cause::cause_of(&figures);
    let mut ranks = Vec::new();
    for r in ev.scanner.events.iter().filter_map(|e| e.rank) {
        if !ranks.contains(&r) {
            ranks.push(r);
        }
    }
    OomReport {
        host: None,
        source: t.kind,
        event: e.clone(),
        gpu,
        cause: found.cause(),
        // Worded by the rules as the report is diagnosed (`rules::words`).
        explanation: String::new(),
        finding: Some(cause::Found::of(found, &figures, &holders)),
        others_bytes: figures.others,
        job_others_bytes: holders.job,
        this_pid: holders.this_pid,
        this_pid_guessed: holders.guessed,
        first_failure: ev.scanner.first_failure.clone(),
        ranks,
        reports: ev.scanner.events.len() as u64 + ev.scanner.dropped,
        before,
        device_used_bytes,
        allocator,
    }
}

/// The GPU an OOM happened on: the text's device mapped to NVML's index, else the only GPU the job used,
/// else the machine's only GPU.
fn gpu_of_text(
    ordinal: Option<u32>,
    allocator: Option<&crate::torch::TorchOom>,
    ev: &Evidence,
) -> Option<u32> {
    if let Some(o) = ordinal {
        return Some(gpu_of_ordinal(
            o,
            allocator,
            ev.cuda_visible_devices,
            ev.timeline,
        ));
    }
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
}

/// Every process on `gpu` (all GPUs when unknown) that held memory in the window before `at`: the job's
/// first, then by peak.
fn before(t: &Timeline, gpu: Option<u32>, at: Micros) -> Vec<Before> {
    let lo = at.saturating_sub((WINDOW_S * 1e6) as Micros);
    let mut before: Vec<Before> = t
        .procs
        .values()
        .filter(|p| gpu.is_none_or(|g| p.gpu == g))
        .filter_map(|p| {
            let peak = p.used.max_in(lo, at)?;
            let (bytes_before, held_from_start) = held_at(t, p, lo);
            (peak > 0).then(|| Before {
                pid: p.pid,
                gpu: p.gpu,
                in_job: p.in_job,
                visible: p.visible,
                cmdline: p.cmdline.clone(),
                uid: p.uid,
                bytes_before,
                bytes_at: p.used.value_at(at).unwrap_or(0),
                peak_bytes: peak,
                held_from_start,
            })
        })
        .collect();
    before.sort_by(|a, b| {
        b.in_job
            .cmp(&a.in_job)
            .then(b.peak_bytes.cmp(&a.peak_bytes))
    });
    before
}

/// The numbers a framework other than PyTorch gave at its OOM, where its text has none (XLA's says only
/// what it asked for): its live arrays, and its pool's limit as the cap, named by the setting that sets
/// it. A pool taken whole at the start (JAX's preallocation) is the cap itself: against it, what the
/// process held is what its arrays held of it.
fn framework_figures(f: &mut cause::Figures, a: &crate::torch::TorchOom) {
    // PyTorch's texts say their own.
    if a.framework == crate::torch::framework::Framework::Torch {
        return;
    }
    let cap = cause::cap_setting_of(a.framework, f.vendor, false);
    f.allocated = f.allocated.or(Some(a.allocated_bytes));
    let limit = a.device_limit_bytes.filter(|&l| l > 0);
    if f.allowed.is_none() && limit.is_some() {
        (f.allowed, f.allowed_by) = (limit, cap);
    }
    // A framework that does not say what its allocator holds (TensorFlow) leaves it to its text.
    let pool_is_cap = limit.is_some_and(|l| a.reserved_bytes.is_some_and(|r| r >= l));
    let held = if pool_is_cap {
        Some(a.allocated_bytes)
    } else {
        a.reserved_bytes
    };
    f.reserved = f.reserved.or(held);
}

/// A BFC allocator's limit is all of the GPU's free memory at its start unless a program set one: the
/// limit stopped the allocation only where the GPU had room for it, which its text does not say. NVML's
/// view does (what was free on the GPU then).
fn bfc_free(f: &mut cause::Figures, t: &parse::OomText) {
    if t.kind != Kind::Tensorflow || t.allowed_bytes.is_none() || f.free.is_some() {
        return;
    }
    if let (Some(total), Some(used)) = (f.total, f.device_used) {
        f.free = Some(total.saturating_sub(used));
    }
}

/// The GPU (NVML index) that a CUDA device ordinal in an OOM text names. Inside the job, `cuda:0` is the
/// first GPU of `CUDA_VISIBLE_DEVICES`, not NVML's GPU 0: the shim's record of that OOM names the GPU by
/// UUID; else the job's `CUDA_VISIBLE_DEVICES` maps the ordinal (indices or UUIDs, up to the first entry
/// that names no GPU, as CUDA reads it); else the ordinal is the index.
pub fn gpu_of_ordinal(
    ordinal: u32,
    allocator: Option<&crate::torch::TorchOom>,
    visible: Option<&str>,
    timeline: &Timeline,
) -> u32 {
    let by_uuid = |uuid: &str| {
        timeline
            .gpus
            .iter()
            .find(|g| !uuid.is_empty() && g.info.uuid.starts_with(uuid))
            .map(|g| g.info.index)
    };
    if let Some(i) = allocator
        .filter(|a| a.device == ordinal)
        .and_then(|a| a.uuid.as_deref())
        .and_then(by_uuid)
    {
        return i;
    }
    let Some(spec) = visible.map(str::trim).filter(|s| !s.is_empty()) else {
        return ordinal;
    };
    let entry = spec.split(',').map(str::trim).nth(ordinal as usize);
    match entry {
        Some(e) if e.starts_with("GPU-") => by_uuid(e).unwrap_or(ordinal),
        Some(e) => e.parse().unwrap_or(ordinal),
        None => ordinal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuInfo;
    use crate::timeline::GpuTimeline;

    fn four_gpus() -> Timeline {
        let mut t = Timeline::default();
        for i in 0..4 {
            t.gpus.push(GpuTimeline::new(GpuInfo {
                index: i,
                name: "NVIDIA H200".into(),
                uuid: format!("GPU-{i}aaa-bbbb"),
                total_bytes: 1 << 40,
            }));
        }
        t
    }

    /// A process on GPU 0 from `first` µs on, holding `bytes`.
    fn holding(t: &mut Timeline, pid: u32, in_job: bool, first: Micros, bytes: u64) {
        let mut used = crate::timeline::Series::default();
        used.push(first, bytes);
        used.push(first + 10_000, bytes);
        t.procs.insert(
            (pid, 0),
            crate::timeline::ProcTimeline {
                pid,
                gpu: 0,
                in_job,
                visible: true,
                cmdline: format!("p{pid}"),
                uid: None,
                ppid: None,
                used,
            },
        );
    }

    #[test]
    fn memory_held_from_before_the_job_is_not_shown_as_taken_in_the_window() {
        // As fixtures/oom/h200/torch_other_process: another user's 100 GiB seen at gpudoc's first look
        // (26 ms in), the job's process from 2.8 s, the OOM at 2.9 s: a window that starts at 0.
        let mut t = four_gpus();
        t.gpus[0].used.push(25_878, 100 << 30);
        // gpudoc's first listing of GPU 0's processes (the job's sum there, 0 then).
        t.gpus[0].job.push(26_889, 0);
        holding(&mut t, 2501, false, 26_889, 100 << 30);
        holding(&mut t, 2608, true, 2_798_235, 10 << 30);
        let b = before(&t, Some(0), 2_900_000);
        let other = b.iter().find(|b| b.pid == 2501).unwrap();
        assert_eq!(
            (other.bytes_before, other.held_from_start),
            (100 << 30, true)
        );
        let job = b.iter().find(|b| b.pid == 2608).unwrap();
        assert_eq!((job.bytes_before, job.held_from_start), (0, false));
    }

    #[test]
    fn nvml_is_read_at_the_shims_record_of_the_oom_not_at_its_late_text() {
        // The job's process held 16 GiB until it raised at 5.0 s and exited; its text came at 5.5 s.
        let mut t = four_gpus();
        let mut used = crate::timeline::Series::default();
        used.push(1_000_000, 16 << 30);
        used.push(5_200_000, 0);
        holding(&mut t, 7, true, 1_000_000, 16 << 30);
        t.procs.get_mut(&(7, 0)).unwrap().used = used;
        let shim = crate::torch::TorchOom {
            at_s: 5.0,
            ..Default::default()
        };
        let job = |at| before(&t, Some(0), at).remove(0);
        let first = Some(1_000_000);
        assert_eq!(job(moment(5.5, Some(&shim), first)).bytes_at, 16 << 30);
        // Without the shim's record, the text's time is all there is.
        assert_eq!(moment(5.5, None, first), 5_500_000);
        assert_eq!(job(moment(5.5, None, first)).bytes_at, 0);
        // A record after the text (another OOM's) never moves the moment later.
        let later = crate::torch::TorchOom {
            at_s: 6.0,
            ..Default::default()
        };
        assert_eq!(moment(5.5, Some(&later), first), 5_500_000);
        // NVML read once, after the OOM (a notebook cell's moment): read at that reading.
        assert_eq!(moment(5.5, Some(&shim), Some(5_400_000)), 5_400_000);
    }

    #[test]
    fn a_cuda_ordinal_is_mapped_to_the_gpu_the_job_was_given() {
        let t = four_gpus();
        // Without CUDA_VISIBLE_DEVICES, cuda:N is GPU N.
        assert_eq!(gpu_of_ordinal(1, None, None, &t), 1);
        // cuda:0 of a job given GPUs 2 and 3 is GPU 2; UUIDs and their prefixes name GPUs too.
        assert_eq!(gpu_of_ordinal(0, None, Some("2,3"), &t), 2);
        assert_eq!(gpu_of_ordinal(1, None, Some("3, 1"), &t), 1);
        assert_eq!(gpu_of_ordinal(0, None, Some("GPU-3aaa"), &t), 3);
        // An ordinal past the list, or a spec naming nothing gpudoc knows, leaves the ordinal.
        assert_eq!(gpu_of_ordinal(2, None, Some("2,3"), &t), 2);
        assert_eq!(gpu_of_ordinal(0, None, Some("MIG-x"), &t), 0);
        // The shim's record names the GPU by UUID, whatever the environment said.
        let shim = crate::torch::TorchOom {
            device: 0,
            uuid: Some("GPU-1aaa-bbbb".into()),
            ..Default::default()
        };
        assert_eq!(gpu_of_ordinal(0, Some(&shim), Some("2"), &t), 1);
        // A record of another ordinal says nothing of this one.
        assert_eq!(gpu_of_ordinal(1, Some(&shim), Some("2,3"), &t), 3);
    }
}
