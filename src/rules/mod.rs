//! The rule set: diagnoses from facts. Rules are TOML files in `rules/` (one rule a file, embedded into
//! the binary), overridable from a folder (`--rules DIR`). A rule's condition and the expressions in its
//! message are CEL (the `cel` crate), evaluated over the [`facts`] of a run. A rule that does not parse,
//! names a fact that does not exist or compares the wrong types fails at load with its file and line.

mod absent;
pub mod bundled;
mod deferred;
pub mod facts;
pub mod framework;
pub mod growth;
mod names;
pub mod phase;
pub mod serving;
pub mod story;
mod when;
pub mod words;

pub use deferred::RunRules;

use crate::ident::{GpuRef, ProcRef};
use crate::verdict::{Diagnosis, Severity};
use absent::Compiled;
use cel::common::ast::{Expr, IdedExpr};
use cel::common::types::CelNull;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, Value};
use facts::Facts;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// What a rule is evaluated for: once per run, or once per GPU, process or PyTorch process (bound to the
/// variable `gpu`, `process` or `torch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Run,
    Gpu,
    Process,
    Torch,
}

impl Scope {
    /// `run`, `gpu`, `process`, `torch`.
    pub fn name(&self) -> &'static str {
        self.var().unwrap_or("run")
    }

    fn var(&self) -> Option<&'static str> {
        match self {
            Scope::Run => None,
            Scope::Gpu => Some("gpu"),
            Scope::Process => Some("process"),
            Scope::Torch => Some("torch"),
        }
    }
    fn list(&self) -> &'static str {
        match self {
            Scope::Run => "",
            Scope::Gpu => "gpus",
            Scope::Process => "processes",
            Scope::Torch => "torch_processes",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
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
enum MessageFile {
    One(String),
    Variants(Vec<VariantFile>),
}

/// A variant of a message: said where `when` holds (and no variant above it does), under its own title
/// where it has one.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct VariantFile {
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
enum AdviceFile {
    Always(String),
    When(AdviceWhen),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdviceWhen {
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
    condition: Compiled,
    /// The facts its condition reads.
    condition_reads: Vec<String>,
    /// Its own parameters (`[params]`) and named sub-expressions (`[let]`).
    names: names::Names,
    /// `at` and `gpu` as written, with their lines.
    mark_src: [Source; 2],
    /// The message's line.
    msg_line: usize,
    /// What it says, compiled at load (a rule file of the user's, so that its errors come before the
    /// command runs) or when first needed (a bundled rule, which the tests check: most never fire, and
    /// their templates are most of the compiling).
    saying: OnceLock<Result<Saying, RuleError>>,
}

/// A rule's message, details, advice conditions and mark, compiled, and the facts they read.
struct Saying {
    /// The message's variants: each one's condition (`None`: always) and template.
    pieces: Vec<(Option<Compiled>, Vec<Piece>)>,
    details: Vec<Vec<Piece>>,
    /// The page to read, as a template.
    docs: Option<Vec<Piece>>,
    /// Each line of advice's condition (`None`: always given).
    advice: Vec<Option<Compiled>>,
    /// The facts the advice conditions read.
    advice_reads: Vec<String>,
    mark: Mark,
    reads: Vec<String>,
}

/// Where on the run's timeline a diagnosis points: the moment and the GPU (see `RuleFile`).
#[derive(Default)]
struct Mark {
    at: Option<Compiled>,
    gpu: Option<Compiled>,
}

/// An expression as written and the line it is on.
type Source = Option<(String, usize)>;

impl Mark {
    /// `at` and `gpu` compiled from their sources.
    fn compile(env: &Env, src: &[Source; 2], file: &str) -> Result<Mark, RuleError> {
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

enum Piece {
    Text(String),
    Expr(Compiled),
}

/// A rule that can't be used, with where (`line` 0: the whole file, or a flag).
#[derive(Debug, Clone, PartialEq)]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file, self.what),
            n => write!(f, "{}:{n}: {}", self.file, self.what),
        }
    }
}

impl std::error::Error for RuleError {}

/// The rules in force.
pub struct RuleSet {
    pub rules: Vec<Rule>,
    env: Arc<Env>,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.rules).finish()
    }
}

const CONSTANTS: [(&str, i64); 6] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// CEL's standard library, with its strings and lists extensions: a template says a list fact with
/// `map`, `join` and `slice` (docs/rules.md, "List facts").
fn env() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .and_then(|()| env.add_extension(cel::extensions::lists))
        .expect("CEL's own extensions declare no name twice");
    Arc::new(env)
}

/// A fact (or a list or group of them) as the interpreter's CEL value, its strings borrowed, made in one
/// step (through a [`Value`], each map is built twice).
fn to_val(v: &serde_json::Value) -> Box<dyn Val + '_> {
    use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelMap, CelMapKey, CelString};
    match v {
        serde_json::Value::Null => Box::new(CelNull),
        serde_json::Value::Bool(b) => Box::new(CelBool::from(*b)),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Box::new(CelInt::from(i)),
            None => Box::new(CelDouble::from(n.as_f64().unwrap_or(0.0))),
        },
        serde_json::Value::String(s) => Box::new(CelString::from(s.as_str())),
        serde_json::Value::Array(a) => {
            Box::new(CelList::from(a.iter().map(to_val).collect::<Vec<_>>()))
        }
        serde_json::Value::Object(o) => Box::new(CelMap::from(
            o.iter()
                .map(|(k, v)| (CelMapKey::from(k.as_str()), to_val(v)))
                .collect::<HashMap<_, _>>(),
        )),
    }
}

/// The facts as the variables rules see (`run`, `oom`, `gpus`, ...), each made a CEL value when a rule
/// first reads it: most rules read two or three, and the lists are most of the facts.
struct Lazy<'a> {
    vars: Vec<LazyVar<'a>>,
}

