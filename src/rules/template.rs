//! Templates: a message, a detail line or a page as text with CEL expressions in `{}`, split at load and
//! filled in where a rule fires (a value printed as [`render`] prints it).

use super::RuleError;
use super::absent::Compiled;
use super::eval::{compile, render};
use cel::{Context, Env, Value};

/// A piece of a template: text as written, or an expression whose value is printed.
pub(super) enum Piece {
    Text(String),
    Expr(Compiled),
}

/// Splits `GPU {gpu.index}: {fmt_bytes(x)}` into text and expressions; `{{` and `}}` are literal braces.
pub(super) fn template(
    env: &Env,
    src: &str,
    file: &str,
    line: usize,
) -> Result<Vec<Piece>, RuleError> {
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

/// A template filled in.
pub(super) fn fill(pieces: &[Piece], ctx: &Context) -> Result<String, String> {
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
pub(super) fn lines(pieces: &[Piece], ctx: &Context) -> Result<Vec<String>, String> {
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

/// Whether a condition of a message's variant or a line of advice holds (one without a condition always
/// does).
pub(super) fn holds(when: Option<&Compiled>, ctx: &Context) -> Result<bool, String> {
    match when.map(|p| p.execute(ctx)) {
        None => Ok(true),
        Some(Ok(Value::Bool(b))) => Ok(b),
        Some(Ok(other)) => Err(format!("gave {other:?}")),
        Some(Err(e)) => Err(e.to_string()),
    }
}
