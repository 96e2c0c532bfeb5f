//! `gpudoc fit`: the largest value of a command's `{}` that runs without running out of GPU memory, found
//! from real short runs of the command, each run and classified as `gpudoc run` runs and classifies it
//! ([`crate::report::Report`]'s ending). This module holds what decides: the command for a value
//! ([`command_for`]), what a run said ([`Probe::of`]), the search ([`search`]), the result
//! ([`FitReport`]) and its words ([`render`]); [`ender`] ends a run once it has run far enough.

pub mod ender;
pub mod remedy;
pub mod search;
pub mod template;

pub use template::command_for;

use crate::oom::Ending;
use crate::report::Report;
use crate::units::{fmt_bytes, fmt_secs};
use serde::{Deserialize, Serialize};

/// The `schema` value of `gpudoc fit --json`.
pub const SCHEMA: &str = "gpudoc.fit/1";
/// How one run ended, for the fit (shared with the report of `--try`, which lives below the fit).
pub use crate::report::RunOutcome as Outcome;

/// One run of the fit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Probe {
    pub value: u64,
    pub outcome: Outcome,
    /// The line chose this value (else a plain step: the first runs, doubling, halving).
    pub guided: bool,
    /// The job's peak on its busiest GPU (NVML, CUDA contexts included), else PyTorch's peak reserved
    /// memory; null when neither was measured.
    pub peak_bytes: Option<u64>,
    /// Memory the job could use on that GPU: its capacity less the driver's reserve and what other
    /// processes held at the start (NVML); null without NVML.
    pub limit_bytes: Option<u64>,
    /// Optimizer steps the run made (the shim's count).
    pub steps: u64,
    pub duration_s: f64,
    /// `gpudoc run`'s exit code for the run (the command's, or 128+N).
    pub exit_code: Option<i32>,
    /// `gpudoc run`'s classification of the ending.
    pub classification: Ending,
    /// The OOM's cause, in `gpudoc run`'s words, when it ran out.
    pub oom_cause: Option<crate::oom::Cause>,
}

impl Probe {
    /// What the run's report says of `value`; `ended`: how gpudoc ended it, if it did (a run it had to
    /// take past SIGINT, to SIGTERM or SIGKILL, is no clean fit: it failed, said as such); `interrupted`:
    /// someone asked the job to end (a Ctrl-C), whatever the job then made of it (a script that catches
    /// KeyboardInterrupt may exit 0).
    pub fn of(
        value: u64,
        guided: bool,
        r: &Report,
        ended: Option<&ender::Ended>,
        interrupted: bool,
    ) -> Probe {
        let ending = r.exit.classification;
        let forced = ended.is_some_and(ender::Ended::forced);
        let outcome = match (ending, ended.map(|e| e.why)) {
            _ if interrupted => Outcome::Interrupted,
            (Ending::GpuOom, _) => Outcome::Oom,
            (_, Some(why)) if forced && why != ender::Why::Budget => Outcome::Failed,
            (Ending::Success, _) => Outcome::Fits,
            (_, Some(ender::Why::Budget)) => Outcome::Cut,
            (_, Some(_)) => Outcome::Fits,
            (Ending::Signal, None) => Outcome::Interrupted,
            _ => Outcome::Failed,
        };
        let busiest = r.gpus.iter().max_by_key(|g| g.job_peak_bytes);
        let nvml_peak = busiest.map(|g| g.job_peak_bytes).filter(|&b| b > 0);
        let torch_peak = r
            .torch
            .processes
            .iter()
            .filter_map(|p| p.peak_reserved_bytes)
            .max()
            .filter(|&b| b > 0);
        Probe {
            value,
            outcome,
            guided,
            peak_bytes: nvml_peak.or(torch_peak),
            limit_bytes: busiest.map(|g| {
                g.total_bytes
                    .saturating_sub(g.driver_reserved_bytes)
                    .saturating_sub(g.start_used_bytes)
            }),
            steps: r
                .torch
                .processes
                .iter()
                .map(|p| p.steps_total)
                .max()
                .unwrap_or(0),
            duration_s: r.duration_s,
            exit_code: r.exit.code,
            classification: ending,
            oom_cause: r.oom.as_ref().map(|o| o.cause),
        }
    }
}

