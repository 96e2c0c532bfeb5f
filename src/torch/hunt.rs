//! Leak hunts, as the shim reports them (`_gpudoc_hunt.py`): for a window of steps in which allocated memory
//! grew, the sites (file:line in the user's code) of the blocks allocated then and still alive, and what
//! holds them; at an out-of-memory failure, what filled the GPU.

use serde::{Deserialize, Serialize};

/// One hunt on one device of one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Hunt {
    pub pid: u32,
    /// torch's device index.
    #[serde(alias = "dev")]
    pub device: u32,
    /// `auto` (allocated memory grew), `on` (`--hunt-leaks`), `oom` (what filled the GPU at an OOM).
    pub why: String,
    /// When it ended, seconds since the run started.
    pub at_s: f64,
    /// The window: the steps recorded (`to_step` − `from_step`).
    pub from_step: u64,
    pub to_step: u64,
    pub steps: u64,
    /// What the window counted: `steps` (optimizer steps), or `forwards` (forward calls of the outermost
    /// module, in a program without steps); empty from older shims (steps).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub clock: String,
    /// Allocated memory's growth over the window.
    pub growth_bytes: i64,
    /// Where the memory that stayed alive was allocated, most first.
    pub sites: Vec<Site>,
    /// What keeps it alive, most first.
    pub holders: Vec<Holder>,
    /// PyTorch's event log overflowed in the window: allocation counts are low.
    pub truncated: bool,
    /// Seconds of recording, and of finding sites and holders at its end.
    pub record_s: f64,
    pub analysis_s: f64,
    /// At an OOM: the Python tensors on the device, and their bytes.
    pub tensors: Option<u64>,
    pub tensor_bytes: Option<u64>,
    /// Why the hunt could not be made, when it could not.
    pub error: Option<String>,
}

/// Where leaking blocks were allocated: the innermost frame in the user's code.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Site {
    pub file: String,
    pub line: u32,
    pub function: String,
    /// The source line.
    pub code: String,
    /// Bytes of its blocks still alive at the window's end, and per step of the window.
    pub bytes: u64,
    pub bytes_per_step: u64,
    pub blocks: u64,
    /// Blocks it allocated in the window.
    pub allocs: u64,
    /// The Python stack, innermost first (`file:line in function`).
    pub stack: Vec<String>,
}

