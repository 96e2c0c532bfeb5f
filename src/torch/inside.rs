//! Where the memory went inside the model, as the shim reports it (`_gpudoc_where.py`): at an OOM, the
//! pass (forward, backward, optimizer) and the module it happened in, with what the device's memory held;
//! on one measured step after warm-up, the same breakdown at the step's peak and a table of the model's
//! top-level modules (the memory each one's forward added, what it saved for backward, the peak inside
//! its backward); and on one call of the model in each phase without optimizer steps (an evaluation
//! after training, inference), the same at that call's peak.

use super::hunt::is_zero;

use serde::{Deserialize, Serialize};

/// One look inside the model, on one device of one process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Inside {
    pub pid: u32,
    /// torch's device index.
    #[serde(alias = "dev")]
    pub device: u32,
    /// `oom` (at an out-of-memory failure) or `peak` (a measured step or call).
    pub why: String,
    /// `peak`: the phase measured: `training` (an optimizer step), `evaluation` (a call of the model
    /// after the program's first eval() following optimizer steps), `inference` (a call of the outermost
    /// module in a program without optimizer steps). Absent in older reports (a training step).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// When it was taken, seconds since the run started.
    pub at_s: f64,
    /// The measured step's number (`peak`).
    pub step: Option<u64>,
    /// At an OOM: `forward`, `backward`, `optimizer` or `other` (loss, data, evaluation code).
    pub pass: Option<String>,
    /// The module's path from the model's variable (`model.layers.17.mlp`): in forward, the innermost
    /// module running; in backward, the module of the parameters nearest the autograd node running.
    pub module: Option<String>,
    /// The autograd node running (`MmBackward0`), or the optimizer's method (`AdamW.step`).
    pub node: Option<String>,
    /// The innermost line of the program's own code on the stack (in backward, the thread that waits in
    /// it: `loss.backward()`).
    pub line: Option<Line>,
    /// Allocated memory then: at the OOM, or the measured step's peak.
    #[serde(alias = "allocated")]
    pub allocated_bytes: u64,
    pub parts: Parts,
    /// Per module of the table (the shallowest depth with at least 4 modules, at most 48).
    #[serde(alias = "rows")]
    pub modules: Vec<ModuleRow>,
    /// On the measured step: allocated memory when backward started.
    #[serde(alias = "at_backward")]
    pub at_backward_bytes: Option<u64>,
    /// With `--snapshot`: the allocator's snapshot (the file gpudoc wrote, in the report, none when it
    /// could not be written; the shim's name for it in the shim's message).
    pub snapshot: Option<String>,
    /// Saved tensors the walk found packed by the program's saved-tensor hooks (checkpointing,
    /// `save_on_cpu`): counted as what the hook kept, not as the tensor saved.
    #[serde(skip_serializing_if = "is_zero")]
    pub saved_hooked: u64,
    /// Saved tensors this torch gave no way to read without unpacking them (never unpacked: their memory
    /// is in `other`).
    #[serde(skip_serializing_if = "is_zero")]
    pub saved_unread: u64,
    /// Seconds the shim took for it.
    pub analysis_s: f64,
    /// Why it could not be taken, when it could not.
    pub error: Option<String>,
}

/// What allocated memory held, in bytes; each storage counted once, in the first part it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Parts {
    /// The models' parameters and buffers.
    pub parameters: u64,
    pub gradients: u64,
    /// The optimizers' state (Adam's moments).
    pub optimizer_state: u64,
    /// Tensors the autograd graph saved for backward (at the OOM; on the measured step, when backward
    /// started).
    pub activations: u64,
    /// The rest of allocated memory: temporaries, inputs, outputs, gradients in flight.
    pub other: u64,
}

/// The innermost frame of the program's own code.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Line {
    pub file: String,
    pub line: u32,
    pub function: String,
    pub code: String,
}

/// One module of the table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct ModuleRow {
    pub name: String,
    /// Measured step: allocated memory its forward added (its activations and output).
    #[serde(alias = "forward")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forward_bytes: Option<u64>,
    /// The tensors its nodes saved for backward (their span of the forward: from the first to the last
    /// node taking its parameters), at the OOM or when the measured step's backward started; absent
    /// where the graph gave none.
    #[serde(alias = "activations")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation_bytes: Option<u64>,
    /// Measured step: the peak of allocated memory while its backward ran.
    #[serde(alias = "backward_peak")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backward_peak_bytes: Option<u64>,
    /// At an OOM: its parameters, their gradients and their optimizer state.
    #[serde(alias = "parameters")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter_bytes: Option<u64>,
    #[serde(alias = "gradients")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gradient_bytes: Option<u64>,
    #[serde(alias = "optimizer_state")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimizer_state_bytes: Option<u64>,
}

impl Parts {
    /// The parts, largest first, by key (`activations`, `parameters`, `gradients`, `optimizer_state`,
    /// `other`).
    pub fn ranked(&self) -> Vec<(&'static str, u64)> {
        let mut v = vec![
            ("activations", self.activations),
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer_state", self.optimizer_state),
            ("other", self.other),
        ];
        v.sort_by_key(|p| std::cmp::Reverse(p.1));
        v
    }

    /// The largest part's key, "" when nothing was counted.
    pub fn largest(&self) -> &'static str {
        let v = [
            ("activations", self.activations),
            ("parameters", self.parameters),
            ("gradients", self.gradients),
            ("optimizer_state", self.optimizer_state),
            ("other", self.other),
        ];
        v.iter()
            .filter(|p| p.1 > 0)
            .max_by_key(|p| p.1)
            .map_or("", |p| p.0)
    }

    pub fn sum(&self) -> u64 {
        self.parameters + self.gradients + self.optimizer_state + self.activations + self.other
    }
}

