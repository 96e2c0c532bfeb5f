//! `gpudoc fit`: orchestration only. Prints the bounds, then runs the command at the values the search
//! asks for, each through `gpudoc run`'s own machinery ([`super::run::measure`]) and ended after its steps
//! by [`crate::fit::ender`]; then the answer, and the JSON.

use crate::exit::{self, Failure};
use crate::fit::ender::EndWhen;
use crate::fit::remedy::{self, Remedy};
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

/// `gpudoc run --try REMEDY`: the command as is, then with the remedy (ended 5 optimizer steps past where
/// the first run ran out, or at its own end), both within `budget`; the two compared. Exits 0 when the
/// command fits with the remedy, 1 when it still runs out, as `gpudoc fit` otherwise (docs/fit.md).
pub fn try_remedy(
    mut s: crate::settings::RunSettings,
    remedy: Remedy,
    budget: std::time::Duration,
) -> Result<ExitCode, Failure> {
    let conf = remedy.alloc_conf(s.env.alloc_conf.as_deref());
    let shown = humantime::format_duration(budget).to_string();
    crate::say!("{}", remedy::render_plan(&remedy, &conf, &shown));
    let deadline = Instant::now() + budget;
    let mut end = EndWhen {
        steps: None,
        after: None,
        deadline,
    };
    let before = side(&s, end)?;
    if before.0.outcome == Outcome::Oom {
        end.steps = Some(before.0.steps + TRY_PAST);
    }
    s.extra_env = remedy.env(s.env.alloc_conf.as_deref());
    let after = side(&s, end)?;
    let (key, value) = remedy.setting();
    crate::say!(
        "gpudoc run --try {key}:{value}:\n{}{}",
        remedy::render_side("as is", &before.0, before.1),
        remedy::render_side("with it", &after.0, after.1)
    );
    if let (Some(t), Some(report)) = (&s.json, after.2) {
        crate::output::write(t, report.to_json().as_bytes()).map_err(|e| {
            Failure::new(exit::GPUDOC_FAILED, format!("--json {}: {e}", t.display()))
        })?;
    }
    let code = match after.0.outcome {
        Outcome::Fits => 0,
        Outcome::Oom => exit::FIT_NOTHING_FITS,
        Outcome::Cut => exit::FIT_UNSETTLED,
        Outcome::Failed => exit::FIT_RUN_FAILED,
        Outcome::Interrupted => after
            .0
            .exit_code
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(130),
    };
    Ok(ExitCode::from(code))
}

/// Steps the remedy's run goes past where the first run ran out before it counts as fitting.
const TRY_PAST: u64 = 5;

/// One run of `--try`: what it said, its fragmentation, its report.
fn side(
    s: &crate::settings::RunSettings,
    end: EndWhen,
) -> Result<(Probe, Option<u64>, Option<crate::report::Report>), Failure> {
    let m = super::run::measure(s, Some(end))?;
    let probe = Probe::of(0, false, &m.report, m.ended.map(|e| e.why));
    let fragmented = remedy::fragmentation(&m.report);
    m.child.finish();
    Ok((probe, fragmented, Some(m.report)))
}