/// A variable of [`Lazy`]: its name, its facts, and their CEL value once read.
struct LazyVar<'a> {
    name: &'a str,
    facts: &'a serde_json::Value,
    val: OnceLock<Box<dyn Val + 'a>>,
}

impl<'a> Lazy<'a> {
    fn new(facts: &'a serde_json::Value) -> Lazy<'a> {
        let vars = facts.as_object().into_iter().flatten();
        Lazy {
            vars: vars
                .map(|(name, facts)| LazyVar {
                    name,
                    facts,
                    val: OnceLock::new(),
                })
                .collect(),
        }
    }
}

impl VariableResolver for Lazy<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        let v = self.vars.iter().find(|v| v.name == variable)?;
        Some(CowVal::Borrowed(
            v.val.get_or_init(|| to_val(v.facts)).as_ref(),
        ))
    }
}

/// A context holding the facts (as rules read them), the unit constants and the formatting functions.
fn context<'a, 'f: 'a>(env: &Arc<Env>, facts: &'a Lazy<'f>) -> Context<'a, 'a> {
    let mut ctx = functions(env);
    ctx.set_variable_resolver(facts);
    ctx
}

/// A context holding the unit constants and the formatting functions.
fn functions<'a>(env: &Arc<Env>) -> Context<'a, 'a> {
    let mut ctx = Context::with_env(env.clone());
    for (name, v) in CONSTANTS {
        ctx.add_variable_from_value(name, Value::Int(v));
    }
    ctx.add_variable_from_value("param", names::param_value(&[]));
    // An absent fact (null), and a -1 that still means one, are said to be unknown.
    let _ = ctx.add_function("fmt_bytes", |b: Value| match b {
        Value::Int(b) if b >= 0 => Ok(Value::from(crate::units::fmt_bytes(b as u64))),
        Value::UInt(b) => Ok(Value::from(crate::units::fmt_bytes(b))),
        Value::Int(_) | Value::Null => Ok(Value::from("an unknown amount")),
        other => Err(not_a_number("fmt_bytes", &other)),
    });
    let _ = ctx.add_function("fmt_list", |l: Arc<Vec<Value>>| {
        l.iter().map(render).collect::<Vec<_>>().join(", ")
    });
    let _ = ctx.add_function("fmt_cmd", |c: Arc<String>| crate::units::shorten(&c, 60));
    let _ = ctx.add_function("fmt_pct", |p: Value| {
        of_double("fmt_pct", p, |p| format!("{p:.1}%"))
    });
    let _ = ctx.add_function("fmt_ratio", |r: Value| {
        of_double("fmt_ratio", r, |r| format!("{r:.1}x"))
    });
    let _ = ctx.add_function("fmt_secs", |s: Value| {
        of_double("fmt_secs", s, crate::units::fmt_secs)
    });
    ctx
}

/// A formatting function of a double: `unknown` for an absent fact.
fn of_double(
    name: &str,
    v: Value,
    f: impl Fn(f64) -> String,
) -> Result<Value, cel::ExecutionError> {
    match v {
        Value::Float(x) => Ok(Value::from(f(x))),
        Value::Null => Ok(Value::from(UNKNOWN)),
        other => Err(not_a_number(name, &other)),
    }
}

fn not_a_number(name: &str, v: &Value) -> cel::ExecutionError {
    cel::ExecutionError::function_error(name, format!("takes a number, not {v:?}"))
}

/// How a template prints an absent fact.
const UNKNOWN: &str = "unknown";

fn line_of(doc: &str, offset: usize) -> usize {
    doc[..offset.min(doc.len())].matches('\n').count() + 1
}

/// The first line of a string value's text (a `'''` string starting with a newline begins one line on).
fn value_line(doc: &str, span: std::ops::Range<usize>) -> usize {
    let raw = &doc[span.clone()];
    let skip =
        (raw.starts_with("'''") || raw.starts_with("\"\"\"")) && raw[3..].starts_with(['\n', '\r']);
    line_of(doc, span.start) + usize::from(skip)
}

fn compile(env: &Env, src: &str, file: &str, line: usize) -> Result<Compiled, RuleError> {
    env.compile(src).map(|p| Compiled::of(&p)).map_err(|e| {
        let first = e.errors.first();
        let (l, c) = first.map_or((1, 0), |p| {
            (p.pos.0.max(1) as usize, p.pos.1.max(0) as usize)
        });
        let msg = first.map_or_else(|| e.to_string(), |p| p.msg.clone());
        RuleError {
            file: file.into(),
            line: line + l - 1,
            what: format!("CEL syntax error at column {}: {msg}", c + 1),
        }
    })
}

