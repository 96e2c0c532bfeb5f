//! What a rule makes of a fact the run does not have (`null`: an OOM text that gave no figure, a process
//! with no rank). CEL compares and computes with null only by failing; in a rule, arithmetic on an absent
//! fact gives an absent value and a comparison (`<`, `<=`, `>`, `>=`) with one is false, so a condition
//! on an absent fact does not hold, and a template's `? :` on one takes its other branch. Equality is
//! CEL's own: `x == null` asks whether a fact is absent. An absent value a template prints reads
//! `unknown` (the `fmt_*` functions say it in their own words).

use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, LiteralValue};
use cel::common::types::CelBool;
use cel::{Context, ExecutionError, Program, Value};

/// The comparisons that are false with an absent operand.
const ORDERING: [&str; 4] = ["_<_", "_<=_", "_>_", "_>=_"];
/// The arithmetic whose result is absent with an absent operand.
const ARITHMETIC: [&str; 5] = ["_+_", "_-_", "_*_", "_/_", "_%_"];

/// A compiled expression of a rule, with absent facts treated as the module says.
#[derive(Debug)]
pub(super) struct Compiled(IdedExpr);

impl Compiled {
    pub(super) fn of(program: &Program) -> Compiled {
        let mut e = program.expression().clone();
        guard(&mut e);
        Compiled(e)
    }

    pub(super) fn execute(&self, ctx: &Context) -> Result<Value, ExecutionError> {
        Value::resolve(&self.0, ctx)
    }

    /// The expression as written, for what reads it (the facts it names).
    pub(super) fn expression(&self) -> &IdedExpr {
        &self.0
    }
}

/// Rewrites `a OP b` into `a == null || b == null ? ABSENT : a OP b`, inside out, where ABSENT is false for
/// a comparison and null for arithmetic.
fn guard(e: &mut IdedExpr) {
    match &mut e.expr {
        Expr::Call(c) => {
            c.target.iter_mut().for_each(|t| guard(t));
            c.args.iter_mut().for_each(guard);
        }
        Expr::Comprehension(c) => {
            let ComprehensionExpr {
                iter_range,
                accu_init,
                loop_cond,
                loop_step,
                result,
                ..
            } = c.as_mut();
            [iter_range, accu_init, loop_cond, loop_step, result]
                .into_iter()
                .for_each(guard);
        }
        Expr::List(l) => l.elements.iter_mut().for_each(guard),
        Expr::Select(s) => guard(&mut s.operand),
        _ => {}
    }
    let Expr::Call(c) = &e.expr else { return };
    let absent = if ORDERING.contains(&c.func_name.as_str()) {
        LiteralValue::Boolean(CelBool::from(false))
    } else if ARITHMETIC.contains(&c.func_name.as_str()) {
        LiteralValue::Null
    } else {
        return;
    };
    if c.args.len() != 2 || c.target.is_some() {
        return;
    }
    let id = e.id;
    let node = |expr: Expr| IdedExpr { id, expr };
    let call = |name: &str, args: Vec<IdedExpr>| {
        node(Expr::Call(CallExpr {
            func_name: name.into(),
            target: None,
            args,
        }))
    };
    let is_null = |x: &IdedExpr| {
        call(
            "_==_",
            vec![x.clone(), node(Expr::Literal(LiteralValue::Null))],
        )
    };
    let either = call("_||_", vec![is_null(&c.args[0]), is_null(&c.args[1])]);
    let original = node(e.expr.clone());
    *e = call("_?_:_", vec![either, node(Expr::Literal(absent)), original]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn eval(src: &str) -> Result<Value, ExecutionError> {
        let env = Arc::new(cel::Env::stdlib());
        let p = env.compile(src).unwrap();
        let mut ctx = Context::with_env(env);
        ctx.add_variable_from_value("gone", Value::Null);
        ctx.add_variable_from_value("n", Value::Int(3));
        Compiled::of(&p).execute(&ctx)
    }

    #[test]
    fn a_comparison_with_an_absent_fact_is_false_and_arithmetic_on_one_is_absent() {
        for cond in [
            "gone >= 0",
            "gone < 0",
            "0 <= gone",
            "gone * 2 >= n",
            "n - gone > 0",
        ] {
            assert_eq!(eval(cond), Ok(Value::Bool(false)), "{cond}");
        }
        // Its negation holds, and a guard reads as written.
        assert_eq!(eval("!(gone >= 0)"), Ok(Value::Bool(true)));
        assert_eq!(eval("gone >= 0 ? 'known' : 'not'"), Ok(Value::from("not")));
        assert_eq!(eval("gone == null && n != null"), Ok(Value::Bool(true)));
        assert_eq!(eval("gone + 1"), Ok(Value::Null));
        // Facts the run has are compared and computed as ever.
        assert_eq!(eval("n * 2 >= 6 && n % 2 == 1"), Ok(Value::Bool(true)));
        assert_eq!(eval("[1, 2].exists(x, x > n - 2)"), Ok(Value::Bool(true)));
    }
}
