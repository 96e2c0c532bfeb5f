//! The verdict types that the rules, the gate, the report and every output share: how bad a finding is,
//! the finding itself, and the gate's checks. They live below all of those, so none imports another.

use serde::{Deserialize, Serialize};

/// How bad a diagnosis is.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warn,
    Error,
}

impl Severity {
    /// `info`, `warn`, `error`.
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warn => "warn",
            Severity::Error => "error",
        }
    }

    /// Its tag in front of a line, five columns wide, in its colour: `error`, `warn `, `info `.
    pub fn tag(self, p: crate::paint::Paint) -> String {
        match self {
            Severity::Error => p.bad("error"),
            Severity::Warn => p.warn("warn "),
            Severity::Info => p.dim("info "),
        }
    }
}

/// One finding of a rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Diagnosis {
    pub rule: String,
    pub severity: Severity,
    pub title: String,
    /// What it is about: `run`, `GPU 0`, `pid 1234`.
    pub subject: String,
    pub message: String,
    /// Lines under the message (where a leak was allocated, what holds it, ...).
    #[serde(default)]
    pub details: Vec<String>,
    pub advice: Vec<String>,
    pub docs: Option<String>,
    /// The GPU it is about, as messages name it (`GPU 0`, `GPU 0 on node-a`): the item's for a rule of
    /// GPUs, processes or PyTorch processes, the rule's `gpu` expression otherwise.
    #[serde(
        default,
        with = "crate::ident::gpu_label",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<String>")]
    pub gpu: Option<crate::ident::GpuRef>,
    /// The process it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The moment it is about, seconds into the run (the rule's `at` expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// The facts the rule read and their values here (`torch.leak_bytes_per_step`: 67108864, ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub facts: std::collections::BTreeMap<String, serde_json::Value>,
    /// When it was first known, seconds into the run: told during the run by a rule judged live
    /// (`live = true`); absent for what only the end of the run showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_at_s: Option<f64>,
    /// Diagnoses of rules whose story this one tells (a rule's `part_of`, docs/rules.md): not said on
    /// their own, kept here with when each was told during the run, so a verdict told live is never lost.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
}

/// A diagnosis folded into the one that tells its story: `near-capacity` on the GPU an OOM filled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Part {
    pub rule: String,
    pub severity: Severity,
    pub title: String,
    pub subject: String,
    pub message: String,
    /// The moment it was about, seconds into the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// When it was told during the run (a live rule's), seconds into the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_at_s: Option<f64>,
}

impl Part {
    /// What of `d` is kept when it is folded into the diagnosis that tells its story.
    pub fn of(d: Diagnosis) -> Part {
        Part {
            rule: d.rule,
            severity: d.severity,
            title: d.title,
            subject: d.subject,
            message: d.message,
            at_s: d.at_s,
            known_at_s: d.known_at_s,
        }
    }
}

/// When a GPU will be full, forecast during the run from a diagnosis told live: the first estimate (the
/// one said) and the last (firmed up as the run went on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Forecast {
    /// The diagnosis it comes from, and what that is about.
    pub rule: String,
    pub subject: String,
    /// The GPU that fills (NVML's index).
    pub gpu: u32,
    pub first: Estimate,
    pub last: Estimate,
    /// What holds the memory, as the leak hunt found it (`list kept (train.py:88)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// One estimate of when a GPU fills, at the rate seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Estimate {
    /// When it was made, seconds into the run.
    pub at_s: f64,
    /// When the GPU will be full, seconds into the run.
    pub full_at_s: f64,
    /// Memory still free for the job on the GPU then (total less the driver's reserve and what is used).
    pub room_bytes: u64,
    /// How fast the memory grows.
    pub rate_bytes_per_s: f64,
    /// For a leak of every step: its size, and the step around which the GPU is full.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_step: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_at_step: Option<u64>,
}

impl Estimate {
    /// Seconds from when it was made until the GPU is full.
    pub fn full_in_s(&self) -> f64 {
        self.full_at_s - self.at_s
    }
}

/// Which number the gate compares, per GPU.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
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

/// One check the gate made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Check {
    /// `max-peak`, `baseline`, `diagnoses`, `measured`.
    pub kind: String,
    pub gpu: Option<u32>,
    pub value_bytes: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub baseline_bytes: Option<u64>,
    pub passed: bool,
    pub message: String,
}

/// The report's `gate` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GateReport {
    pub passed: bool,
    pub measure: Measure,
    /// Why it failed, one line each.
    pub reasons: Vec<String>,
    pub checks: Vec<Check>,
    /// What else to know (a missing baseline entry, the baseline written).
    pub notes: Vec<String>,
}

impl Forecast {
    /// In words, as said on stderr and in the summary: `GPU 0 will be full in ~42 min (around step
    /// 4,100) at +32.00 MiB/step; held by list `kept` (train.py:88)`, from estimate `e`.
    pub fn words(&self, e: &Estimate) -> String {
        let mut s = format!("GPU {} will be full in {}", self.gpu, about(e.full_in_s()));
        if let Some(step) = e.full_at_step {
            s += &format!(" (around step {})", thousands(step));
        }
        s += &match e.bytes_per_step {
            Some(b) => format!(" at +{}/step", crate::units::fmt_bytes(b as u64)),
            None => format!(
                " at +{}/s",
                crate::units::fmt_bytes(e.rate_bytes_per_s as u64)
            ),
        };
        if let Some(h) = &self.held_by {
            s += &format!("; held by {h}");
        }
        s
    }
}

/// A duration as a forecast gives it: `~40 s`, `~42 min`, `~3.5 h`, `~2.1 days`.
pub fn about(secs: f64) -> String {
    let secs = secs.max(0.0);
    match secs {
        s if s < 90.0 => format!("~{s:.0} s"),
        s if s < 90.0 * 60.0 => format!("~{:.0} min", s / 60.0),
        s if s < 48.0 * 3600.0 => format!("~{:.1} h", s / 3600.0),
        s => format!("~{:.1} days", s / 86400.0),
    }
}

/// `4100` as `4,100`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forecast_in_words() {
        let e = Estimate {
            at_s: 60.0,
            full_at_s: 60.0 + 42.0 * 60.0,
            room_bytes: 4100 << 25,
            rate_bytes_per_s: 1.0,
            bytes_per_step: Some((32u64 << 20) as f64),
            full_at_step: Some(4100),
        };
        let f = Forecast {
            rule: "step-leak".into(),
            subject: "pid 1".into(),
            gpu: 0,
            first: e,
            last: e,
            held_by: Some("list `kept` (train.py:88)".into()),
        };
        assert_eq!(
            f.words(&e),
            "GPU 0 will be full in ~42 min (around step 4,100) at +32.00 MiB/step; held by list `kept` (train.py:88)"
        );
        assert_eq!(about(30.0), "~30 s");
        assert_eq!(about(7200.0), "~2.0 h");
        assert_eq!(thousands(1234567), "1,234,567");
    }
}