/// Splits `GPU {gpu.index}: {fmt_bytes(x)}` into text and expressions; `{{` and `}}` are literal braces.
fn template(env: &Env, src: &str, file: &str, line: usize) -> Result<Vec<Piece>, RuleError> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = src.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut expr = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(ch) => expr.push(ch),
                        None => {
                            return Err(RuleError {
                                file: file.into(),
                                line,
                                what: format!("message: `{{{expr}` is not closed"),
                            });
                        }
                    }
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Expr(compile(env, &expr, file, line)?));
            }
            '}' => {
                return Err(RuleError {
                    file: file.into(),
                    line,
                    what: "message: a `}` without its `{`".into(),
                });
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Dotted paths of the facts an expression reads (`torch.steps`, `gpus[].index` inside a macro).
fn reads(e: &IdedExpr, bound: &HashMap<String, String>, out: &mut Vec<String>) {
    fn path(e: &IdedExpr, bound: &HashMap<String, String>) -> Option<String> {
        match &e.expr {
            Expr::Ident(n) => Some(bound.get(n).cloned().unwrap_or_else(|| n.clone())),
            Expr::Select(s) => Some(format!("{}.{}", path(&s.operand, bound)?, s.field)),
            // `gpus[1]`: an element of the list, whichever.
            Expr::Call(c) if c.func_name == "_[_]" && c.args.len() == 2 => {
                Some(format!("{}[]", path(&c.args[0], bound)?))
            }
            _ => None,
        }
    }
    match &e.expr {
        Expr::Ident(_) | Expr::Select(_) => match path(e, bound) {
            Some(p) => out.push(p),
            None => {
                if let Expr::Select(s) = &e.expr {
                    reads(&s.operand, bound, out)
                }
            }
        },
        Expr::Call(c) if c.func_name == "_[_]" && c.args.len() == 2 => {
            if let Some(p) = path(e, bound) {
                out.push(p);
            } else {
                reads(&c.args[0], bound, out);
            }
            reads(&c.args[1], bound, out);
        }
        Expr::Call(c) => {
            if let Some(t) = &c.target {
                reads(t, bound, out);
            }
            for a in &c.args {
                reads(a, bound, out);
            }
        }
        Expr::List(l) => l.elements.iter().for_each(|x| reads(x, bound, out)),
        Expr::Comprehension(c) => {
            reads(&c.iter_range, bound, out);
            reads(&c.accu_init, bound, out);
            let mut inner = bound.clone();
            // Over a list fact, or a method's result on one (`l.slice(0, 2)`): some of its elements.
            let range = path(&c.iter_range, bound).or_else(|| match &c.iter_range.expr {
                Expr::Call(m) => path(m.target.as_deref()?, bound),
                _ => None,
            });
            if let Some(range) = range {
                inner.insert(c.iter_var.clone(), format!("{range}[]"));
            }
            inner.insert(c.accu_var.clone(), String::new());
            for x in [&c.loop_cond, &c.loop_step, &c.result] {
                reads(x, &inner, out);
            }
        }
        _ => {}
    }
}

/// Evaluates each operand of `&&`, `||` and `?:` separately (recursively), and anything else whole. Only
/// type errors count: what depends on the values (an index past the example's one element, a division by
/// its zero) is for the run to find, guarded as the rule guards it.
fn check_operands(e: &IdedExpr, ctx: &Context) -> Result<(), String> {
    if let Expr::Call(c) = &e.expr
        && matches!(c.func_name.as_str(), "_&&_" | "_||_" | "_?_:_" | "!_")
    {
        return c.args.iter().try_for_each(|a| check_operands(a, ctx));
    }
    match Value::resolve(e, ctx) {
        Ok(_) => Ok(()),
        Err(x) if depends_on_values(&x) => Ok(()),
        Err(x) => Err(x.to_string()),
    }
}

/// An error that a rule's guard can rule out at run time, not a mistake in the rule.
fn depends_on_values(e: &cel::ExecutionError) -> bool {
    use cel::ExecutionError as E;
    matches!(
        e,
        E::IndexOutOfBounds(_)
            | E::DivisionByZero(_)
            | E::RemainderByZero(_)
            | E::Overflow(..)
            | E::NoSuchKey(_)
    )
}

/// Whether `path` names a fact in `facts` (the example, with one element in each list).
fn resolves(facts: &serde_json::Value, path: &str) -> bool {
    path.is_empty() || CONSTANTS.iter().any(|(n, _)| *n == path) || lookup(facts, path).is_some()
}

/// The value at a fact's path (`gpu.total_bytes`; `gpus[].index` reads a list's first element).
fn lookup<'a>(facts: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    let mut cur = facts;
    for part in path.split('.') {
        let (name, elem) = match part.strip_suffix("[]") {
            Some(n) => (n, true),
            None => (part, false),
        };
        cur = cur.get(name)?;
        if elem {
            cur = cur.get(0)?;
        }
    }
    Some(cur)
}

/// The facts as the variables a rule sees: `run`, `oom`, the lists, and the scope's item.
fn variables(facts: &Facts, scope: Scope, item: usize) -> serde_json::Value {
    let mut v = serde_json::to_value(facts).expect("facts serialize");
    if let Some(var) = scope.var() {
        let elem = v[scope.list()][item].clone();
        v[var] = elem;
    }
    v
}

/// The example facts with every number made 1, so a rule's arithmetic can be tried without dividing by 0.
fn example_variables(scope: Scope) -> serde_json::Value {
    fn ones(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Number(n) => {
                *n = if n.is_f64() {
                    serde_json::Number::from_f64(1.0).unwrap()
                } else {
                    1.into()
                }
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(ones),
            serde_json::Value::Object(o) => o.values_mut().for_each(ones),
            _ => {}
        }
    }
    // Two of everything, so `gpus[1]` can be checked too (past that, the index depends on the run).
    let mut f = Facts::example();
    f.gpus.extend(f.gpus.clone());
    f.processes.extend(f.processes.clone());
    f.torch_processes.extend(f.torch_processes.clone());
    let mut v = variables(&f, scope, 0);
    ones(&mut v);
    v
}

