//! The live verdicts of a recorded run, judged again (`gpudoc report --live-verdicts`): the trace's rows
//! applied in the order of their times, and the run so far looked at every [`EVERY`], as `gpudoc run`
//! looks at it, by the same code (the analysis of the run so far, the rules, [`Verdicts`]). What would
//! have been told during the run and when, and the forecasts, from the recording alone: a forecast can be
//! checked against the run it was made in.
//!
//! The run looked every [`EVERY`] and rested longer after a slow look; the replay looks every [`EVERY`]
//! exactly, so a verdict comes at the run's look or one look earlier. A trace holds changes only: at each
//! look, every series is taken to hold its last value up to that moment, as the sampler's did. The looks
//! keep what `gpudoc run`'s keep ([`Looks`]): each takes only the rows since the last.

use super::so_far::Looks;
use super::verdicts::{EVERY, Verdicts};
use crate::analysis::{EndRow, Evidence};
use crate::oom::scan::Scanner;
use crate::replay::{Header, LoadError, ReadRow, Rebuild};
use crate::rules::RuleSet;
use crate::timeline::{Micros, Timeline};
use crate::torch::TorchTimeline;
use crate::trace::Row;
use std::path::Path;

/// The verdicts `gpudoc run` would have told, and when, over the recorded run in `path`.
pub fn verdicts(path: &Path, rules: &RuleSet) -> Result<Verdicts, LoadError> {
    let (rows, end) = timed(crate::replay::rows(path)?);
    let mut b = Rebuild::default();
    let mut verdicts = Verdicts::new(rules.live_ids());
    let mut looks = Looks::default();
    let every = EVERY.as_secs_f64();
    let mut look = every;
    let mut last = 0.0;
    for (at, n, row) in rows {
        while at > look {
            let r = look_at(&b, end.as_ref(), look, rules, &mut looks);
            verdicts.observe(&r, look);
            look += every;
        }
        b.apply(row)
            .map_err(|what| crate::replay::bad(path, n, what))?;
        last = at;
    }
    // The looks still to come before the command ended; a trace without its end stops at its last row.
    let until = end.as_ref().map_or(last, |e| e.duration_s);
    while look <= until {
        let r = look_at(&b, end.as_ref(), look, rules, &mut looks);
        verdicts.observe(&r, look);
        look += every;
    }
    Ok(verdicts)
}

/// A row, its time (seconds into the run) and its line.
type Timed = (f64, usize, ReadRow);

