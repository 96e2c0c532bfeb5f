//! `gpudoc report FILE`: diagnose a saved run again: a report (`--json` of `gpudoc run`) or a trace
//! (`--trace FILE.jsonl`, with the command's captured output for its OOM text, if any), with the rules in
//! force now. A rule can be developed and checked on recorded runs this way.

use crate::exit;
use crate::oom::{self, HostOom, scan::Scanner};
use crate::report::{Inputs, Report};
use crate::rules::{self, RuleSet};
use crate::sample::Rates;
use crate::summary::{self, Paint};
use crate::supervise::{Outcome, ProcessEnd, Stream};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A report (`gpudoc run --json`) or a JSON-lines trace (`gpudoc run --trace FILE.jsonl`).
    pub file: PathBuf,
    /// With a trace: the command's captured output (stderr), scanned for an out-of-memory report.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the facts the rules read (JSON) instead of the summary: for writing and checking rules.
    #[arg(long)]
    pub facts: bool,
    /// Write the re-diagnosed report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub rules: RulesArgs,
}

/// Flags that choose the rules, shared by `run`, `report` and `rules`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RulesArgs {
    /// A folder of rule files (*.toml) added to the bundled ones; a rule with a bundled rule's id replaces it.
    #[arg(long, value_name = "DIR", global = true)]
    pub rules: Option<PathBuf>,
    /// Switch a rule off (repeatable).
    #[arg(long, value_name = "ID", global = true)]
    pub disable_rule: Vec<String>,
}

impl RulesArgs {
    pub fn load(&self) -> Result<RuleSet, rules::RuleError> {
        RuleSet::load(self.rules.as_deref(), &self.disable_rule)
    }
}

/// Reads a report or rebuilds one from a trace.
pub fn load(file: &Path, output: Option<&Path>) -> Result<Report, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let first = text.lines().next().unwrap_or("");
    if first.contains("\"gpudoc.trace/1\"") || first.contains("\"kind\"") {
        return from_trace(file, output);
    }
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a report or trace: {e}", file.display()))?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(crate::report::SCHEMA) => {}
        Some(other) => {
            return Err(format!(
                "{}: schema {other}, this gpudoc reads {}",
                file.display(),
                crate::report::SCHEMA
            ));
        }
        None => {
            return Err(format!(
                "{}: no `schema`: not a gpudoc report",
                file.display()
            ));
        }
    }
    serde_json::from_value(value).map_err(|e| format!("{}: {e}", file.display()))
}

fn from_trace(file: &Path, output: Option<&Path>) -> Result<Report, String> {
    let (header, timeline) = crate::trace::load(file).map_err(|e| e.to_string())?;
    let mut scanner = Scanner::new();
    if let Some(out) = output {
        let bytes = std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let at = (oom::replay_time(&timeline) * 1e6) as u64;
        scanner.feed(Stream::Stderr, &bytes, at);
        scanner.finish(at);
    }
    let end = timeline
        .gpus
        .iter()
        .map(|g| g.used.last_at())
        .max()
        .unwrap_or(0);
    // A trace does not record how the command ended: an OOM text means it failed.
    let code = if scanner.events.is_empty() { 0 } else { 1 };
    let outcome = Outcome {
        end: ProcessEnd::Exited(code),
        duration: Duration::from_micros(end),
        escalated: false,
        forwarded: Vec::new(),
    };
    let (mut ending, oom, _) = oom::classify(&oom::Evidence {
        end: outcome.end,
        scanner: &scanner,
        timeline: &timeline,
        host: HostOom::default(),
    });
    if oom.is_none() {
        ending = oom::Ending::Unknown;
    }
    let gpus: Vec<_> = timeline.gpus.iter().map(|g| g.info.clone()).collect();
    let torch = crate::torch::view::build(&Default::default(), &timeline, &gpus, false);
    let r = Report::build(Inputs {
        command: header.command,
        started_unix_s: header.unix_s,
        outcome: &outcome,
        nvml: header.nvml.unwrap_or(crate::gpu::NvmlStatus {
            available: true,
            ..Default::default()
        }),
        rates: Rates::default(),
        timeline: &timeline,
        leftovers: &[],
        ended: &[],
        ending,
        torch,
        oom,
        host_oom: None,
        self_usage: (0.0, 0),
        notes: vec![format!(
            "rebuilt from the trace {}: no exit status, no PyTorch view",
            file.display()
        )],
    });
    Ok(r)
}

pub fn run(args: ReportArgs, paint: Paint) -> ExitCode {
    let rules = match args.rules.load() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpudoc: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    let mut report = match load(&args.file, args.output.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpudoc: {e}");
            return ExitCode::from(exit::USAGE);
        }
    };
    if args.facts {
        let facts = serde_json::to_string_pretty(&rules::facts::Facts::of(&report))
            .expect("facts serialize");
        println!("{facts}");
        return ExitCode::SUCCESS;
    }
    rules::diagnose(&mut report, &rules);
    let to_stdout = args.json.as_deref() == Some(Path::new("-"));
    let text = summary::render(&report, paint);
    if to_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(path) = &args.json {
        let json = report.to_json();
        let res = if to_stdout {
            std::io::stdout().write_all(json.as_bytes())
        } else {
            std::fs::write(path, json)
        };
        if let Err(e) = res {
            eprintln!("gpudoc: --json {}: {e}", path.display());
            return ExitCode::from(exit::USAGE);
        }
    }
    ExitCode::SUCCESS
}
