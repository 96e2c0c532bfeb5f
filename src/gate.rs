//! The CI gate: fail a job whose GPU memory regressed, against an absolute budget (`--max-peak`) or a
//! recorded baseline (`--baseline FILE --name NAME --tolerance 5%`), and optionally on diagnoses
//! (`--fail-on warn|error`). The gated measure is per GPU, the job's processes only. [`Gate::evaluate`]
//! only reads the report; writing the baseline is a separate step ([`write_baseline`]).

use crate::report::Report;
use crate::units::fmt_bytes;
use crate::verdict::{Check, GateReport, Measure, Severity};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Schema tag of baseline files.
pub const BASELINE_SCHEMA: &str = "gpudoc.baseline/1";

/// The gate's settings, resolved and checked before the command runs.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// Budget per GPU index; `None` key: every GPU.
    pub budgets: Vec<(Option<u32>, u64)>,
    /// The baseline file and the job's name in it.
    pub baseline: Option<(PathBuf, String)>,
    pub tolerance_pct: f64,
    pub tolerance_bytes: u64,
    pub update: bool,
    pub measure: Measure,
    pub fail_on: Option<Severity>,
    pub junit: Option<PathBuf>,
    /// Pass even when nothing was measured.
    pub allow_no_gpu: bool,
    /// The baseline file as read at start (None: no file yet).
    pub file: Option<BaselineFile>,
}

/// A baseline file: named jobs, each with its gated peaks per GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BaselineFile {
    pub schema: String,
    pub jobs: BTreeMap<String, Baseline>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Baseline {
    pub measure: Measure,
    /// Peak bytes per GPU index (as a string key, for JSON).
    pub gpus: BTreeMap<String, u64>,
    pub command: String,
    pub updated_unix_s: f64,
}

