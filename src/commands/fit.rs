//! `gpudoc fit`: orchestration only. Prints the bounds, then runs the command at the values the search
//! asks for, each through `gpudoc run`'s own machinery ([`super::run::measure`]) and ended after its steps
//! by [`crate::fit::ender`]; then the answer, and the JSON.

use crate::exit::{self, Failure};
use crate::fit::ender::EndWhen;
use crate::fit::search::{Next, Search, Verdict};
use crate::fit::{self, FitReport, Outcome, Probe, Stop};
use crate::settings::FitSettings;
use std::process::ExitCode;
use std::time::Instant;

pub fn run(mut s: FitSettings) -> Result<ExitCode, Failure> {
    // SAFETY: no thread has started yet; everything below starts after the split.
    let _ = unsafe { crate::supervise::guard::split() };
    s.run.rules.start();
    crate::say!("{}", fit::render_bounds(&s.bounds));
    let started = Instant::now();
    let deadline = started + s.budget;
    let mut search = Search::new(s.bounds.min, s.bounds.max, None);
    let mut probes: Vec<Probe> = Vec::new();
    let stop = loop {
        let (value, guided) = match search.next() {
            Next::Done(Some(_)) => break Stop::Found,
            Next::Done(None) => break Stop::NothingFits,
            Next::Run { value, guided } => (value, guided),
        };
        if probes.len() as u64 >= s.bounds.runs {
            break Stop::Runs;
        }
        if Instant::now() >= deadline {
            break Stop::Budget;
        }
        let probe = probe(&mut s, value, guided, deadline)?;
        crate::say!(
            "{}",
            fit::render_probe(probes.len() + 1, s.bounds.runs, &probe)
        );
        let outcome = probe.outcome;
        if search.limit.is_none() {
            search.limit = probe.limit_bytes;
        }
        probes.push(probe.clone());
        match outcome {
            Outcome::Fits => search.record(value, Verdict::Fits(probe.peak_bytes), guided),
            Outcome::Oom => search.record(value, Verdict::Oom, guided),
            Outcome::Failed => break Stop::Failed,
            Outcome::Cut => break Stop::Budget,
            Outcome::Interrupted => break Stop::Interrupted,
        }
    };
    let command = s
        .template
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let report = FitReport::build(
        command,
        s.bounds.clone(),
        &search,
        probes,
        stop,
        started.elapsed().as_secs_f64(),
    );
    crate::say!("{}", fit::render(&report));
    if let Some(t) = &s.json {
        crate::output::write(t, report.to_json().as_bytes()).map_err(|e| {
            Failure::new(exit::GPUDOC_FAILED, format!("--json {}: {e}", t.display()))
        })?;
    }
    Ok(ExitCode::from(report.exit_code()))
}

/// One run at `value`, ended after its steps (or its time, or at the budget's end).
fn probe(
    s: &mut FitSettings,
    value: u64,
    guided: bool,
    deadline: Instant,
) -> Result<Probe, Failure> {
    s.run.command = fit::command_for(&s.template, value).expect("checked when resolved");
    let end = EndWhen {
        steps: s.bounds.steps,
        after: s.run_for,
        deadline,
    };
    let m = super::run::measure(&s.run, Some(end))?;
    let probe = Probe::of(value, guided, &m.report, m.ended.map(|e| e.why));
    m.child.finish();
    Ok(probe)
}
