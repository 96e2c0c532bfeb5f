//! The words of a hunt: `rules/words/hunt.toml`, templates over a hunt's records ([`facts::hunt`]): a
//! site's words, a holder's, and the named lists of lines a rule's details give with
//! `hunt_lines('NAME', hunt, sites, holders)`. The facts carry the data; every word said of a hunt (in a
//! diagnosis, the HTML report, a forecast) is this file's, which a rules folder's `words/hunt.toml`
//! replaces whole.
//!
//! [`facts::hunt`]: super::facts::hunt

use super::RuleError;
use super::absent::Compiled;
use super::eval::{compile, env, functions, to_val};
use super::facts::hunt::{HolderRecord, HuntRecord, SiteRecord};
use super::facts::inside::InsideRecord;
use super::lines::{line_of, read_in_dir, value_line};
use super::names::Names;
use super::template::{Piece, fill, holds, template};
use cel::{Context, Env, ExecutionError, Value};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

/// Where the bundled words are, as errors name them.
pub const FILE: &str = "rules/words/hunt.toml";

/// Where a user's rules folder (`--rules DIR`) has its words: they replace the bundled ones.
pub const IN_DIR: &str = "words/hunt.toml";

const BUNDLED: &str = include_str!("../../rules/words/hunt.toml");

/// The lists of lines the bundled rules and the HTML report ask for: a words file lacking one fails at
/// load.
pub const NEEDED: [&str; 5] = ["leak", "oom", "report", "inside", "peak"];

/// The lists said of a look inside the model (they see `inside`), not of a hunt.
pub const INSIDE: [&str; 2] = ["inside", "peak"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HuntFile {
    say: SayFile,
    lines: HashMap<String, toml::Spanned<Vec<toml::Spanned<PartFile>>>>,
    #[serde(default, rename = "let")]
    lets: HashMap<String, toml::Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SayFile {
    site: toml::Spanned<TemplateFile>,
    holder: toml::Spanned<TemplateFile>,
    place: toml::Spanned<TemplateFile>,
    parts: toml::Spanned<TemplateFile>,
    incomplete: toml::Spanned<TemplateFile>,
}

/// A template as written: one text, or cases of which the first that holds is said.
#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateFile {
    One(String),
    Cases(Vec<CaseFile>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    when: String,
    text: String,
}

/// A part of a list of lines: said where `when` holds, once, or once per site or holder.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartFile {
    #[serde(default)]
    when: Option<String>,
    #[serde(default)]
    each: Option<Each>,
    text: String,
}

/// What a part is said for each of.
#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum Each {
    Sites,
    Holders,
}

impl Each {
    /// The list it goes over, the name each record is seen by, and the name of its words.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Each::Sites => ("sites", "site", "site_said"),
            Each::Holders => ("holders", "holder", "holder_said"),
        }
    }
}

/// A template compiled: its cases (`None`: always) in order.
pub(super) type Cases = Vec<(Option<Compiled>, Vec<Piece>)>;

/// A part compiled, with its line for errors.
pub(super) struct Part {
    when: Option<Compiled>,
    each: Option<Each>,
    text: Vec<Piece>,
    line: usize,
}

