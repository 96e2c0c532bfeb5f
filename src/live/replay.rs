//! The live verdicts of a recorded run, judged again (`gpudoc report --live-verdicts`): the trace's rows
//! applied in the order of their times, and the run so far looked at every [`EVERY`], as `gpudoc run`
//! looks at it, by the same code (the analysis of the run so far, the rules, [`Verdicts`]). What would
//! have been told during the run and when, and the forecasts, from the recording alone: a forecast can be
//! checked against the run it was made in.
//!
//! The run looked every [`EVERY`] and rested longer after a slow look; the replay looks every [`EVERY`]
//! exactly, so a verdict comes at the run's look or one look earlier. A trace holds changes only: at each
//! look, every series is taken to hold its last value up to that moment, as the sampler's did.

use super::verdicts::{EVERY, Verdicts};
use crate::analysis::{self, EndRow, Evidence};
use crate::oom::scan::Scanner;
use crate::replay::{Header, LoadError, ReadRow, Rebuild, Trace};
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
    let every = EVERY.as_secs_f64();
    let mut look = every;
    let mut last = 0.0;
    for (at, n, row) in rows {
        while at > look {
            observe(&b, end.as_ref(), look, rules, &mut verdicts);
            look += every;
        }
        b.apply(row)
            .map_err(|what| crate::replay::bad(path, n, what))?;
        last = at;
    }
    // The looks still to come before the command ended; a trace without its end stops at its last row.
    let until = end.as_ref().map_or(last, |e| e.duration_s);
    while look <= until {
        observe(&b, end.as_ref(), look, rules, &mut verdicts);
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

/// One look at the run so far, at `at_s` seconds into it.
fn observe(b: &Rebuild, end: Option<&EndRow>, at_s: f64, rules: &RuleSet, v: &mut Verdicts) {
    let Trace {
        header,
        mut timeline,
        torch,
        ..
    } = b.so_far();
    hold_to(&mut timeline, (at_s * 1e6).round() as Micros);
    let ev = so_far(header, timeline, torch, end, at_s);
    v.observe(&analysis::analyze_so_far(&ev, rules), at_s);
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
    use super::*;

    /// A look that brings its copy of the timeline up to date with the rows since the last look
    /// (`Timeline::catch_up`, as `gpudoc run`'s looks do) sees the run as a look that copies the whole
    /// timeline: at every look of a recorded run replayed row by row, and at its end, where the final
    /// report is the same too.
    #[test]
    fn looks_that_take_only_the_new_samples_see_the_run_as_whole_copies_do() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/leaks/list.trace.jsonl"
        ));
        let rules = RuleSet::load(None, &[]).unwrap();
        let (rows, end) = timed(crate::replay::rows(path).unwrap());
        let end = end.as_ref();
        let mut b = Rebuild::default();
        let mut seen = Timeline::default();
        let both = |b: &Rebuild, seen: &mut Timeline, at_s: f64| {
            seen.catch_up(&b.trace().timeline);
            let (header, torch) = (b.trace().header.clone(), b.trace().torch.clone());
            let whole = so_far(
                header.clone(),
                b.trace().timeline.clone(),
                torch.clone(),
                end,
                at_s,
            );
            let mine = so_far(header, std::mem::take(seen), torch, end, at_s);
            let reports = (
                analysis::analyze_so_far(&mine, &rules),
                analysis::analyze_so_far(&whole, &rules),
            );
            *seen = mine.timeline;
            reports
        };
        let (mut look, mut looks) = (EVERY.as_secs_f64(), 0);
        for (at, n, row) in rows {
            while at > look {
                let (mine, whole) = both(&b, &mut seen, look);
                assert_eq!(mine, whole, "at {look} s");
                (look, looks) = (look + EVERY.as_secs_f64(), looks + 1);
            }
            b.apply(row).unwrap_or_else(|e| panic!("line {n}: {e}"));
        }
        assert!(looks >= 5, "{looks} looks");
        let (mine, whole) = both(&b, &mut seen, end.unwrap().duration_s);
        assert_eq!(mine, whole);
        assert!(
            whole.diagnoses.iter().any(|d| d.rule == "step-leak"),
            "{:?}",
            whole.diagnoses
        );
        // The run's final report, from the looks' copy and from the whole timeline.
        let last = |timeline: Timeline| {
            let mut ev = so_far(
                b.trace().header.clone(),
                timeline,
                b.trace().torch.clone(),
                end,
                1e9,
            );
            ev.outcome = end.unwrap().outcome();
            analysis::analyze(ev, &rules)
        };
        assert_eq!(last(seen), last(b.trace().timeline.clone()));
    }
}
