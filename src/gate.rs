//! The CI gate: fail a job whose GPU memory regressed, against an absolute budget (`--max-peak`) or a
//! recorded baseline (`--baseline FILE --name NAME --tolerance 5%`), and optionally on diagnoses
//! (`--fail-on warn|error`). The gated measure is per GPU, the job's processes only.

use crate::report::Report;
use crate::rules::Severity;
use crate::units::{fmt_bytes, parse_bytes};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Exit code of `gpudoc run` when the command succeeded but the gate failed.
pub const GATE_FAILED: u8 = 122;
/// Schema tag of baseline files.
pub const BASELINE_SCHEMA: &str = "gpudoc.baseline/1";

/// Which number is gated, per GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// The job's peak as NVML sees it (its processes' memory, CUDA contexts included).
    #[default]
    Nvml,
    /// PyTorch's peak reserved memory (the framework view; less noisy).
    Reserved,
    /// PyTorch's peak allocated memory (live tensors).
    Allocated,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct GateArgs {
    /// Fail if the job's peak on a GPU exceeds SIZE: `40GiB` for every GPU, `1=20GiB` for GPU 1
    /// (repeatable).
    #[arg(long, value_name = "[GPU=]SIZE")]
    pub max_peak: Vec<String>,
    /// A baseline file holding the peaks of named jobs.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// The job's name in the baseline file.
    #[arg(long, value_name = "NAME", requires = "baseline")]
    pub name: Option<String>,
    /// Allowed growth over the baseline: `5%`, `512MiB`, or both (`5%,512MiB`: the larger applies).
    #[arg(long, value_name = "PCT|SIZE", default_value = "0%")]
    pub tolerance: String,
    /// Write this run's peaks into the baseline (creating the entry or the file).
    #[arg(long, requires = "baseline")]
    pub update_baseline: bool,
    /// Which measure is gated.
    #[arg(long, value_enum, default_value_t = Measure::Nvml)]
    pub gate: Measure,
    /// Also fail on diagnoses of this severity or worse.
    #[arg(long, value_name = "warn|error", value_parser = parse_severity)]
    pub fail_on: Option<Severity>,
    /// Write the gate's checks as a JUnit XML file, for CI systems other than GitHub Actions.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
}

fn parse_severity(s: &str) -> Result<Severity, String> {
    match s {
        "warn" => Ok(Severity::Warn),
        "error" => Ok(Severity::Error),
        "info" => Ok(Severity::Info),
        _ => Err(format!("`{s}`: warn or error")),
    }
}

/// The gate's settings, resolved and checked before the command runs.
#[derive(Debug, Clone)]
pub struct Gate {
    /// Budget per GPU index; `None` key: every GPU.
    pub budgets: Vec<(Option<u32>, u64)>,
    pub baseline: Option<(PathBuf, String)>,
    pub tolerance_pct: f64,
    pub tolerance_bytes: u64,
    pub update: bool,
    pub measure: Measure,
    pub fail_on: Option<Severity>,
    pub junit: Option<PathBuf>,
    /// The baseline file as read at start (None: no file yet).
    pub file: Option<BaselineFile>,
}

/// A baseline file: named jobs, each with its gated peaks per GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BaselineFile {
    pub schema: String,
    pub jobs: BTreeMap<String, Baseline>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub measure: Measure,
    /// Peak bytes per GPU index (as a string key, for JSON).
    pub gpus: BTreeMap<String, u64>,
    pub command: String,
    pub updated_unix_s: f64,
}

/// One check the gate made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    /// `max-peak`, `baseline`, `diagnoses`.
    pub kind: String,
    pub gpu: Option<u32>,
    pub value_bytes: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub baseline_bytes: Option<u64>,
    pub passed: bool,
    pub message: String,
}

/// The report's `gate` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateReport {
    pub passed: bool,
    pub measure: Measure,
    /// Why it failed, one line each.
    pub reasons: Vec<String>,
    pub checks: Vec<Check>,
    /// What else to know (a missing baseline entry, the baseline written).
    pub notes: Vec<String>,
}