/// The words of a hunt, compiled.
pub struct HuntWords {
    /// `[say]`'s words, each with its line.
    site: (usize, Cases),
    holder: (usize, Cases),
    /// `[say]`'s words of a look inside the model, by name, each with its line.
    pub(super) inside: Vec<(&'static str, usize, Cases)>,
    pub(super) lines: HashMap<String, Vec<Part>>,
    lets: Names,
    pub(super) env: Arc<Env>,
    /// The file they were read from, as errors name it.
    pub(super) file: String,
}

/// A `[say]` template compiled, with its line.
fn said(
    env: &Env,
    t: toml::Spanned<TemplateFile>,
    text: &str,
    file: &str,
) -> Result<(usize, Cases), RuleError> {
    Ok((value_line(text, t.span()), cases(env, t, text, file)?))
}

fn cases(
    env: &Env,
    t: toml::Spanned<TemplateFile>,
    text: &str,
    file: &str,
) -> Result<Cases, RuleError> {
    let line = value_line(text, t.span());
    match t.into_inner() {
        TemplateFile::One(s) => Ok(vec![(None, template(env, &s, file, line)?)]),
        TemplateFile::Cases(v) => v
            .into_iter()
            .map(|c| {
                Ok((
                    Some(compile(env, &c.when, file, line)?),
                    template(env, &c.text, file, line)?,
                ))
            })
            .collect(),
    }
}

impl HuntWords {
    /// A words file's text, compiled; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<HuntWords, RuleError> {
        let env = env();
        let f: HuntFile = toml::from_str(text).map_err(|e| RuleError {
            file: file.into(),
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            what: e.message().to_string(),
        })?;
        let mut lines = HashMap::new();
        for (name, parts) in f.lines {
            let mut compiled = Vec::new();
            for p in parts.into_inner() {
                let line = value_line(text, p.span());
                let p = p.into_inner();
                compiled.push(Part {
                    when: p.when.map(|w| compile(&env, &w, file, line)).transpose()?,
                    each: p.each,
                    text: template(&env, &p.text, file, line)?,
                    line,
                });
            }
            lines.insert(name, compiled);
        }
        let mut inside = Vec::new();
        for (name, t) in [
            ("place", f.say.place),
            ("parts", f.say.parts),
            ("incomplete", f.say.incomplete),
        ] {
            let (line, cases) = said(&env, t, text, file)?;
            inside.push((name, line, cases));
        }
        Ok(HuntWords {
            site: said(&env, f.say.site, text, file)?,
            holder: said(&env, f.say.holder, text, file)?,
            inside,
            lines,
            lets: Names::read(&env, text, file, HashMap::new(), f.lets)?,
            env,
            file: file.into(),
        })
    }

