//! The words of a look inside the model: `rules/words/hunt.toml`'s lists `inside` (an OOM's place,
//! breakdown and the modules that saved the most for backward) and `peak` (a measured step's breakdown),
//! over the look's record ([`InsideRecord`]), with its `[say]` words `place`, `parts` and `incomplete`. A
//! rule's details reach them with `inside_lines('inside', oom.inside)`; the summary and the HTML report
//! say them of the bundled words.

use super::eval::functions;
use super::facts::inside::InsideRecord;
use super::hunt_words::{HuntWords, Part, say, value};
use crate::torch::inside::Inside;
use cel::Value;
use std::sync::Arc;

impl HuntWords {
    /// The lines `name` gives of a look inside the model, as CEL sees its record (none of a null one).
    pub fn inside(&self, name: &str, inside: &Value) -> Result<Vec<String>, String> {
        let parts = self
            .lines
            .get(name)
            .ok_or_else(|| format!("{}: no lines `{name}`", self.file))?;
        if matches!(inside, Value::Null) {
            return Ok(Vec::new());
        }
        let out = self
            .inside_parts(parts, inside)
            .map_err(|(line, e)| format!("{}:{line}: {e}", self.file))?;
        Ok(out.into_iter().filter(|l| !l.is_empty()).collect())
    }

    /// The lines `name` gives of a look (the summary's and the HTML report's).
    pub fn look(&self, name: &str, w: &Inside) -> Vec<String> {
        let record = value(&serde_json::json!(InsideRecord::of(w)));
        self.inside(name, &record).unwrap_or_else(|e| vec![e])
    }