/// What refers to leaking tensors: a container, a global, an attribute, or an autograd graph.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Holder {
    /// `container`, `global`, `attr`, `graph`, `graphs` (the autograd graphs behind the tensors of the
    /// holder named in `of`).
    pub kind: String,
    /// In words: "list `kept` (train.py, module globals), 300 items".
    pub text: String,
    pub tensors: u64,
    pub bytes: u64,
    pub items: Option<u64>,
    /// Of its tensors, those that carry an autograd graph (grad_fn).
    #[serde(skip_serializing_if = "is_zero")]
    pub graphs: u64,
    /// Kind `graphs`: the holder whose tensors' graphs these are.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub of: Option<String>,
}

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Hunt {
    /// Reads a `hunt` message; `start_unix` turns its time into run time.
    pub fn from_message(v: &serde_json::Value, start_unix: f64) -> Option<Hunt> {
        let mut h: Hunt = serde_json::from_value(v.clone()).ok()?;
        let t = v.get("t").and_then(|t| t.as_f64()).unwrap_or(start_unix);
        h.at_s = (t - start_unix).max(0.0);
        Some(h)
    }

    /// The bytes the autograd graphs behind held tensors keep (the holder of kind `graphs`, see the shim's
    /// `_behind`), and the holder of those tensors; 0 and "" when none was told.
    pub fn graphs(&self) -> (u64, &str) {
        self.holders
            .iter()
            .find(|h| h.kind == "graphs")
            .map_or((0, ""), |h| (h.bytes, h.of.as_deref().unwrap_or("")))
    }

    /// Its holders in the order a reader needs them. A leak's come as the search found them; at an OOM,
    /// where they are an inventory of everything alive (the model's parameters and the optimizer's state
    /// among them), the one that held the most comes first, each container with the autograd graphs
    /// behind its tensors (kind `graphs`, `of` it) right after it and counted with it.
    pub fn ordered_holders(&self) -> Vec<&Holder> {
        let mut held: Vec<&Holder> = self.holders.iter().collect();
        if self.why != "oom" {
            return held;
        }
        let name = |h: &Holder| h.of.clone().unwrap_or_else(|| h.text.clone());
        // A group (a holder and the graphs behind its tensors) by where the search first gave it; `h`
        // itself is in the list, so there is always one.
        let group = |h: &Holder| {
            let n = name(h);
            self.holders
                .iter()
                .position(|c| name(c) == n)
                .unwrap_or_default()
        };
        let mut weight = vec![0u64; self.holders.len()];
        for h in &self.holders {
            weight[group(h)] += h.bytes;
        }
        // Equal weights in the search's order, a container before its graphs.
        held.sort_by_cached_key(|h| {
            let g = group(h);
            (std::cmp::Reverse(weight[g]), g, h.kind == "graphs")
        });
        held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hunt_message_reads_into_sites_and_holders() {
        let m = serde_json::json!({
            "k": "hunt", "why": "auto", "dev": 0, "t": 110.5, "from_step": 12, "to_step": 32,
            "steps": 20, "growth_bytes": 671088640, "pid": 7,
            "sites": [{"file": "/home/u/train.py", "line": 8, "function": "<module>", "code": "y = m(x)",
                       "bytes": 671088640, "bytes_per_step": 33554432, "blocks": 20, "allocs": 40,
                       "stack": ["/home/u/train.py:8 in <module>"]}],
            "holders": [{"kind": "container", "text": "list `kept` (train.py, module globals), 300 items",
                         "tensors": 20, "bytes": 671088640, "items": 300}]
        });
        let h = Hunt::from_message(&m, 100.0).unwrap();
        assert_eq!((h.pid, h.device, h.at_s), (7, 0, 10.5));
        let s = &h.sites[0];
        assert_eq!(
            (s.file.as_str(), s.line, s.bytes_per_step, s.blocks),
            ("/home/u/train.py", 8, 32 << 20, 20)
        );
        let held = &h.holders[0];
        assert_eq!((held.tensors, held.items), (20, Some(300)));
    }

    #[test]
    fn at_an_oom_the_holder_that_held_most_comes_first_with_its_graphs() {
        let holder = |kind: &str, text: &str, bytes, of: Option<&str>| Holder {
            kind: kind.into(),
            text: text.into(),
            tensors: 8,
            bytes,
            items: None,
            graphs: 0,
            of: of.map(String::from),
        };
        let mut h = Hunt {
            why: "oom".into(),
            holders: vec![
                holder(
                    "attr",
                    "dict attribute `_parameters` of a `Linear`",
                    1 << 30,
                    None,
                ),
                holder(
                    "attr",
                    "attribute `exp_avg` of a `defaultdict`",
                    1 << 30,
                    None,
                ),
                holder("container", "list `val_losses`", 148, None),
                holder(
                    "graphs",
                    "the autograd graphs behind list `val_losses`",
                    70 << 30,
                    Some("list `val_losses`"),
                ),
            ],
            ..Hunt::default()
        };
        let first_words = |h: &Hunt| -> Vec<String> {
            h.ordered_holders().iter().map(|x| x.text.clone()).collect()
        };
        assert_eq!(
            first_words(&h),
            [
                "list `val_losses`",
                "the autograd graphs behind list `val_losses`",
                "dict attribute `_parameters` of a `Linear`",
                "attribute `exp_avg` of a `defaultdict`",
            ]
        );
        // A leak's holders stay in the search's order.
        h.why = "auto".into();
        assert_eq!(
            first_words(&h)[0],
            "dict attribute `_parameters` of a `Linear`"
        );
    }
}