impl Gate {
    /// Resolves the flags; `None` when no gate was asked for. Reads the baseline file now, so a corrupt one
    /// stops gpudoc before the command runs.
    pub fn from_args(a: &GateArgs) -> Result<Option<Gate>, String> {
        if a.max_peak.is_empty() && a.baseline.is_none() && a.fail_on.is_none() {
            return Ok(None);
        }
        let mut budgets = Vec::new();
        for m in &a.max_peak {
            let (gpu, size) = match m.split_once('=') {
                Some((g, s)) => (
                    Some(
                        g.trim()
                            .parse::<u32>()
                            .map_err(|_| format!("--max-peak {m}: `{g}` is not a GPU index"))?,
                    ),
                    s,
                ),
                None => (None, m.as_str()),
            };
            budgets.push((
                gpu,
                parse_bytes(size).map_err(|e| format!("--max-peak {m}: {e}"))?,
            ));
        }
        let (mut pct, mut bytes) = (0.0, 0);
        for part in a
            .tolerance
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            if let Some(p) = part.strip_suffix('%') {
                pct = p
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("--tolerance {part}: not a percentage"))?;
            } else {
                bytes = parse_bytes(part).map_err(|e| format!("--tolerance {e}"))?;
            }
        }
        let baseline = match (&a.baseline, &a.name) {
            (Some(f), Some(n)) => Some((f.clone(), n.clone())),
            (Some(_), None) => {
                return Err("--baseline needs --name: the job's name in the file".into());
            }
            _ => None,
        };
        let file = match &baseline {
            Some((path, _)) => read_baseline(path)?,
            None => None,
        };
        Ok(Some(Gate {
            budgets,
            baseline,
            tolerance_pct: pct,
            tolerance_bytes: bytes,
            update: a.update_baseline,
            measure: a.gate,
            fail_on: a.fail_on,
            junit: a.junit.clone(),
            file,
        }))
    }

    /// Checks the run; writes the baseline when asked to.
    pub fn evaluate(&self, r: &Report) -> GateReport {
        let peaks = measured(r, self.measure);
        let mut checks = Vec::new();
        let mut notes = Vec::new();
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
            if let Some(g) = gpu
                && !peaks.contains_key(&g)
            {
                notes.push(format!(
                    "--max-peak names GPU {g}, which the job did not use"
                ));
            }
        }
        if let Some((path, name)) = &self.baseline {
            match self.file.as_ref().and_then(|f| f.jobs.get(name)) {
                None => notes.push(format!(
                    "no baseline for `{name}` in {}{}",
                    path.display(),
                    if self.update { "" } else { ": run with --update-baseline to record one" }
                )),
                Some(b) if b.measure != self.measure => notes.push(format!(
                    "the baseline for `{name}` gates {:?}, this run gates {:?}: not compared (--update-baseline records this measure)",
                    b.measure, self.measure
                )),
                Some(b) => {
                    for (g, &v) in &peaks {
                        let Some(&base) = b.gpus.get(&g.to_string()) else {
                            notes.push(format!("the baseline for `{name}` has no GPU {g}"));
                            continue;
                        };
                        let allowed = ((base as f64 * self.tolerance_pct / 100.0) as u64).max(self.tolerance_bytes);
                        let passed = v <= base + allowed;
                        let change = if base > 0 { (v as f64 / base as f64 - 1.0) * 100.0 } else { 0.0 };
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
        }
        if let Some(level) = self.fail_on {
            let bad: Vec<_> = r.diagnoses.iter().filter(|d| d.severity >= level).collect();
            checks.push(Check {
                kind: "diagnoses".into(),
                gpu: None,
                value_bytes: None,
                limit_bytes: None,
                baseline_bytes: None,
                passed: bad.is_empty(),
                message: if bad.is_empty() {
                    format!("no diagnosis at {level:?} or worse").to_lowercase()
                } else {
                    bad.iter()
                        .map(|d| format!("[{}] {}", d.rule, d.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                },
            });
        }
        if self.update
            && let Some((path, name)) = &self.baseline
        {
            match write_baseline(path, name, self.measure, &peaks, r, self.file.clone()) {
                Ok(()) => notes.push(format!("baseline `{name}` written to {}", path.display())),
                Err(e) => notes.push(format!("baseline not written: {e}")),
            }
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
                let v = if m == Measure::Reserved {
                    t.peak_reserved_bytes
                } else {
                    t.peak_allocated_bytes
                };
                *out.entry(g).or_insert(0) += v;
            }
        }
    }
    out
}

fn read_baseline(path: &Path) -> Result<Option<BaselineFile>, String> {
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

/// Writes the entry, keeping every other job; atomically (temp file + rename), keys in stable order.
fn write_baseline(
    path: &Path,
    name: &str,
    measure: Measure,
    peaks: &BTreeMap<u32, u64>,
    r: &Report,
    read_at_start: Option<BaselineFile>,
) -> Result<(), String> {
    // Re-read: another job may have written its entry while this one ran.
    let mut file = read_baseline(path)?.or(read_at_start).unwrap_or_default();
    file.schema = BASELINE_SCHEMA.into();
    file.jobs.insert(
        name.to_string(),
        Baseline {
            measure,
            gpus: peaks.iter().map(|(g, v)| (g.to_string(), *v)).collect(),
            command: r.command.join(" "),
            updated_unix_s: r.started_unix_s,
        },
    );
    let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())? + "\n";
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
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

/// The exit code: a failing command's own code always wins; a failed gate turns 0 into [`GATE_FAILED`].
pub fn exit_code(child: i32, gate: Option<&GateReport>) -> i32 {
    match gate {
        Some(g) if child == 0 && !g.passed => GATE_FAILED as i32,
        _ => child,
    }
}
