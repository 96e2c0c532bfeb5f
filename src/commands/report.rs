//! `gpudoc report FILE`: diagnose a saved run again with the rules in force.

use crate::exit::{self, Failure};
use crate::output::{self, Target};
use crate::report::Report;
use crate::settings::ReportSettings;
use crate::{replay, rules, summary};
use std::process::ExitCode;

pub fn run(s: ReportSettings) -> Result<ExitCode, Failure> {
    let mut reports = Vec::new();
    // The samples themselves, for the page and the event file of one trace: a merge keeps each node's
    // summary.
    let samples = (s.html.is_some() || s.tensorboard.is_some()) && s.files.len() == 1;
    let mut timeline = None;
    for f in &s.files {
        let (mut r, t) = replay::load_with_timeline(f, s.output.as_deref(), &s.rules, samples)
            .map_err(|e| Failure::new(exit::USAGE, e))?;
        if s.live_verdicts {
            live_verdicts(f, &s, &mut r)?;
        }
        reports.push(r);
        timeline = t;
    }
    let labels: Vec<String> = s.files.iter().map(|f| f.display().to_string()).collect();
    let parts: Vec<(&str, &crate::report::Report)> =
        labels.iter().map(String::as_str).zip(&reports).collect();
    crate::merge::one_job(&parts).map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
    let mut report = crate::merge::merge(reports).map_err(|e| Failure::new(exit::USAGE, e))?;
    if !report.hosts.is_empty() {
        rules::diagnose(&mut report, &s.rules);
    }
    if let Some(dir) = &s.tensorboard {
        crate::tensorboard::write(dir, &report, timeline.as_ref()).map_err(|e| {
            Failure::new(exit::USAGE, format!("--tensorboard {}: {e}", dir.display()))
        })?;
    }
    if let Some(t) = &s.html {
        crate::html::write(t, &report, timeline.as_ref()).map_err(|e| match t {
            Target::Stdout => Failure::printing(e, exit::USAGE),
            Target::File(_) => Failure::new(exit::USAGE, format!("--html {}: {e}", t.display())),
        })?;
    }
    if s.facts {
        let facts = serde_json::to_string_pretty(&rules::facts::Facts::of(&report))
            .expect("facts serialize");
        output::stdout(&(facts + "\n")).map_err(|e| Failure::printing(e, exit::USAGE))?;
        return Ok(ExitCode::SUCCESS);
    }
    let text = summary::render(&report, s.paint);
    if s.json == Some(Target::Stdout) || s.html == Some(Target::Stdout) {
        crate::say!("{text}");
    } else {
        output::stdout(&text).map_err(|e| Failure::printing(e, exit::USAGE))?;
    }
    if let Some(t) = &s.json {
        output::write(t, report.to_json().as_bytes()).map_err(|e| match t {
            Target::Stdout => Failure::printing(e, exit::USAGE),
            Target::File(_) => Failure::new(exit::USAGE, format!("--json {}: {e}", t.display())),
        })?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Marks in `r`, the report of the trace `f`, what its run's live verdicts told and when.
fn live_verdicts(f: &std::path::Path, s: &ReportSettings, r: &mut Report) -> Result<(), Failure> {
    if !replay::is_trace(f) {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "--live-verdicts: {} is a report, which keeps a summary of the samples: give the run's trace (--trace)",
                f.display()
            ),
        ));
    }
    let v = crate::live::replay::verdicts(f, &s.rules)
        .map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
    v.annotate(r);
    Ok(())
}
