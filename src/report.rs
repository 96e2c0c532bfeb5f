//! The report of a run: one versioned, serializable value built from the timeline and the command's end.
//! Byte counts are integer bytes; times are seconds since the run started.

use crate::gpu::NvmlStatus;
use crate::procs::ProcInfo;
use crate::sample::Rates;
use crate::supervise::Outcome;
use crate::timeline::Micros;
use crate::timeline::running::{Maxima, Running, Stretch};
use crate::timeline::{GpuTimeline, ProcTimeline, Timeline};
use serde::{Deserialize, Serialize};

/// The `schema` value of this version of the report.
pub const SCHEMA: &str = "gpudoc.report/2";
/// Points kept in each GPU's `job_timeline`.
pub const TIMELINE_POINTS: usize = 120;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Report {
    pub schema: String,
    pub gpudoc_version: String,
    /// Where and as what the run ran: host, `--name`, Slurm's ids.
    #[serde(default)]
    pub origin: crate::origin::Origin,
    pub command: Vec<String>,
    pub started_unix_s: f64,
    pub duration_s: f64,
    pub exit: Exit,
    pub nvml: NvmlStatus,
    pub sampling: Sampling,
    pub gpus: Vec<GpuReport>,
    pub processes: Vec<ProcessReport>,
    #[serde(default)]
    pub oom: Option<crate::oom::OomReport>,
    /// The framework view: PyTorch's allocator per process and GPU.
    #[serde(default)]
    pub torch: crate::torch::view::TorchReport,
    #[serde(default)]
    pub orphans: Vec<Orphan>,
    /// What the rules found, most severe first.
    #[serde(default)]
    pub diagnoses: Vec<crate::verdict::Diagnosis>,
    #[serde(default)]
    pub gate: Option<crate::verdict::GateReport>,
    /// When a GPU would be full, forecast during the run (`gpudoc run`, from diagnoses told live).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forecasts: Vec<crate::verdict::Forecast>,
    /// Rules that failed on this run's facts (a division by zero, say), with why: each is said, and
    /// fails a gate with `--fail-on`.
    #[serde(default)]
    pub rule_errors: Vec<String>,
    /// Things gpudoc could not do, in words (a trace write error, a sampling gap, a rule that failed).
    #[serde(default)]
    pub notes: Vec<String>,
    /// A report merged from the reports of a job's nodes: each node's run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostRun>,
    /// `gpudoc run --try`: both runs compared. This report is then the remedy's run (the first run's when
    /// the remedy never ran).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tried: Option<Tried>,
    /// A report of the run so far, made while it runs (live verdicts, `--metrics`): never written.
    #[serde(skip)]
    pub live: bool,
    /// A report of one moment, not of a run (`gpudoc watch`'s look at the machine): never written.
    #[serde(skip)]
    pub moment: Option<Moment>,
}

/// One look at the machine (`gpudoc watch`): no job ran, so "the job" is the watcher's own processes (its
/// uid), "others" are other users', and what is held now stands where a run has its peaks (the report's
/// timeline is one sample, at 0 s). What a look knows that a run does not is here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Moment {
    /// The watcher's uid.
    pub me: u32,
    /// Every process holding GPU memory or a device file, judged as `gpudoc orphans` judges it.
    pub holders: Vec<crate::orphans::Holder>,
    /// What the runs in progress forecast, seen at this moment.
    pub forecasts: Vec<crate::runs::RunForecast>,
}

/// One node's run in a merged report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HostRun {
    pub origin: crate::origin::Origin,
    pub started_unix_s: f64,
    pub duration_s: f64,
    pub exit_code: Option<i32>,
    pub classification: crate::oom::Ending,
    /// NVML's indices of its GPUs.
    pub gpus: Vec<u32>,
    /// The ranks its PyTorch processes reported.
    pub ranks: Vec<i64>,
}

/// `gpudoc run --try REMEDY`: the command as is, then with the remedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Tried {
    /// The remedy, as `--try` names it (`expandable_segments:True`, `{}=48`).
    pub remedy: String,
    /// `PYTORCH_CUDA_ALLOC_CONF` as the remedy's run got it: the user's own value with the remedy's key
    /// set; null for a value of `{}` (the environment stays the user's).
    pub alloc_conf: Option<String>,
    /// The remedy's run did not run out of GPU memory: it ran to its end, or 5 optimizer steps past where
    /// the first run ran out.
    pub fits_now: bool,
    /// The command as is.
    pub before: TriedRun,
    /// With the remedy; null when the first run was interrupted and the remedy never ran.
    pub after: Option<TriedRun>,
}