/// A rule's checks at load: every fact named exists in the scope's variables, and the rule runs and gives
/// the right types, every operand of && and || on its own too, so short-circuiting on the example can't
/// hide a mistake. The error's line and what is wrong.
fn check_rule(
    env: &Arc<Env>,
    (scope, names): (Scope, &names::Names),
    condition: &Compiled,
    pieces: &[&[Piece]],
    (read, msg_reads): (&[String], &[String]),
    (when_line, msg_line): (usize, usize),
) -> Result<(), (usize, String)> {
    let example = names.example(scope);
    for (paths, line, what) in [(read, when_line, "when"), (msg_reads, msg_line, "message")] {
        if let Some(bad) = paths.iter().find(|p| !resolves(&example, p)) {
            let hint = match scope.var() {
                Some(v) => format!(
                    " (this rule's item is `{v}`; facts are listed by `gpudoc rules facts`)"
                ),
                None => " (facts are listed by `gpudoc rules facts`)".into(),
            };
            return Err((line, format!("{what}: unknown fact `{bad}`{hint}")));
        }
    }
    let vars = Lazy::new(&example);
    let root = context(env, &vars);
    let ctx = names.bind(&root, true).map_err(|e| (when_line, e))?;
    check_operands(condition.expression(), &ctx).map_err(|e| (when_line, format!("when: {e}")))?;
    gives_bool(condition, &ctx).map_err(|e| (when_line, format!("when: {e}")))?;
    for p in pieces.iter().flat_map(|p| p.iter()) {
        if let Piece::Expr(e) = p
            && let Err(x) = e.execute(&ctx)
            && !depends_on_values(&x)
        {
            return Err((msg_line, format!("message: {x}")));
        }
    }
    Ok(())
}

/// Each advice condition reads known facts and gives true or false on the example facts.
fn check_advice(
    env: &Arc<Env>,
    (scope, names): (Scope, &names::Names),
    saying: &Saying,
    (line, msg_line): (usize, usize),
) -> Result<(), (usize, String)> {
    let example = names.example(scope);
    if let Some(bad) = saying.advice_reads.iter().find(|p| !resolves(&example, p)) {
        return Err((line, format!("advice: unknown fact `{bad}`")));
    }
    let vars = Lazy::new(&example);
    let root = context(env, &vars);
    let ctx = names.bind(&root, true).map_err(|e| (line, e))?;
    for p in saying.advice.iter().flatten() {
        gives_bool(p, &ctx).map_err(|e| (line, format!("advice: {e}")))?;
    }
    for p in saying.pieces.iter().filter_map(|v| v.0.as_ref()) {
        gives_bool(p, &ctx).map_err(|e| (msg_line, format!("message: when: {e}")))?;
    }
    Ok(())
}

