//! A rule's own names: its parameters (`[params]`, beside the table of [`crate::params`], all read as
//! `param.NAME`) and its named sub-expressions (`[let]`), which its condition, message, details, advice
//! and mark read by name. A let is evaluated for each item before the condition, in the file's order, and
//! sees the lets above it.

use super::absent::Compiled;
use super::eval::{
    check_operands, compile, depends_on_values, example_variables, param_entries, param_value,
    reads, to_json,
};
use super::lines::value_line;
use super::{RuleError, Scope};
use crate::params::Number;
use cel::{Context, Env, Value};
use std::collections::HashMap;

/// The names a rule's expressions see besides its lets: the facts' variables and `param`.
const TAKEN: [&str; 9] = [
    "run",
    "oom",
    "gpus",
    "processes",
    "torch_processes",
    "gpu",
    "process",
    "torch",
    "param",
];

/// `param` as JSON, for the example facts a rule is checked on.
fn param_json(own: &[(String, Number)]) -> serde_json::Value {
    param_entries(own)
        .map(|(k, v)| {
            let v: serde_json::Value = match v {
                Number::Int(i) => i.into(),
                Number::Float(f) => f.into(),
            };
            (k, v)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A named sub-expression: its name, its source, compiled, and the facts it reads.
struct Let {
    name: String,
    src: String,
    program: Compiled,
    /// The facts it reads.
    reads: Vec<String>,
    /// It reads one of the run's lists whole (`processes`, to pick some): a diagnosis records its value,
    /// not the list, which is as long as the run has processes.
    whole: bool,
}

/// Whether a fact's path is one of the run's lists whole (`gpus`, `processes`, `torch_processes`): a
/// diagnosis never records it (it is as long as the run), only what a let made of it.
pub(super) fn whole_list(path: &str) -> bool {
    [Scope::Gpu, Scope::Process, Scope::Torch]
        .iter()
        .any(|s| s.list() == path)
}

/// A rule's parameters and lets.
#[derive(Default)]
pub(super) struct Names {
    pub(super) params: Vec<(String, Number)>,
    /// `param` as the rule sees it, where it has parameters of its own.
    param_value: Option<Value>,
    lets: Vec<Let>,
}

impl Names {
    /// A rule file's `[params]` and `[let]`, checked: names that take no other's, numbers, CEL that
    /// compiles.
    pub(super) fn read(
        env: &Env,
        text: &str,
        file: &str,
        params: HashMap<String, toml::Spanned<toml::Value>>,
        lets: HashMap<String, toml::Spanned<String>>,
    ) -> Result<Names, RuleError> {
        let err = |span: std::ops::Range<usize>, what: String| RuleError {
            file: file.into(),
            line: value_line(text, span),
            what,
        };
        let mut own = Vec::new();
        for (name, v) in sorted(params) {
            let span = v.span();
            let n = match v.into_inner() {
                toml::Value::Integer(i) => Number::Int(i),
                toml::Value::Float(f) => Number::Float(f),
                _ => return Err(err(span, format!("params: `{name}` must be a number"))),
            };
            if crate::params::find(&name).is_some() {
                let what = format!(
                    "params: `{name}` is the table's (see `param.{name}` in docs/rules.md): name the rule's own otherwise"
                );
                return Err(err(span, what));
            }
            own.push((name, n));
        }
        let mut names = Names {
            param_value: (!own.is_empty()).then(|| param_value(&own)),
            params: own,
            lets: Vec::new(),
        };
        for (name, src) in sorted(lets) {
            let line = value_line(text, src.span());
            if !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                || TAKEN.contains(&name.as_str())
                || names.lets.iter().any(|l| l.name == name)
            {
                let what = format!(
                    "let: `{name}`: use lower-case letters, digits and `_`, and no name a rule already sees ({})",
                    TAKEN.join(", ")
                );
                return Err(RuleError {
                    file: file.into(),
                    line,
                    what,
                });
            }
            let src = src.into_inner();
            let program = compile(env, &src, file, line)?;
            let mut read = Vec::new();
            reads(program.expression(), &HashMap::new(), &mut read);
            let read = names.expand(read);
            let whole = read.iter().any(|p| whole_list(p));
            names.lets.push(Let {
                name,
                src,
                program,
                reads: read,
                whole,
            });
        }
        Ok(names)
    }

    /// The lets as written, in the file's order.
    pub(super) fn lets(&self) -> Vec<(String, String)> {
        self.lets
            .iter()
            .map(|l| (l.name.clone(), l.src.clone()))
            .collect()
    }

    /// `paths` with each let read replaced by the facts it reads.
    pub(super) fn expand(&self, paths: Vec<String>) -> Vec<String> {
        let mut out = Vec::new();
        for p in paths {
            let head = p.split(['.', '[']).next().unwrap_or_default();
            match self.lets.iter().find(|l| l.name == head) {
                Some(l) => out.extend(l.reads.iter().cloned()),
                None => out.push(p),
            }
        }
        out
    }

    /// A scope of `ctx` with the rule's parameters and lets bound. `lenient` (checking on the example
    /// facts): each let's operands are checked for types, and one that fails on values alone (a division
    /// by the example's zero) is null.
    pub(super) fn bind<'b, 'v>(
        &self,
        ctx: &'b Context<'b, 'v>,
        lenient: bool,
    ) -> Result<Context<'b, 'v>, String> {
        self.bind_keeping(ctx, lenient, &mut Vec::new())
    }

    /// [`Names::bind`], with the values of the lets a diagnosis records by value (those that read a list
    /// of the run whole) put in `kept`, by name.
    pub(super) fn bind_keeping<'b, 'v>(
        &self,
        ctx: &'b Context<'b, 'v>,
        lenient: bool,
        kept: &mut Vec<(String, serde_json::Value)>,
    ) -> Result<Context<'b, 'v>, String> {
        let mut scope = ctx.new_inner_scope();
        if let Some(p) = &self.param_value {
            scope.add_variable_from_value("param", p.clone());
        }
        for l in &self.lets {
            if lenient {
                check_operands(l.program.expression(), &scope)
                    .map_err(|e| format!("let {}: {e}", l.name))?;
            }
            let v = match l.program.execute(&scope) {
                Ok(v) => v,
                Err(e) if lenient && depends_on_values(&e) => Value::Null,
                Err(e) => return Err(format!("let {}: {e}", l.name)),
            };
            if l.whole {
                kept.push((l.name.clone(), to_json(&v)));
            }
            scope.add_variable_from_value(l.name.clone(), v);
        }
        Ok(scope)
    }

    /// The example facts a rule of `scope` is checked on, with `param` as it sees it.
    pub(super) fn example(&self, scope: Scope) -> serde_json::Value {
        let mut v = example_variables(scope);
        v["param"] = param_json(&self.params);
        v
    }
}

/// A table's entries in the order the file gives them.
fn sorted<T>(m: HashMap<String, toml::Spanned<T>>) -> Vec<(String, toml::Spanned<T>)> {
    let mut v: Vec<_> = m.into_iter().collect();
    v.sort_by_key(|(_, x)| x.span().start);
    v
}

#[cfg(test)]
mod tests {
    use super::super::{Rule, RuleSet, facts::Facts};

    fn rule(body: &str) -> Result<Rule, super::RuleError> {
        let head = "id = \"x\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"gpu\"\n";
        Rule::parse(&format!("{head}{body}"), "x.toml")
    }

    /// What the rule says on the example facts (one H200), and the facts its diagnosis records.
    fn said(r: Rule) -> Result<(String, Vec<String>), Vec<String>> {
        let set = RuleSet {
            rules: vec![r],
            env: super::super::eval::env(),
            words: None,
            reasons: None,
            hunt_words: None,
        };
        let (found, failed) = set.evaluate(&Facts::example());
        match found.first() {
            Some(d) if failed.is_empty() => {
                Ok((d.message.clone(), d.facts.keys().cloned().collect()))
            }
            _ => Err(failed),
        }
    }

    #[test]
    fn a_let_names_what_the_condition_and_message_repeat() {
        let r = rule(
            "when = \"h200 && !tiny\"\nmessage = \"{h200 ? 'an H200' : 'other'}, {tiny}\"\n[let]\nh200 = \"gpu.name.contains('H200')\"\ntiny = \"!h200 || gpu.total_bytes < 0\"\n",
        )
        .unwrap();
        assert_eq!(r.lets()[0].0, "h200", "in the file's order");
        let (message, facts) = said(r).unwrap();
        assert_eq!(message, "an H200, false");
        // The diagnosis records the facts behind a let, not its name.
        assert_eq!(facts, ["gpu.name", "gpu.total_bytes"]);
    }

    #[test]
    fn a_let_over_every_process_is_recorded_by_its_value_not_the_list() {
        // 2,000 processes of a large job, two of them DataLoader workers holding a context each.
        let mut f = Facts::example();
        let one = f.processes[0].clone();
        f.processes = (0..2000)
            .map(|pid| {
                let mut p = one.clone();
                p.pid = pid;
                (p.in_job, p.parent_holds, p.rank) = (true, pid < 2, None);
                p.per_gpu[0].bytes = 500 << 20;
                p.peak_bytes = 500 << 20;
                p
            })
            .collect();
        let set = super::super::RuleSet::load(None, &[]).unwrap();
        let set = RuleSet {
            rules: set
                .rules
                .into_iter()
                .filter(|r| r.id == "worker-contexts")
                .collect(),
            env: set.env,
            words: None,
            reasons: None,
            hunt_words: None,
        };
        let (found, failed) = set.evaluate(&f);
        assert!(failed.is_empty(), "{failed:?}");
        let d = &found[0];
        assert!(d.message.starts_with("2 process(es)"), "{}", d.message);
        // What the rule made of the list (its two helpers), not the list it was computed from.
        let keys: Vec<&str> = d.facts.keys().map(String::as_str).collect();
        assert_eq!(keys, ["helpers"]);
        let pids: Vec<_> = d.facts["helpers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["pid"].as_i64().unwrap())
            .collect();
        assert_eq!(pids, [0, 1]);
        let stored = serde_json::to_string(&d.facts).unwrap().len();
        assert!(stored < 10_000, "{stored} bytes of facts");
    }

    #[test]
    fn a_let_sees_only_the_lets_above_it_and_takes_no_facts_name() {
        let e =
            rule("when = \"a\"\nmessage = \"m\"\n[let]\na = \"b\"\nb = \"true\"\n").unwrap_err();
        assert!(e.what.contains("unknown fact `b`"), "{e}");
        let e = rule("when = \"gpu\"\nmessage = \"m\"\n[let]\ngpu = \"true\"\n").unwrap_err();
        assert_eq!(e.line, 8, "{e}");
        assert!(e.what.starts_with("let: `gpu`"), "{e}");
        // A let's types are checked at load as the condition's are.
        let e = rule("when = \"a\"\nmessage = \"m\"\n[let]\na = \"gpu.name > 1\"\n").unwrap_err();
        assert!(e.what.starts_with("let a:"), "{e}");
    }

    #[test]
    fn param_reads_the_table_and_the_rules_own() {
        let r = rule(
            "when = \"size(gpu.name) >= param.min_name && param.oom_full_pct == 90\"\nmessage = \"{param.min_name} {param.leak_min_r2}\"\n[params]\nmin_name = 3\n",
        )
        .unwrap();
        assert_eq!(r.own_params().len(), 1);
        assert_eq!(said(r).unwrap().0, "3 0.8");
        let e = rule("when = \"param.nope > 1\"\nmessage = \"m\"\n").unwrap_err();
        assert!(e.what.contains("unknown fact `param.nope`"), "{e}");
        let e =
            rule("when = \"true\"\nmessage = \"m\"\n[params]\noom_full_pct = 80\n").unwrap_err();
        assert!(e.what.contains("is the table's"), "{e}");
        let e = rule("when = \"true\"\nmessage = \"m\"\n[params]\nx = \"80\"\n").unwrap_err();
        assert!(e.what.contains("must be a number"), "{e}");
    }

    #[test]
    fn the_first_variant_of_a_message_that_holds_is_said() {
        let variants = "message = [\n  { when = \"gpu.name == 'A100'\", text = \"an A100\" },\n  { when = \"gpu.name.contains('H')\", text = \"{gpu.name}\" },\n  { when = \"true\", text = \"any\" },\n]\n";
        let r = rule(&format!("when = \"true\"\n{variants}")).unwrap();
        assert_eq!(said(r).unwrap().0, "NVIDIA H200");
        // None holding is the rule's failure, said as such.
        let none = "message = [{ when = \"gpu.name == 'A100'\", text = \"an A100\" }]\n";
        let r = rule(&format!("when = \"true\"\n{none}")).unwrap();
        let failed = said(r).unwrap_err();
        assert!(failed[0].contains("no variant holds"), "{failed:?}");
        let bad = "message = [{ when = \"gpu.name\", text = \"t\" }]\n";
        let e = rule(&format!("when = \"true\"\n{bad}")).unwrap_err();
        assert!(e.what.starts_with("message: when:"), "{e}");
    }
}