impl Probe {
    /// How the run ended, in words.
    pub fn words(&self) -> String {
        match self.outcome {
            Outcome::Fits => "fits".to_string(),
            Outcome::Oom => match self.oom_cause {
                Some(c) => format!("out of memory ({})", c.words()),
                None => "out of memory".into(),
            },
            // A run whose death by signal is not an interruption: gpudoc's SIGTERM or SIGKILL after its
            // SIGINT did not end it.
            Outcome::Failed if self.classification == Ending::Signal => format!(
                "did not end on SIGINT; gpudoc ended it (exit {})",
                self.exit_code.map_or("?".into(), |c| c.to_string())
            ),
            Outcome::Failed => format!(
                "failed (exit {}) without a GPU out-of-memory error",
                self.exit_code.map_or("?".into(), |c| c.to_string())
            ),
            Outcome::Cut => "cut short: the time budget ran out".into(),
            Outcome::Interrupted => "interrupted".into(),
        }
    }
}

/// Why the fit stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The answer is verified: it fits and the next value ran out (or it is `--max`).
    Found,
    /// Not even `--min` fits.
    NothingFits,
    /// The runs allowed (`--runs`) were spent first.
    Runs,
    /// The time budget (`--budget`) was spent first.
    Budget,
    /// A run failed for a reason other than GPU memory.
    Failed,
    /// A run was ended by something else than gpudoc (a Ctrl-C).
    Interrupted,
}

/// The bounds the fit ran within, as printed before the first run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Bounds {
    pub min: u64,
    pub max: u64,
    /// Runs at most.
    pub runs: u64,
    /// Seconds at most (each run is ended when they are spent).
    pub budget_s: f64,
    /// Each run is ended after this many optimizer steps.
    pub steps: Option<u64>,
    /// Each run is ended after this many seconds (`--for`).
    pub run_for_s: Option<f64>,
}

/// `gpudoc fit --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FitReport {
    pub schema: String,
    pub gpudoc_version: String,
    /// The command as given, with `{}` where the value goes.
    pub command: Vec<String>,
    pub bounds: Bounds,
    /// The largest value that ran without running out of GPU memory (null: none did, or none ran).
    pub answer: Option<u64>,
    pub stop: Stop,
    /// The answer is settled: it fit and the value above it ran out of memory (or it is `max`).
    pub verified: bool,
    /// The smallest value that ran out of memory.
    pub smallest_oom: Option<u64>,
    /// peak ≈ a + b·value, fitted to the peaks of the runs that fit.
    pub line: Option<search::Line>,
    /// The peak the line predicts at the answer, the peak measured there, and the memory left at it.
    pub predicted_peak_bytes: Option<u64>,
    pub measured_peak_bytes: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub headroom_bytes: Option<u64>,
    /// Every run, in order.
    pub runs: Vec<Probe>,
    pub duration_s: f64,
}

impl FitReport {
    /// The result of the runs made and the search's state.
    pub fn build(
        command: Vec<String>,
        bounds: Bounds,
        s: &search::Search,
        runs: Vec<Probe>,
        stop: Stop,
        duration_s: f64,
    ) -> FitReport {
        let answer = s.lo;
        let line = s.line();
        let at = answer.and_then(|a| runs.iter().find(|p| p.value == a));
        let measured = at.and_then(|p| p.peak_bytes);
        let limit = at.and_then(|p| p.limit_bytes).or(s.limit);
        FitReport {
            schema: SCHEMA.into(),
            gpudoc_version: env!("CARGO_PKG_VERSION").into(),
            command,
            verified: stop == Stop::Found,
            smallest_oom: s.hi,
            predicted_peak_bytes: line.zip(answer).map(|(l, a)| l.peak(a)),
            measured_peak_bytes: measured,
            headroom_bytes: limit.zip(measured).map(|(l, m)| l.saturating_sub(m)),
            limit_bytes: limit,
            line,
            answer,
            stop,
            bounds,
            runs,
            duration_s,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a fit report serializes") + "\n"
    }

    /// The exit code: 0 found, 1 nothing fits, 3 not settled within the bounds, 4 a run failed; an
    /// interrupted fit leaves as its run did.
    pub fn exit_code(&self) -> u8 {
        match self.stop {
            Stop::Found => 0,
            Stop::NothingFits => crate::exit::FIT_NOTHING_FITS,
            Stop::Runs | Stop::Budget => crate::exit::FIT_UNSETTLED,
            Stop::Failed => crate::exit::FIT_RUN_FAILED,
            Stop::Interrupted => self
                .runs
                .last()
                .and_then(|p| p.exit_code)
                .and_then(|c| u8::try_from(c).ok())
                .unwrap_or(130),
        }
    }
}

/// The bounds, in words: printed before the first run.
pub fn render_bounds(b: &Bounds) -> String {
    let each = match (b.steps, b.run_for_s) {
        (Some(k), Some(t)) => format!("{k} optimizer steps or {}", dur(t)),
        (Some(k), None) => format!("{k} optimizer steps"),
        (None, Some(t)) => dur(t),
        (None, None) => "its end".into(),
    };
    format!(
        "gpudoc fit: values {} to {}, at most {} runs and {}; each run is ended after {each}\n",
        b.min,
        b.max,
        b.runs,
        dur(b.budget_s)
    )
}

/// A duration as it was given (`30m`, `1h 30m`).
fn dur(s: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs_f64(s)).to_string()
}

