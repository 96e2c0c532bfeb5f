//! `gpudoc rules list | explain ID | facts`.

use crate::exit::{self, Failure};
use crate::output;
use crate::rules::RuleSet;
use crate::rules::facts::documented;
use std::fmt::Write as _;
use std::process::ExitCode;

/// What `gpudoc rules` shows.
pub enum What {
    List,
    Explain(String),
    Facts,
}

pub fn run(what: What, rules: Result<RuleSet, String>) -> Result<ExitCode, Failure> {
    let text = match what {
        What::Facts => facts(),
        What::List => list(&rules.map_err(|e| Failure::new(exit::USAGE, e))?),
        What::Explain(id) => {
            let set = rules.map_err(|e| Failure::new(exit::USAGE, e))?;
            explain(&set, &id)
                .ok_or_else(|| Failure::new(exit::USAGE, crate::rules::no_rule(&id)))?
        }
    };
    output::stdout(&text).map_err(|e| Failure::printing(e, exit::USAGE))?;
    Ok(ExitCode::SUCCESS)
}

/// The facts table, as the README's reference shows it.
pub fn facts() -> String {
    let mut o = String::from("| fact | type | meaning |\n|---|---|---|\n");
    for (name, ty, doc) in documented() {
        let _ = writeln!(o, "| `{name}` | {ty} | {doc} |");
    }
    o
}

fn list(set: &RuleSet) -> String {
    // Columns as wide as their longest entry: a user's rule may have a longer id or title than ours.
    let width = |head: &str, f: &dyn Fn(&crate::rules::Rule) -> usize| {
        set.rules
            .iter()
            .map(f)
            .chain([head.len()])
            .max()
            .unwrap_or(0)
    };
    let id = width("ID", &|r| r.id.chars().count());
    let title = width("TITLE", &|r| r.title.chars().count());
    // ALSO: where else than at a run's end a rule is judged (`live`, `look`).
    let mut o = format!(
        "{:<id$} {:<6} {:<8} {:<9} {:<title$} SOURCE\n",
        "ID", "LEVEL", "EACH", "ALSO", "TITLE"
    );
    for r in &set.rules {
        let also = r.also().join(",");
        let _ = writeln!(
            o,
            "{:<id$} {:<6} {:<8} {:<9} {:<title$} {}",
            r.id,
            r.severity.name(),
            r.scope.name(),
            if also.is_empty() { "-" } else { &also },
            r.title,
            r.source
        );
    }
    o
}

fn explain(set: &RuleSet, id: &str) -> Option<String> {
    let r = set.rules.iter().find(|r| r.id == id)?;
    let mut o = String::new();
    // Judged live during a run (`live = true`), on each look of `gpudoc watch` (`look = true`).
    let also = match r.also().join(", ") {
        a if a.is_empty() => a,
        a => format!("; also judged {a}"),
    };
    let _ = writeln!(
        o,
        "{} ({}, for each {}{also}): {}",
        r.id,
        r.severity.name(),
        r.scope.name(),
        r.title
    );
    let _ = writeln!(o, "from: {}\n", r.source);
    let _ = writeln!(o, "fires when:\n    {}\n", r.when.replace('\n', "\n    "));
    if !r.own_params().is_empty() {
        let _ = writeln!(o, "its parameters:");
        for (name, v) in r.own_params() {
            let _ = writeln!(o, "    param.{name} = {v}");
        }
        let _ = writeln!(o);
    }
    let lets = r.lets();
    if !lets.is_empty() {
        let _ = writeln!(o, "names:");
        for (name, src) in &lets {
            let _ = writeln!(o, "    {name} = {}", src.trim().replace('\n', "\n      "));
        }
        let _ = writeln!(o);
    }
    let _ = writeln!(o, "reads:");
    let documented = documented();
    for fact in &r.reads() {
        let key = fact
            .replace("[]", "")
            .replace("gpus.", "gpu.")
            .replace("processes.", "process.")
            .replace("torch_processes.", "torch.");
        let doc = documented.iter().find(|d| d.0 == key).map_or("", |d| d.2);
        let _ = writeln!(o, "    {fact:<36} {doc}");
    }
    let _ = writeln!(o, "\nsays:");
    for m in &r.message {
        match &m.when {
            Some(w) => {
                let title = m
                    .title
                    .as_ref()
                    .map(|t| format!("{t}: "))
                    .unwrap_or_default();
                let _ = writeln!(o, "    - (when {w}) {title}{}", m.text.trim());
            }
            None => {
                let _ = writeln!(o, "    {}", m.text.trim());
            }
        }
    }
    for d in &r.details_src {
        let _ = writeln!(o, "      {d}");
    }
    if !r.advice.is_empty() {
        let _ = writeln!(o, "\nadvice:");
        for a in &r.advice {
            match &a.when {
                Some(w) => {
                    let _ = writeln!(o, "    - (when {w}) {}", a.text);
                }
                None => {
                    let _ = writeln!(o, "    - {}", a.text);
                }
            }
        }
    }
    if let Some(d) = &r.docs {
        let _ = writeln!(o, "\ndocs: {d}");
    }
    Some(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rules_source_starts_in_its_own_column() {
        let set = RuleSet::load(None, &[]).unwrap();
        let text = list(&set);
        let at = text.lines().next().unwrap().find("SOURCE").unwrap();
        for (line, r) in text.lines().skip(1).zip(&set.rules) {
            let chars: Vec<char> = line.chars().collect();
            let source: String = chars[at..].iter().collect();
            assert_eq!(source, r.source, "{line}");
            assert_eq!(chars[at - 1], ' ', "{line}");
        }
    }
}
