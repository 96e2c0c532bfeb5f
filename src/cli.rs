//! Command-line flags, and their resolution into settings in one place.

use crate::exit;
use clap::{Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "gpudoc", version, about = "A doctor for NVIDIA GPU memory")]
pub struct Cli {
    /// When to colour output: auto (a terminal, and NO_COLOR unset), always or never.
    #[arg(long, global = true, value_enum, default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Run a command and record its GPU memory, per GPU and per process.
    Run(RunArgs),
    /// List the processes that hold GPU memory or an NVIDIA device, and end the leftovers.
    Orphans(crate::orphans::command::OrphansArgs),
    /// Diagnose a saved run again (a report or a trace) with the rules in force.
    Report(crate::replay::ReportArgs),
    /// What changed between two runs (reports or traces), per GPU and per rule.
    Compare(crate::compare::CompareArgs),
    /// The rule set: list, explain a rule, list the facts rules read.
    Rules(crate::rules::command::RulesCmd),
    /// Show what gpudoc does: on a GPU machine, run a small example under it; elsewhere, diagnose a run
    /// recorded on an H200.
    Demo,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// How often to sample device memory on every GPU (e.g. 1ms, 500us, 0.1s).
    #[arg(long, value_parser = parse_interval, default_value = "1ms")]
    pub interval: Duration,
    /// Device-memory sampling period once nothing has changed for a second (back to --interval at the
    /// next change). Give the same value as --interval to sample at one rate throughout.
    #[arg(long, value_parser = parse_interval, default_value = "5ms")]
    pub idle_interval: Duration,
    /// How often to sample the per-process lists.
    #[arg(long, value_parser = parse_interval, default_value = "10ms")]
    pub proc_interval: Duration,
    /// Write the report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the timeline as it is sampled: CSV, or JSON lines for a `.jsonl` name.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Don't put the PyTorch shim in place (no framework view).
    #[arg(long)]
    pub no_torch: bool,
    /// How often the shim samples PyTorch's allocator in each process.
    #[arg(long, value_parser = parse_interval, default_value = "10ms")]
    pub torch_interval: Duration,
    /// Leave PyTorch's peak counters alone (by default the shim resets them after each optimizer step,
    /// so per-step peaks are exact; a script that reads torch.cuda.max_memory_allocated() then sees the
    /// current step's peak).
    #[arg(long)]
    pub keep_torch_peaks: bool,
    /// End the job's descendants still running after the command exits (SIGTERM, 10 s, SIGKILL).
    #[arg(long)]
    pub kill_orphans: bool,
    /// No live status line and no summary (errors still print).
    #[arg(short, long)]
    pub quiet: bool,
    #[command(flatten)]
    pub rules: crate::replay::RulesArgs,
    #[command(flatten)]
    pub gate: crate::gate::GateArgs,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{e} (write it like 1ms, 500us or 0.5s)"))?;
    if d < Duration::from_micros(100) {
        return Err(format!("{s} is too short: the shortest interval is 100us"));
    }
    Ok(d)
}

/// Colours for a stream that is (or is not) a terminal.
pub fn use_color(when: ColorWhen, stderr: bool) -> bool {
    match when {
        ColorWhen::Always => true,
        ColorWhen::Never => false,
        ColorWhen::Auto => {
            let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
            let tty = if stderr {
                std::io::stderr().is_terminal()
            } else {
                std::io::stdout().is_terminal()
            };
            tty && !no_color
        }
    }
}

/// Parses the command line and runs; the process's exit code.
pub fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let is_run = args
        .iter()
        .skip(1)
        .find(|a| !a.to_string_lossy().starts_with('-'))
        .is_some_and(|a| a == "run");
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => {
                    ExitCode::SUCCESS
                }
                // `run`'s own failures must not look like the command's codes.
                _ if is_run => ExitCode::from(exit::GPUDOC_FAILED),
                _ => ExitCode::from(exit::USAGE),
            };
        }
    };
    match cli.cmd {
        Cmd::Run(args) => crate::run::run(args, cli.color),
        Cmd::Orphans(args) => {
            crate::orphans::command::run(args, crate::summary::Paint(use_color(cli.color, false)))
        }
        Cmd::Report(args) => {
            crate::replay::run(args, crate::summary::Paint(use_color(cli.color, false)))
        }
        Cmd::Rules(cmd) => crate::rules::command::run(cmd),
        Cmd::Compare(args) => crate::compare::run(args),
        Cmd::Demo => crate::run::demo(cli.color),
    }
}