/// A condition gives true or false on the example facts (an error that only real values could avoid,
/// a division by zero, is no fault of the rule's).
fn gives_bool(p: &Compiled, ctx: &Context) -> Result<(), String> {
    match p.execute(ctx) {
        Ok(Value::Bool(_)) => Ok(()),
        Ok(other) => Err(format!("must be true or false, not {other:?}")),
        Err(e) if depends_on_values(&e) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// A template filled in.
fn fill(pieces: &[Piece], ctx: &Context) -> Result<String, String> {
    let mut out = String::new();
    for p in pieces {
        match p {
            Piece::Text(t) => out.push_str(t),
            Piece::Expr(e) => out.push_str(&render(&e.execute(ctx).map_err(|x| x.to_string())?)),
        }
    }
    Ok(out.trim().to_string())
}

/// A detail template's lines: a template that is one expression giving a list gives a line per item;
/// empty lines are left out.
fn lines(pieces: &[Piece], ctx: &Context) -> Result<Vec<String>, String> {
    let out = match pieces {
        [Piece::Expr(e)] => match e.execute(ctx).map_err(|x| x.to_string())? {
            Value::List(l) => l.iter().map(render).collect(),
            v => vec![render(&v)],
        },
        _ => vec![fill(pieces, ctx)?],
    };
    Ok(out
        .into_iter()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

fn render(value: &Value) -> String {
    match value {
        Value::String(s) => s.to_string(),
        Value::Int(i) => i.to_string(),
        Value::UInt(u) => u.to_string(),
        Value::Float(f) => {
            // Two decimals at most, no trailing zeros past the first: 13.0, 12.4, 0.98.
            let s = format!("{f:.2}");
            let s = s.trim_end_matches('0');
            if s.ends_with('.') {
                format!("{s}0")
            } else {
                s.to_string()
            }
        }
        Value::Bool(b) => b.to_string(),
        Value::List(l) => l.iter().map(render).collect::<Vec<_>>().join(", "),
        Value::Null => UNKNOWN.into(),
        other => format!("{other:?}"),
    }
}

impl Rule {
    /// Parses and checks one rule file's text: every fact it names exists, and it gives true or false.
    pub fn parse(text: &str, source: &str) -> Result<Rule, RuleError> {
        Rule::read(text, source, true)
    }

    /// Parses without the checks: for the bundled rules, which the tests check, so a run starts sooner.
    fn parse_trusted(text: &str, source: &str) -> Result<Rule, RuleError> {
        Rule::read(text, source, false)
    }

    fn read(text: &str, source: &str, check: bool) -> Result<Rule, RuleError> {
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
        if check {
            let advice_line = text.find("advice").map_or(msg_line, |o| line_of(text, o));
            rule.check(&env, (when_line, msg_line, advice_line))
                .map_err(|(line, what)| RuleError {
                    file: source.into(),
                    line,
                    what,
                })?;
        }
        Ok(rule)
    }

    /// The checks at load of a rule read from a file ([`Rule::parse`]): its saying is compiled and kept.
    fn check(
        &self,
        env: &Arc<Env>,
        (when_line, msg_line, advice_line): (usize, usize, usize),
    ) -> Result<(), (usize, String)> {
        let saying = self.compile_saying(env).map_err(|e| (e.line, e.what))?;
        let all: Vec<&[Piece]> = saying
            .pieces
            .iter()
            .map(|p| p.1.as_slice())
            .chain(saying.details.iter().map(|d| d.as_slice()))
            .chain(saying.docs.iter().map(|d| d.as_slice()))
            .collect();
        let names = (self.scope, &self.names);
        check_rule(
            env,
            names,
            &self.condition,
            &all,
            (&self.condition_reads, &saying.reads),
            (when_line, msg_line),
        )?;
        check_advice(env, names, &saying, (advice_line, msg_line))?;
        check_mark(env, names, &saying.mark, &self.mark_src)?;
        let _ = self.saying.set(Ok(saying));
        Ok(())
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
    fn compile_saying(&self, env: &Env) -> Result<Saying, RuleError> {
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
    fn saying(&self) -> Result<&Saying, String> {
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
    fn fire(&self, ctx: &Context) -> Result<Option<Fired>, String> {
        let scope = self.names.bind(ctx, false)?;
        let ctx = &scope;
        match self.condition.execute(ctx) {
            Ok(Value::Bool(false)) => Ok(None),
            Ok(Value::Bool(true)) => self.say(ctx).map(Some),
            Ok(other) => Err(format!("gave {other:?}, not true or false")),
            Err(e) => Err(e.to_string()),
        }
    }

    /// What it says where it fires: the first variant of its message that holds, its details, its mark
    /// and the advice that holds.
    fn say(&self, ctx: &Context) -> Result<Fired, String> {
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
        })
    }
}

/// Whether a condition of a message's variant or a line of advice holds (one without a condition always
/// does).
fn holds(when: Option<&Compiled>, ctx: &Context) -> Result<bool, String> {
    match when.map(|p| p.execute(ctx)) {
        None => Ok(true),
        Some(Ok(Value::Bool(b))) => Ok(b),
        Some(Ok(other)) => Err(format!("gave {other:?}")),
        Some(Err(e)) => Err(e.to_string()),
    }
}

/// What a rule says when it fires.
struct Fired {
    title: String,
    message: String,
    details: Vec<String>,
    docs: Option<String>,
    advice: Vec<String>,
    at_s: Option<f64>,
    /// The GPU the rule's `gpu` expression named (none where its words name no GPU NVML sees).
    gpu: Option<GpuRef>,
}

/// `at` must give a number and `gpu` a string (or null), on every item a rule can be given.
fn check_mark(
    env: &Arc<Env>,
    (scope, names): (Scope, &names::Names),
    mark: &Mark,
    src: &[Source; 2],
) -> Result<(), (usize, String)> {
    let example = names.example(scope);
    let vars = Lazy::new(&example);
    let root = context(env, &vars);
    let ctx = names.bind(&root, true).map_err(|e| (0, e))?;
    for ((program, src), (what, number)) in [&mark.at, &mark.gpu]
        .into_iter()
        .zip(src)
        .zip([("at", true), ("gpu", false)])
    {
        let (Some(p), Some((_, line))) = (program, src) else {
            continue;
        };
        match p.execute(&ctx) {
            Ok(Value::Int(_) | Value::UInt(_) | Value::Float(_) | Value::Null) if number => {}
            Ok(Value::String(_) | Value::Null) if !number => {}
            Ok(other) => {
                let want = if number { "seconds" } else { "a GPU's label" };
                return Err((*line, format!("{what}: must give {want}, not {other:?}")));
            }
            Err(e) if depends_on_values(&e) => {}
            Err(e) => return Err((*line, format!("{what}: {e}"))),
        }
    }
    Ok(())
}

/// Rules that became variants of another, by their old id: what a user's `--disable-rule` or
/// `gpudoc rules explain` of the old id is told.
const MERGED: [(&str, &str); 5] = [
    ("oom-near-capacity", "oom-self-growth"),
    ("oom-before-training", "oom-self-growth"),
    ("oom-training-step", "oom-self-growth"),
    ("oom-after-training", "oom-self-growth"),
    ("oom-serving", "oom-self-growth"),
];

/// What is said of an id that names no rule: where a rule of that id went, or where to find the ids.
pub fn no_rule(id: &str) -> String {
    match MERGED.iter().find(|(old, _)| *old == id) {
        Some((_, now)) => format!(
            "no rule `{id}`: it is one of the variants of `{now}` now (`gpudoc rules explain {now}`)"
        ),
        None => format!("no rule `{id}` (see `gpudoc rules list`)"),
    }
}

/// Each id given to `--disable-rule` must name a rule.
fn check_disabled(ids: &[&str], disabled: &[String]) -> Result<(), RuleError> {
    match disabled.iter().find(|d| !ids.contains(&d.as_str())) {
        Some(id) => Err(RuleError {
            file: "--disable-rule".into(),
            line: 0,
            what: no_rule(id),
        }),
        None => Ok(()),
    }
}

impl RuleSet {
    /// The bundled rules, those of `dir` on top (a rule with the same id replaces the bundled one), less
    /// the disabled ones (each must name a rule).
    pub fn load(dir: Option<&Path>, disabled: &[String]) -> Result<RuleSet, RuleError> {
        let mut rules: Vec<Rule> = Vec::new();
        for (name, text) in bundled::RULES {
            rules.push(Rule::parse_trusted(text, &format!("bundled:{name}"))?);
        }
        if let Some(dir) = dir {
            let io = |what: String| RuleError {
                file: dir.display().to_string(),
                line: 0,
                what,
            };
            let mut files: Vec<_> = std::fs::read_dir(dir)
                .map_err(|e| io(format!("cannot read the rules folder: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            files.sort();
            for path in files {
                let file = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|e| RuleError {
                    file: file.clone(),
                    line: 0,
                    what: e.to_string(),
                })?;
                let rule = Rule::parse(&text, &file)?;
                rules.retain(|r| r.id != rule.id);
                rules.push(rule);
            }
        }
        let ids: Vec<&str> = rules.iter().map(|r| r.id.as_str()).collect();
        check_disabled(&ids, disabled)?;
        rules.retain(|r| !disabled.contains(&r.id));
        rules.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(RuleSet { rules, env: env() })
    }

    /// The ids of the rules judged during the run too (`live = true`).
    pub fn live_ids(&self) -> Vec<String> {
        self.rules
            .iter()
            .filter(|r| r.live)
            .map(|r| r.id.clone())
            .collect()
    }

    /// The rules judged on a look at the machine (`look = true`), the others left out: `gpudoc watch`
    /// evaluates only these, every interval.
    pub fn looks(self) -> RuleSet {
        RuleSet {
            rules: self.rules.into_iter().filter(|r| r.look).collect(),
            env: self.env,
        }
    }

    /// Every rule against the facts; diagnoses most severe first. A rule that fails on these facts is
    /// reported in the second list instead of firing. The facts are turned into CEL values once; each
    /// item of a rule's scope is then bound in a scope of its own, so the cost grows with the facts, not
    /// with their square.
    pub fn evaluate(&self, facts: &Facts) -> (Vec<Diagnosis>, Vec<String>) {
        let all = serde_json::to_value(facts).expect("facts serialize");
        // Each GPU, process and PyTorch process is made a CEL value once, for every rule of its scope, and
        // only where a rule is of that scope; the facts as a whole only as rules read them: converting them,
        // not the rules, was most of a look's cost (`gpudoc watch`, bench/watch_look.rs).
        let scopes: Vec<(Scope, Vec<Item>)> = [Scope::Gpu, Scope::Process, Scope::Torch]
            .into_iter()
            .filter(|s| self.rules.iter().any(|r| r.scope == *s))
            .map(|s| (s, Item::all(&all, s)))
            .collect();
        let run = [Item::none()];
        let lazy = Lazy::new(&all);
        let root = context(&self.env, &lazy);
        let mut out = Vec::new();
        let mut failed = Vec::new();
        for rule in &self.rules {
            let list = match scopes.iter().find(|(s, _)| *s == rule.scope) {
                Some((_, items)) => items.as_slice(),
                None => &run,
            };
            for (i, item) in list.iter().enumerate() {
                let mut ctx = root.new_inner_scope();
                ctx.set_variable_resolver(item);
                match rule.fire(&ctx) {
                    Ok(None) => {}
                    Ok(Some(f)) => {
                        let (gpu, pid) = about(facts, rule.scope, i);
                        let read = read_values(&all, rule, i);
                        out.push(Diagnosis {
                            rule: rule.id.clone(),
                            severity: rule.severity,
                            title: f.title,
                            subject: subject(facts, rule.scope, i),
                            message: f.message,
                            details: f.details,
                            advice: f.advice,
                            docs: f.docs,
                            gpu: f.gpu.or(gpu),
                            pid,
                            at_s: f.at_s,
                            facts: read,
                            known_at_s: None,
                            parts: Vec::new(),
                        })
                    }
                    Err(e) => failed.push(format!("rule {}: {e}", rule.id)),
                }
            }
        }
        out.sort_by(|a, b| {
            b.severity
                .cmp(&a.severity)
                .then(a.rule.cmp(&b.rule))
                .then(a.subject.cmp(&b.subject))
        });
        (out, failed)
    }
}

/// An item of a rule's scope, bound to its variable (`gpu`, `process`, `torch`), or nothing for a rule of
/// the run.
struct Item<'a> {
    var: &'static str,
    val: Box<dyn Val + 'a>,
}

impl<'a> Item<'a> {
    /// The items of `scope`'s list in the facts `all`.
    fn all(all: &'a serde_json::Value, scope: Scope) -> Vec<Item<'a>> {
        let var = scope.var().unwrap_or_default();
        let list = all.get(scope.list()).and_then(|v| v.as_array());
        list.into_iter()
            .flatten()
            .map(|v| Item {
                var,
                val: to_val(v),
            })
            .collect()
    }

    /// The run's "item": no variable.
    fn none() -> Item<'a> {
        Item {
            var: "",
            val: Box::new(CelNull),
        }
    }
}

impl VariableResolver for Item<'_> {
    fn resolve<'b>(&'b self, variable: &str) -> Option<CowVal<'b, 'b>> {
        (!self.var.is_empty() && variable == self.var).then(|| CowVal::Borrowed(self.val.as_ref()))
    }
}

/// What a diagnosis is about: `run`, `GPU 0`, `pid 1234`, `pid 1234 on node-a`.
fn subject(facts: &Facts, scope: Scope, i: usize) -> String {
    match scope {
        Scope::Run => "run".to_string(),
        Scope::Gpu => facts.gpus[i].label.clone(),
        Scope::Process => facts.processes[i].who().to_string(),
        Scope::Torch => facts.torch_processes[i].who().to_string(),
    }
}

/// The facts a rule read, with their values for item `i` of its scope: the numbers behind a diagnosis.
fn read_values(
    all: &serde_json::Value,
    rule: &Rule,
    i: usize,
) -> std::collections::BTreeMap<String, serde_json::Value> {
    let item = rule
        .scope
        .var()
        .and_then(|var| Some((var, all.get(rule.scope.list())?.get(i)?)));
    rule.reads()
        .iter()
        .filter(|p| !p.contains("[]"))
        .filter_map(|p| {
            let value = match (item, p.split_once('.')) {
                (Some((var, v)), Some((head, rest))) if head == var => lookup(v, rest),
                _ => lookup(all, p),
            }?;
            (!value.is_object()).then(|| (p.clone(), value.clone()))
        })
        .collect()
}

/// The GPU and the process an item of a rule's scope is.
fn about(facts: &Facts, scope: Scope, i: usize) -> (Option<GpuRef>, Option<u32>) {
    let who = |p: ProcRef| Some(p.pid);
    match scope {
        Scope::Run => (None, None),
        Scope::Gpu => (Some(facts.gpus[i].gpu()), None),
        Scope::Process => {
            let p = &facts.processes[i];
            (p.main_gpu(), who(p.who()))
        }
        Scope::Torch => {
            let t = &facts.torch_processes[i];
            (t.on_gpu(), who(t.who()))
        }
    }
}

/// Evaluates `rules` on a report and stores the diagnoses in it, and the rules that failed. A diagnosis
/// that still holds keeps when it was first known during the run (`known_at_s`): a saved report diagnosed
/// again still says what was told while it ran. A diagnosis that is part of another's story is kept in
/// that one's `parts` ([`story`]).
pub fn diagnose(report: &mut crate::report::Report, rules: &RuleSet) {
    // The OOM's explanation first: the rules read it as `oom.explanation`.
    let unworded = words::word(report);
    let (mut found, mut failed) = rules.evaluate(&Facts::of(report));
    failed.extend(unworded);
    let known: HashMap<(&str, &str), f64> = report
        .diagnoses
        .iter()
        .flat_map(|d| {
            let parts = d.parts.iter().map(|p| (&p.rule, &p.subject, p.known_at_s));
            std::iter::once((&d.rule, &d.subject, d.known_at_s)).chain(parts)
        })
        .filter_map(|(rule, subject, at)| Some(((rule.as_str(), subject.as_str()), at?)))
        .collect();
    for d in &mut found {
        d.known_at_s = known.get(&(d.rule.as_str(), d.subject.as_str())).copied();
    }
    report.diagnoses = story::fold(found, rules, report);
    // Reports from before `rule_errors` kept them in their notes.
    report.notes.retain(|n| !n.starts_with("rule "));
    report.rule_errors = failed;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_rules_load_and_pass_every_check() {
        let set = RuleSet::load(None, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(set.rules.len(), bundled::RULES.len());
        for (name, text) in bundled::RULES {
            Rule::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn parse(text: &str) -> Result<Rule, RuleError> {
        Rule::parse(text, "r.toml")
    }

    const GOOD: &str = "id = \"x\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"gpu\"\nwhen = \"gpu.total_bytes > 1\"\nmessage = \"GPU {gpu.index}\"\n";

    #[test]
    fn errors_name_the_line_and_what_is_wrong() {
        assert!(parse(GOOD).is_ok());
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.total_bytes >")).unwrap_err();
        assert_eq!(
            (e.line, e.what.starts_with("CEL syntax error")),
            (5, true),
            "{e}"
        );
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.totl_bytes > 1")).unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.what.contains("unknown fact `gpu.totl_bytes`"), "{e}");
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.name > 1")).unwrap_err();
        assert!(e.what.starts_with("when:"), "wrong type: {e}");
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.total_bytes")).unwrap_err();
        assert!(e.what.contains("true or false"), "{e}");
        let e = parse(&GOOD.replace("{gpu.index}", "{gpu.nope}")).unwrap_err();
        assert_eq!(e.line, 6);
        assert!(e.what.contains("unknown fact `gpu.nope`"), "{e}");
        let e = parse(&GOOD.replace("severity = \"warn\"", "severity = \"bad\"")).unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = parse(&format!("{GOOD}colour = 1\n")).unwrap_err();
        assert!(e.what.contains("colour"), "{e}");
        // The mark: `at` gives seconds, `gpu` a label, from known facts.
        assert!(
            parse(&format!(
                "{GOOD}at = \"gpu.spike_at_s\"\ngpu = \"gpu.label\"\n"
            ))
            .is_ok()
        );
        let e = parse(&format!("{GOOD}at = \"gpu.label\"\n")).unwrap_err();
        assert_eq!(e.line, 7, "{e}");
        assert!(e.what.starts_with("at: must give seconds"), "{e}");
        let e = parse(&format!("{GOOD}gpu = \"gpu.index\"\n")).unwrap_err();
        assert!(e.what.starts_with("gpu: must give a GPU's label"), "{e}");
        let e = parse(&format!("{GOOD}at = \"gpu.when\"\n")).unwrap_err();
        assert!(e.what.contains("unknown fact `gpu.when`"), "{e}");
        // Facts inside a macro are checked through the list's elements.
        assert!(
            parse(&GOOD.replace(
                "gpu.total_bytes > 1",
                "gpus.exists(g, g.job_peak_bytes > 0)"
            ))
            .is_ok()
        );
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpus.exists(g, g.jobpeak > 0)"))
            .unwrap_err();
        assert!(e.what.contains("gpus[].jobpeak"), "{e}");
    }

    #[test]
    fn a_guard_is_checked_for_types_not_values_at_load() {
        // The example facts have one GPU: `gpus[1]` is out of bounds there, and the guard says so.
        let guarded = GOOD
            .replace("each = \"gpu\"", "each = \"run\"")
            .replace(
                "gpu.total_bytes > 1",
                "size(gpus) > 1 && gpus[1].job_peak_bytes > 0",
            )
            .replace("{gpu.index}", "{gpus[1].job_peak_bytes}");
        assert!(parse(&guarded).is_ok(), "{:?}", parse(&guarded).err());
        // A type mistake behind the index is still found.
        let wrong = guarded.replace("gpus[1].job_peak_bytes > 0", "gpus[1].name > 0");
        assert!(parse(&wrong).unwrap_err().what.starts_with("when:"));
        let unknown = guarded.replace("gpus[1].job_peak_bytes > 0", "gpus[1].nope > 0");
        assert!(parse(&unknown).unwrap_err().what.contains("gpus[].nope"));
    }

    #[test]
    fn a_rule_that_fails_at_run_time_is_said_not_skipped() {
        let text = "id = \"ratio\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"run.job_peak_max_bytes / run.job_gpus > 0\"\nmessage = \"m\"\n";
        let rule = Rule::parse(text, "ratio.toml").unwrap();
        let set = RuleSet {
            rules: vec![rule],
            env: env(),
        };
        let (found, failed) = set.evaluate(&Facts::default());
        assert!(found.is_empty());
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].starts_with("rule ratio:") && failed[0].contains("zero"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_rules_gpu_is_a_gpu_nvml_sees_never_words_for_none() {
        let text = "id = \"g\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\ngpu = \"oom.label\"\nwhen = \"true\"\nmessage = \"m\"\n";
        let set = RuleSet {
            rules: vec![Rule::parse(text, "g.toml").unwrap()],
            env: env(),
        };
        let gpu_of = |oom: facts::OomFacts| {
            let f = Facts {
                oom,
                ..Facts::default()
            };
            set.evaluate(&f).0[0].gpu.clone()
        };
        // An OOM on no GPU that NVML sees (`an unknown GPU`, `Intel GPU 0 (XPU)`) marks none.
        assert_eq!(gpu_of(facts::OomFacts::absent()), None);
        let intel = facts::OomFacts {
            label: "Intel GPU 0 (XPU)".into(),
            ..facts::OomFacts::absent()
        };
        assert_eq!(gpu_of(intel), None);
        let merged = facts::OomFacts {
            label: "GPU 1 on node-b".into(),
            ..facts::OomFacts::absent()
        };
        assert_eq!(gpu_of(merged), Some(GpuRef::new(Some("node-b"), 1)));
    }

    #[test]
    fn a_figure_the_oom_text_did_not_give_is_unknown_never_a_number() {
        // An OOM text that named no request, no free memory and no GPU.
        let f = Facts {
            oom: facts::OomFacts::absent(),
            ..Facts::default()
        };
        let rule = |when: &str, message: &str| {
            let text = format!(
                "id = \"x\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"{when}\"\nmessage = \"{message}\"\n"
            );
            let set = RuleSet {
                rules: vec![Rule::parse(&text, "x.toml").unwrap()],
                env: env(),
            };
            let (found, failed) = set.evaluate(&f);
            assert!(failed.is_empty(), "{failed:?}");
            found.first().map(|d| d.message.clone())
        };
        // A condition on an absent figure does not hold, whichever way it asks.
        assert_eq!(rule("oom.requested_bytes >= 0", "m"), None);
        assert_eq!(rule("oom.requested_bytes < 0", "m"), None);
        assert_eq!(rule("oom.gpu * 2 > oom.free_bytes", "m"), None);
        // A template says it is unknown.
        let said = rule(
            "oom.requested_bytes == null",
            "asked {oom.requested_bytes} ({fmt_bytes(oom.free_bytes)} free) on GPU {oom.gpu}",
        );
        assert_eq!(
            said.as_deref(),
            Some("asked unknown (an unknown amount free) on GPU unknown")
        );
    }

    #[test]
    fn a_stray_context_without_a_rank_is_named_by_its_command_not_rank_minus_one() {
        let set = RuleSet::load(None, &[]).unwrap();
        let said = |rank: Option<i64>| {
            let mut f = Facts::example();
            f.processes = vec![facts::ProcFacts {
                pid: 7,
                cmdline: "python3 train.py".into(),
                in_job: true,
                rank,
                main_gpu: Some(0),
                stray_gpus: vec![1],
                ..Default::default()
            }];
            let (found, _) = set.evaluate(&f);
            let d = found.iter().find(|d| d.rule == "stray-context").unwrap();
            d.message.clone()
        };
        assert!(
            said(None).starts_with("pid 7 (python3 train.py) works on GPU 0"),
            "{}",
            said(None)
        );
        assert!(
            said(Some(3)).starts_with("pid 7 (rank 3) works on GPU 0"),
            "{}",
            said(Some(3))
        );
    }

    #[test]
    fn thousands_of_processes_are_each_diagnosed_without_error() {
        // Each of the per-process rules evaluated once per process entry. How the cost grows with the
        // entries (100,000 took hours when every item re-serialized every fact) is a benchmark's to say:
        // `cargo bench --bench diagnose` prints it up to 100,000 (25 s of this suite when run here).
        let set = RuleSet::load(None, &[]).unwrap();
        let mut f = Facts::example();
        f.processes = (0..2_000)
            .map(|pid| facts::ProcFacts {
                pid,
                in_job: true,
                ..Default::default()
            })
            .collect();
        let (found, failed) = set.evaluate(&f);
        assert!(failed.is_empty(), "{failed:?}");
        assert!(found.iter().all(|d| d.rule != "stray-context"));
    }

    #[test]
    fn every_fact_is_documented_and_every_documented_fact_exists() {
        fn paths(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(o) => {
                    for (k, x) in o {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        if x.is_object() {
                            paths(x, &p, out)
                        } else {
                            out.push(p)
                        }
                    }
                }
                _ => out.push(prefix.to_string()),
            }
        }
        let ex = serde_json::to_value(Facts::example()).unwrap();
        let mut have = Vec::new();
        for (name, alias) in [("run", "run"), ("oom", "oom")] {
            paths(&ex[name], alias, &mut have);
        }
        for (list, alias) in [
            ("gpus", "gpu"),
            ("processes", "process"),
            ("torch_processes", "torch"),
        ] {
            paths(&ex[list][0], alias, &mut have);
        }
        let documented: Vec<String> = facts::documented().into_iter().map(|d| d.0).collect();
        for p in &have {
            assert!(
                documented.contains(p),
                "fact {p} has no doc comment in rules/facts/"
            );
        }
        for d in &documented {
            assert!(
                have.iter().any(|p| p == d),
                "rules/facts/ documents {d}, which rules cannot read"
            );
        }
    }

    #[test]
    fn every_rule_file_is_bundled() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rules");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".toml"))
            .collect();
        files.sort();
        let bundled: Vec<String> = bundled::RULES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            files, bundled,
            "src/rules/bundled.rs must list every file in rules/"
        );
    }
}
