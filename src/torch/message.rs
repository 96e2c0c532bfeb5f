//! The shim's messages, typed: the contract between the Python shim (`python/gpudoc/_shim/`) and this
//! reader. One JSON object a line, `k` its kind. The types here are the published JSON Schema
//! (`gpudoc schema shim-message`, docs/schema/shim-message.schema.json) that both sides are tested
//! against: the Rust side by round-tripping recorded messages through them (tests/schema.rs), the Python
//! side by validating what its writers produce (tests/python/test_shim_messages.py). The trace's `torch`
//! rows carry these messages as they came.
//!
//! A field a message may leave out is an `Option` (absent, or `null`: not known); fields are only added,
//! and the reader ignores those it does not know.

use super::activity::Activity;
use super::hunt::{Holder, Site};
use super::inside::{Line, Parts};
use serde::{Deserialize, Serialize};

/// One message of the shim's, as either of its parts writes it: PyTorch's (`_gpudoc_torch*.py`), or the
/// other frameworks' (`_gpudoc_frameworks.py`: JAX, CuPy, TensorFlow, RMM), whose every message names its
/// framework (`fw`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
#[schemars(title = "gpudoc shim message")]
pub enum Message {
    Framework(FrameworkMessage),
    Torch(ShimMessage),
}

/// A message of the shim's part for the frameworks beyond PyTorch: its framework, who sent it, and what it
/// says. Its records carry what the framework's allocator tells, each figure absent where it cannot tell
/// it (src/torch/framework.rs reads them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FrameworkMessage {
    /// `jax`, `cupy`, `tensorflow` or `rmm`.
    pub fw: String,
    #[serde(flatten)]
    pub body: FrameworkBody,
    #[serde(flatten)]
    pub sender: Sender,
}

/// What a framework's message says, by its kind `k`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "k")]
pub enum FrameworkBody {
    /// The framework's first record is coming: its version, the settings in force that decide its
    /// allocator (environment variables, memory growth), and the share of the step time the shim aims at.
    #[serde(rename = "hello")]
    Hello {
        version: String,
        settings: std::collections::BTreeMap<String, String>,
        budget: f64,
    },
    /// A record at a step (every Nth).
    #[serde(rename = "step")]
    Step(FrameworkRecord),
    /// A record at a reading without steps, or at exit.
    #[serde(rename = "s")]
    Sample(FrameworkRecord),
    /// The allocator at an out-of-memory error, before the program sees it.
    #[serde(rename = "oom")]
    Oom(FrameworkRecord),
}

/// A framework's record of one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FrameworkRecord {
    /// Steps seen, and the steps the record covers.
    pub step: u64,
    pub n: u64,
    /// The framework's device index, and Unix seconds.
    pub dev: u32,
    pub t: f64,
    /// The shim's cost of its last record, and the time per step, µs.
    pub c: u64,
    pub p: u64,
    /// The device's UUID, where the framework gives it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// In use and reserved bytes, their peaks, the allocator's limit and largest free block, its
    /// allocations, free blocks and pinned free blocks: each absent where the framework does not tell it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pa: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lim: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lfb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub na: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfb: Option<u64>,
}

/// One message of the shim's PyTorch part, as it writes it: who sent it, and what it says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShimMessage {
    #[serde(flatten)]
    pub body: Body,
    #[serde(flatten)]
    pub sender: Sender,
}

/// Who sent a message: every message carries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Sender {
    pub pid: u32,
    /// `RANK` and `LOCAL_RANK` from the process's environment, where set: a number when they are digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<Rank>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_rank: Option<Rank>,
}

/// A rank as the environment gave it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Rank {
    Index(u64),
    Name(String),
}

/// What a message says, by its kind `k`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "k")]
pub enum Body {
    /// CUDA initialised: the torch version, and the share of the step time the shim aims at.
    #[serde(rename = "hello")]
    Hello { torch: String, budget: f64 },
    /// A record at an optimizer step (every Nth, N from the shim's cost).
    #[serde(rename = "step")]
    Step {
        #[serde(flatten)]
        record: Record,
    },
    /// A record of the forward clock (with `fwd`) or at exit.
    #[serde(rename = "s")]
    Sample {
        /// The forward clock's calls so far, at its records.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fwd: Option<u64>,
        #[serde(flatten)]
        record: Record,
    },
    /// PyTorch's OOM observer, before the exception unwinds.
    #[serde(rename = "oom")]
    Oom {
        /// The allocation that failed, the device's limit and its free memory, as the observer was told.
        alloc: u64,
        device_allocated: u64,
        device_free: u64,
        /// What the program was doing (absent from shims before it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        act: Option<Activity>,
        #[serde(flatten)]
        reading: Reading,
    },
    /// A notebook cell's end: the allocator then, at the cell's start (`a0`, `r0`) and its peaks inside it.
    #[serde(rename = "cell")]
    Cell {
        /// IPython's execution count.
        n: u64,
        /// 1: it ended without an exception.
        ok: u8,
        /// The cell, hashed (its notebook id, else its source).
        id: String,
        /// Its first line of code.
        src: String,
        /// Its start (Unix seconds).
        t0: f64,
        a0: u64,
        r0: u64,
        #[serde(flatten)]
        reading: Reading,
    },
    /// A leak hunt's end (`why` `auto`, `on`), what filled the GPU at an OOM (`oom`), or why no hunt could
    /// be made (`error`).
    #[serde(rename = "hunt")]
    Hunt(HuntMessage),
    /// The where-walk: at an OOM (`why` `oom`), at a measured step or call (`peak`), or why it failed.
    #[serde(rename = "where")]
    Where(WhereMessage),
    /// The shim went quiet: where it failed, and the error.
    #[serde(rename = "error")]
    Error {
        #[serde(rename = "where")]
        at: String,
        error: String,
    },
    /// A message too large for one pipe write: it is in the file `name` beside the pipe.
    #[serde(rename = "file")]
    File { name: String },
}