    /// The bundled words (`rules/words/hunt.toml`), which the tests check.
    pub fn bundled() -> &'static HuntWords {
        static WORDS: OnceLock<HuntWords> = OnceLock::new();
        WORDS.get_or_init(|| HuntWords::parse(BUNDLED, FILE).unwrap_or_else(|e| panic!("{e}")))
    }

    /// The words of a user's rules folder (`--rules DIR`): its `words/hunt.toml`, which replaces the
    /// bundled words whole; `None` where it has none. An error names the user's file, and its line.
    pub fn of_dir(dir: &std::path::Path) -> Result<Option<HuntWords>, RuleError> {
        let Some((text, file)) = read_in_dir(dir, IN_DIR)? else {
            return Ok(None);
        };
        let words = HuntWords::parse(&text, &file)?;
        words.check()?;
        Ok(Some(words))
    }

    /// Every list the bundled rules and the report ask for is there, and every part says its words of
    /// example hunts (one that ran and found sites and holders, one at an OOM, one that could not run,
    /// one that found nothing): a user's file is checked at load as the bundled one is by the tests.
    pub fn check(&self) -> Result<(), RuleError> {
        let err = |line, what| RuleError {
            file: self.file.clone(),
            line,
            what,
        };
        if let Some(name) = NEEDED.iter().find(|n| !self.lines.contains_key(**n)) {
            return Err(err(
                0,
                format!("lines: no `{name}` (the bundled rules say it)"),
            ));
        }
        for (name, parts) in self
            .lines
            .iter()
            .filter(|(n, _)| INSIDE.contains(&n.as_str()))
        {
            for look in InsideRecord::examples()
                .iter()
                .map(|l| value(&serde_json::json!(l)))
            {
                self.inside_parts(parts, &look)
                    .map_err(|(line, e)| err(line, format!("lines.{name}: {e}")))?;
            }
        }
        for (hunt, sites, holders) in examples() {
            for (name, parts) in &self.lines {
                if INSIDE.contains(&name.as_str()) {
                    continue;
                }
                self.with_scope(&hunt, &sites, &holders, |scope| {
                    for p in parts {
                        self.part(p, scope, &sites, &holders)
                            .map_err(|(line, e)| (line, format!("lines.{name}: {e}")))?;
                    }
                    Ok(())
                })
                .map_err(|e| err(0, e))?
                .map_err(|(line, what)| err(line, what))?;
            }
        }
        Ok(())
    }

    /// The lines `name` gives of a hunt (none of a null hunt).
    pub fn lines(
        &self,
        name: &str,
        hunt: &Value,
        sites: &Value,
        holders: &Value,
    ) -> Result<Vec<String>, String> {
        let parts = self
            .lines
            .get(name)
            .ok_or_else(|| format!("{}: no lines `{name}`", self.file))?;
        if matches!(hunt, Value::Null) {
            return Ok(Vec::new());
        }
        let out = self.with_scope(hunt, sites, holders, |scope| {
            let mut out = Vec::new();
            for p in parts {
                out.extend(
                    self.part(p, scope, sites, holders)
                        .map_err(|(line, e)| format!("{}:{line}: {e}", self.file))?,
                );
            }
            Ok::<_, String>(out)
        })??;
        Ok(out.into_iter().filter(|l| !l.is_empty()).collect())
    }

    /// The lines `name` gives of a hunt's records (the HTML report's hunts).
    pub fn records(
        &self,
        name: &str,
        hunt: &HuntRecord,
        sites: &[SiteRecord],
        holders: &[HolderRecord],
    ) -> Result<Vec<String>, String> {
        let v = |x: serde_json::Value| value(&x);
        let (h, s, o) = (
            v(serde_json::json!(hunt)),
            v(serde_json::json!(sites)),
            v(serde_json::json!(holders)),
        );
        self.lines(name, &h, &s, &o)
    }

    /// A holder in words, without its verb (what a forecast says after "held by").
    pub fn holder(
        &self,
        hunt: &serde_json::Value,
        holder: &serde_json::Value,
    ) -> Result<String, String> {
        self.one(&self.holder.1, hunt, ("holder", holder))
    }

    /// A site in words.
    pub fn site(
        &self,
        hunt: &serde_json::Value,
        site: &serde_json::Value,
    ) -> Result<String, String> {
        self.one(&self.site.1, hunt, ("site", site))
    }

    fn one(
        &self,
        words: &Cases,
        hunt: &serde_json::Value,
        (var, item): (&str, &serde_json::Value),
    ) -> Result<String, String> {
        let empty = Value::List(Arc::new(Vec::new()));
        let said = self.with_scope(&value(hunt), &empty, &empty, |scope| {
            let mut inner = scope.new_inner_scope();
            inner.add_variable_from_value(var, value(item));
            say(words, &inner)
        });
        said.and_then(|s| s)
            .map_err(|e| format!("{}: {e}", self.file))
    }

    /// `f` in a context with the hunt, its lists and the phrases of `[let]`; what binding the phrases
    /// failed on, if it did.
    fn with_scope<R>(
        &self,
        hunt: &Value,
        sites: &Value,
        holders: &Value,
        f: impl FnOnce(&Context) -> R,
    ) -> Result<R, String> {
        let mut ctx = functions(&self.env);
        ctx.add_variable_from_value("hunt", hunt.clone());
        ctx.add_variable_from_value("sites", sites.clone());
        ctx.add_variable_from_value("holders", holders.clone());
        let bound = self.lets.bind(&ctx, false)?;
        Ok(f(&bound))
    }

    /// A part's lines in `ctx`: none where its `when` does not hold, one, or one per site or holder. What
    /// failed, with the line of the part or of the `[say]` words that did.
    pub(super) fn part(
        &self,
        p: &Part,
        ctx: &Context,
        sites: &Value,
        holders: &Value,
    ) -> Result<Vec<String>, (usize, String)> {
        let here = |e: String| (p.line, e);
        if !holds(p.when.as_ref(), ctx).map_err(here)? {
            return Ok(Vec::new());
        }
        let Some(each) = p.each else {
            return Ok(vec![fill(&p.text, ctx).map_err(here)?]);
        };
        let (list, var, said) = each.names();
        let (records, (line, words)) = match each {
            Each::Sites => (sites, &self.site),
            Each::Holders => (holders, &self.holder),
        };
        let Value::List(records) = records else {
            return Err(here(format!("`{list}` is not a list")));
        };
        let mut out = Vec::new();
        for r in records.iter() {
            let mut inner = ctx.new_inner_scope();
            inner.add_variable_from_value(var, r.clone());
            let words = say(words, &inner).map_err(|e| (*line, format!("say.{var}: {e}")))?;
            inner.add_variable_from_value(said, words);
            out.push(fill(&p.text, &inner).map_err(here)?);
        }
        Ok(out)
    }
}

