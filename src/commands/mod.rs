//! The subcommands: each takes its resolved settings and returns the exit code, or a [`Failure`] that
//! `main` prints once. Orchestration only: the work is in the domain modules below.

pub mod compare;
pub mod demo;
pub mod fit;
pub mod orphans;
pub mod report;
pub mod rules;
pub mod run;
pub mod schema;
pub mod watch;

use crate::cli::{ClapCmd, Cli, RulesWhat};
use crate::exit::{self, Failure};
use crate::settings::{self, Env};
use clap::{CommandFactory, Parser};
use std::ffi::OsString;
use std::process::ExitCode;

/// Parses `args`, resolves the settings and runs the subcommand.
pub fn main(args: Vec<OsString>, env: Env) -> Result<ExitCode, Failure> {
    // gpudoc's own helper processes (see supervise::drain and supervise::keeper).
    use crate::supervise::{drain, keeper};
    match args.get(1).and_then(|a| a.to_str()) {
        Some(drain::ARG) => return Ok(drain::run(&args[2..])),
        Some(keeper::ARG) => return Ok(keeper::run(&args[2..])),
        _ => {}
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return Err(clap_failure(e, is_run(&args))),
    };
    let color = cli.color;
    match cli.cmd {
        ClapCmd::Run(a) => {
            let s = settings::RunSettings::resolve(*a, color, env)?;
            match s.try_remedy.clone() {
                Some((remedy, budget)) => fit::try_remedy(s, remedy, budget),
                None => run::run(s),
            }
        }
        ClapCmd::Fit(a) => fit::run(settings::FitSettings::resolve(a, color, env)?),
        ClapCmd::Orphans(a) => orphans::run(settings::OrphansSettings::resolve(a, color, &env)?),
        ClapCmd::Watch(a) => watch::run(settings::WatchSettings::resolve(a, color, &env)?),
        ClapCmd::Report(a) => report::run(settings::ReportSettings::resolve(a, color, &env)?),
        ClapCmd::Compare(a) => compare::run(settings::CompareSettings::resolve(a, color, &env)?),
        ClapCmd::Rules(c) => {
            let what = match c.what {
                RulesWhat::List => rules::What::List,
                RulesWhat::Explain { id } => rules::What::Explain(id),
                RulesWhat::Facts => rules::What::Facts,
            };
            rules::run(what, settings::load_rules(&c.rules))
        }
        ClapCmd::Demo => demo::run(color, env),
        ClapCmd::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "gpudoc", &mut out);
            print_all(&out)
        }
        ClapCmd::Schema { name } => schema::run(name),
        ClapCmd::Man => {
            let mut out = Vec::new();
            man_page(&mut out).map_err(|e| Failure::new(exit::USAGE, e.to_string()))?;
            print_all(&out)
        }
    }
}

/// The man page: gpudoc(1) with every subcommand's options, from the same definitions as `--help`.
fn man_page(out: &mut Vec<u8>) -> std::io::Result<()> {
    let cmd = Cli::command();
    let top = clap_mangen::Man::new(cmd.clone());
    top.render_title(out)?;
    top.render_name_section(out)?;
    top.render_synopsis_section(out)?;
    top.render_description_section(out)?;
    top.render_options_section(out)?;
    // clap_mangen points each subcommand to a page of its own (gpudoc-run(1)); gpudoc installs one page,
    // where each is a section below.
    out.extend_from_slice(b".SH SUBCOMMANDS\n");
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
        let line = format!(
            ".TP\n\\fBgpudoc {}\\fR\n{about} (section GPUDOC {} below)\n",
            sub.get_name(),
            sub.get_name().to_uppercase()
        );
        out.extend_from_slice(line.replace('-', "\\-").as_bytes());
    }
    man_table(
        out,
        "EXIT STATUS",
        exit::TABLE
            .iter()
            .map(|(cmd, code, what)| (format!("{code} ({cmd})"), what.to_string())),
    );
    man_table(
        out,
        "ENVIRONMENT",
        crate::settings::VARIABLES
            .iter()
            .map(|(v, what)| (v.to_string(), what.to_string())),
    );
    top.render_version_section(out)?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("gpudoc {}", sub.get_name());
        out.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
        let man = clap_mangen::Man::new(sub.clone().bin_name(name));
        man.render_synopsis_section(out)?;
        man.render_description_section(out)?;
        man.render_options_section(out)?;
    }
    Ok(())
}

/// A man page section of tagged paragraphs: a term, then what it means.
fn man_table(out: &mut Vec<u8>, title: &str, rows: impl Iterator<Item = (String, String)>) {
    out.extend_from_slice(format!(".SH \"{title}\"\n").as_bytes());
    for (term, what) in rows {
        let text = format!(".TP\n\\fB{term}\\fR\n{what}\n");
        out.extend_from_slice(text.replace('-', "\\-").as_bytes());
    }
}

/// clap prints its own message; help and version are successes. `run`'s own failures must not look like
/// the command's codes.
fn clap_failure(e: clap::Error, run: bool) -> Failure {
    let printed = e.print();
    let code = match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => 0,
        _ if run => exit::GPUDOC_FAILED,
        _ => exit::USAGE,
    };
    match printed {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Failure::broken_pipe(),
        _ => Failure::new(code, ""),
    }
}

/// Global flags that take a value in the next argument.
const GLOBAL_WITH_VALUE: [&str; 3] = ["--color", "--rules", "--disable-rule"];

/// Whether the subcommand wraps a command (`run`, `fit`: their own failures must not look like the
/// command's codes): the first argument that is neither a global flag nor its value.
fn is_run(args: &[OsString]) -> bool {
    let mut it = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(a) = it.next() {
        if GLOBAL_WITH_VALUE.contains(&a.as_ref()) {
            it.next();
        } else if !a.starts_with('-') {
            return a == "run" || a == "fit";
        }
    }
    false
}

/// Writes `bytes` to stdout, as every command's output is written (a reader that went away ends it
/// quietly).
fn print_all(bytes: &[u8]) -> Result<ExitCode, Failure> {
    crate::output::write(&crate::output::Target::Stdout, bytes)
        .map_err(|e| Failure::printing(e, exit::USAGE))?;
    Ok(ExitCode::SUCCESS)
}