    /// `parts` said of a look: its `[say]` words bound as `place_said`, `parts_said` and
    /// `incomplete_said`. What failed, with the line of the part or of the `[say]` words that did.
    pub(super) fn inside_parts(
        &self,
        parts: &[Part],
        inside: &Value,
    ) -> Result<Vec<String>, (usize, String)> {
        let mut ctx = functions(&self.env);
        ctx.add_variable_from_value("inside", inside.clone());
        for (name, line, words) in &self.inside {
            let said = say(words, &ctx).map_err(|e| (*line, format!("say.{name}: {e}")))?;
            ctx.add_variable_from_value(format!("{name}_said"), said);
        }
        let empty = Value::List(Arc::new(Vec::new()));
        let mut out = Vec::new();
        for p in parts {
            out.extend(self.part(p, &ctx, &empty, &empty)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(w: &Inside) -> Vec<String> {
        HuntWords::bundled().look("inside", w)
    }

    fn oom(m: serde_json::Value) -> Inside {
        Inside::from_message(&m, 0.0).unwrap()
    }

    #[test]
    fn an_oom_in_backward_says_its_module_node_line_and_breakdown() {
        let w = oom(serde_json::json!({
            "why": "oom", "dev": 0, "allocated": 4362076160u64,
            "pass": "backward", "node": "MmBackward0", "module": "model.layers.2.mlp",
            "line": {"file": "/w/model.py", "line": 51, "function": "train", "code": "loss.backward()"},
            "parts": {"parameters": 905969664, "gradients": 268435456, "optimizer_state": 0,
                      "activations": 2030043136, "other": 1157627904},
            "rows": [{"name": "model.embed", "parameters": 33554432, "gradients": 0,
                      "optimizer_state": 0}],
        }));
        assert_eq!(
            said(&w),
            [
                "in backward of model.layers.2.mlp (MmBackward0), at w/model.py:51 `loss.backward()`",
                "4.06 GiB allocated then: activations saved for backward 1.89 GiB (46%), \
                 other tensors (temporaries, inputs, outputs) 1.08 GiB (26%), parameters 864.00 MiB \
                 (20%), gradients 256.00 MiB (6%)"
            ]
        );
    }

    #[test]
    fn each_pass_says_its_place() {
        let at = |pass: &str, module: Option<&str>, node: Option<&str>| {
            let w = Inside {
                pass: Some(pass.into()),
                module: module.map(String::from),
                node: node.map(String::from),
                parts: crate::torch::inside::Parts {
                    parameters: 1,
                    optimizer_state: 1 << 30,
                    ..Default::default()
                },
                allocated_bytes: 2 << 30,
                ..Default::default()
            };
            said(&w)
        };
        assert_eq!(
            at("forward", Some("model.head"), None),
            [
                "in forward of model.head",
                "2.00 GiB allocated then: optimizer state 1.00 GiB (99%), parameters 1 B (0%)"
            ]
        );
        assert_eq!(at("forward", Some(""), None)[0], "in forward");
        assert_eq!(
            at("optimizer", Some("model"), Some("AdamW.step"))[0],
            "in the optimizer's step (AdamW.step)"
        );
        assert_eq!(
            at("other", Some("model"), None)[0],
            "outside the model's forward and backward"
        );
        // A look without a pass (a measured step) says no place; a null look, nothing.
        let mut w = Inside {
            module: Some("m".into()),
            ..Default::default()
        };
        assert!(said(&w).is_empty());
        w.parts.other = 1;
        assert_eq!(
            said(&w),
            ["0 B allocated then: other tensors (temporaries, inputs, outputs) 1 B (100%)"]
        );
        assert_eq!(
            HuntWords::bundled().inside("inside", &Value::Null),
            Ok(Vec::new())
        );
    }

    #[test]
    fn an_oom_names_the_modules_that_saved_the_most_for_backward() {
        let row = |name: &str, saved: u64| {
            serde_json::json!({"name": name, "parameters": 1, "gradients": 0, "optimizer_state": 0,
                               "activations": saved})
        };
        let mut m = serde_json::json!({
            "why": "oom", "dev": 0, "allocated": 8u64 << 30,
            "pass": "backward", "node": "SoftmaxBackward0", "module": "model.blocks.1.attn",
            "parts": {"parameters": 1u64 << 30, "activations": 6u64 << 30, "other": 1u64 << 30},
            "rows": [row("model.embed", 16 << 20), row("model.blocks.0", 3 << 30),
                     row("model.blocks.1", 2 << 30), row("model.blocks.2", 0),
                     row("model.head", 1 << 30)],
        });
        let w = oom(m.clone());
        assert_eq!(
            said(&w)[2],
            "saved for backward by model.blocks.0 3.00 GiB, model.blocks.1 2.00 GiB, model.head \
             1.00 GiB and 1 more"
        );
        assert_eq!(w.top_modules(1)[0].name, "model.blocks.0");
        // Three or fewer: no "more".
        m["rows"] = serde_json::json!([row("model.blocks.0", 3 << 30)]);
        assert_eq!(
            said(&oom(m))[2],
            "saved for backward by model.blocks.0 3.00 GiB"
        );
    }

    #[test]
    fn an_oom_whose_saved_tensors_hooks_packed_says_its_breakdown_is_incomplete() {
        // Recorded on the CPU by tests/programs/where_saved.py: two blocks checkpointed
        // (use_reentrant=False), one plain, the fourth under save_on_cpu, where its forward runs out.
        let m: serde_json::Value =
            serde_json::from_str(include_str!("../../fixtures/where/cpu_hooked_oom.json")).unwrap();
        let w = oom(m);
        assert_eq!((w.saved_hooked, w.saved_unread), (11, 0));
        let lines = said(&w);
        assert!(
            lines[0].starts_with("in forward of self.blocks.3, at "),
            "{lines:?}"
        );
        assert_eq!(
            lines.last().unwrap(),
            "saved for backward is incomplete by 11 tensors: 11 packed by the program's saved-tensor \
             hooks (counted as what the hooks kept)"
        );
        // A torch whose saved tensors cannot be read without unpacking them, and both at once.
        let unread = Inside {
            saved_hooked: 0,
            saved_unread: 1,
            ..w.clone()
        };
        assert_eq!(
            said(&unread).last().unwrap(),
            "saved for backward is incomplete by 1 tensor: 1 this torch could not read without \
             unpacking them (counted as other tensors)"
        );
        let both = Inside {
            saved_unread: 2,
            ..w.clone()
        };
        assert_eq!(
            said(&both).last().unwrap(),
            "saved for backward is incomplete by 13 tensors: 11 packed by the program's saved-tensor \
             hooks (counted as what the hooks kept), and 2 this torch could not read without \
             unpacking them (counted as other tensors)"
        );
        // Every saved tensor counted: nothing said, and nothing written of it.
        let all = Inside {
            saved_hooked: 0,
            ..w
        };
        assert!(!said(&all).last().unwrap().contains("incomplete"));
        let json = serde_json::to_value(&all).unwrap();
        assert!(json.get("saved_hooked").is_none() && json.get("saved_unread").is_none());
        // A measured step's peak says its breakdown, then what it did not count.
        let mut step = both.clone();
        (step.pass, step.parts.other) = (None, 1);
        let peak = HuntWords::bundled().look("peak", &step);
        assert_eq!(
            peak[0],
            "other tensors (temporaries, inputs, outputs) 1 B (100%)"
        );
        assert!(peak[1].starts_with("saved for backward is incomplete by 13 tensors"));
    }

    const BUNDLED: &str = include_str!("../../rules/words/hunt.toml");

    /// A rules folder whose `words/hunt.toml` is `text`, and that file.
    fn folder(text: &str) -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("words")).unwrap();
        let file = dir.path().join("words").join("hunt.toml");
        std::fs::write(&file, text).unwrap();
        (dir, file.display().to_string())
    }

    /// The details of the OOM diagnosis of a recorded OOM in backward, with the words of `dir`.
    fn oom_details(dir: Option<&std::path::Path>) -> Vec<String> {
        use crate::rules::{RuleSet, diagnose};
        let mut r: crate::report::Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/where/oom.report.json"
        )))
        .unwrap();
        diagnose(&mut r, &RuleSet::load(dir, &[]).unwrap());
        let d = r
            .diagnoses
            .iter()
            .find(|d| d.rule.starts_with("oom-"))
            .unwrap();
        d.details.clone()
    }

    #[test]
    fn a_rules_folders_words_change_an_ooms_look_inside() {
        let bundled = oom_details(None);
        assert!(
            bundled.iter().any(|l| l.contains(" allocated then: ")),
            "{bundled:?}"
        );
        let (dir, _) = folder(&BUNDLED.replace(" allocated then: ", " in use then: "));
        let edited = oom_details(Some(dir.path()));
        assert_eq!(
            edited,
            bundled
                .iter()
                .map(|l| l.replace(" allocated then: ", " in use then: "))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn broken_inside_words_name_their_file_and_line() {
        use crate::rules::RuleSet;
        let line_of = |needle: &str| BUNDLED.lines().position(|l| l.contains(needle)).unwrap() + 1;
        // A part that fails on a look (a field no record has): its line.
        let (dir, file) =
            folder(&BUNDLED.replace("string(inside.saved_more)", "string(inside.more)"));
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line),
            (file.as_str(), line_of("saved for backward by {")),
            "{e}"
        );
        assert!(e.what.starts_with("lines.inside: "), "{e}");
        // `[say]` words that fail: their line.
        let (dir, file) =
            folder(&BUNDLED.replace("in {inside.pass} of {inside.module}", "in {inside.pas} of"));
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line),
            (file.as_str(), line_of("place = [")),
            "{e}"
        );
        assert!(e.what.contains("say.place: "), "{e}");
    }

    #[test]
    fn a_users_rule_that_reads_the_gone_filled_by_fails_at_load_naming_it() {
        use crate::rules::RuleSet;
        let dir = tempfile::tempdir().unwrap();
        let rule = "id = \"mine\"\nseverity = \"info\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"oom.present\"\nmessage = \"m\"\ndetails = [\"{oom.filled_by}\"]\n";
        std::fs::write(dir.path().join("mine.toml"), rule).unwrap();
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert!(
            e.file.ends_with("mine.toml") && e.what.contains("filled_by"),
            "{e}"
        );
    }
}