impl Inside {
    /// Reads a `where` message; `start_unix` turns its time into run time.
    pub fn from_message(v: &serde_json::Value, start_unix: f64) -> Option<Inside> {
        let mut w: Inside = serde_json::from_value(v.clone()).ok()?;
        let t = v.get("t").and_then(|t| t.as_f64()).unwrap_or(start_unix);
        w.at_s = (t - start_unix).max(0.0);
        Some(w)
    }

    /// A model was seen (a module, or parameters): without one, "outside the model" and "all of it
    /// other" would say nothing.
    pub fn saw_model(&self) -> bool {
        self.module.is_some() || self.parts.parameters > 0
    }

    /// The table's modules, most memory first (forward's on the measured step, parameters' and saved
    /// tensors' at an OOM).
    pub fn top_modules(&self, n: usize) -> Vec<&ModuleRow> {
        let mut v: Vec<&ModuleRow> = self.modules.iter().collect();
        v.sort_by_key(|r| std::cmp::Reverse(r.weight()));
        v.truncate(n);
        v
    }

    /// What was measured, in words: "step 12", "an evaluation call", "an inference call".
    pub fn measured(&self) -> String {
        match (self.phase.as_deref(), self.step) {
            (Some("evaluation"), _) => "an evaluation call".into(),
            (Some("inference"), _) => "an inference call".into(),
            (_, Some(s)) => format!("step {s}"),
            _ => "a step".into(),
        }
    }
}

/// Adds a look inside the model to a run's (at most `max`). A process's measured training step stands for
/// its peak step: one the shim measured again, later steps having peaked higher, replaces it when its
/// peak is higher, and is dropped otherwise.
pub fn keep(all: &mut Vec<Inside>, w: Inside, max: usize) {
    let step = |i: &Inside| i.why == "peak" && i.phase.as_deref().is_none_or(|p| p == "training");
    if step(&w)
        && let Some(old) = all
            .iter_mut()
            .find(|o| step(o) && o.pid == w.pid && o.device == w.device)
    {
        if w.allocated_bytes > old.allocated_bytes {
            *old = w;
        }
        return;
    }
    if all.len() < max {
        all.push(w);
    }
}

/// A column of the module table: its heading, and its value in a row.
pub type Column = (&'static str, fn(&ModuleRow) -> Option<u64>);

impl Inside {
    /// The table's columns its rows have (a call measured has no backward, a graph without grad no saved
    /// tensors, an OOM no forward measured): forward adds, saved for backward, backward peak.
    pub fn columns(&self) -> Vec<Column> {
        let all: [Column; 3] = [
            ("forward adds", |m| m.forward_bytes),
            ("saved for backward", |m| m.activation_bytes),
            ("backward peak", |m| m.backward_peak_bytes),
        ];
        all.into_iter()
            .filter(|(_, get)| self.modules.iter().any(|m| get(m).is_some()))
            .collect()
    }
}

impl ModuleRow {
    /// What ranks it: the memory its forward added, else what it holds (its parameters with their
    /// gradients and state, and what it saved for backward).
    pub fn weight(&self) -> u64 {
        self.forward_bytes.unwrap_or(0).max(
            self.parameter_bytes.unwrap_or(0)
                + self.gradient_bytes.unwrap_or(0)
                + self.optimizer_state_bytes.unwrap_or(0)
                + self.activation_bytes.unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_oom_in_backward_reads_into_its_module_and_breakdown() {
        let m = serde_json::json!({
            "k": "where", "why": "oom", "dev": 0, "t": 105.0, "allocated": 4362076160u64,
            "pass": "backward", "node": "MmBackward0", "module": "model.layers.2.mlp",
            "line": {"file": "/w/model.py", "line": 51, "function": "train", "code": "loss.backward()"},
            "parts": {"parameters": 905969664, "gradients": 268435456, "optimizer_state": 0,
                      "activations": 2030043136, "other": 1157627904},
            "rows": [{"name": "model.embed", "parameters": 33554432, "gradients": 0,
                      "optimizer_state": 0}],
            "pid": 7
        });
        let w = Inside::from_message(&m, 100.0).unwrap();
        assert_eq!((w.pid, w.at_s, w.parts.largest()), (7, 5.0, "activations"));
        assert_eq!(w.line.as_ref().unwrap().code, "loss.backward()");
        assert_eq!(w.modules[0].parameter_bytes, Some(33554432));
        // At an OOM the table has what each module holds: the saved tensors, no forward measured.
        let columns: Vec<&str> = w.columns().iter().map(|c| c.0).collect();
        assert!(columns.is_empty(), "{columns:?}");
    }

    #[test]
    fn a_measured_call_says_its_phase() {
        let mut w = Inside {
            why: "peak".into(),
            step: Some(12),
            ..Default::default()
        };
        assert_eq!(w.measured(), "step 12");
        w.phase = Some("evaluation".into());
        assert_eq!(w.measured(), "an evaluation call");
    }

    #[test]
    fn an_oom_where_no_model_was_seen_saw_no_model() {
        let w = Inside {
            why: "oom".into(),
            pass: Some("other".into()),
            allocated_bytes: 1 << 30,
            parts: Parts {
                other: 1 << 30,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(!w.saw_model());
        assert!(
            Inside {
                module: Some("m".into()),
                ..w
            }
            .saw_model()
        );
    }
}
