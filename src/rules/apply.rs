//! Applying the rules to a run's facts: each rule on the run or on each item of its scope, the diagnoses
//! with the facts they read, and a report diagnosed again keeping what was known while it ran.

use super::eval::{Lazy, context, lookup, to_val};
use super::facts::Facts;
use super::rule::Rule;
use super::{RuleSet, Scope, story};
use crate::ident::{GpuRef, ProcRef};
use crate::verdict::Diagnosis;
use cel::common::types::CelNull;
use cel::common::value::{CowVal, Val};
use cel::context::VariableResolver;
use std::collections::HashMap;

impl RuleSet {
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
        let mut root = context(&self.env, &lazy);
        // `hunt_lines`: the user's words of a hunt, else the bundled ones.
        super::hunt_words::register(&mut root, self.hunt_words.clone());
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
                        let mut read = read_values(&all, rule, i);
                        read.extend(f.kept);
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
pub(super) struct Item<'a> {
    var: &'static str,
    val: Box<dyn Val + 'a>,
}

impl<'a> Item<'a> {
    /// The items of `scope`'s list in the facts `all`.
    pub(super) fn all(all: &'a serde_json::Value, scope: Scope) -> Vec<Item<'a>> {
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
    pub(super) fn none() -> Item<'a> {
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
pub(super) fn subject(facts: &Facts, scope: Scope, i: usize) -> String {
    match scope {
        Scope::Run => "run".to_string(),
        Scope::Gpu => facts.gpus[i].label.clone(),
        Scope::Process => facts.processes[i].who().to_string(),
        Scope::Torch => facts.torch_processes[i].who().to_string(),
    }
}

/// The facts a rule read, with their values for item `i` of its scope: the numbers behind a diagnosis. A
/// list of the run read whole is left out: what a let made of it is recorded instead ([`super::names`]).
pub(super) fn read_values(
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
        .filter(|p| !p.contains("[]") && !super::names::whole_list(p))
        .filter_map(|p| {
            let value = match (item, p.split_once('.')) {
                (Some((var, v)), Some((head, rest))) if head == var => lookup(v, rest),
                _ => lookup(all, p),
            }?;
            // A group of facts (`oom`) is no fact; a record (`torch.leak_hunt`) is.
            (!value.is_object() || p.contains('.')).then(|| (p.clone(), value.clone()))
        })
        .collect()
}

/// The GPU and the process an item of a rule's scope is.
pub(super) fn about(facts: &Facts, scope: Scope, i: usize) -> (Option<GpuRef>, Option<u32>) {
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
    // The OOM's explanation and the look's reasons first: the rules read them as `oom.explanation` and
    // `process.reason`.
    let unworded = super::words::word(report, rules.words.as_deref());
    let unreasoned = report
        .moment
        .as_mut()
        .and_then(|m| super::words::reasons(&mut m.holders, rules.reasons.as_deref()));
    let (mut found, mut failed) = rules.evaluate(&Facts::of(report));
    failed.extend(unworded.into_iter().chain(unreasoned));
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
