//! Live verdicts: the rules judged during the run, on the run so far, by the same code as at its end
//! (the caller diagnoses the report of the run so far; this decides what of it is told). A rule is
//! judged live when its file says `live = true`. Each cause (a rule and what it is about: `step-leak`
//! for `pid 1234`) is told at most once, and only once its diagnosis has held in [`CONFIRM`]
//! evaluations in a row: a diagnosis that comes and goes is never told, and one told is never taken
//! back. A told diagnosis that forecasts ([`forecast`](super::forecast)) keeps its forecast up to date.
//! Pure: the thread that evaluates and the words are the command's.

use super::forecast::{self, Outlook};
use crate::report::Report;
use crate::verdict::{Diagnosis, Forecast};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// Evaluations in a row a diagnosis must hold in before it is told (`live_confirm_looks`).
pub const CONFIRM: u32 = crate::params::LIVE_CONFIRM.uint() as u32;
/// The shortest time between two evaluations of the run so far.
pub const EVERY: Duration = Duration::from_secs(2);

/// A cause: the rule and what it is about.
type Cause = (String, String);

/// What has been seen and told so far.
#[derive(Debug, Default, Clone)]
pub struct Verdicts {
    live: HashSet<String>,
    /// Evaluations in a row each cause not yet told has held in.
    streak: BTreeMap<Cause, u32>,
    told: BTreeMap<Cause, Told>,
}

/// A diagnosis told during the run, and its forecast.
#[derive(Debug, Clone, PartialEq)]
pub struct Told {
    pub diagnosis: Diagnosis,
    /// Seconds into the run.
    pub at_s: f64,
    pub forecast: Option<Forecast>,
}

impl Verdicts {
    /// Judges the rules with these ids live.
    pub fn new(live: impl IntoIterator<Item = String>) -> Verdicts {
        Verdicts {
            live: live.into_iter().collect(),
            ..Verdicts::default()
        }
    }

    /// Takes one evaluation (`r`, the run so far, diagnosed, at `now_s`): the diagnoses to tell now,
    /// each with its first forecast. Forecasts of those told before are brought up to date.
    pub fn observe(&mut self, r: &Report, now_s: f64) -> Vec<Told> {
        let mut held = HashSet::new();
        let mut new = Vec::new();
        for d in r.diagnoses.iter().filter(|d| self.live.contains(&d.rule)) {
            let cause = (d.rule.clone(), d.subject.clone());
            let outlook = forecast::outlook(r, d, now_s);
            if let Some(t) = self.told.get_mut(&cause) {
                update(t, outlook);
                continue;
            }
            held.insert(cause.clone());
            let streak = self.streak.entry(cause.clone()).or_default();
            *streak += 1;
            if *streak >= CONFIRM {
                let t = Told {
                    diagnosis: d.clone(),
                    at_s: now_s,
                    forecast: outlook.map(|o| first(d, o)),
                };
                self.told.insert(cause, t.clone());
                new.push(t);
            }
        }
        // A streak is of evaluations in a row: one that did not hold starts it again.
        self.streak
            .retain(|c, _| held.contains(c) && !self.told.contains_key(c));
        new
    }

    /// Everything told so far, in the order of the rules' causes.
    pub fn told(&self) -> impl Iterator<Item = &Told> {
        self.told.values()
    }

    /// Marks in `r` (the run's final report, or a report of the run so far) when each of its diagnoses
    /// was first known, and puts in the forecasts.
    pub fn annotate(&self, r: &mut Report) {
        let told = |rule: &str, subject: &str| {
            let t = self.told.get(&(rule.to_string(), subject.to_string()));
            t.map(|t| t.at_s)
        };
        for d in &mut r.diagnoses {
            d.known_at_s = told(&d.rule, &d.subject).or(d.known_at_s);
            for p in &mut d.parts {
                p.known_at_s = told(&p.rule, &p.subject).or(p.known_at_s);
            }
        }
        r.forecasts = self.told().filter_map(|t| t.forecast.clone()).collect();
    }
}

fn first(d: &Diagnosis, o: Outlook) -> Forecast {
    Forecast {
        rule: d.rule.clone(),
        subject: d.subject.clone(),
        gpu: o.gpu,
        first: o.estimate,
        last: o.estimate,
        held_by: o.held_by,
    }
}

/// A told diagnosis' forecast, firmer: the latest estimate (the first stays as it was said).
fn update(t: &mut Told, o: Option<Outlook>) {
    let Some(o) = o else { return };
    match &mut t.forecast {
        Some(f) => {
            f.last = o.estimate;
            f.held_by = o.held_by.or(f.held_by.take());
        }
        None => t.forecast = Some(first(&t.diagnosis, o)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::Severity;

    fn report(rules: &[&str]) -> Report {
        let mut r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/healthy.report.json"
        )))
        .unwrap();
        r.diagnoses = rules
            .iter()
            .map(|id| Diagnosis {
                rule: id.to_string(),
                severity: Severity::Warn,
                title: "t".into(),
                subject: "GPU 0".into(),
                message: "m".into(),
                details: Vec::new(),
                advice: Vec::new(),
                docs: None,
                gpu: Some(crate::ident::GpuRef::new(None, 0)),
                pid: None,
                at_s: None,
                facts: Default::default(),
                known_at_s: None,
                parts: Vec::new(),
            })
            .collect();
        r
    }

    #[test]
    fn a_cause_is_told_once_after_holding_in_a_row() {
        let mut v = Verdicts::new(["step-leak".to_string()]);
        assert!(v.observe(&report(&["step-leak"]), 1.0).is_empty());
        // It went away: the streak starts again.
        assert!(v.observe(&report(&[]), 2.0).is_empty());
        assert!(v.observe(&report(&["step-leak"]), 3.0).is_empty());
        let told = v.observe(&report(&["step-leak"]), 4.0);
        assert_eq!(told.len(), 1);
        assert_eq!(told[0].at_s, 4.0);
        // Never again, whether it holds or comes and goes.
        assert!(v.observe(&report(&["step-leak"]), 5.0).is_empty());
        assert!(v.observe(&report(&[]), 6.0).is_empty());
        assert!(v.observe(&report(&["step-leak"]), 7.0).is_empty());
        assert!(v.observe(&report(&["step-leak"]), 8.0).is_empty());
        let mut end = report(&["step-leak"]);
        v.annotate(&mut end);
        assert_eq!(end.diagnoses[0].known_at_s, Some(4.0));
    }

    #[test]
    fn rules_not_judged_live_are_never_told() {
        let mut v = Verdicts::new(["step-leak".to_string()]);
        for t in 0..5 {
            assert!(v.observe(&report(&["oom-cap"]), t as f64).is_empty());
        }
    }
}