/// One run, in a line.
pub fn render_probe(i: usize, of: u64, p: &Probe) -> String {
    let peak = p
        .peak_bytes
        .map(|b| format!(", peak {}", fmt_bytes(b)))
        .unwrap_or_default();
    format!(
        "gpudoc fit: run {i}/{of}: {} → {}{peak} ({} steps, {})\n",
        p.value,
        p.words(),
        p.steps,
        fmt_secs(p.duration_s)
    )
}

/// The answer, in words.
pub fn render(r: &FitReport) -> String {
    let runs = format!("{} runs, {}", r.runs.len(), fmt_secs(r.duration_s));
    let Some(a) = r.answer else {
        return match r.stop {
            Stop::NothingFits => format!(
                "gpudoc fit: nothing fits: {} ran out of GPU memory ({runs})\n{}",
                r.bounds.min,
                fragmented_above(r)
            ),
            _ => format!(
                "gpudoc fit: no value ran to the end: {} ({runs})\n",
                why(r.stop)
            ),
        };
    };
    let mut o = String::new();
    let head = if r.verified {
        match r.smallest_oom {
            Some(h) => format!("{a} is the largest value that fits ({h} ran out of memory)"),
            None => format!("{a} fits (the largest value asked for)"),
        }
    } else {
        let above = r
            .smallest_oom
            .map(|h| format!(", {h} ran out of memory"))
            .unwrap_or_default();
        format!("{a} fits, the largest found before {}{above}", why(r.stop))
    };
    o.push_str(&format!("gpudoc fit: {head} ({runs})\n"));
    if let Some(m) = r.measured_peak_bytes {
        let predicted = r
            .predicted_peak_bytes
            .map(|p| format!(" (the line predicts {})", fmt_bytes(p)))
            .unwrap_or_default();
        let room = r
            .headroom_bytes
            .zip(r.limit_bytes)
            .map(|(h, l)| format!(", {} of headroom under {}", fmt_bytes(h), fmt_bytes(l)))
            .unwrap_or_default();
        o.push_str(&format!(
            "  peak at {a}: {}{predicted}{room}\n",
            fmt_bytes(m)
        ));
    }
    if let Some(l) = r.line {
        o.push_str(&format!(
            "  memory ≈ {} + {} × value\n",
            fmt_bytes(l.a_bytes.max(0.0) as u64),
            fmt_bytes(l.b_bytes as u64)
        ));
    }
    o.push_str(&fragmented_above(r));
    o
}

/// When the smallest value that ran out did so through fragmentation (PyTorch's cache held the memory,
/// in pieces too small for the request), the answer is the allocator's, not the memory's: that value
/// may fit with expandable segments, and the `--try` that checks it.
fn fragmented_above(r: &FitReport) -> String {
    let Some(h) = r.smallest_oom else {
        return String::new();
    };
    let fragmented = r
        .runs
        .iter()
        .any(|p| p.value == h && p.oom_cause == Some(crate::oom::Cause::Fragmentation));
    if !fragmented {
        return String::new();
    }
    let template: Vec<std::ffi::OsString> = r.command.iter().map(Into::into).collect();
    let Some(command) = command_for(&template, h) else {
        return String::new();
    };
    let command: Vec<String> = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!(
        "  {h} ran out through fragmentation (memory PyTorch had cached, in pieces too small): it may fit with expandable segments\n  {}\n",
        remedy::fragmentation_try(&command)
    )
}

