//! One rule: its file as written (TOML: its condition, message and variants, details, advice, mark,
//! `[let]` and `[params]`), read and checked at load, and what it says where it fires.

use super::absent::Compiled;
use super::eval::{CONSTANTS, compile, env, reads};
use super::hunt_words::HuntWords;
use super::lines::{line_of, value_line};
use super::template::{Piece, fill, holds, lines, template};
use super::{RuleError, Scope, names};
use crate::ident::GpuRef;
use crate::verdict::Severity;
use cel::{Context, Env, Value};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuleFile {
    id: String,
    severity: Severity,
    title: String,
    each: Scope,
    when: toml::Spanned<String>,
    /// One template, or variants `{ when, text }` of which the first that holds is said.
    message: toml::Spanned<MessageFile>,
    /// Named sub-expressions (`[let]`, `NAME = "CEL"`): each sees the facts, the parameters and the lets
    /// written above it, and the rule's other expressions see them all by name.
    #[serde(default, rename = "let")]
    lets: HashMap<String, toml::Spanned<String>>,
    /// The rule's own parameters (`[params]`, `NAME = number`), read as `param.NAME` beside the table's
    /// ([`crate::params`]), whose names they may not take.
    #[serde(default)]
    params: HashMap<String, toml::Spanned<toml::Value>>,
    /// Lines under the message, templates like it; one that gives a list is a line per item, one that
    /// gives nothing is left out.
    #[serde(default)]
    details: Vec<String>,
    #[serde(default)]
    advice: Vec<AdviceFile>,
    /// A page to read, a template like the message's (a variant's own page).
    #[serde(default)]
    docs: Option<String>,
    /// The moment a diagnosis is about: an expression giving seconds into the run (or null).
    #[serde(default)]
    at: Option<toml::Spanned<String>>,
    /// The GPU it is about, as messages name it (`gpu.label`, `oom.label`): an expression giving a label
    /// (or null). A rule of GPUs, processes or PyTorch processes is about the item's GPU without one.
    #[serde(default)]
    gpu: Option<toml::Spanned<String>>,
    /// Judged during the run too (`gpudoc run`), on the run so far: only for a rule whose evidence
    /// cannot be undone by what comes later in a way that matters (a leak, growth, a stray context).
    #[serde(default)]
    live: bool,
    /// Judged by `gpudoc watch` too, on each look at the machine (`run.look`): for a rule whose facts one
    /// look has (memory in use now, who holds it, leftovers, stray contexts).
    #[serde(default)]
    look: bool,
    /// The story its diagnosis tells (`oom`: why the job ran out), which the diagnoses of rules that
    /// are `part_of` it join on the same GPU and moment ([`story`]).
    #[serde(default)]
    story: Option<String>,
    /// The story its diagnosis is part of: said on its own only where no diagnosis tells that story on
    /// its GPU at its moment ([`story`]).
    #[serde(default)]
    part_of: Option<String>,
}

/// A rule's message as written: one template, or variants of which the first whose `when` holds is said
/// (a fact that names the variant, `oom.phase`, choosing the wording).
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum MessageFile {
    One(String),
    Variants(Vec<VariantFile>),
}

/// A variant of a message: said where `when` holds (and no variant above it does), under its own title
/// where it has one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct VariantFile {
    when: String,
    #[serde(default)]
    title: Option<String>,
    text: String,
}

/// A variant of a rule's message as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Variant {
    /// Where it is said (`None`: a plain message, always).
    pub when: Option<String>,
    /// Its own title, said instead of the rule's.
    pub title: Option<String>,
    pub text: String,
}