/// A record of the shim's clock (`step`, `s`): the calls it covers, the shim's cost, and the reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Record {
    /// Optimizer steps seen.
    pub step: u64,
    /// Steps (or forward calls) the record covers.
    pub n: u64,
    /// The shim's cost of its last record, and the time per step (or call), µs.
    pub c: u64,
    pub p: u64,
    #[serde(flatten)]
    pub reading: Reading,
}

/// A reading of the allocator on one device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Reading {
    /// torch's device index.
    pub dev: u32,
    /// Unix seconds.
    pub t: f64,
    /// Allocated and reserved bytes.
    pub a: u64,
    pub r: u64,
    /// Their peaks since the last record (absent where not known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pa: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pr: Option<u64>,
    /// Inactive split bytes; alloc retries, OOMs, device allocations and frees so far.
    pub i: u64,
    pub nr: u64,
    pub no: u64,
    pub nda: u64,
    pub ndf: u64,
    /// The device's UUID (on a device's first record, and every cell's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
}

/// A `hunt` message (read into `torch::hunt::Hunt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HuntMessage {
    /// `auto`, `on`, `oom` (absent from a failed hunt's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    pub dev: u32,
    pub t: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    /// `steps` or `forwards`: what the window counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub growth_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sites: Option<Vec<Site>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders: Option<Vec<Holder>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_s: Option<f64>,
    /// At an OOM: the Python tensors on the device, and their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A `where` message (read into `torch::inside::Inside`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WhereMessage {
    /// `oom` or `peak` (absent from a failed walk's message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// `peak`: `training`, `evaluation` or `inference`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    pub dev: u32,
    pub t: f64,
    /// Allocated bytes then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    /// The measured step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// At an OOM: `forward`, `backward`, `optimizer`, `other`; the module, the autograd node, the line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<Line>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Parts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<Vec<WhereRow>>,
    /// The measured step: allocated bytes when backward started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_backward: Option<u64>,
    /// `--snapshot`: the shim's name for the snapshot it wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_hooked: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_unread: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One module of a `where` message's table, bytes (read into `torch::inside::ModuleRow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WhereRow {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activations: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backward_peak: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gradients: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer_state: Option<u64>,
}

/// The kinds of message the reader applies (`TorchTimeline::apply`), by their `k`; `file` is resolved to
/// its content before (`from_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Hello,
    Step,
    Sample,
    Oom,
    Cell,
    Hunt,
    Where,
    Error,
}

impl Kind {
    /// Every kind the reader applies.
    pub const ALL: [Kind; 8] = [
        Kind::Hello,
        Kind::Step,
        Kind::Sample,
        Kind::Oom,
        Kind::Cell,
        Kind::Hunt,
        Kind::Where,
        Kind::Error,
    ];

    /// Its `k`.
    pub fn tag(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Step => "step",
            Kind::Sample => "s",
            Kind::Oom => "oom",
            Kind::Cell => "cell",
            Kind::Hunt => "hunt",
            Kind::Where => "where",
            Kind::Error => "error",
        }
    }

    /// The kind whose `k` is `tag`; None for one the reader does not apply.
    pub fn of(tag: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.tag() == tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `k` of each variant the schema has.
    fn schema_kinds(schema: &serde_json::Value) -> Vec<String> {
        let mut out = Vec::new();
        let mut stack = vec![schema];
        while let Some(v) = stack.pop() {
            match v {
                serde_json::Value::Object(m) => {
                    let k = m.get("properties").and_then(|p| p.get("k"));
                    if let Some(c) = k.and_then(|k| k.get("const")).and_then(|c| c.as_str()) {
                        out.push(c.to_string());
                    }
                    stack.extend(m.values());
                }
                serde_json::Value::Array(a) => stack.extend(a),
                _ => {}
            }
        }
        out.sort();
        out.dedup();
        out
    }

    #[test]
    fn every_kind_the_reader_applies_is_in_the_schema_and_no_other() {
        let schema = schemars::schema_for!(ShimMessage).to_value();
        let mut applied: Vec<String> = Kind::ALL.iter().map(|k| k.tag().to_string()).collect();
        // Resolved to its content before the reader applies it.
        applied.push("file".to_string());
        applied.sort();
        assert_eq!(schema_kinds(&schema), applied);
        for k in Kind::ALL {
            assert_eq!(Kind::of(k.tag()), Some(k));
        }
        assert_eq!(Kind::of("file"), None);
    }

    #[test]
    fn a_message_reads_and_writes_as_the_shim_wrote_it() {
        let line = r#"{"k":"s","step":3,"fwd":40,"n":8,"dev":0,"t":1765000000.123456,"a":10,"r":20,"pa":15,"pr":20,"i":3,"nr":0,"no":0,"nda":2,"ndf":0,"c":12,"p":300,"pid":7,"rank":"a"}"#;
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let m: ShimMessage = serde_json::from_value(v.clone()).unwrap();
        assert!(matches!(m.body, Body::Sample { fwd: Some(40), .. }));
        assert_eq!(m.sender.rank, Some(Rank::Name("a".into())));
        assert_eq!(serde_json::to_value(&m).unwrap(), v);
    }
}
