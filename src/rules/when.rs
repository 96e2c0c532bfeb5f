//! The facts of when: where an OOM and each GPU's peak fell among the optimizer steps (a
//! [`Stretch`](super::phase::Stretch): a time; what the program was doing then is its
//! [`Phase`](super::phase::Phase), read from the shim's evidence, never from this), and growth found
//! in the stretches no optimizer step explains (a run without steps, or after the last one). Before the
//! program's first forward call or step (as the shim recorded them), memory that rises is loading:
//! growth is looked for only from then on.

use super::growth::{self, Growth};
use super::phase::{self, Clock, Placed};
use crate::oom::OomReport;
use crate::report::{GpuReport, Report};
use crate::torch::view::TorchProcReport;

/// The framework view's processes of each host, for their steps.
pub struct Steps<'a> {
    procs: Vec<&'a TorchProcReport>,
}

/// The steps that place a moment on one GPU: `None` when the framework view saw no process on its host
/// (no shim: the phases are unknown).
struct Known<'a> {
    clock: Option<Clock>,
    procs: Vec<&'a TorchProcReport>,
}

impl<'a> Steps<'a> {
    pub fn of(r: &'a Report) -> Steps<'a> {
        Steps {
            procs: r.torch.processes.iter().collect(),
        }
    }

    /// The steps of `gpu`'s own PyTorch processes (or of `pid`'s, when it is one), else of its host's.
    fn on(&self, host: &Option<String>, gpu: Option<u32>, pid: Option<u32>) -> Option<Known<'a>> {
        let host_procs: Vec<_> = self
            .procs
            .iter()
            .copied()
            .filter(|p| &p.host == host)
            .collect();
        if host_procs.is_empty() {
            return None;
        }
        // CuPy's and RMM's records are readings by time, no steps: no clock of steps.
        let pick = |f: &dyn Fn(&TorchProcReport) -> bool| -> Vec<&'a TorchProcReport> {
            host_procs
                .iter()
                .copied()
                .filter(|p| f(p) && !p.steps.is_empty() && p.framework.counts_steps())
                .collect()
        };
        let procs = [
            pick(&|p| pid.is_some_and(|x| x == p.pid)),
            pick(&|p| gpu.is_some() && p.gpu == gpu),
            pick(&|_| true),
        ]
        .into_iter()
        .find(|v| !v.is_empty())
        .unwrap_or_default();
        Some(Known {
            clock: Clock::of_all(procs.iter().copied()),
            procs,
        })
    }
}

impl Known<'_> {
    fn place(&self, at: f64) -> Placed {
        phase::place(self.clock.as_ref(), &self.procs, at)
    }
}

/// Where a moment fell among the steps, as facts: (its stretch's name, steps before it, seconds since the
/// last, before the first none), all none where the steps are unknown.
pub type Placing = (Option<String>, Option<i64>, Option<f64>);

fn placing(known: Option<&Known>, at: f64) -> Placing {
    match known.map(|k| k.place(at)) {
        None => (None, None, None),
        Some(p) => (
            Some(p.stretch.name().into()),
            Some(p.steps as i64),
            p.since_last_s,
        ),
    }
}

/// One GPU's when.
pub struct GpuWhen {
    /// Where the job's peak on it fell.
    pub peak: Placing,
    /// Growth without steps, and the step it came after (none: a run without steps).
    pub growth: Option<Growth>,
    pub growth_after_step: Option<i64>,
}

pub fn gpu(steps: &Steps, g: &GpuReport, oom: Option<&OomReport>) -> GpuWhen {
    let known = steps.on(&g.host, Some(g.index), None);
    let clock = known.as_ref().and_then(|k| k.clock);
    // A slice counts from the last step on when it ends after it: its highest point may be after.
    let width = match g.job_timeline.as_slice() {
        [a, b, ..] => b.0 - a.0,
        _ => 0.0,
    };
    // The program's own time ends at the shim's last reading (its exit record: after it, only teardown),
    // or at an OOM on this GPU (after it, the exception's unwinding).
    let exit = steps
        .procs
        .iter()
        .filter(|p| p.host == g.host && p.gpu == Some(g.index))
        .filter_map(|p| p.last_reading_s)
        .reduce(f64::max);
    let failed = oom
        .filter(|o| o.host == g.host && o.gpu == Some(g.index))
        .map(oom_at);
    let exit = match (exit, failed) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    // A load is not a leak: what rose before the program first called its model or stepped is loading.
    let work = steps
        .procs
        .iter()
        .filter(|p| p.host == g.host && p.gpu == Some(g.index))
        .filter_map(|p| p.started_work_s())
        .reduce(f64::min);
    let stretch: Vec<(f64, u64)> = g
        .job_timeline
        .iter()
        .copied()
        .filter(|&(t, _)| clock.is_none_or(|c| t + width > c.last_s))
        .filter(|&(t, _)| work.is_none_or(|w| t + width > w))
        .filter(|&(t, _)| exit.is_none_or(|e| t <= e))
        .collect();
    GpuWhen {
        peak: placing(known.as_ref(), g.job_peak_at_s),
        growth: growth::find(
            &stretch,
            match clock {
                Some(_) => growth::MIN_SECS_AFTER_STEPS,
                None => growth::MIN_SECS,
            },
        ),
        growth_after_step: clock.map(|c| c.steps as i64),
    }
}

/// Where the report's OOM fell: in the process that failed (when known), else on its GPU.
pub fn oom(steps: &Steps, r: &Report) -> Placing {
    let Some(o) = &r.oom else {
        return (None, None, None);
    };
    let pid = o.allocator.as_ref().map(|a| a.pid).or(o.this_pid);
    placing(steps.on(&o.host, o.gpu, pid).as_ref(), oom_at(o))
}

/// When the OOM happened: the shim's observer saw it as it did; the text is printed after the exception
/// has unwound.
fn oom_at(o: &OomReport) -> f64 {
    o.allocator.as_ref().map_or(o.event.at_s, |a| a.at_s)
}