/// The rows but the end one, each with its time and line, in the order of their times (rows of the same
/// time keep theirs); and the end row. A shim's message is timed by its own clock where it has one, else
/// it comes with the row before it.
fn timed(rows: Vec<(usize, ReadRow)>) -> (Vec<Timed>, Option<EndRow>) {
    let mut out = Vec::with_capacity(rows.len());
    let (mut end, mut unix_s, mut at) = (None, 0.0, 0.0);
    for (n, row) in rows {
        at = match &row {
            Row::Start { unix_s: u, .. } => {
                unix_s = *u;
                0.0
            }
            Row::Device { t, .. } | Row::Process { t, .. } | Row::Job { t, .. } => *t,
            Row::Lost { t, .. } => *t,
            Row::Torch { m } => m
                .get("t")
                .and_then(|t| t.as_f64())
                .map_or(at, |t| t - unix_s),
            Row::End { end: e } => {
                end = Some(EndRow::clone(e));
                continue;
            }
        };
        out.push((at, n, row));
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    (out, end)
}

/// One look at the run so far, at `at_s` seconds into it, as `gpudoc run` looks: `looks`' copies of the
/// timelines brought up to date with the rows since the look before, and the analysis reading on from
/// where it stopped then.
fn look_at(
    b: &Rebuild,
    end: Option<&EndRow>,
    at_s: f64,
    rules: &RuleSet,
    looks: &mut Looks,
) -> crate::report::Report {
    let header = b.catch_up(&mut looks.timeline, &mut looks.torch).clone();
    hold_to(&mut looks.timeline, (at_s * 1e6).round() as Micros);
    looks.analyze(
        |timeline, torch| so_far(header, timeline, torch, end, at_s),
        rules,
    )
}

/// The evidence of the run so far at `at_s`: what the rows so far give, and what the run knew from its
/// start on that only the end row carries (the driver's reserve, NVML's status, the rates).
fn so_far(
    header: Header,
    mut timeline: Timeline,
    torch: TorchTimeline,
    end: Option<&EndRow>,
    at_s: f64,
) -> Evidence {
    if let Some(e) = end {
        e.complete(&mut timeline);
    }
    let mut scanner = Scanner::new();
    scanner.events = end
        .map(|e| {
            e.oom_events
                .iter()
                .filter(|o| o.at_s <= at_s)
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    let shim = end.is_some_and(|e| e.torch_enabled) || torch.messages > 0;
    Evidence {
        origin: header.origin,
        command: header.command,
        started_unix_s: header.unix_s,
        nvml: end
            .and_then(|e| e.nvml.clone())
            .or(header.nvml)
            .unwrap_or_default(),
        rates: end.map(EndRow::rates).unwrap_or_default(),
        timeline,
        torch: shim.then_some(torch),
        scanner,
        ..Evidence::default()
    }
}

/// Every series still going holds its last value up to `at`: the samples the trace did not write
/// because nothing changed.
fn hold_to(t: &mut Timeline, at: Micros) {
    for g in t.gpus.iter_mut().filter(|g| g.lost.is_none()) {
        for s in [&mut g.used, &mut g.job] {
            if let Some(v) = s.last().filter(|_| s.last_at() < at) {
                s.push(at, v);
            }
        }
    }
    for p in t.procs.values_mut() {
        if let Some(v) = p.used.last().filter(|&v| v > 0 && p.used.last_at() < at) {
            p.used.push(at, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::so_far::Sources;
    use super::*;
    use crate::report::Report;
    use crate::rules::RunRules;
    use std::sync::{Arc, Mutex};

    /// A run whose samplers have what a trace's rows so far give, and `gpudoc run`'s looks at it.
    struct Run {
        nvml: Arc<Mutex<Timeline>>,
        torch: Arc<Mutex<TorchTimeline>>,
        rules: Arc<RunRules>,
    }

    impl Run {
        /// What a look reads, with nothing kept from a look before.
        fn sources(&self) -> Sources {
            let nvml = self.nvml.clone();
            Sources {
                timeline: Box::new(move |copy: &mut Timeline| {
                    copy.catch_up(&nvml.lock().unwrap());
                    None
                }),
                torch: Some(self.torch.clone()),
                scanner: Default::default(),
                rules: self.rules.clone(),
                origin: Default::default(),
                command: vec!["python3".into()],
                started_unix_s: 0.0,
                rates: Default::default(),
                seen: Default::default(),
            }
        }

        /// The samplers have what `b` rebuilt so far.
        fn at(&self, b: &Rebuild) {
            *self.nvml.lock().unwrap() = b.trace().timeline.clone();
            *self.torch.lock().unwrap() = b.trace().torch.clone();
        }
    }

    /// The looks at a recorded run, replayed row by row, every 2 s. `gpudoc run`'s looks
    /// (`Sources::report`), which keep their copies of the timelines and what the analysis read of them
    /// from look to look, each give the report a look with nothing kept gives: the whole run so far
    /// copied and analyzed from its start. So do the replay's own looks ([`look_at`], which keep theirs
    /// the same way, a job summed from process rows included). The number of looks, and the replay's
    /// last report.
    fn looks_match_whole_runs(trace: &str, run: &Run) -> (usize, Report) {
        looks_match_whole_runs_of(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join(trace),
            trace,
            run,
        )
    }

    fn looks_match_whole_runs_of(path: &Path, trace: &str, run: &Run) -> (usize, Report) {
        let (rows, end) = timed(crate::replay::rows(path).unwrap());
        let end = end.as_ref();
        let (mut b, kept, mut replayed) = (Rebuild::default(), run.sources(), Looks::default());
        let mut look = |b: &Rebuild, at_s: f64| {
            run.at(b);
            let (mine, whole) = (kept.report(), run.sources().report());
            assert_eq!(mine, whole, "{trace}: gpudoc run's look at {at_s} s");
            let rules = run.rules.get();
            let mine = look_at(b, end, at_s, rules, &mut replayed);
            let whole = look_at(b, end, at_s, rules, &mut Looks::default());
            assert_eq!(mine, whole, "{trace}: the replay's look at {at_s} s");
            whole
        };
        let (mut at_s, mut looks) = (EVERY.as_secs_f64(), 0);
        for (at, n, row) in rows {
            while at > at_s {
                look(&b, at_s);
                (at_s, looks) = (at_s + EVERY.as_secs_f64(), looks + 1);
            }
            b.apply(row)
                .unwrap_or_else(|e| panic!("{trace} line {n}: {e}"));
        }
        (looks, look(&b, end.unwrap().duration_s))
    }

    /// Real runs: a step leak on the H200; a leak run out of memory on the H200 (memory that climbs to
    /// its OOM: the processes' peaks, so the bars of their longest stretches high, move at every look);
    /// an OOM on one of two H200s under DDP; an inference server caching its outputs on an H100.
    #[test]
    fn looks_that_read_only_what_is_new_report_what_whole_run_analyses_report() {
        let run = Run {
            nvml: Default::default(),
            torch: Default::default(),
            rules: Arc::new(RunRules::ready(RuleSet::load(None, &[]).unwrap())),
        };
        let told = |r: &Report, rule: &str| r.diagnoses.iter().any(|d| d.rule == rule);
        let (looks, r) = looks_match_whole_runs("fixtures/leaks/list.trace.jsonl", &run);
        assert!(looks >= 5 && told(&r, "step-leak"), "{looks} looks");
        let (looks, r) = looks_match_whole_runs("fixtures/forecast/leak.trace.jsonl", &run);
        assert!(looks >= 40 && r.oom.is_some(), "{looks} looks");
        let (looks, r) = looks_match_whole_runs("fixtures/multi/oom.trace.jsonl", &run);
        assert!(
            looks >= 5 && r.gpus.len() == 2 && r.oom.is_some(),
            "{looks}"
        );
        let (looks, _) =
            looks_match_whole_runs("fixtures/phases/h100/infer_cache.trace.jsonl", &run);
        assert!(looks >= 5, "{looks} looks");
        // The step leak without its job rows, as gpudoc.trace/1 wrote none: the job's memory summed from
        // the process rows at each look.
        let list = include_str!("../../fixtures/leaks/list.trace.jsonl");
        let rows: Vec<&str> = list
            .lines()
            .filter(|l| !l.contains(r#""kind":"job""#))
            .collect();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), rows.join("\n") + "\n").unwrap();
        let (looks, r) = looks_match_whole_runs_of(file.path(), "list without job rows", &run);
        assert!(looks >= 5 && r.gpus[0].job_peak_bytes > 0, "{looks} looks");
    }
}
