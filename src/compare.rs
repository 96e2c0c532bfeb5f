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
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Change {
    pub gpu: u32,
    /// In words: `job peak (NVML)`, `device peak (NVML)`, `PyTorch reserved peak`, `PyTorch allocated peak`.
    pub measure: String,
    /// The same, for programs: `job_peak`, `device_peak`, `reserved_peak`, `allocated_peak`.
    pub measure_id: String,
    pub old_bytes: Option<u64>,
    pub new_bytes: Option<u64>,
    pub delta_bytes: i64,
    pub delta_pct: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Comparison {
    pub schema: &'static str,
    pub old: String,
    pub new: String,
    pub changes: Vec<Change>,
    /// `rule (severity, subject)` found only in the new run, only in the old, in both.
    pub rules_added: Vec<String>,
    pub rules_removed: Vec<String>,
    pub rules_kept: Vec<String>,
    /// The same diagnoses, as fields.
    pub diagnoses_added: Vec<Found>,
    pub diagnoses_removed: Vec<Found>,
    pub diagnoses_kept: Vec<Found>,
    pub old_duration_s: f64,
    pub new_duration_s: f64,
}

/// A diagnosis as `compare` matches it: a rule about a subject.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Found {
    pub rule: String,
    pub severity: crate::verdict::Severity,
    pub subject: String,
    pub gpu: Option<String>,
    pub pid: Option<u32>,
}

/// Each diagnosis under its `rule (severity, subject)` key.
fn keyed(r: &Report) -> std::collections::BTreeMap<String, Found> {
    r.diagnoses
        .iter()
        .map(|d| {
            let key = format!("{} ({}, {})", d.rule, d.severity.name(), d.subject);
            let found = Found {
                rule: d.rule.clone(),
                severity: d.severity,
                subject: d.subject.clone(),
                gpu: d.gpu.clone(),
                pid: d.pid,
            };
            (key, found)
        })
        .collect()
}

/// A measure's value per GPU index.
type PerGpu = fn(&Report) -> std::collections::BTreeMap<u32, u64>;

/// Compares two reports (already diagnosed with the same rules).
pub fn compare(old: &Report, new: &Report, old_name: &str, new_name: &str) -> Comparison {
    let mut changes = Vec::new();
    let measures: [(&str, &str, PerGpu); 4] = [
        ("job peak (NVML)", "job_peak", |r| {
            measured(r, Measure::Nvml)
        }),
        ("device peak (NVML)", "device_peak", |r| {
            r.gpus
                .iter()
                .map(|g| (g.index, g.peak_used_bytes))
                .collect()
        }),
        ("PyTorch reserved peak", "reserved_peak", |r| {
            measured(r, Measure::Reserved)
        }),
        ("PyTorch allocated peak", "allocated_peak", |r| {
            measured(r, Measure::Allocated)
        }),
    ];
    for (name, id, f) in &measures {
        let (a, b) = (f(old), f(new));
        let gpus: BTreeSet<u32> = a.keys().chain(b.keys()).copied().collect();
        for g in gpus {
            let (o, n) = (a.get(&g).copied(), b.get(&g).copied());
            let delta = n.unwrap_or(0) as i64 - o.unwrap_or(0) as i64;
            changes.push(Change {
                gpu: g,
                measure: name.to_string(),
                measure_id: id.to_string(),
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
    let pick = |from: &std::collections::BTreeMap<String, Found>,
                keep: &dyn Fn(&String) -> bool| {
        let keys: Vec<String> = from.keys().filter(|k| keep(k)).cloned().collect();
        let found: Vec<Found> = keys.iter().map(|k| from[k].clone()).collect();
        (keys, found)
    };
    let (rules_added, diagnoses_added) = pick(&kn, &|k| !ko.contains_key(k));
    let (rules_removed, diagnoses_removed) = pick(&ko, &|k| !kn.contains_key(k));
    let (rules_kept, diagnoses_kept) = pick(&kn, &|k| ko.contains_key(k));
    Comparison {
        schema: "gpudoc.compare/1",
        old: old_name.into(),
        new: new_name.into(),
        changes,
        rules_added,
        rules_removed,
        rules_kept,
        diagnoses_added,
        diagnoses_removed,
        diagnoses_kept,
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