/// A line of advice as written: given always, or only where its condition holds (`{ when = "...", text =
/// "..." }`: advice fitted to what ran, a vLLM server or a training loop).
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum AdviceFile {
    Always(String),
    When(AdviceWhen),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AdviceWhen {
    when: String,
    text: String,
}

/// A line of advice and, if it has one, the condition under which it is given.
#[derive(Debug, Clone, PartialEq)]
pub struct Advice {
    pub when: Option<String>,
    pub text: String,
}

/// A loaded rule.
pub struct Rule {
    pub id: String,
    pub severity: Severity,
    pub title: String,
    pub scope: Scope,
    pub when: String,
    /// Its message's variants as written, in order (one without a condition for a plain message): the
    /// first that holds is said.
    pub message: Vec<Variant>,
    /// The detail templates, as written.
    pub details_src: Vec<String>,
    pub advice: Vec<Advice>,
    pub docs: Option<String>,
    /// Where it came from: `bundled:NAME.toml` or a path.
    pub source: String,
    /// Judged during the run too, on the run so far (`live = true`).
    pub live: bool,
    /// Judged by `gpudoc watch` on each look at the machine (`look = true`).
    pub look: bool,
    /// The story its diagnosis tells (`story = "oom"`).
    pub story: Option<String>,
    /// The story its diagnosis is part of (`part_of = "oom"`).
    pub part_of: Option<String>,
    pub(super) condition: Compiled,
    /// The facts its condition reads.
    pub(super) condition_reads: Vec<String>,
    /// Its own parameters (`[params]`) and named sub-expressions (`[let]`).
    pub(super) names: names::Names,
    /// `at` and `gpu` as written, with their lines.
    pub(super) mark_src: [Source; 2],
    /// The message's line.
    pub(super) msg_line: usize,
    /// What it says, compiled at load (a rule file of the user's, so that its errors come before the
    /// command runs) or when first needed (a bundled rule, which the tests check: most never fire, and
    /// their templates are most of the compiling).
    pub(super) saying: OnceLock<Result<Saying, RuleError>>,
}

/// A rule's message, details, advice conditions and mark, compiled, and the facts they read.
pub(super) struct Saying {
    /// The message's variants: each one's condition (`None`: always) and template.
    pub(super) pieces: Vec<(Option<Compiled>, Vec<Piece>)>,
    pub(super) details: Vec<Vec<Piece>>,
    /// The page to read, as a template.
    pub(super) docs: Option<Vec<Piece>>,
    /// Each line of advice's condition (`None`: always given).
    pub(super) advice: Vec<Option<Compiled>>,
    /// The facts the advice conditions read.
    pub(super) advice_reads: Vec<String>,
    pub(super) mark: Mark,
    pub(super) reads: Vec<String>,
}

/// Where on the run's timeline a diagnosis points: the moment and the GPU (see `RuleFile`).
#[derive(Default)]
pub(super) struct Mark {
    pub(super) at: Option<Compiled>,
    pub(super) gpu: Option<Compiled>,
}

/// An expression as written and the line it is on.
pub(super) type Source = Option<(String, usize)>;

impl Mark {
    /// `at` and `gpu` compiled from their sources.
    pub(super) fn compile(env: &Env, src: &[Source; 2], file: &str) -> Result<Mark, RuleError> {
        let [at, gpu] = src.each_ref().map(|m| {
            m.as_ref()
                .map(|(s, line)| compile(env, s, file, *line))
                .transpose()
        });
        Ok(Mark { at: at?, gpu: gpu? })
    }
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rule({} from {})", self.id, self.source)
    }
}

impl Rule {
    /// Parses and checks one rule file's text: every fact it names exists, and it gives true or false.
    pub fn parse(text: &str, source: &str) -> Result<Rule, RuleError> {
        Rule::read(text, source, Some(None))
    }

    /// Parses and checks a user's rule file, its `hunt_lines` saying the words of a hunt in force there.
    pub(super) fn parse_with(
        text: &str,
        source: &str,
        words: Option<&Arc<HuntWords>>,
    ) -> Result<Rule, RuleError> {
        Rule::read(text, source, Some(words))
    }

    /// Parses without the checks: for the bundled rules, which the tests check, so a run starts sooner.
    pub(super) fn parse_trusted(text: &str, source: &str) -> Result<Rule, RuleError> {
        Rule::read(text, source, None)
    }