/// One run of `--try`, in the words of `gpudoc fit`'s runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TriedRun {
    pub command: Vec<String>,
    pub outcome: RunOutcome,
    /// The OOM's cause, when it ran out.
    pub oom_cause: Option<crate::oom::Cause>,
    /// Optimizer steps it made (the shim's count).
    pub steps: u64,
    /// The job's peak on its busiest GPU (NVML, CUDA contexts included), else PyTorch's peak reserved
    /// memory.
    pub peak_bytes: Option<u64>,
    /// PyTorch's peak memory in split blocks not in use (the shim's reading), else what the OOM text
    /// calls reserved but unallocated.
    pub fragmentation_bytes: Option<u64>,
    /// What `gpudoc run` would have exited with (the command's code, or 128+N).
    pub exit_code: Option<i32>,
    pub classification: crate::oom::Ending,
    pub duration_s: f64,
}

/// How a run of `gpudoc fit` or `--try` ended, for the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunOutcome {
    /// It ran the steps (or the time) asked for, or to its end, without running out of GPU memory.
    Fits,
    /// It ran out of GPU memory (`gpudoc run`'s `gpu_oom`).
    Oom,
    /// It failed for another reason (an error, the host's OOM killer): the fit cannot judge the value.
    Failed,
    /// The time budget ran out before it had run far enough.
    Cut,
    /// Something else ended it (a Ctrl-C, a signal from elsewhere).
    Interrupted,
}

/// How the command ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Exit {
    /// What `gpudoc run` exits with: the child's code, or 128+N for death by signal N; null when nothing
    /// recorded it (a report rebuilt from a trace that predates gpudoc recording it).
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub core_dumped: bool,
    /// gpudoc killed the job: after three quick Ctrl-C presses it did not answer, or at the end of
    /// `--stop-on`'s steps.
    pub killed_by_gpudoc: bool,
    /// `--stop-on`: the rule whose live diagnosis made gpudoc end the job (SIGINT first, as Ctrl-C).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_on: Option<String>,
    /// `success`, `gpu_oom`, `host_oom_kill` (the kernel's OOM killer, for host RAM), `signal`, `failure`;
    /// `unknown` for a report rebuilt from a trace.
    #[serde(default)]
    pub classification: crate::oom::Ending,
    /// Evidence of a host-RAM OOM kill, when there is some.
    #[serde(default)]
    pub host_oom: Option<crate::oom::HostOom>,
    /// Signals gpudoc passed on to the command, in order (`SIGTERM`, ...). Those the terminal delivered to
    /// the command itself are not here.
    #[serde(default)]
    pub forwarded_signals: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Sampling {
    pub device_interval_s: f64,
    /// The device period once memory has been flat for a second.
    #[serde(default)]
    pub device_idle_interval_s: f64,
    pub process_interval_s: f64,
    pub device_samples: u64,
    pub process_samples: u64,
    /// Memory the stored timeline took.
    pub timeline_bytes: u64,
    /// gpudoc's own CPU time over the run (all its threads, user + system).
    #[serde(default)]
    pub self_cpu_s: f64,
    /// gpudoc's own peak resident memory.
    #[serde(default)]
    pub self_max_rss_bytes: u64,
}