fn why(stop: Stop) -> &'static str {
    match stop {
        Stop::Found | Stop::NothingFits => "the end",
        Stop::Runs => "the runs allowed were spent",
        Stop::Budget => "the time budget was spent",
        Stop::Failed => "a run failed for another reason than GPU memory",
        Stop::Interrupted => "it was interrupted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oom::Cause;
    use search::{Search, Verdict};

    const GIB: u64 = 1 << 30;

    fn probe(value: u64, peak: Option<u64>, cause: Option<Cause>) -> Probe {
        Probe {
            value,
            outcome: if cause.is_some() {
                Outcome::Oom
            } else {
                Outcome::Fits
            },
            guided: false,
            peak_bytes: peak,
            limit_bytes: Some(139 * GIB),
            steps: 5,
            duration_s: 20.0,
            exit_code: Some(if cause.is_some() { 1 } else { 130 }),
            classification: if cause.is_some() {
                Ending::GpuOom
            } else {
                Ending::Signal
            },
            oom_cause: cause,
        }
    }

    /// The H200's fit of tests/gpu/fit_model.py (fixtures/fit): 98 fits, 99 ran out of memory with
    /// 12.08 GiB cached but unallocated.
    fn fitted(above: Cause) -> FitReport {
        let runs = vec![
            probe(1, Some(22 * GIB), None),
            probe(98, Some(139 * GIB - GIB / 4), None),
            probe(99, Some(137 * GIB), Some(above)),
        ];
        report_of(1, runs, Stop::Found)
    }

    /// The fit of `--batch-size {}` from `min` that made `runs`.
    fn report_of(min: u64, runs: Vec<Probe>, stop: Stop) -> FitReport {
        let mut s = Search::new(min, 1 << 20, Some(139 * GIB));
        for p in &runs {
            let v = match p.oom_cause {
                Some(_) => Verdict::Oom,
                None => Verdict::Fits(p.peak_bytes),
            };
            s.record(p.value, v, false);
        }
        let command = ["python3", "train.py", "--batch-size", "{}"].map(String::from);
        let bounds = Bounds {
            min,
            max: 1 << 20,
            runs: 10,
            budget_s: 1800.0,
            steps: Some(5),
            run_for_s: None,
        };
        FitReport::build(command.to_vec(), bounds, &s, runs, stop, 60.0)
    }

    #[test]
    fn a_value_that_ran_out_through_fragmentation_gets_the_try_that_may_fit_it() {
        let text = render(&fitted(Cause::Fragmentation));
        assert!(
            text.contains("98 is the largest value that fits (99 ran out of memory)"),
            "{text}"
        );
        assert!(
            text.contains(
                "  99 ran out through fragmentation (memory PyTorch had cached, in pieces too small): it may fit with expandable segments\n  try: gpudoc run --try expandable_segments -- python3 train.py --batch-size 99 (reruns"
            ),
            "{text}"
        );
        // The job's own growth: the answer is the memory's, and no remedy is proposed.
        let text = render(&fitted(Cause::SelfGrowth));
        assert!(!text.contains("--try"), "{text}");
    }

    #[test]
    fn a_min_that_ran_out_through_fragmentation_gets_the_try_too() {
        // `--min 8`, and 8 ran out with the memory cached in pieces: nothing fits as is, and 8 is the
        // value expandable segments may make fit.
        let r = report_of(
            8,
            vec![probe(8, Some(87 * GIB), Some(Cause::Fragmentation))],
            Stop::NothingFits,
        );
        let text = render(&r);
        assert!(
            text.starts_with("gpudoc fit: nothing fits: 8 ran out of GPU memory (1 runs, "),
            "{text}"
        );
        assert!(
            text.contains(
                "  8 ran out through fragmentation (memory PyTorch had cached, in pieces too small): it may fit with expandable segments\n  try: gpudoc run --try expandable_segments -- python3 train.py --batch-size 8 (reruns"
            ),
            "{text}"
        );
    }
}