    /// `check`: checked at load, with the words of a hunt in force (`None` inside: the bundled ones).
    pub(super) fn read(
        text: &str,
        source: &str,
        check: Option<Option<&Arc<HuntWords>>>,
    ) -> Result<Rule, RuleError> {
        let env = env();
        let f: RuleFile = toml::from_str(text).map_err(|e| RuleError {
            file: source.into(),
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            what: e.message().to_string(),
        })?;
        if f.id.is_empty()
            || !f
                .id
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            let what = format!("id `{}`: use lower-case letters, digits and `-`", f.id);
            return Err(RuleError {
                file: source.into(),
                line: 1,
                what,
            });
        }
        let when_line = value_line(text, f.when.span());
        let msg_line = value_line(text, f.message.span());
        let names = names::Names::read(&env, text, source, f.params, f.lets)?;
        let condition = compile(&env, f.when.get_ref(), source, when_line)?;
        let mut condition_reads = Vec::new();
        reads(
            condition.expression(),
            &HashMap::new(),
            &mut condition_reads,
        );
        let mark_src = [&f.at, &f.gpu].map(|m| {
            m.as_ref()
                .map(|m| (m.get_ref().clone(), value_line(text, m.span())))
        });
        let when_or_always = |a: AdviceFile| match a {
            AdviceFile::Always(text) => Advice { when: None, text },
            AdviceFile::When(w) => Advice {
                when: Some(w.when),
                text: w.text,
            },
        };
        let message = match f.message.into_inner() {
            MessageFile::One(text) => vec![Variant {
                when: None,
                title: None,
                text,
            }],
            MessageFile::Variants(v) => v
                .into_iter()
                .map(|v| Variant {
                    when: Some(v.when),
                    title: v.title,
                    text: v.text,
                })
                .collect(),
        };
        let rule = Rule {
            id: f.id,
            severity: f.severity,
            title: f.title,
            scope: f.each,
            when: f.when.into_inner().trim().to_string(),
            message,
            details_src: f.details,
            advice: f.advice.into_iter().map(when_or_always).collect(),
            docs: f.docs,
            live: f.live,
            look: f.look,
            story: f.story,
            part_of: f.part_of,
            source: source.into(),
            condition_reads: names.expand(condition_reads),
            condition,
            names,
            mark_src,
            msg_line,
            saying: OnceLock::new(),
        };
        if let Some(words) = check {
            let advice_line = text.find("advice").map_or(msg_line, |o| line_of(text, o));
            rule.check((&env, words), (when_line, msg_line, advice_line))
                .map_err(|(line, what)| RuleError {
                    file: source.into(),
                    line,
                    what,
                })?;
        }
        Ok(rule)
    }

    /// Its named sub-expressions as written (`[let]`), in the file's order.
    pub fn lets(&self) -> Vec<(String, String)> {
        self.names.lets()
    }

    /// Its own parameters (`[params]`).
    pub fn own_params(&self) -> &[(String, crate::params::Number)] {
        &self.names.params
    }

    /// The message, details and mark compiled, with the facts they read.
    pub(super) fn compile_saying(&self, env: &Env) -> Result<Saying, RuleError> {
        let (file, line) = (self.source.as_str(), self.msg_line);
        let mut variant_reads = Vec::new();
        let pieces = self
            .message
            .iter()
            .map(|v| {
                let when = v
                    .when
                    .as_deref()
                    .map(|w| compile(env, w, file, line))
                    .transpose()?;
                if let Some(p) = &when {
                    reads(p.expression(), &HashMap::new(), &mut variant_reads);
                }
                Ok((when, template(env, &v.text, file, line)?))
            })
            .collect::<Result<Vec<_>, RuleError>>()?;
        let details = self
            .details_src
            .iter()
            .map(|d| template(env, d, file, line))
            .collect::<Result<Vec<_>, _>>()?;
        let mark = Mark::compile(env, &self.mark_src, file)?;
        let docs = self
            .docs
            .as_deref()
            .map(|d| template(env, d, file, line))
            .transpose()?;
        let mut advice_reads = Vec::new();
        let advice = self
            .advice
            .iter()
            .map(|a| {
                a.when
                    .as_deref()
                    .map(|w| {
                        let p = compile(env, w, file, line)?;
                        reads(p.expression(), &HashMap::new(), &mut advice_reads);
                        Ok(p)
                    })
                    .transpose()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut read = variant_reads;
        for e in mark.at.iter().chain(mark.gpu.iter()) {
            reads(e.expression(), &HashMap::new(), &mut read);
        }
        let texts = pieces.iter().flat_map(|p| p.1.iter());
        for p in texts
            .chain(details.iter().flatten())
            .chain(docs.iter().flatten())
        {
            if let Piece::Expr(e) = p {
                reads(e.expression(), &HashMap::new(), &mut read);
            }
        }
        Ok(Saying {
            pieces,
            details,
            docs,
            advice,
            advice_reads: self.names.expand(advice_reads),
            mark,
            reads: self.names.expand(read),
        })
    }

    /// What it says, compiled the first time it is needed.
    pub(super) fn saying(&self) -> Result<&Saying, String> {
        self.saying
            .get_or_init(|| self.compile_saying(&env()))
            .as_ref()
            .map_err(|e| e.to_string())
    }

    /// Where else it is judged than at a run's end: `live` (during the run), `look` (by `gpudoc watch`).
    pub fn also(&self) -> Vec<&'static str> {
        [(self.live, "live"), (self.look, "look")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect()
    }

    /// The facts its condition, message and details read (none of the message's if it cannot be
    /// compiled).
    pub fn reads(&self) -> Vec<String> {
        let mut read = self.condition_reads.clone();
        if let Ok(s) = self.saying() {
            read.extend(s.reads.iter().cloned());
        }
        read.sort();
        read.dedup();
        read.retain(|p| !CONSTANTS.iter().any(|(n, _)| n == p));
        read
    }

    /// The message, its detail lines and its mark if the rule fires in `ctx`, `None` if it does not.
    pub(super) fn fire(&self, ctx: &Context) -> Result<Option<Fired>, String> {
        let mut kept = Vec::new();
        let scope = self.names.bind_keeping(ctx, false, &mut kept)?;
        let ctx = &scope;
        match self.condition.execute(ctx) {
            Ok(Value::Bool(false)) => Ok(None),
            Ok(Value::Bool(true)) => self.say(ctx).map(|f| Some(Fired { kept, ..f })),
            Ok(other) => Err(format!("gave {other:?}, not true or false")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What it says where it fires: the first variant of its message that holds, its details, its mark
    /// and the advice that holds.
    pub(super) fn say(&self, ctx: &Context) -> Result<Fired, String> {
        let said = self.saying()?;
        let mut message = None;
        for ((when, pieces), v) in said.pieces.iter().zip(&self.message) {
            if holds(when.as_ref(), ctx).map_err(|e| format!("message: {e}"))? {
                let text = fill(pieces, ctx).map_err(|e| format!("message: {e}"))?;
                message = Some((text, v.title.clone()));
                break;
            }
        }
        let (message, title) = message.ok_or("message: no variant holds")?;
        let mut details = Vec::new();
        for d in &said.details {
            details.extend(lines(d, ctx).map_err(|e| format!("details: {e}"))?);
        }
        let docs = said
            .docs
            .as_ref()
            .map(|d| fill(d, ctx).map_err(|e| format!("docs: {e}")))
            .transpose()?
            .filter(|d| !d.is_empty());
        let run = |p: &Option<Compiled>, what: &str| {
            p.as_ref()
                .map(|p| p.execute(ctx).map_err(|e| format!("{what}: {e}")))
                .transpose()
        };
        let at_s = match run(&said.mark.at, "at")? {
            Some(Value::Float(x)) if x >= 0.0 => Some(x),
            Some(Value::Int(x)) if x >= 0 => Some(x as f64),
            Some(Value::UInt(x)) => Some(x as f64),
            _ => None,
        };
        let gpu = match run(&said.mark.gpu, "gpu")? {
            Some(Value::String(s)) => GpuRef::parse(&s),
            _ => None,
        };
        let mut advice = Vec::new();
        for (a, when) in self.advice.iter().zip(&said.advice) {
            if holds(when.as_ref(), ctx).map_err(|e| format!("advice: {e}"))? {
                advice.push(a.text.clone());
            }
        }
        Ok(Fired {
            title: title.unwrap_or_else(|| self.title.clone()),
            message,
            details,
            docs,
            advice,
            at_s,
            gpu,
            kept: Vec::new(),
        })
    }
}

/// What a rule says when it fires.
pub(super) struct Fired {
    pub(super) title: String,
    pub(super) message: String,
    pub(super) details: Vec<String>,
    pub(super) docs: Option<String>,
    pub(super) advice: Vec<String>,
    pub(super) at_s: Option<f64>,
    /// The GPU the rule's `gpu` expression named (none where its words name no GPU NVML sees).
    pub(super) gpu: Option<GpuRef>,
    /// The values of its lets that a diagnosis records by value, by name ([`super::names`]).
    pub(super) kept: Vec<(String, serde_json::Value)>,
}
