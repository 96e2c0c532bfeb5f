//! A hunt's findings as the rules read them (`torch.leak_hunt`, `torch.leak_sites`, `torch.leak_holders`,
//! `gpu.growth_*` of the same, `oom.hunt`, `oom.sites`, `oom.holders`): records of what the shim found,
//! never words. The words are `rules/words/hunt.toml`'s ([`crate::rules::hunt_words`]).

use crate::torch::hunt::Hunt;
use serde::Serialize;

facts! {
/// A hunt: what decides which of its lines are said (whether it ran, its window, its counts).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HuntRecord {
    /// why it ran: `auto` (allocated memory grew), `on` (`--hunt-leaks`), `oom` (what held the GPU at an
    /// OOM)
    pub why: String,
    /// what its window counted, one of it: `step` (optimizer steps), or `forward call` (of the outermost
    /// module, in a program without steps)
    pub unit: String,
    /// the window's first step (or forward call); null where it recorded no window (at an OOM)
    pub from: Option<i64>,
    /// its last, when the hunt looked; null as `from`
    pub to: Option<i64>,
    /// when it ended, seconds into the run
    pub at_s: f64,
    /// why it could not run; null where it ran
    pub error: Option<String>,
    /// at an OOM, the Python tensors on the GPU; null where they were not counted
    pub tensors: Option<i64>,
    /// their bytes; null as `tensors`
    pub tensor_bytes: Option<i64>,
}
}

facts! {
/// Where memory that stayed alive was allocated: the innermost frame in the user's code.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SiteRecord {
    /// the source file, as the program named it (a full path)
    pub file: String,
    /// the line in it
    pub line: i64,
    /// the function
    pub function: String,
    /// the source line; null where it could not be read
    pub code: Option<String>,
    /// bytes of its blocks still alive when the hunt looked
    pub bytes: i64,
    /// those per step (or forward call) of the window; null where the hunt counted no steps
    pub per_step_bytes: Option<i64>,
    /// its blocks still alive
    pub blocks: i64,
}
}

facts! {
/// What refers to the tensors a hunt found: a container, a global, an attribute, an autograd graph.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HolderRecord {
    /// what it is, as the shim names it: "list `kept` (train.py, module globals), 300 items"
    pub name: String,
    /// `container`, `global`, `attr`, `graph`, or `graphs` (the autograd graphs behind the tensors of the
    /// holder named in `of`)
    pub kind: String,
    /// its tensors the hunt counted (allocated in the window; all of them at an OOM)
    pub tensors: i64,
    /// their bytes
    pub bytes: i64,
    /// a container's items when the hunt looked; null for what is no container
    pub items: Option<i64>,
    /// of its tensors, those that carry an autograd graph (grad_fn)
    pub graphs: i64,
    /// kind `graphs`: the holder whose tensors' graphs these are; null otherwise
    pub of: Option<String>,
}
}

/// A hunt as records: itself, its sites (most first) and its holders (in the order a reader needs them:
/// [`Hunt::ordered_holders`]).
pub fn records(h: &Hunt) -> (HuntRecord, Vec<SiteRecord>, Vec<HolderRecord>) {
    let int = |n: u64| n as i64;
    let window = h.to_step > 0;
    let hunt = HuntRecord {
        why: h.why.clone(),
        unit: if h.clock == "forwards" {
            "forward call"
        } else {
            "step"
        }
        .into(),
        from: window.then_some(int(h.from_step)),
        to: window.then_some(int(h.to_step)),
        at_s: h.at_s,
        error: h.error.clone(),
        tensors: h.tensors.map(int),
        tensor_bytes: h.tensor_bytes.map(int),
    };
    let sites = h
        .sites
        .iter()
        .map(|s| SiteRecord {
            file: s.file.clone(),
            line: i64::from(s.line),
            function: s.function.clone(),
            code: Some(s.code.clone()).filter(|c| !c.is_empty()),
            bytes: int(s.bytes),
            per_step_bytes: (h.steps > 0).then_some(int(s.bytes_per_step)),
            blocks: int(s.blocks),
        })
        .collect();
    let holders = h
        .ordered_holders()
        .into_iter()
        .map(|x| HolderRecord {
            name: x.text.clone(),
            kind: x.kind.clone(),
            tensors: int(x.tensors),
            bytes: int(x.bytes),
            items: x.items.map(int),
            graphs: int(x.graphs),
            of: x.of.clone(),
        })
        .collect();
    (hunt, sites, holders)
}

/// The records of `h`, or none (a null hunt and empty lists) where there is no hunt.
pub(super) fn of(h: Option<&Hunt>) -> (Option<HuntRecord>, Vec<SiteRecord>, Vec<HolderRecord>) {
    match h.map(records) {
        Some((hunt, sites, holders)) => (Some(hunt), sites, holders),
        None => (None, Vec::new(), Vec::new()),
    }
}

impl HuntRecord {
    /// A leak hunt with every field set, for the example facts.
    pub(in crate::rules) fn example() -> HuntRecord {
        HuntRecord {
            why: "auto".into(),
            unit: "step".into(),
            from: Some(12),
            to: Some(32),
            at_s: 110.5,
            error: Some("torch has no memory history".into()),
            tensors: Some(20),
            tensor_bytes: Some(1 << 30),
        }
    }
}

impl SiteRecord {
    /// A site with every field set, for the example facts.
    pub(in crate::rules) fn example() -> SiteRecord {
        SiteRecord {
            file: "/home/u/train.py".into(),
            line: 8,
            function: "<module>".into(),
            code: Some("y = m(x)".into()),
            bytes: 640 << 20,
            per_step_bytes: Some(32 << 20),
            blocks: 20,
        }
    }
}

impl HolderRecord {
    /// A holder with every field set, for the example facts.
    pub(in crate::rules) fn example() -> HolderRecord {
        HolderRecord {
            name: "list `kept` (train.py, module globals), 300 items".into(),
            kind: "container".into(),
            tensors: 20,
            bytes: 640 << 20,
            items: Some(300),
            graphs: 20,
            of: Some("list `kept`".into()),
        }
    }
}
