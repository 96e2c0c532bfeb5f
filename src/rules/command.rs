//! `gpudoc rules list | explain ID | facts`.

use super::facts::DOC;
use super::{RuleSet, Scope};
use crate::replay::RulesArgs;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct RulesCmd {
    #[command(subcommand)]
    pub what: RulesWhat,
    #[command(flatten)]
    pub rules: RulesArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum RulesWhat {
    /// Every rule in force: id, severity, scope, title, where it comes from.
    List,
    /// One rule: its condition, the facts it reads (with their meaning), its message and advice.
    Explain { id: String },
    /// Every fact rules can read, with its type and meaning.
    Facts,
}

fn scope_name(s: Scope) -> &'static str {
    match s {
        Scope::Run => "run",
        Scope::Gpu => "gpu",
        Scope::Process => "process",
        Scope::Torch => "torch",
    }
}

pub fn run(cmd: RulesCmd) -> ExitCode {
    if let RulesWhat::Facts = cmd.what {
        println!("| fact | type | meaning |\n|---|---|---|");
        for (name, ty, doc) in DOC {
            println!("| `{name}` | {ty} | {doc} |");
        }
        return ExitCode::SUCCESS;
    }
    let set = match RuleSet::load(cmd.rules.rules.as_deref(), &cmd.rules.disable_rule) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gpudoc: {e}");
            return ExitCode::from(crate::exit::USAGE);
        }
    };
    match cmd.what {
        RulesWhat::List => {
            println!(
                "{:<20} {:<6} {:<8} {:<60} SOURCE",
                "ID", "LEVEL", "EACH", "TITLE"
            );
            for r in &set.rules {
                let level = format!("{:?}", r.severity).to_lowercase();
                println!(
                    "{:<20} {:<6} {:<8} {:<60} {}",
                    r.id,
                    level,
                    scope_name(r.scope),
                    r.title,
                    r.source
                );
            }
        }
        RulesWhat::Explain { id } => {
            let Some(r) = set.rules.iter().find(|r| r.id == id) else {
                eprintln!("gpudoc: no rule `{id}` (see `gpudoc rules list`)");
                return ExitCode::from(crate::exit::USAGE);
            };
            println!(
                "{} ({}, for each {}): {}",
                r.id,
                format!("{:?}", r.severity).to_lowercase(),
                scope_name(r.scope),
                r.title
            );
            println!("from: {}\n", r.source);
            println!("fires when:\n    {}\n", r.when.replace('\n', "\n    "));
            println!("reads:");
            for fact in &r.reads {
                let key = fact
                    .replace("[]", "")
                    .replace("gpus.", "gpu.")
                    .replace("processes.", "process.")
                    .replace("torch_processes.", "torch.");
                let doc = DOC.iter().find(|d| d.0 == key).map_or("", |d| d.2);
                println!("    {fact:<36} {doc}");
            }
            println!("\nsays:\n    {}", r.message.trim());
            if !r.advice.is_empty() {
                println!("\nadvice:");
                for a in &r.advice {
                    println!("    - {a}");
                }
            }
            if let Some(d) = &r.docs {
                println!("\ndocs: {d}");
            }
        }
        RulesWhat::Facts => unreachable!(),
    }
    ExitCode::SUCCESS
}