/// gpudoc's own CPU seconds and peak RSS so far (getrusage of this process).
pub fn self_usage() -> (f64, u64) {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (
        tv(ru.ru_utime) + tv(ru.ru_stime),
        ru.ru_maxrss as u64 * 1024,
    )
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GpuReport {
    /// In a report merged from several hosts (`gpudoc report a.json b.json`): the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub total_bytes: u64,
    /// Device memory in use, as `nvidia-smi` shows it (NVML v2 `used`), at the first sample.
    pub start_used_bytes: u64,
    pub peak_used_bytes: u64,
    pub peak_used_at_s: f64,
    pub final_used_bytes: u64,
    /// Memory the driver sets aside (NVML v2 `reserved`; v1 `used` counts it).
    pub driver_reserved_bytes: u64,
    /// Peak of the sum over the job's processes.
    pub job_peak_bytes: u64,
    pub job_peak_at_s: f64,
    pub job_final_bytes: u64,
    /// `[seconds, bytes]` pairs: the job's highest memory in each of up to 120 equal slices of the run.
    pub job_timeline: Vec<(f64, u64)>,
    pub lost: Option<LostReport>,
    /// Queries this GPU does not support, which gpudoc stopped asking.
    pub unsupported: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LostReport {
    pub at_s: f64,
    pub error: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessReport {
    /// In a report merged from several hosts (`gpudoc report a.json b.json`): the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: u32,
    pub cmdline: String,
    pub uid: Option<u32>,
    /// Its parent when first seen; absent where unknown (older reports, another PID namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
    pub gpu: u32,
    pub peak_bytes: u64,
    pub peak_at_s: f64,
    pub final_bytes: u64,
    pub first_seen_s: f64,
    pub in_job: bool,
    /// /proc has this PID (false: another PID namespace, e.g. inside a container, or already gone).
    #[serde(default = "yes")]
    pub visible: bool,
    /// What it held at gpudoc's first look at this GPU's processes, at the run's start (0: it was not
    /// there yet); absent where unknown (older reports, a GPU whose processes could not be listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_bytes: Option<u64>,
    /// Its longest stretch above half-way from `start_bytes` to its peak, without a break: when it
    /// began and how long it lasted (to the end of the run, or to now in a run still going). Memory that
    /// came and went in a blip has a short one; absent where `start_bytes` is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_from_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub high_s: Option<f64>,
}

/// A descendant of the job still alive after the command exited.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Orphan {
    /// In a report merged from several hosts (`gpudoc report a.json b.json`): the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub pid: u32,
    pub ppid: u32,
    /// Its start time in clock ticks since boot: with the PID, its identity (`None` in older reports).
    #[serde(default)]
    pub start_ticks: Option<u64>,
    pub cmdline: String,
    /// GPU memory it held at the last sample, per GPU index.
    pub gpu_bytes: Vec<(u32, u64)>,
    /// With `--kill-orphans`: what became of it.
    #[serde(default)]
    pub ended: Option<crate::orphans::end::Ended>,
}

fn yes() -> bool {
    true
}

fn secs(t: Micros) -> f64 {
    (t as f64 / 1e6 * 1e6).round() / 1e6
}

/// Everything a report is built from.
pub struct Inputs<'a> {
    pub origin: crate::origin::Origin,
    pub command: Vec<String>,
    pub started_unix_s: f64,
    /// How the command ended; `None` when not recorded.
    pub outcome: Option<&'a Outcome>,
    pub nvml: NvmlStatus,
    pub rates: Rates,
    pub timeline: &'a Timeline,
    pub leftovers: &'a [ProcInfo],
    /// What `--kill-orphans` did to them.
    pub ended: &'a [crate::orphans::end::EndResult],
    pub ending: crate::oom::Ending,
    pub torch: crate::torch::view::TorchReport,
    pub oom: Option<crate::oom::OomReport>,
    pub host_oom: Option<crate::oom::HostOom>,
    /// gpudoc's CPU seconds and peak RSS, from [`self_usage`].
    pub self_usage: (f64, u64),
    pub notes: Vec<String>,
}

impl GpuReport {
    /// Which GPU this is: its index on its host.
    pub fn gpu(&self) -> crate::ident::GpuRef {
        crate::ident::GpuRef::new(self.host.as_deref(), self.index)
    }
}

impl Report {
    /// The report of a run: a function of its inputs alone.
    pub fn build(i: Inputs) -> Report {
        Report::build_on(i, &mut Running::default())
    }

    /// The report of a run, reading its timeline on from what `read` has read of it (a look at a run in
    /// progress keeps it between looks: each reads only the points since the last); the same report as
    /// [`Report::build`]'s, which reads the run from its start.
    pub fn build_on(i: Inputs, read: &mut Running) -> Report {
        let t = i.timeline;
        read.keep_only(t);
        let end: Micros = match i.outcome {
            Some(o) => o.duration.as_micros() as Micros,
            None => t.end(),
        };
        Report {
            schema: SCHEMA.into(),
            gpudoc_version: env!("CARGO_PKG_VERSION").into(),
            origin: i.origin,
            command: i.command,
            started_unix_s: i.started_unix_s,
            duration_s: secs(end),
            exit: exit_of(i.outcome, i.ending, i.host_oom),
            nvml: i.nvml,
            sampling: Sampling {
                device_interval_s: i.rates.device.as_secs_f64(),
                device_idle_interval_s: i.rates.device_idle.as_secs_f64(),
                process_interval_s: i.rates.process.as_secs_f64(),
                device_samples: t.device_samples,
                process_samples: t.process_samples,
                timeline_bytes: t.heap_bytes as u64,
                self_cpu_s: i.self_usage.0,
                self_max_rss_bytes: i.self_usage.1,
            },
            gpus: t
                .gpus
                .iter()
                .map(|g| gpu_report(g, end, read.job(g.info.index)))
                .collect(),
            processes: t
                .procs
                .values()
                .map(|p| {
                    let start = t.first_look(p.gpu).map(|_| t.at_first_look(p).unwrap_or(0));
                    process_report(p, start, end, read.high(p.gpu, p.pid))
                })
                .collect(),
            oom: i.oom,
            torch: i.torch,
            orphans: orphans(i.leftovers, i.ended, t),
            diagnoses: Vec::new(),
            forecasts: Vec::new(),
            live: false,
            moment: None,
            gate: None,
            rule_errors: Vec::new(),
            notes: i.notes,
            hosts: Vec::new(),
            tried: None,
        }
    }

    /// The report as pretty JSON with a trailing newline.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a report always serializes");
        s.push('\n');
        s
    }
}

