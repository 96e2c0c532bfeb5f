//! The checks a rule file passes at load: every fact it names exists, its condition gives true or false,
//! its templates, advice and mark give the right types, on the example facts of its scope.

use super::absent::Compiled;
use super::eval::{CONSTANTS, Lazy, check_operands, context, depends_on_values, lookup};
use super::hunt_words::{HuntWords, register};
use super::rule::{Mark, Rule, Saying, Source};
use super::template::Piece;
use super::{Scope, names};
use cel::{Context, Env, Value};
use std::sync::Arc;

/// Whether `path` names a fact in `facts` (the example, with one element in each list).
pub(super) fn resolves(facts: &serde_json::Value, path: &str) -> bool {
    path.is_empty() || CONSTANTS.iter().any(|(n, _)| *n == path) || lookup(facts, path).is_some()
}

/// A rule's checks at load: every fact named exists in the scope's variables, and the rule runs and gives
/// the right types, every operand of && and || on its own too, so short-circuiting on the example can't
/// hide a mistake. The error's line and what is wrong.
pub(super) fn check_rule(
    (env, words): (&Arc<Env>, Option<&Arc<HuntWords>>),
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
    let mut root = context(env, &vars);
    register(&mut root, words.cloned());
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
pub(super) fn check_advice(
    (env, words): (&Arc<Env>, Option<&Arc<HuntWords>>),
    (scope, names): (Scope, &names::Names),
    saying: &Saying,
    (line, msg_line): (usize, usize),
) -> Result<(), (usize, String)> {
    let example = names.example(scope);
    if let Some(bad) = saying.advice_reads.iter().find(|p| !resolves(&example, p)) {
        return Err((line, format!("advice: unknown fact `{bad}`")));
    }
    let vars = Lazy::new(&example);
    let mut root = context(env, &vars);
    register(&mut root, words.cloned());
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
pub(super) fn gives_bool(p: &Compiled, ctx: &Context) -> Result<(), String> {
    match p.execute(ctx) {
        Ok(Value::Bool(_)) => Ok(()),
        Ok(other) => Err(format!("must be true or false, not {other:?}")),
        Err(e) if depends_on_values(&e) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// `at` must give a number and `gpu` a string (or null), on every item a rule can be given.
pub(super) fn check_mark(
    (env, words): (&Arc<Env>, Option<&Arc<HuntWords>>),
    (scope, names): (Scope, &names::Names),
    mark: &Mark,
    src: &[Source; 2],
) -> Result<(), (usize, String)> {
    let example = names.example(scope);
    let vars = Lazy::new(&example);
    let mut root = context(env, &vars);
    register(&mut root, words.cloned());
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

impl Rule {
    /// The checks at load of a rule read from a file ([`Rule::parse`]): its saying is compiled and kept.
    /// `hunt_lines` and `inside_lines` say `words` (a user's words of a hunt; the bundled ones where `None`).
    pub(super) fn check(
        &self,
        (env, words): (&Arc<Env>, Option<&Arc<HuntWords>>),
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
            (env, words),
            names,
            &self.condition,
            &all,
            (&self.condition_reads, &saying.reads),
            (when_line, msg_line),
        )?;
        check_advice((env, words), names, &saying, (advice_line, msg_line))?;
        check_mark((env, words), names, &saying.mark, &self.mark_src)?;
        let _ = self.saying.set(Ok(saying));
        Ok(())
    }
}
