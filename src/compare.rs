//! `gpudoc compare OLD NEW`: what changed between two runs, per GPU and per rule, for reviewing a
//! regression the gate caught.

use crate::gate::measured;
use crate::paint::Paint;
use crate::report::Report;
use crate::units::fmt_bytes;
use crate::verdict::Measure;
use serde::Serialize;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// One measure on one GPU in both runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub gpu: u32,
    pub measure: String,
    pub old_bytes: Option<u64>,
    pub new_bytes: Option<u64>,
    pub delta_bytes: i64,
    pub delta_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub schema: &'static str,
    pub old: String,
    pub new: String,
    pub changes: Vec<Change>,
    /// `rule (subject)` found only in the new run, only in the old, in both.
    pub rules_added: Vec<String>,
    pub rules_removed: Vec<String>,
    pub rules_kept: Vec<String>,
    pub old_duration_s: f64,
    pub new_duration_s: f64,
}

fn keyed(r: &Report) -> BTreeSet<String> {
    r.diagnoses
        .iter()
        .map(|d| format!("{} ({}, {})", d.rule, d.severity.name(), d.subject))
        .collect()
}

/// A measure's value per GPU index.
type PerGpu = fn(&Report) -> std::collections::BTreeMap<u32, u64>;

/// Compares two reports (already diagnosed with the same rules).
pub fn compare(old: &Report, new: &Report, old_name: &str, new_name: &str) -> Comparison {
    let mut changes = Vec::new();
    let measures: [(&str, PerGpu); 4] = [
        ("job peak (NVML)", |r| measured(r, Measure::Nvml)),
        ("device peak (NVML)", |r| {
            r.gpus
                .iter()
                .map(|g| (g.index, g.peak_used_bytes))
                .collect()
        }),
        ("PyTorch reserved peak", |r| measured(r, Measure::Reserved)),
        ("PyTorch allocated peak", |r| {
            measured(r, Measure::Allocated)
        }),
    ];
    for (name, f) in &measures {
        let (a, b) = (f(old), f(new));
        let gpus: BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
        for g in gpus {
            let (o, n) = (a.get(&g).copied(), b.get(&g).copied());
            let delta = n.unwrap_or(0) as i64 - o.unwrap_or(0) as i64;
            changes.push(Change {
                gpu: g,
                measure: name.to_string(),
                old_bytes: o,
                new_bytes: n,
                delta_bytes: delta,
                delta_pct: o
                    .filter(|&x| x > 0)
                    .map(|x| delta as f64 * 100.0 / x as f64),
            });
        }
    }
    changes.sort_by_key(|c| c.gpu);
    let (ko, kn) = (keyed(old), keyed(new));
    Comparison {
        schema: "gpudoc.compare/1",
        old: old_name.into(),
        new: new_name.into(),
        changes,
        rules_added: kn.difference(&ko).cloned().collect(),
        rules_removed: ko.difference(&kn).cloned().collect(),
        rules_kept: ko.intersection(&kn).cloned().collect(),
        old_duration_s: old.duration_s,
        new_duration_s: new.duration_s,
    }
}

fn signed(d: i64) -> String {
    if d < 0 {
        format!("-{}", fmt_bytes(d.unsigned_abs()))
    } else {
        format!("+{}", fmt_bytes(d as u64))
    }
}

/// The comparison for people.
pub fn render(c: &Comparison, p: Paint) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "{} {} → {}", p.bold("gpudoc compare:"), c.old, c.new);
    let mut last = None;
    for ch in &c.changes {
        if last != Some(ch.gpu) {
            let _ = writeln!(o, "  GPU {}", ch.gpu);
            last = Some(ch.gpu);
        }
        let v = |b: Option<u64>| b.map(fmt_bytes).unwrap_or_else(|| "-".into());
        let pct = ch
            .delta_pct
            .map(|p| format!(" ({p:+.1}%)"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "    {:<24} {:>11} → {:<11} {}{pct}",
            ch.measure,
            v(ch.old_bytes),
            v(ch.new_bytes),
            signed(ch.delta_bytes)
        );
    }
    let _ = writeln!(
        o,
        "  duration {:.1} s → {:.1} s",
        c.old_duration_s, c.new_duration_s
    );
    for (sign, list) in [
        (p.bad("+"), &c.rules_added),
        (p.good("-"), &c.rules_removed),
        (p.dim("="), &c.rules_kept),
    ] {
        for r in list {
            let _ = writeln!(o, "  {sign} {r}");
        }
    }
    if c.rules_added.is_empty() && c.rules_removed.is_empty() && c.rules_kept.is_empty() {
        let _ = writeln!(o, "  no diagnosis in either run");
    }
    o
}