impl Gate {
    /// Checks the run against the budgets, the baseline and the diagnoses.
    pub fn evaluate(&self, r: &Report) -> GateReport {
        let peaks = measured(r, self.measure);
        let mut checks = Vec::new();
        let mut notes = Vec::new();
        if !self.budgets.is_empty() || self.baseline.is_some() {
            match (nothing_measured(r, self.measure, &peaks), self.allow_no_gpu) {
                (Some(why), false) => checks.push(Check {
                    kind: "measured".into(),
                    gpu: None,
                    value_bytes: None,
                    limit_bytes: None,
                    baseline_bytes: None,
                    passed: false,
                    message: format!(
                        "{why}: the gate measured nothing (--allow-no-gpu lets such a run pass)"
                    ),
                }),
                (Some(why), true) => notes.push(format!("{why} (allowed by --allow-no-gpu)")),
                (None, _) => {}
            }
        }
        self.check_budgets(r, &peaks, &mut checks, &mut notes);
        self.check_baseline(&peaks, &mut checks, &mut notes);
        if let Some(level) = self.fail_on {
            checks.push(diagnoses_check(r, level));
        }
        let reasons: Vec<String> = checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| c.message.clone())
            .collect();
        GateReport {
            passed: reasons.is_empty(),
            measure: self.measure,
            reasons,
            checks,
            notes,
        }
    }

    fn check_budgets(
        &self,
        r: &Report,
        peaks: &BTreeMap<u32, u64>,
        checks: &mut Vec<Check>,
        notes: &mut Vec<String>,
    ) {
        for &(gpu, limit) in &self.budgets {
            for (&g, &v) in peaks.iter().filter(|(g, _)| gpu.is_none_or(|x| x == **g)) {
                let passed = v <= limit;
                checks.push(Check {
                    kind: "max-peak".into(),
                    gpu: Some(g),
                    value_bytes: Some(v),
                    limit_bytes: Some(limit),
                    baseline_bytes: None,
                    passed,
                    message: format!(
                        "GPU {g}: peak {} {} budget {}",
                        fmt_bytes(v),
                        if passed { "within" } else { "over" },
                        fmt_bytes(limit)
                    ),
                });
            }
            let Some(g) = gpu.filter(|g| !peaks.contains_key(g)) else {
                continue;
            };
            if r.nvml.available && !r.gpus.iter().any(|x| x.index == g) {
                let have: Vec<u32> = r.gpus.iter().map(|x| x.index).collect();
                checks.push(Check {
                    kind: "max-peak".into(),
                    gpu: Some(g),
                    value_bytes: None,
                    limit_bytes: Some(limit),
                    baseline_bytes: None,
                    passed: false,
                    message: no_such_gpu(g, &have),
                });
            } else {
                notes.push(format!(
                    "--max-peak names GPU {g}, which the job did not use"
                ));
            }
        }
    }

    /// The first GPU a `--max-peak` names that is not among `present` (NVML's GPUs for the job): known
    /// before the command runs, so said then.
    pub fn absent_gpu(&self, present: &[u32]) -> Option<u32> {
        self.budgets
            .iter()
            .filter_map(|&(gpu, _)| gpu)
            .find(|g| !present.contains(g))
    }

    fn check_baseline(
        &self,
        peaks: &BTreeMap<u32, u64>,
        checks: &mut Vec<Check>,
        notes: &mut Vec<String>,
    ) {
        let Some((path, name)) = &self.baseline else {
            return;
        };
        let b = match self.file.as_ref().and_then(|f| f.jobs.get(name)) {
            None => {
                let hint = if self.update {
                    ""
                } else {
                    ": run with --update-baseline to record one"
                };
                notes.push(format!(
                    "no baseline for `{name}` in {}{hint}",
                    path.display()
                ));
                return;
            }
            Some(b) if b.measure != self.measure => {
                notes.push(format!(
                    "the baseline for `{name}` gates {:?}, this run gates {:?}: not compared (--update-baseline records this measure)",
                    b.measure, self.measure
                ));
                return;
            }
            Some(b) => b,
        };
        for (g, &v) in peaks {
            let Some(&base) = b.gpus.get(&g.to_string()) else {
                notes.push(format!("the baseline for `{name}` has no GPU {g}"));
                continue;
            };
            let allowed =
                ((base as f64 * self.tolerance_pct / 100.0) as u64).max(self.tolerance_bytes);
            let passed = v <= base + allowed;
            let change = if base > 0 {
                (v as f64 / base as f64 - 1.0) * 100.0
            } else {
                0.0
            };
            checks.push(Check {
                kind: "baseline".into(),
                gpu: Some(*g),
                value_bytes: Some(v),
                limit_bytes: Some(base + allowed),
                baseline_bytes: Some(base),
                passed,
                message: format!(
                    "GPU {g}: peak {} vs baseline `{name}` {} ({change:+.1}%, allowed +{})",
                    fmt_bytes(v),
                    fmt_bytes(base),
                    fmt_bytes(allowed)
                ),
            });
        }
    }
}

/// Why the gate measured nothing, if it did.
fn nothing_measured(r: &Report, m: Measure, peaks: &BTreeMap<u32, u64>) -> Option<String> {
    if !r.nvml.available && m == Measure::Nvml {
        let why = r.nvml.error.as_deref().unwrap_or("NVML unavailable");
        return Some(format!("GPU sampling was off ({why})"));
    }
    if !peaks.is_empty() {
        return None;
    }
    Some(match m {
        Measure::Nvml => "the job held no GPU memory that gpudoc saw".into(),
        Measure::Allocated => "the PyTorch view saw no process of the job on a GPU".into(),
        Measure::Reserved => {
            "the PyTorch view saw no process of the job on a GPU whose allocator says what it reserves"
                .into()
        }
    })
}

/// Diagnoses at `level` or worse fail the gate; so does a rule that could not be evaluated (it can't
/// vouch for the run).
fn diagnoses_check(r: &Report, level: Severity) -> Check {
    let bad: Vec<String> = r
        .diagnoses
        .iter()
        .filter(|d| d.severity >= level)
        .map(|d| format!("[{}] {}", d.rule, d.message))
        .chain(
            r.rule_errors
                .iter()
                .map(|e| format!("a rule could not be evaluated: {e}")),
        )
        .collect();
    Check {
        kind: "diagnoses".into(),
        gpu: None,
        value_bytes: None,
        limit_bytes: None,
        baseline_bytes: None,
        passed: bad.is_empty(),
        message: if bad.is_empty() {
            format!("no diagnosis at {} or worse", level.name())
        } else {
            bad.join("; ")
        },
    }
}