/// The first case of `words` that holds, filled in.
pub(super) fn say(words: &Cases, ctx: &Context) -> Result<String, String> {
    for (when, pieces) in words {
        if holds(when.as_ref(), ctx)? {
            return fill(pieces, ctx);
        }
    }
    Err("no case holds".into())
}

/// A record as CEL sees it (numbers as the facts give them: integers signed).
pub(super) fn value(v: &serde_json::Value) -> Value {
    Value::try_from(to_val(v).as_ref()).unwrap_or(Value::Null)
}

/// Example hunts the words are checked on: one that ran and found sites and holders (a container, one
/// tensor, graphs, one counted nothing), one at an OOM, one that could not run, one that found nothing.
fn examples() -> Vec<(Value, Value, Value)> {
    let holders = vec![
        HolderRecord::example(),
        HolderRecord {
            items: None,
            tensors: 1,
            bytes: 4,
            ..HolderRecord::example()
        },
        HolderRecord {
            kind: "graphs".into(),
            ..HolderRecord::example()
        },
        HolderRecord {
            tensors: 0,
            ..HolderRecord::example()
        },
    ];
    let ran = HuntRecord {
        error: None,
        ..HuntRecord::example()
    };
    let oom = HuntRecord {
        why: "oom".into(),
        from: None,
        to: None,
        ..ran.clone()
    };
    let site = SiteRecord {
        per_step_bytes: None,
        code: None,
        ..SiteRecord::example()
    };
    let json = |v: serde_json::Value| value(&v);
    let all = |h: &HuntRecord, s: Vec<SiteRecord>, o: Vec<HolderRecord>| {
        (
            json(serde_json::json!(h)),
            json(serde_json::json!(s)),
            json(serde_json::json!(o)),
        )
    };
    vec![
        all(
            &ran,
            vec![SiteRecord::example(), site.clone()],
            holders.clone(),
        ),
        all(&oom, vec![site], holders),
        all(&HuntRecord::example(), Vec::new(), Vec::new()),
        all(&ran, vec![SiteRecord::example()], Vec::new()),
        all(&ran, Vec::new(), Vec::new()),
    ]
}

