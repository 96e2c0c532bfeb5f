//! The expression evaluator: the facts as CEL values (made when a rule first reads them), the context a
//! rule's expressions run in (the unit constants, `param`, the formatting functions), compiling an
//! expression with absent facts treated as [`absent`](super::absent) says, and the facts it reads.

use super::absent::Compiled;
use super::facts::Facts;
use super::{RuleError, Scope};
use crate::params::Number;
use cel::common::ast::{Expr, IdedExpr};
use cel::common::types::CelNull;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use cel::{Context, Env, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

pub(super) const CONSTANTS: [(&str, i64); 6] = [
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
    ("TiB", 1 << 40),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
];

/// CEL's standard library, with its strings and lists extensions: a template says a list fact with
/// `map`, `join` and `slice` (docs/rules.md, "List facts").
pub(super) fn env() -> Arc<Env> {
    let mut env = Env::stdlib();
    env.add_extension(cel::extensions::strings)
        .and_then(|()| env.add_extension(cel::extensions::lists))
        .expect("CEL's own extensions declare no name twice");
    Arc::new(env)
}

/// A fact (or a list or group of them) as the interpreter's CEL value, its strings borrowed, made in one
/// step (through a [`Value`], each map is built twice).
pub(super) fn to_val(v: &serde_json::Value) -> Box<dyn Val + '_> {
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
pub(super) struct Lazy<'a> {
    vars: Vec<LazyVar<'a>>,
}

/// A variable of [`Lazy`]: its name, its facts, and their CEL value once read.
pub(super) struct LazyVar<'a> {
    name: &'a str,
    facts: &'a serde_json::Value,
    val: OnceLock<Box<dyn Val + 'a>>,
}

impl<'a> Lazy<'a> {
    pub(super) fn new(facts: &'a serde_json::Value) -> Lazy<'a> {
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
pub(super) fn context<'a, 'f: 'a>(env: &Arc<Env>, facts: &'a Lazy<'f>) -> Context<'a, 'a> {
    let mut ctx = functions(env);
    ctx.set_variable_resolver(facts);
    ctx
}

/// A context holding the unit constants and the formatting functions.
pub(super) fn functions<'a>(env: &Arc<Env>) -> Context<'a, 'a> {
    let mut ctx = Context::with_env(env.clone());
    for (name, v) in CONSTANTS {
        ctx.add_variable_from_value(name, Value::Int(v));
    }
    ctx.add_variable_from_value("param", param_value(&[]));
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
    // What a list fact's records add up to (`sum(l.map(p, p.bytes))`): CEL itself has no fold.
    let _ = ctx.add_function("sum", |l: Arc<Vec<Value>>| sum(&l));
    let _ = ctx.add_function("fmt_cmd", |c: Arc<String>| crate::units::shorten(&c, 60));
    // A source file as a diagnosis names it: its last two components (`u/train.py`).
    let _ = ctx.add_function("fmt_path", |p: Arc<String>| crate::units::path_tail(&p));
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

/// The sum of a list of numbers: an integer where all are (0 for none), else a double; an absent one
/// (null) makes the sum absent, as arithmetic on null is.
fn sum(l: &[Value]) -> Result<Value, cel::ExecutionError> {
    let (mut int, mut float, mut all_int) = (0i64, 0.0f64, true);
    for v in l {
        match v {
            Value::Int(i) => {
                int = int
                    .checked_add(*i)
                    .ok_or_else(|| cel::ExecutionError::function_error("sum", "overflow"))?;
                float += *i as f64;
            }
            Value::Float(x) => {
                all_int = false;
                float += x;
            }
            Value::Null => return Ok(Value::Null),
            other => return Err(not_a_number("sum", other)),
        }
    }
    Ok(if all_int {
        Value::Int(int)
    } else {
        Value::Float(float)
    })
}

/// A formatting function of a double: `unknown` for an absent fact.
pub(super) fn of_double(
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

pub(super) fn not_a_number(name: &str, v: &Value) -> cel::ExecutionError {
    cel::ExecutionError::function_error(name, format!("takes a number, not {v:?}"))
}

/// How a template prints an absent fact.
pub(super) const UNKNOWN: &str = "unknown";

pub(super) fn compile(
    env: &Env,
    src: &str,
    file: &str,
    line: usize,
) -> Result<Compiled, RuleError> {
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

/// Dotted paths of the facts an expression reads (`torch.steps`, `gpus[].index` inside a macro).
pub(super) fn reads(e: &IdedExpr, bound: &HashMap<String, String>, out: &mut Vec<String>) {
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

/// The value at a fact's path (`gpu.total_bytes`; `gpus[].index` reads a list's first element).
pub(super) fn lookup<'a>(
    facts: &'a serde_json::Value,
    path: &str,
) -> Option<&'a serde_json::Value> {
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
pub(super) fn variables(facts: &Facts, scope: Scope, item: usize) -> serde_json::Value {
    let mut v = serde_json::to_value(facts).expect("facts serialize");
    if let Some(var) = scope.var() {
        let elem = v[scope.list()][item].clone();
        v[var] = elem;
    }
    v
}

/// The example facts with every number made 1, so a rule's arithmetic can be tried without dividing by 0.
pub(super) fn example_variables(scope: Scope) -> serde_json::Value {
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

/// A CEL value as JSON, as a diagnosis records it (`facts`): what a template would print of a value JSON
/// has no type for.
pub(super) fn to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::UInt(u) => J::from(*u),
        Value::Float(f) => J::from(*f),
        Value::String(s) => J::from(s.as_str()),
        Value::List(l) => J::Array(l.iter().map(to_json).collect()),
        Value::Map(m) => J::Object(
            m.map
                .iter()
                .map(|(k, v)| {
                    let k = match k {
                        cel::objects::Key::String(s) => s.to_string(),
                        cel::objects::Key::Int(i) => i.to_string(),
                        cel::objects::Key::Uint(u) => u.to_string(),
                        cel::objects::Key::Bool(b) => b.to_string(),
                    };
                    (k, to_json(v))
                })
                .collect(),
        ),
        other => J::from(render(other)),
    }
}

/// How a template prints a value: an absent one as `unknown`, a list joined with commas.
pub(super) fn render(value: &Value) -> String {
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

/// A parameter's number as CEL.
fn number_value(n: Number) -> Value {
    match n {
        Number::Int(i) => Value::Int(i),
        Number::Float(f) => Value::Float(f),
    }
}

/// The parameters a rule sees as `param`: the table's ([`crate::params::ALL`]) and its own.
pub(super) fn param_entries(
    own: &[(String, Number)],
) -> impl Iterator<Item = (String, Number)> + '_ {
    crate::params::ALL
        .iter()
        .map(|p| (p.name.to_string(), p.value))
        .chain(own.iter().cloned())
}

/// `param` as a CEL map.
pub(super) fn param_value(own: &[(String, Number)]) -> Value {
    let map: HashMap<String, Value> = param_entries(own)
        .map(|(k, v)| (k, number_value(v)))
        .collect();
    map.into()
}

/// Evaluates each operand of `&&`, `||` and `?:` separately (recursively), and anything else whole. Only
/// type errors count: what depends on the values (an index past the example's one element, a division by
/// its zero) is for the run to find, guarded as the rule guards it.
pub(super) fn check_operands(e: &IdedExpr, ctx: &Context) -> Result<(), String> {
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
pub(super) fn depends_on_values(e: &cel::ExecutionError) -> bool {
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