/// The gated measure per GPU the job used.
pub fn measured(r: &Report, m: Measure) -> BTreeMap<u32, u64> {
    let mut out = BTreeMap::new();
    match m {
        Measure::Nvml => {
            for g in r.gpus.iter().filter(|g| g.job_peak_bytes > 0) {
                out.insert(g.index, g.job_peak_bytes);
            }
        }
        Measure::Reserved | Measure::Allocated => {
            for t in &r.torch.processes {
                let Some(g) = t.gpu else { continue };
                // A framework that does not say what it reserves (TensorFlow) is not measured as 0.
                let v = match m {
                    Measure::Reserved => match t.peak_reserved_bytes {
                        Some(v) => v,
                        None => continue,
                    },
                    _ => t.peak_allocated_bytes,
                };
                *out.entry(g).or_insert(0) += v;
            }
        }
    }
    out
}

/// Reads a baseline file; `None` when there is none yet. A corrupt one is an error that says gpudoc will
/// not overwrite it.
pub fn read_baseline(path: &Path) -> Result<Option<BaselineFile>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("baseline {}: {e}", path.display())),
    };
    let file: BaselineFile = serde_json::from_str(&text).map_err(|e| {
        format!(
            "baseline {} is corrupt ({e}); fix or remove it: gpudoc never overwrites it",
            path.display()
        )
    })?;
    if file.schema != BASELINE_SCHEMA {
        return Err(format!(
            "baseline {}: schema `{}`, expected {BASELINE_SCHEMA}",
            path.display(),
            file.schema
        ));
    }
    Ok(Some(file))
}

/// The baseline file with `name`'s entry set to this run's peaks, every other job kept. `current` is the
/// file as it is now (re-read under the lock: another job may have written its entry meanwhile).
pub fn updated_baseline(
    current: Option<BaselineFile>,
    name: &str,
    measure: Measure,
    r: &Report,
) -> BaselineFile {
    let mut file = current.unwrap_or_default();
    file.schema = BASELINE_SCHEMA.into();
    file.jobs.insert(
        name.to_string(),
        Baseline {
            measure,
            gpus: measured(r, measure)
                .iter()
                .map(|(g, v)| (g.to_string(), *v))
                .collect(),
            command: r.command.join(" "),
            updated_unix_s: r.started_unix_s,
        },
    );
    file
}

/// The one-line verdict for CI logs.
pub fn verdict(g: &GateReport) -> String {
    if g.passed {
        let n = g.checks.len();
        format!(
            "gpudoc gate: passed ({n} check{})",
            if n == 1 { "" } else { "s" }
        )
    } else {
        format!("gpudoc gate: FAILED: {}", g.reasons.join("; "))
    }
}

/// GitHub Actions workflow commands: an error per failed check, a warning per note.
pub fn annotations(g: &GateReport) -> String {
    let esc = |s: &str| {
        s.replace('%', "%25")
            .replace('\r', "%0D")
            .replace('\n', "%0A")
    };
    let mut out = String::new();
    for r in &g.reasons {
        out.push_str(&format!("::error title=gpudoc memory gate::{}\n", esc(r)));
    }
    for n in &g.notes {
        out.push_str(&format!("::warning title=gpudoc memory gate::{}\n", esc(n)));
    }
    out
}

/// The checks as a JUnit XML test suite.
pub fn junit(g: &GateReport, command: &str) -> String {
    use quick_xml::escape::escape;
    let failures = g.checks.iter().filter(|c| !c.passed).count();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    x.push_str(&format!(
        "<testsuites><testsuite name=\"gpudoc memory gate\" tests=\"{}\" failures=\"{failures}\">\n",
        g.checks.len()
    ));
    for c in &g.checks {
        let name = match c.gpu {
            Some(gpu) => format!("{} GPU {gpu}", c.kind),
            None => c.kind.clone(),
        };
        x.push_str(&format!(
            "  <testcase classname=\"{}\" name=\"{}\">",
            escape(command),
            escape(&name)
        ));
        if !c.passed {
            x.push_str(&format!("<failure message=\"{}\"/>", escape(&c.message)));
        } else {
            x.push_str(&format!("<system-out>{}</system-out>", escape(&c.message)));
        }
        x.push_str("</testcase>\n");
    }
    x.push_str("</testsuite></testsuites>\n");
    x
}

