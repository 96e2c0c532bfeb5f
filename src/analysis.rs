//! From what a run left behind to its report: the one pure stage that `gpudoc run` and `gpudoc report`
//! (replaying a trace) share, so a replayed trace gives the run's own OOM, classification and diagnoses.
//! The trace's end row ([`EndRow`]) carries what only the end of the run knows.

use crate::gpu::NvmlStatus;
use crate::oom::scan::{FirstFailure, OomEvent, Scanner};
use crate::oom::{self, Ending, HostOom};
use crate::orphans::end::EndResult;
use crate::procs::ProcInfo;
use crate::report::{Inputs, Moment, Report};
use crate::rules::RuleSet;
use crate::sample::Rates;
use crate::supervise::{Outcome, ProcessEnd};
use crate::timeline::Timeline;
use crate::timeline::running::Running;
use crate::torch::{self, TorchTimeline};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Everything a run's report is made from. Its default is a run of which nothing is known yet: the
/// evidence of a run still going fills in what has been sampled so far.
#[derive(Default)]
pub struct Evidence {
    pub origin: crate::origin::Origin,
    pub command: Vec<String>,
    pub started_unix_s: f64,
    /// How the command ended; `None` when nothing recorded it (a trace from before gpudoc did).
    pub outcome: Option<Outcome>,
    pub nvml: NvmlStatus,
    pub rates: Rates,
    pub timeline: Timeline,
    /// The framework view; `None` with the shim off.
    pub torch: Option<TorchTimeline>,
    pub scanner: Scanner,
    pub host: HostOom,
    pub leftovers: Vec<ProcInfo>,
    pub ended: Vec<EndResult>,
    pub notes: Vec<String>,
    /// gpudoc's CPU seconds and peak RSS.
    pub self_usage: (f64, u64),
}

/// The report of a run, diagnosed by `rules`: a function of the evidence alone.
pub fn analyze(ev: Evidence, rules: &RuleSet) -> Report {
    let mut report = build(&ev, &mut Running::default());
    crate::rules::diagnose(&mut report, rules);
    report
}

/// The report of a run still going, on the evidence so far: the same stage, with the facts saying the
/// run is live (`run.live`), so that a rule can ask more of a run that is not over. It borrows the
/// evidence: a look at a run in progress copies nothing of it (`Timeline::catch_up` keeps it); and it
/// reads the timeline on from what `read` read of it at the look before (a fresh one: from the start),
/// to the same report.
pub fn analyze_so_far(ev: &Evidence, read: &mut Running, rules: &RuleSet) -> Report {
    let mut report = build(ev, read);
    report.live = true;
    crate::rules::diagnose(&mut report, rules);
    report
}

/// The report of one moment (`gpudoc watch`'s look at the machine: `ev`'s timeline is one sample): the
/// same stage, with the facts saying it is a look (`run.look`) and what the look knows besides.
pub fn analyze_moment(ev: Evidence, moment: Moment, rules: &RuleSet) -> Report {
    let mut report = build(&ev, &mut Running::default());
    report.moment = Some(moment);
    crate::rules::diagnose(&mut report, rules);
    report
}

fn build(ev: &Evidence, read: &mut Running) -> Report {
    let recorded_end = ev.outcome.as_ref().map(|o| o.end);
    let torch_enabled = ev.torch.is_some();
    let none = TorchTimeline::default();
    let torch_timeline = ev.torch.as_ref().unwrap_or(&none);
    let (ending, oom_report, host_oom) = oom::classify(&oom::Evidence {
        end: recorded_end.unwrap_or(ProcessEnd::Exited(1)),
        scanner: &ev.scanner,
        timeline: &ev.timeline,
        host: ev.host.clone(),
        torch_ooms: &torch_timeline.ooms,
        cuda_visible_devices: ev.origin.cuda_visible_devices.as_deref(),
    });
    // Without the recorded end, only an OOM text says how the command ended.
    let ending = match (recorded_end, &oom_report) {
        (Some(_), _) => ending,
        (None, Some(_)) => Ending::GpuOom,
        (None, None) => Ending::Unknown,
    };
    let torch_report = torch::view::build(
        torch_timeline,
        &ev.timeline,
        &ev.timeline.gpu_infos(),
        torch_enabled,
    );
    let mut notes = ev.notes.clone();
    if !torch_timeline.errors.is_empty() {
        notes.push(format!(
            "the PyTorch view was lost in {} process(es): {}",
            torch_timeline.errors.len(),
            torch_report.errors.join("; ")
        ));
    }
    let inputs = Inputs {
        origin: ev.origin.clone(),
        command: ev.command.clone(),
        started_unix_s: ev.started_unix_s,
        outcome: ev.outcome.as_ref(),
        nvml: ev.nvml.clone(),
        rates: ev.rates,
        timeline: &ev.timeline,
        leftovers: &ev.leftovers,
        ended: &ev.ended,
        ending,
        torch: torch_report,
        oom: oom_report,
        host_oom,
        self_usage: ev.self_usage,
        notes,
    };
    Report::build_on(inputs, read)
}