fn exit_of(
    o: Option<&Outcome>,
    ending: crate::oom::Ending,
    host_oom: Option<crate::oom::HostOom>,
) -> Exit {
    let (code, signal, core_dumped) = match o.map(|o| o.end) {
        Some(crate::supervise::ProcessEnd::Exited(c)) => (Some(c), None, false),
        Some(crate::supervise::ProcessEnd::Signaled {
            signal,
            core_dumped,
        }) => (Some(128 + signal), Some(signal), core_dumped),
        None => (None, None, false),
    };
    Exit {
        code,
        signal,
        core_dumped,
        killed_by_gpudoc: o.is_some_and(|o| o.escalated),
        stopped_on: None,
        classification: ending,
        host_oom,
        forwarded_signals: o
            .map(|o| {
                o.forwarded
                    .iter()
                    .map(|&s| crate::supervise::signals::signal_name(s))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// One GPU over the run. "In use at start" is what the first sample saw that was not the job's: the
/// job may already hold memory when NVML first answers.
fn gpu_report(g: &GpuTimeline, end: Micros, job: &mut Maxima) -> GpuReport {
    job.feed(&g.job);
    let step = end / TIMELINE_POINTS as u64;
    GpuReport {
        host: None,
        index: g.info.index,
        name: g.info.name.clone(),
        uuid: g.info.uuid.clone(),
        total_bytes: g.info.total_bytes,
        start_used_bytes: g
            .used
            .first()
            .unwrap_or(0)
            .saturating_sub(g.job.first().unwrap_or(0)),
        peak_used_bytes: g.used.peak(),
        peak_used_at_s: secs(g.used.peak_at()),
        final_used_bytes: g.used.last().unwrap_or(0),
        driver_reserved_bytes: g.driver_reserved,
        job_peak_bytes: g.job.peak(),
        job_peak_at_s: secs(g.job.peak_at()),
        job_final_bytes: g.job.last().unwrap_or(0),
        job_timeline: job
            .bucket_max(&g.job, end, TIMELINE_POINTS)
            .into_iter()
            .enumerate()
            .map(|(k, v)| (secs(k as u64 * step), v))
            .collect(),
        lost: g.lost.as_ref().map(|l| LostReport {
            at_s: secs(l.at),
            error: l.error.clone(),
        }),
        unsupported: g
            .unsupported
            .iter()
            .map(|(what, e)| format!("{what}: {e}"))
            .collect(),
    }
}

/// `p` over the run; `start`: what it held at gpudoc's first look at its GPU's processes (0: it was not
/// there yet; `None`: no look, [`Timeline::at_first_look`]); `end`: the run's end (or now). Its longest
/// stretch high (`high_from_s`, `high_s`): at or above half-way from `start` to its peak, and above
/// zero; a stretch still open lasts to `end` (the run's end, not the series' last sample: a trace keeps
/// only changes, and the sampler may look once more after the command's end; both must give the run's
/// own figure).
fn process_report(
    p: &ProcTimeline,
    start: Option<u64>,
    end: Micros,
    stretch: &mut Stretch,
) -> ProcessReport {
    let high = start.map(|s| {
        let bar = s + p.used.peak().saturating_sub(s) / 2;
        stretch.longest(&p.used, bar, end)
    });
    ProcessReport {
        host: None,
        pid: p.pid,
        cmdline: p.cmdline.clone(),
        uid: p.uid,
        ppid: p.ppid,
        gpu: p.gpu,
        peak_bytes: p.used.peak(),
        peak_at_s: secs(p.used.peak_at()),
        final_bytes: p.used.last().unwrap_or(0),
        first_seen_s: secs(p.used.first_at().unwrap_or(0)),
        in_job: p.in_job,
        visible: p.visible,
        start_bytes: start,
        high_from_s: high.map(|(from, _)| secs(from)),
        high_s: high.map(|(_, len)| secs(len)),
    }
}

/// The job's descendants still alive after the command exited, with the GPU memory each held last.
fn orphans(
    leftovers: &[ProcInfo],
    ended: &[crate::orphans::end::EndResult],
    t: &Timeline,
) -> Vec<Orphan> {
    leftovers
        .iter()
        .map(|p| Orphan {
            host: None,
            pid: p.pid,
            ppid: p.ppid,
            start_ticks: Some(p.start_ticks),
            cmdline: p.cmdline.clone(),
            gpu_bytes: t
                .procs
                .values()
                .filter(|q| q.pid == p.pid && q.used.last().unwrap_or(0) > 0)
                .map(|q| (q.gpu, q.used.last().unwrap_or(0)))
                .collect(),
            ended: ended
                .iter()
                .find(|r| r.pid == p.pid)
                .map(|r| r.result.clone()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::GpuInfo;
    use crate::supervise::{Outcome, ProcessEnd};
    use crate::timeline::{GpuTimeline, ProcTimeline, Series};

    const GIB: u64 = 1 << 30;

    /// GPU 0: the job's process climbs 2 → 6 → 1 GiB while another user's process holds 3 GiB throughout.
    fn timeline() -> Timeline {
        let mut t = Timeline::default();
        let mut g = GpuTimeline::new(GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            total_bytes: 140 * GIB,
        });
        let mut job = Series::default();
        let mut other = Series::default();
        for (i, gib) in [2, 6, 6, 1].into_iter().enumerate() {
            let at = i as u64 * 1_000_000;
            job.push(at, gib * GIB);
            other.push(at, 3 * GIB);
            g.used.push(at, (gib + 3) * GIB);
            g.job.push(at, gib * GIB);
        }
        t.gpus.push(g);
        let proc = |pid, in_job, used| ProcTimeline {
            pid,
            gpu: 0,
            in_job,
            visible: true,
            cmdline: format!("python {pid}.py"),
            uid: Some(1000),
            ppid: None,
            used,
        };
        t.procs.insert((0, 10), proc(10, true, job));
        t.procs.insert((0, 20), proc(20, false, other));
        t
    }

    fn build(t: &Timeline, end: ProcessEnd) -> Report {
        let outcome = Outcome {
            end,
            duration: std::time::Duration::from_secs(4),
            escalated: false,
            terminate: false,
            forwarded: vec![],
            stopped: false,
            interrupted: None,
        };
        Report::build(Inputs {
            origin: Default::default(),
            command: vec!["python".into(), "train.py".into()],
            started_unix_s: 0.0,
            outcome: Some(&outcome),
            nvml: NvmlStatus::default(),
            rates: Default::default(),
            timeline: t,
            leftovers: &[],
            ended: &[],
            ending: crate::oom::Ending::Success,
            torch: Default::default(),
            oom: None,
            host_oom: None,
            self_usage: (0.0, 0),
            notes: vec![],
        })
    }

    #[test]
    fn the_job_and_the_others_are_told_apart() {
        let r = build(&timeline(), ProcessEnd::Exited(0));
        let g = &r.gpus[0];
        assert_eq!(g.job_peak_bytes, 6 * GIB);
        assert_eq!(g.job_peak_at_s, 1.0);
        assert_eq!(g.peak_used_bytes, 9 * GIB);
        // What the GPU held before the command: the other process.
        assert_eq!(g.start_used_bytes, 3 * GIB);
        assert_eq!(g.job_final_bytes, GIB);
        assert_eq!(r.duration_s, 4.0);
        let job: Vec<_> = r.processes.iter().filter(|p| p.in_job).collect();
        assert_eq!((job.len(), job[0].pid, job[0].peak_bytes), (1, 10, 6 * GIB));
        let other = r.processes.iter().find(|p| !p.in_job).unwrap();
        assert_eq!((other.pid, other.peak_bytes), (20, 3 * GIB));
        // The job's slices of the run never miss its peak.
        assert_eq!(g.job_timeline.iter().map(|p| p.1).max(), Some(6 * GIB));
    }

    #[test]
    fn a_process_listed_just_after_the_first_look_was_there_at_the_start_as_the_oom_reader_says() {
        // Another user's 3 GiB, first read 50 ms after gpudoc's first look at the GPU's processes (they
        // are read one by one): there at the start, for the report as for the OOM's window
        // (Timeline::at_first_look, the one reading of the first look).
        let mut t = timeline();
        let look = t.first_look(0).unwrap();
        let mut used = Series::default();
        used.push(look + 50_000, 3 * GIB);
        t.procs.insert(
            (0, 40),
            ProcTimeline {
                pid: 40,
                gpu: 0,
                in_job: false,
                visible: true,
                cmdline: "python theirs.py".into(),
                uid: Some(1001),
                ppid: None,
                used,
            },
        );
        assert_eq!(t.at_first_look(&t.procs[&(0, 40)]), Some(3 * GIB));
        let r = build(&t, ProcessEnd::Exited(0));
        let theirs = r.processes.iter().find(|p| p.pid == 40).unwrap();
        assert_eq!(theirs.start_bytes, Some(3 * GIB));
    }

    #[test]
    fn memory_of_others_that_came_during_the_run_is_told_from_what_was_there_at_the_start() {
        let r = build(&timeline(), ProcessEnd::Exited(0));
        // The other process held its 3 GiB from the first look to the end.
        let other = r.processes.iter().find(|p| !p.in_job).unwrap();
        assert_eq!(other.start_bytes, Some(3 * GIB));
        assert_eq!((other.high_from_s, other.high_s), (Some(0.0), Some(4.0)));
        // One that came at 1 s: a blip of 20 GiB, then 8 GiB from 2 s to the end; half-way to its peak
        // is 10 GiB, so only the blip's second counts.
        let mut t = timeline();
        let mut used = Series::default();
        for (at, gib) in [(1, 20), (2, 8)] {
            used.push(at * 1_000_000, gib * GIB);
        }
        t.procs.insert(
            (0, 30),
            ProcTimeline {
                pid: 30,
                gpu: 0,
                in_job: false,
                visible: true,
                cmdline: "python other.py".into(),
                uid: Some(1001),
                ppid: None,
                used,
            },
        );
        let r = build(&t, ProcessEnd::Exited(0));
        let came = r.processes.iter().find(|p| p.pid == 30).unwrap();
        assert_eq!(came.start_bytes, Some(0));
        assert_eq!((came.high_from_s, came.high_s), (Some(1.0), Some(1.0)));
        // Where the GPU's processes were never listed, nothing is known of the start.
        let mut t = timeline();
        t.gpus[0].job = Series::default();
        let r = build(&t, ProcessEnd::Exited(0));
        assert!(
            r.processes
                .iter()
                .all(|p| p.start_bytes.is_none() && p.high_s.is_none())
        );
    }

    #[test]
    fn how_it_ended() {
        let r = build(&timeline(), ProcessEnd::Exited(3));
        assert_eq!(r.exit.code, Some(3));
        let r = build(
            &timeline(),
            ProcessEnd::Signaled {
                signal: 15,
                core_dumped: false,
            },
        );
        assert_eq!((r.exit.code, r.exit.signal), (Some(143), Some(15)));
    }
}