/// The exit code: a failing command's own code always wins; a failed gate turns 0 into
/// [`crate::exit::GATE_FAILED`].
pub fn exit_code(child: i32, gate: Option<&GateReport>) -> i32 {
    match gate {
        Some(g) if child == 0 && !g.passed => crate::exit::GATE_FAILED as i32,
        _ => child,
    }
}

/// A `--max-peak` for a GPU that is not there, in words.
pub fn no_such_gpu(g: u32, present: &[u32]) -> String {
    let have: Vec<String> = present.iter().map(u32::to_string).collect();
    let have = if have.is_empty() {
        "none".into()
    } else {
        have.join(", ")
    };
    format!("--max-peak names GPU {g}, which this machine does not have (GPUs: {have})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// A real H200 run (fixtures/runs/healthy): the job peaked at about 1.5 GiB on GPU 0.
    fn healthy() -> Report {
        serde_json::from_str(include_str!("../fixtures/runs/healthy.report.json")).unwrap()
    }

    fn budget(gpu: Option<u32>, gib: u64) -> Gate {
        Gate {
            budgets: vec![(gpu, gib * GIB)],
            ..Default::default()
        }
    }

    #[test]
    fn a_budget_passes_under_it_and_fails_over_it() {
        let r = healthy();
        let peak = measured(&r, Measure::Nvml)[&0];
        assert!(peak > GIB && peak < 2 * GIB, "{peak}");
        let g = budget(None, 40).evaluate(&r);
        assert!(g.passed, "{g:?}");
        assert_eq!(g.checks.len(), measured(&r, Measure::Nvml).len());
        let g = budget(Some(0), 1).evaluate(&r);
        assert!(!g.passed);
        assert_eq!(g.reasons.len(), 1);
        assert!(
            g.reasons[0].starts_with("GPU 0: peak")
                && g.reasons[0].contains("over budget 1.00 GiB")
        );
        assert_eq!(exit_code(0, Some(&g)), crate::exit::GATE_FAILED as i32);
        // A failing command's own code wins over the gate's.
        assert_eq!(exit_code(3, Some(&g)), 3);
    }

    #[test]
    fn a_gate_that_measured_nothing_fails_unless_allowed() {
        let mut r = healthy();
        r.nvml.available = false;
        r.nvml.error = Some("libnvidia-ml.so.1: cannot open".into());
        for g in &mut r.gpus {
            g.job_peak_bytes = 0;
        }
        r.processes.clear();
        let g = budget(None, 40).evaluate(&r);
        assert!(!g.passed);
        assert_eq!(g.checks[0].kind, "measured");
        let allowed = Gate {
            allow_no_gpu: true,
            ..budget(None, 40)
        }
        .evaluate(&r);
        assert!(allowed.passed, "{allowed:?}");
        assert!(allowed.notes[0].contains("allowed by --allow-no-gpu"));
    }

    #[test]
    fn a_baseline_with_tolerance() {
        let r = healthy();
        let peak = measured(&r, Measure::Nvml)[&0];
        let file = |bytes: u64| BaselineFile {
            schema: BASELINE_SCHEMA.into(),
            jobs: [(
                "train".to_string(),
                Baseline {
                    measure: Measure::Nvml,
                    gpus: [("0".to_string(), bytes)].into(),
                    command: "python train.py".into(),
                    updated_unix_s: 0.0,
                },
            )]
            .into(),
        };
        let gate = |base: u64, pct: f64| Gate {
            baseline: Some(("base.json".into(), "train".into())),
            tolerance_pct: pct,
            file: Some(file(base)),
            ..Default::default()
        };
        // 10% over the baseline: fails without tolerance, passes with 15%.
        let base = peak * 10 / 11;
        assert!(!gate(base, 0.0).evaluate(&r).passed);
        assert!(gate(base, 15.0).evaluate(&r).passed);
        // At or under the baseline passes.
        assert!(gate(peak, 0.0).evaluate(&r).passed);
    }
}