/// What the end of a run adds to its trace (the trace's `end` row). A field a writer does not know is left
/// out and read as its default (no exit, no signal, nothing left over): the notebook's trace of a moment
/// (python/gpudoc/_report.py) writes only what a moment has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct EndRow {
    /// The command's exit code, or `None` with `signal` when a signal ended it.
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub core_dumped: bool,
    pub duration_s: f64,
    pub escalated: bool,
    pub terminate: bool,
    pub forwarded: Vec<i32>,
    pub oom_events: Vec<OomEvent>,
    pub oom_dropped: u64,
    pub first_failure: Option<FirstFailure>,
    pub host: HostOom,
    pub leftovers: Vec<ProcInfo>,
    pub ended: Vec<EndResult>,
    pub notes: Vec<String>,
    /// NVML's status as the run ended it (the start row's may predate a failure).
    pub nvml: Option<NvmlStatus>,
    pub torch_enabled: bool,
    pub self_cpu_s: f64,
    pub self_max_rss_bytes: u64,
    /// Device, idle and process sampling periods, seconds.
    pub rates_s: (f64, f64, f64),
    /// What the timeline knew that its rows do not carry.
    pub device_samples: u64,
    pub process_samples: u64,
    pub timeline_bytes: u64,
    pub gpus: Vec<GpuEnd>,
    /// `--snapshot`'s file, and the shim's snapshot written to it (absent when none was written, and in
    /// traces from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<crate::torch::SnapshotFile>,
}

/// One GPU's numbers that only the end of a run has.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct GpuEnd {
    pub index: u32,
    /// Memory the driver sets aside (NVML v2 `reserved`).
    pub driver_reserved_bytes: u64,
    /// Queries the GPU does not support: (what, error).
    pub unsupported: Vec<(String, String)>,
}

impl EndRow {
    /// The end row of `ev`.
    pub fn of(ev: &Evidence) -> EndRow {
        let o = ev.outcome.as_ref();
        let (code, signal, core_dumped) = match o.map(|o| o.end) {
            Some(ProcessEnd::Exited(c)) => (Some(c), None, false),
            Some(ProcessEnd::Signaled {
                signal,
                core_dumped,
            }) => (None, Some(signal), core_dumped),
            None => (None, None, false),
        };
        EndRow {
            code,
            signal,
            core_dumped,
            duration_s: o.map_or(0.0, |o| o.duration.as_secs_f64()),
            escalated: o.is_some_and(|o| o.escalated),
            terminate: o.is_some_and(|o| o.terminate),
            forwarded: o.map(|o| o.forwarded.clone()).unwrap_or_default(),
            oom_events: ev.scanner.events.clone(),
            oom_dropped: ev.scanner.dropped,
            first_failure: ev.scanner.first_failure.clone(),
            host: ev.host.clone(),
            leftovers: ev.leftovers.clone(),
            ended: ev.ended.clone(),
            notes: ev.notes.clone(),
            nvml: Some(ev.nvml.clone()),
            torch_enabled: ev.torch.is_some(),
            self_cpu_s: ev.self_usage.0,
            self_max_rss_bytes: ev.self_usage.1,
            rates_s: (
                ev.rates.device.as_secs_f64(),
                ev.rates.device_idle.as_secs_f64(),
                ev.rates.process.as_secs_f64(),
            ),
            device_samples: ev.timeline.device_samples,
            process_samples: ev.timeline.process_samples,
            timeline_bytes: ev.timeline.heap_bytes as u64,
            gpus: ev
                .timeline
                .gpus
                .iter()
                .map(|g| GpuEnd {
                    index: g.info.index,
                    driver_reserved_bytes: g.driver_reserved,
                    unsupported: g.unsupported.clone(),
                })
                .collect(),
            snapshot: ev.torch.as_ref().and_then(|t| t.snapshot_file.clone()),
        }
    }

    /// Puts back into a timeline read from the trace's rows what only this row has.
    pub fn complete(&self, t: &mut Timeline) {
        t.device_samples = self.device_samples;
        t.process_samples = self.process_samples;
        t.heap_bytes = self.timeline_bytes as usize;
        for e in &self.gpus {
            if let Some(g) = t.gpu_mut(e.index) {
                g.driver_reserved = e.driver_reserved_bytes;
                g.unsupported = e.unsupported.clone();
            }
        }
    }

    /// How the command ended, as recorded.
    pub fn outcome(&self) -> Option<Outcome> {
        let end = match (self.code, self.signal) {
            (_, Some(signal)) => ProcessEnd::Signaled {
                signal,
                core_dumped: self.core_dumped,
            },
            (Some(c), None) => ProcessEnd::Exited(c),
            (None, None) => return None,
        };
        Some(Outcome {
            end,
            duration: Duration::from_secs_f64(self.duration_s.max(0.0)),
            escalated: self.escalated,
            terminate: self.terminate,
            forwarded: self.forwarded.clone(),
            // The trace does not record it: the report does (`exit.stopped_on`).
            stopped: false,
            interrupted: None,
        })
    }

    /// The scanner's findings, as recorded.
    pub fn scanner(&self) -> Scanner {
        let mut s = Scanner::new();
        s.events = self.oom_events.clone();
        s.dropped = self.oom_dropped;
        s.first_failure = self.first_failure.clone();
        s
    }

    pub fn rates(&self) -> Rates {
        let d = |s: f64| Duration::from_secs_f64(s.max(0.0));
        Rates {
            device: d(self.rates_s.0),
            device_idle: d(self.rates_s.1),
            process: d(self.rates_s.2),
        }
    }
}
