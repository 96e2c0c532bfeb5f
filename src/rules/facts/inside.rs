//! The look inside the model at an OOM as the rules read it (`oom.inside`): a record of where it happened
//! and what the memory held, never words. The words are `rules/words/hunt.toml`'s `[lines] inside`
//! ([`crate::rules::hunt_words`]).

use crate::torch::inside::Inside;
use serde::Serialize;

/// The modules named of those that saved the most for backward; the rest are counted in `saved_more`.
pub const SAVED_BY: usize = 3;

facts! {
/// A look inside the model: where it was, what allocated memory held, who saved it for backward.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct InsideRecord {
    /// `forward`, `backward`, `optimizer` or `other` (loss, data, evaluation code); null where the look
    /// gave none (a measured step)
    pub pass: Option<String>,
    /// the module's path (`model.layers.17.mlp`): in forward, the innermost module running; in backward,
    /// the module of the parameters nearest the autograd node running; null where none
    pub module: Option<String>,
    /// the autograd node running (`MmBackward0`), or the optimizer's method (`AdamW.step`); null where none
    pub node: Option<String>,
    /// the source file of the innermost line of the program's own code on the stack (a full path); null
    /// where none was found
    pub file: Option<String>,
    /// its line; null as `file`
    pub line: Option<i64>,
    /// that line's source; null where it could not be read
    pub code: Option<String>,
    /// allocated memory then
    pub allocated_bytes: i64,
    /// what it held, largest first, those counted only: each a part (`part`: `activations`,
    /// `parameters`, `gradients`, `optimizer_state` or `other`; `bytes`)
    pub parts: Vec<PartRecord>,
    /// the modules that saved the most for backward, most first (3 at most): each a saver (`module`,
    /// `bytes`)
    pub saved_by: Vec<SavedRecord>,
    /// the other modules that saved something for backward, not in `saved_by`
    pub saved_more: i64,
    /// saved tensors packed by the program's saved-tensor hooks (counted as what the hooks kept)
    pub saved_hooked: i64,
    /// saved tensors this torch could not read without unpacking them (counted as other tensors)
    pub saved_unread: i64,
}
}

facts! {
/// A part of what allocated memory held.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PartRecord {
    /// `activations` (saved for backward), `parameters`, `gradients`, `optimizer_state`, `other`
    /// (temporaries, inputs, outputs)
    pub part: String,
    /// its bytes
    pub bytes: i64,
}
}

facts! {
/// A module that saved tensors for backward.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SavedRecord {
    /// its path (`model.layers.5`)
    pub module: String,
    /// the bytes it saved
    pub bytes: i64,
}
}

impl InsideRecord {
    /// A look as a record.
    pub fn of(w: &Inside) -> InsideRecord {
        let int = |n: u64| n as i64;
        let mut saved: Vec<SavedRecord> = w
            .modules
            .iter()
            .filter_map(|m| {
                Some(SavedRecord {
                    module: m.name.clone(),
                    bytes: int(m.activation_bytes.filter(|&b| b > 0)?),
                })
            })
            .collect();
        saved.sort_by_key(|s| std::cmp::Reverse(s.bytes));
        let saved_more = saved.len().saturating_sub(SAVED_BY) as i64;
        saved.truncate(SAVED_BY);
        InsideRecord {
            pass: w.pass.clone(),
            module: w.module.clone().filter(|m| !m.is_empty()),
            node: w.node.clone(),
            file: w.line.as_ref().map(|l| l.file.clone()),
            line: w.line.as_ref().map(|l| i64::from(l.line)),
            code: w
                .line
                .as_ref()
                .map(|l| l.code.clone())
                .filter(|c| !c.is_empty()),
            allocated_bytes: int(w.allocated_bytes),
            parts: w
                .parts
                .ranked()
                .into_iter()
                .filter(|p| p.1 > 0)
                .map(|(part, b)| PartRecord {
                    part: part.into(),
                    bytes: int(b),
                })
                .collect(),
            saved_by: saved,
            saved_more,
            saved_hooked: int(w.saved_hooked),
            saved_unread: int(w.saved_unread),
        }
    }

    /// A look at an OOM in backward with every field set, for the example facts.
    pub(in crate::rules) fn example() -> InsideRecord {
        InsideRecord {
            pass: Some("backward".into()),
            module: Some("model.layers.2.mlp".into()),
            node: Some("MmBackward0".into()),
            file: Some("/home/u/train.py".into()),
            line: Some(51),
            code: Some("loss.backward()".into()),
            allocated_bytes: 4 << 30,
            parts: vec![
                PartRecord {
                    part: "activations".into(),
                    bytes: 3 << 30,
                },
                PartRecord {
                    part: "parameters".into(),
                    bytes: 1 << 30,
                },
            ],
            saved_by: vec![SavedRecord {
                module: "model.layers.2".into(),
                bytes: 1 << 30,
            }],
            saved_more: 2,
            saved_hooked: 11,
            saved_unread: 1,
        }
    }
}

impl InsideRecord {
    /// Looks the words are checked on: one in each pass (backward with its module, node and line; forward
    /// without a module; the optimizer's step; other), one with nothing counted, a measured step (no pass).
    pub fn examples() -> Vec<InsideRecord> {
        let backward = InsideRecord::example();
        let looks = [
            InsideRecord {
                pass: Some("forward".into()),
                module: None,
                node: None,
                code: None,
                saved_more: 0,
                saved_hooked: 0,
                ..backward.clone()
            },
            InsideRecord {
                pass: Some("optimizer".into()),
                file: None,
                line: None,
                code: None,
                saved_unread: 0,
                ..backward.clone()
            },
            InsideRecord {
                pass: Some("other".into()),
                parts: vec![PartRecord {
                    part: "other".into(),
                    bytes: 1,
                }],
                saved_by: vec![SavedRecord::default()],
                ..backward.clone()
            },
            InsideRecord {
                parts: Vec::new(),
                saved_by: Vec::new(),
                ..backward.clone()
            },
            InsideRecord {
                pass: None,
                ..backward.clone()
            },
            backward,
        ];
        looks.to_vec()
    }
}