/// `hunt_lines('NAME', hunt, sites, holders)` in `ctx`, said in `words` (the bundled words where `None`):
/// the one way a rule's templates reach these words.
pub(super) fn register(ctx: &mut Context, words: Option<Arc<HuntWords>>) {
    let inside = words.clone();
    let _ = ctx.add_function(
        "hunt_lines",
        move |name: Arc<String>, hunt: Value, sites: Value, holders: Value| {
            let words = words.as_deref().unwrap_or_else(|| HuntWords::bundled());
            words
                .lines(&name, &hunt, &sites, &holders)
                .map(|l| Value::List(Arc::new(l.into_iter().map(Value::from).collect())))
                .map_err(|e| ExecutionError::function_error("hunt_lines", e))
        },
    );
    // `inside_lines('NAME', inside)`: a look inside the model said in the same words (inside_words.rs).
    let _ = ctx.add_function("inside_lines", move |name: Arc<String>, look: Value| {
        let words = inside.as_deref().unwrap_or_else(|| HuntWords::bundled());
        words
            .inside(&name, &look)
            .map(|l| Value::List(Arc::new(l.into_iter().map(Value::from).collect())))
            .map_err(|e| ExecutionError::function_error("inside_lines", e))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::facts::hunt::records;
    use crate::torch::hunt::{Holder, Hunt, Site};

    /// A leak hunt of steps 12-32 that found one site and one container.
    fn leak() -> Hunt {
        let m = serde_json::json!({
            "k": "hunt", "why": "auto", "dev": 0, "t": 110.5, "from_step": 12, "to_step": 32,
            "steps": 20, "growth_bytes": 671088640, "pid": 7,
            "sites": [{"file": "/home/u/train.py", "line": 8, "function": "<module>", "code": "y = m(x)",
                       "bytes": 671088640, "bytes_per_step": 33554432, "blocks": 20, "allocs": 40,
                       "stack": ["/home/u/train.py:8 in <module>"]}],
            "holders": [{"kind": "container", "text": "list `kept` (train.py, module globals), 300 items",
                         "tensors": 20, "bytes": 671088640, "items": 300}]
        });
        Hunt::from_message(&m, 100.0).unwrap()
    }

    fn lines(name: &str, h: &Hunt) -> Vec<String> {
        let (hunt, sites, holders) = records(h);
        HuntWords::bundled()
            .records(name, &hunt, &sites, &holders)
            .unwrap()
    }

    #[test]
    fn the_bundled_words_say_every_example_hunt() {
        HuntWords::bundled()
            .check()
            .unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_leak_hunt_says_its_sites_then_what_keeps_them_alive() {
        assert_eq!(
            lines("leak", &leak()),
            [
                "allocated at u/train.py:8 in <module> `y = m(x)`: +32.00 MiB a step, 640.00 MiB in 20 live blocks",
                "kept alive by list `kept` (train.py, module globals), 300 items — at step 32: 20 of its tensors, allocated in steps 12-32, hold 640.00 MiB",
            ]
        );
        // Counted in forward calls, in a program without steps.
        let forwards = Hunt {
            clock: "forwards".into(),
            ..leak()
        };
        let said = lines("leak", &forwards);
        assert!(
            said[0].contains(": +32.00 MiB a forward call, "),
            "{said:?}"
        );
        assert!(
            said[1].contains(
                "— at forward call 32: 20 of its tensors, allocated in forward calls 12-32, hold"
            ),
            "{said:?}"
        );
    }

    #[test]
    fn a_hunt_that_failed_or_found_nothing_says_so_from_its_record() {
        let failed = Hunt {
            error: Some("torch has no memory history".into()),
            ..leak()
        };
        assert_eq!(
            lines("leak", &failed),
            ["the leak hunt could not run: torch has no memory history"]
        );
        let nothing = Hunt {
            sites: Vec::new(),
            ..leak()
        };
        assert_eq!(
            lines("leak", &nothing),
            ["the leak hunt (steps 12-32) found no allocation site that kept its memory alive"]
        );
        let unheld = Hunt {
            holders: Vec::new(),
            ..leak()
        };
        assert!(
            lines("leak", &unheld)[1].starts_with("what keeps it alive was not found: "),
            "{:?}",
            lines("leak", &unheld)
        );
        // No hunt, no line.
        let empty = Value::List(Arc::new(Vec::new()));
        let none = HuntWords::bundled().lines("leak", &Value::Null, &empty, &empty);
        assert_eq!(none, Ok(Vec::new()));
    }

    #[test]
    fn holder_numbers_say_what_was_counted_and_when() {
        let holder = |text: &str, tensors, bytes, items| Holder {
            kind: "container".into(),
            text: text.into(),
            tensors,
            bytes,
            items,
            ..Holder::default()
        };
        let mut h = Hunt {
            why: "oom".into(),
            tensors: Some(21),
            tensor_bytes: Some(41 << 30),
            sites: vec![Site {
                file: "eval.py".into(),
                line: 3,
                function: "run".into(),
                bytes: 40 << 30,
                blocks: 20,
                ..Site::default()
            }],
            holders: vec![
                // 47 items of which 20 tensors of 2 GiB: not "47 items (40.00 GiB)".
                holder(
                    "list `outs` (eval.py, module globals), 47 items",
                    20,
                    40 << 30,
                    Some(47),
                ),
                holder("global `total` (train.py, module globals)", 1, 4, None),
            ],
            ..Hunt::default()
        };
        assert_eq!(
            lines("oom", &h),
            [
                "held by list `outs` (eval.py, module globals), 47 items — at the OOM: 20 of its tensors hold 40.00 GiB",
                "held by global `total` (train.py, module globals) — at the OOM: its tensor holds 4 B (storage alone: what an autograd graph keeps alive is not counted)",
                "21 Python tensors on the GPU held 41.00 GiB in all",
                "allocated at eval.py:3 in run: 40.00 GiB in 20 live blocks",
            ]
        );
        (h.why, h.from_step, h.to_step) = ("auto".into(), 10, 40);
        let (hunt, _, holders) = records(&h);
        let said = HuntWords::bundled()
            .holder(&serde_json::json!(hunt), &serde_json::json!(holders[0]))
            .unwrap();
        assert!(
            said.ends_with(
                "47 items — at step 40: 20 of its tensors, allocated in steps 10-40, hold 40.00 GiB"
            ),
            "{said}"
        );
    }

    #[test]
    fn growth_whose_hunt_named_no_holder_gets_the_inference_mode_remedy() {
        use crate::rules::facts::{Facts, hunt::*};
        let mut f = Facts::example();
        f.run.server = None;
        let g = &mut f.gpus[0];
        (g.growth_bytes, g.growth_s, g.growth_graph_bytes) = (Some(4 << 30), Some(600.0), 0);
        g.growth_hunt = Some(HuntRecord {
            error: None,
            ..HuntRecord::example()
        });
        g.growth_sites = vec![SiteRecord::example()];
        let set = crate::rules::RuleSet::load(None, &[]).unwrap();
        let remedy = |f: &Facts| {
            let (found, failed) = set.evaluate(f);
            assert!(failed.is_empty(), "{failed:?}");
            let d = found.iter().find(|d| d.rule == "steady-growth").unwrap();
            d.advice
                .iter()
                .any(|a| a.contains("torch.inference_mode()"))
        };
        // The hunt found where it was allocated and nothing holding it: no cache of inference tensors
        // was named, so the remedy for graphs is given.
        f.gpus[0].growth_holders = Vec::new();
        assert!(remedy(&f));
        // A holder named, with no graph behind it (a cache): not given.
        f.gpus[0].growth_holders = vec![HolderRecord::example()];
        assert!(!remedy(&f));
    }

    /// A rules folder whose `words/hunt.toml` is `text`.
    fn folder(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("words")).unwrap();
        let file = dir.path().join("words").join("hunt.toml");
        std::fs::write(&file, text).unwrap();
        (dir, file)
    }

    #[test]
    fn a_rules_folders_hunt_words_change_the_detail_lines() {
        use crate::rules::{RuleSet, diagnose};
        let mut r: crate::report::Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/leak.report.json"
        )))
        .unwrap();
        let (dir, _) =
            folder(&BUNDLED.replace("kept alive by {holder_said}", "referenced by {holder_said}"));
        diagnose(&mut r, &RuleSet::load(Some(dir.path()), &[]).unwrap());
        let leak = r.diagnoses.iter().find(|d| d.rule == "step-leak").unwrap();
        assert!(
            leak.details[1]
                .starts_with("referenced by list `kept` (torch_steps.py, module globals)"),
            "{:?}",
            leak.details
        );
        diagnose(&mut r, &RuleSet::load(None, &[]).unwrap());
        let leak = r.diagnoses.iter().find(|d| d.rule == "step-leak").unwrap();
        assert!(
            leak.details[1].starts_with("kept alive by list `kept`"),
            "{:?}",
            leak.details
        );
    }

    #[test]
    fn a_users_rule_may_say_a_list_its_own_hunt_words_add() {
        use crate::rules::{RuleSet, diagnose};
        let (dir, words) = folder(&BUNDLED.replace(
            "[lines]\n",
            "[lines]\nmine = [{ each = \"sites\", text = \"at line {site.line}\" }]\n",
        ));
        let rule = "id = \"mine\"\nseverity = \"info\"\ntitle = \"t\"\neach = \"torch\"\nwhen = \"torch.leak_hunt != null\"\nmessage = \"m\"\ndetails = [\"{hunt_lines('mine', torch.leak_hunt, torch.leak_sites, torch.leak_holders)}\"]\n";
        std::fs::write(dir.path().join("mine.toml"), rule).unwrap();
        let mut r: crate::report::Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/leak.report.json"
        )))
        .unwrap();
        diagnose(&mut r, &RuleSet::load(Some(dir.path()), &[]).unwrap());
        let mine = r.diagnoses.iter().find(|d| d.rule == "mine").unwrap();
        assert_eq!(mine.details, ["at line 26"]);
        // Without the words that add the list, the rule fails at load, naming its file.
        std::fs::remove_file(words).unwrap();
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert!(
            e.file.ends_with("mine.toml") && e.what.contains("no lines `mine`"),
            "{e}"
        );
    }

    #[test]
    fn a_broken_hunt_words_file_names_its_file_and_line() {
        use crate::rules::RuleSet;
        let load = |text: &str| {
            let (dir, file) = folder(text);
            let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
            (e, file.display().to_string())
        };
        // A template that does not compile: its line.
        let (e, file) =
            load(&BUNDLED.replace("allocated at {fmt_path(", "allocated at {fmt_path(("));
        let line = BUNDLED
            .lines()
            .position(|l| l.starts_with("site = "))
            .unwrap()
            + 1;
        assert_eq!((e.file.as_str(), e.line), (file.as_str(), line), "{e}");
        // A part that fails on a hunt (a field no record has): its line.
        let (e, file) = load(&BUNDLED.replace(
            "could not run: {hunt.error}",
            "could not run: {hunt.reason}",
        ));
        let line = BUNDLED
            .lines()
            .position(|l| l.contains("could not run"))
            .unwrap()
            + 1;
        assert_eq!((e.file.as_str(), e.line), (file.as_str(), line), "{e}");
        assert!(e.what.starts_with("lines.leak: "), "{e}");
        // `[say]` words that fail on a record: their line.
        let (e, file) = load(&BUNDLED.replace("{site.blocks} live", "{site.blokcs} live"));
        let line = BUNDLED
            .lines()
            .position(|l| l.starts_with("site = "))
            .unwrap()
            + 1;
        assert_eq!((e.file.as_str(), e.line), (file.as_str(), line), "{e}");
        assert!(e.what.contains("say.site: "), "{e}");
        // A list the bundled rules say, missing.
        let (e, file) = load(&BUNDLED.replace("\nreport = [", "\nreported = ["));
        assert_eq!(e.file, file, "{e}");
        assert!(e.what.contains("no `report`"), "{e}");
    }
}
