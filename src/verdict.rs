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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<String>,
    /// The process it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The moment it is about, seconds into the run (the rule's `at` expression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<f64>,
    /// The facts the rule read and their values here (`torch.leak_bytes_per_step`: 67108864, ...).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub facts: std::collections::BTreeMap<String, serde_json::Value>,
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
