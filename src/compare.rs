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
    /// `rule (severity, place)` found only in the new run, only in the old, in both (matched by rule,
    /// severity and place, never by pid).
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

/// A diagnosis as `compare` matches it: a rule about a place.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct Found {
    pub rule: String,
    pub severity: crate::verdict::Severity,
    pub subject: String,
    /// What it is matched by across runs: the GPU, the rank and the allocation site it names (`GPU 0,
    /// rank 1, train.py:26`), never the pid, which differs in every run.
    pub place: String,
    pub gpu: Option<String>,
    pub pid: Option<u32>,
}

/// Where a diagnosis is, in words that stay the same from run to run: its GPU, its process's rank and
/// the allocation site its facts hold; the subject when it is no process (`run`, `GPU 0`).
fn place(r: &Report, d: &crate::verdict::Diagnosis) -> String {
    let Some(pid) = d.pid else {
        return d
            .gpu
            .as_ref()
            .map_or_else(|| d.subject.clone(), |g| g.to_string());
    };
    let rank = r
        .torch
        .processes
        .iter()
        .find(|t| t.pid == pid)
        .and_then(|t| t.rank.as_ref())
        .map(|v| format!("rank {}", v.as_str().map_or(v.to_string(), str::to_string)));
    // The first allocation site the facts it read hold (`torch.leak_sites`, `gpu.growth_sites`,
    // `oom.sites`): `dir/file.py:26`. A report is diagnosed again before it is compared, so one stored
    // before sites were records has them too.
    let site = d.facts.values().find_map(|v| {
        let s = v.as_array()?.first()?;
        let (file, line) = (s.get("file")?.as_str()?, s.get("line")?.as_i64()?);
        Some(format!("{}:{line}", crate::units::path_tail(file)))
    });
    let gpu = d.gpu.as_ref().map(|g| g.to_string());
    let parts: Vec<String> = [gpu, rank, site].into_iter().flatten().collect();
    if parts.is_empty() {
        // A process on no one GPU: the same words without the pid (`pid 12 on node-a` → `a process on
        // node-a`).
        let host = d.subject.split_once(" on ").map(|(_, h)| h);
        return host.map_or("a process".into(), |h| format!("a process on {h}"));
    }
    parts.join(", ")
}

/// Each diagnosis under its `rule (severity, place)` key; a key several diagnoses share (four workers
/// on one GPU) holds them all, so that their number is compared.
fn keyed(r: &Report) -> std::collections::BTreeMap<String, Vec<Found>> {
    let mut out: std::collections::BTreeMap<String, Vec<Found>> = Default::default();
    for d in &r.diagnoses {
        let place = place(r, d);
        let key = format!("{} ({}, {place})", d.rule, d.severity.name());
        out.entry(key).or_default().push(Found {
            rule: d.rule.clone(),
            severity: d.severity,
            subject: d.subject.clone(),
            place,
            gpu: d.gpu.as_ref().map(|g| g.to_string()),
            pid: d.pid,
        });
    }
    out
}

/// The diagnoses of `from` beyond the first `skip(key)` under each key, and their keys.
fn beyond(
    from: &std::collections::BTreeMap<String, Vec<Found>>,
    skip: impl Fn(&str) -> usize,
) -> (Vec<String>, Vec<Found>) {
    from.iter()
        .flat_map(|(k, v)| v.iter().skip(skip(k)).map(move |f| (k.clone(), f.clone())))
        .unzip()
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
    let count =
        |m: &std::collections::BTreeMap<String, Vec<Found>>, k: &str| m.get(k).map_or(0, Vec::len);
    let (rules_added, diagnoses_added) = beyond(&kn, |k| count(&ko, k));
    let (rules_removed, diagnoses_removed) = beyond(&ko, |k| count(&kn, k));
    let (rules_kept, diagnoses_kept) =
        beyond(&kn, |k| count(&kn, k) - count(&ko, k).min(count(&kn, k)));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn leak_run(pid: u32) -> Report {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/leak.report.json"
        );
        let mut r: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for d in &mut r.diagnoses {
            d.pid = Some(pid);
            d.subject = format!("pid {pid}");
        }
        for t in &mut r.torch.processes {
            t.pid = pid;
        }
        r
    }

    #[test]
    fn the_same_leak_under_another_pid_is_kept_not_added_and_removed() {
        let c = compare(&leak_run(3134), &leak_run(3469), "old", "new");
        assert_eq!(c.rules_added, Vec::<String>::new());
        assert_eq!(c.rules_removed, Vec::<String>::new());
        assert_eq!(
            c.rules_kept,
            ["step-leak (warn, GPU 0, gpu/torch_steps.py:26)"]
        );
    }

    #[test]
    fn a_leak_at_another_site_or_on_another_rank_is_another_diagnosis() {
        let mut moved = leak_run(3469);
        let sites = moved.diagnoses[0]
            .facts
            .get_mut("torch.leak_sites")
            .unwrap();
        sites[0]["line"] = 31.into();
        let c = compare(&leak_run(3134), &moved, "old", "new");
        assert_eq!(
            c.rules_added,
            ["step-leak (warn, GPU 0, gpu/torch_steps.py:31)"]
        );
        assert_eq!(
            c.rules_removed,
            ["step-leak (warn, GPU 0, gpu/torch_steps.py:26)"]
        );
        let mut ranked = leak_run(3469);
        ranked.torch.processes[0].rank = Some(serde_json::json!(1));
        let c = compare(&leak_run(3134), &ranked, "old", "new");
        assert_eq!(
            c.rules_added,
            ["step-leak (warn, GPU 0, rank 1, gpu/torch_steps.py:26)"]
        );
    }

    #[test]
    fn diagnoses_sharing_a_place_are_counted() {
        let old = leak_run(1);
        let mut new = leak_run(2);
        let mut second = new.diagnoses[0].clone();
        second.pid = Some(3);
        new.diagnoses.push(second);
        let c = compare(&old, &new, "old", "new");
        assert_eq!(c.rules_kept.len(), 1);
        assert_eq!(c.diagnoses_added.len(), 1);
        assert_eq!(c.diagnoses_removed.len(), 0);
    }
}
