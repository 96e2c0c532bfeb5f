//! Every command-line flag, as clap parses it. Nothing here decides anything: `settings` resolves these
//! raw flags, with the environment, into what the commands run with.

use clap::{Parser, Subcommand, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(name = "gpudoc", version, about = "A doctor for NVIDIA GPU memory")]
pub struct Cli {
    /// When to colour output: auto (a terminal, and NO_COLOR unset), always or never.
    #[arg(long, global = true, value_enum, default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
    #[command(subcommand)]
    pub cmd: ClapCmd,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorWhen {
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum ClapCmd {
    /// Run a command and record its GPU memory, per GPU and per process.
    Run(Box<RunArgs>),
    /// Find the largest value of the command's `{}` (a batch size, a sequence length) that runs without
    /// running out of GPU memory, from short real runs under `gpudoc run`.
    Fit(FitArgs),
    /// List the processes that hold GPU memory or an NVIDIA device, and end the leftovers.
    Orphans(OrphansArgs),
    /// Every GPU and every process holding memory, live, with the checks that can run live; JSON lines
    /// (or CSV) when not on a terminal; a Prometheus exporter with --metrics.
    Watch(WatchArgs),
    /// Diagnose a saved run again (a report or a trace) with the rules in force.
    Report(ReportArgs),
    /// What changed between two runs (reports or traces), per GPU and per rule.
    Compare(CompareArgs),
    /// The rule set: list, explain a rule, list the facts rules read.
    Rules(RulesCmd),
    /// Show what gpudoc does: on a GPU machine, run a small example under it; elsewhere, diagnose a run
    /// recorded on an H200.
    Demo,
    /// Print a shell completion script, for bash into
    /// ~/.local/share/bash-completion/completions/gpudoc (zsh: a `_gpudoc` file on $fpath; fish:
    /// ~/.config/fish/completions/gpudoc.fish).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `gpudoc man > ~/.local/share/man/man1/gpudoc.1`.
    Man,
    /// Print the JSON Schema of a file gpudoc writes (also in docs/schema/ of the repository).
    Schema {
        #[arg(value_enum)]
        name: SchemaName,
    },
}

/// The files gpudoc writes that have a JSON Schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SchemaName {
    /// `gpudoc run --json`, `gpudoc report --json`.
    Report,
    /// One row of `gpudoc run --trace FILE.jsonl`.
    TraceRow,
    /// A `--baseline` file.
    Baseline,
    /// `gpudoc compare --json`.
    Compare,
    /// `gpudoc orphans --json`.
    Orphans,
    /// `gpudoc fit --json`.
    Fit,
    /// One message of the PyTorch shim to gpudoc (a trace's `torch` rows carry them).
    ShimMessage,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// How often to sample device memory on every GPU (e.g. 1ms, 500us, 0.1s).
    #[arg(long, value_parser = parse_interval, default_value = "1ms", value_name = "DUR")]
    pub interval: Duration,
    /// Device-memory sampling period once nothing has changed for a second (back to --interval at the
    /// next change). Give the same value as --interval to sample at one rate throughout.
    #[arg(long, value_parser = parse_interval, default_value = "5ms", value_name = "DUR")]
    pub idle_interval: Duration,
    /// How often to sample the per-process lists.
    #[arg(long, value_parser = parse_interval, default_value = "10ms", value_name = "DUR")]
    pub proc_interval: Duration,
    /// Write the report as JSON to FILE (a file, or a descriptor such as /dev/fd/3; not `-`: stdout is
    /// the command's).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the report as JSON into the folder DIR (made if missing) under a name of its own: the job's
    /// id, the host and the rank (`4242.0-node7-rank3.json`), never over another file. Give every node
    /// of a job the same shared folder and `gpudoc report DIR` merges them (docs/cluster.md).
    #[arg(long, value_name = "DIR", conflicts_with = "try_remedy")]
    pub report_dir: Option<PathBuf>,
    /// Write the timeline as it is sampled: CSV, or JSON lines for a `.jsonl` name.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Don't put the PyTorch shim in place (no framework view).
    #[arg(long)]
    pub no_torch: bool,
    /// Never reset PyTorch's peak counters (by default the shim resets them at each record, so per-step
    /// peaks are exact, while the program's own view of them stays as if they were never reset).
    #[arg(long)]
    pub keep_torch_peaks: bool,
    /// Find the line that leaks and what keeps it alive: `auto` records PyTorch's memory history for a
    /// window of steps once allocated memory grows step after step; `on` from warm-up on; `off` never.
    #[arg(long, value_name = "WHEN", num_args = 0..=1, default_value = "auto", default_missing_value = "on")]
    pub hunt_leaks: HuntLeaks,
    /// Write PyTorch's allocator snapshot to FILE, the pickle pytorch.org/memory_viz opens: at the first
    /// out-of-memory failure, else at the end of the step gpudoc measures after warm-up (memory history
    /// is recorded from CUDA's start to that step for it).
    #[arg(long, value_name = "FILE", conflicts_with = "no_torch")]
    pub snapshot: Option<PathBuf>,
    /// End the job's descendants still running after the command exits (SIGTERM, 10 s, SIGKILL).
    #[arg(long)]
    pub kill_orphans: bool,
    /// Serve Prometheus metrics at ADDR while the job runs: PORT (on 127.0.0.1) or HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// With --metrics: keep serving this long after the job ends (at most 1h; less if gpudoc is asked to
    /// end), so a scraper sees its end.
    #[arg(long, value_parser = parse_duration, default_value = "0s", value_name = "DUR", requires = "metrics")]
    pub metrics_linger: Duration,
    /// The job's name: its entry in a --baseline file, a label on every metric (`job_name`), and in the
    /// report.
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Write TensorBoard event files of the job's memory into DIR when it ends (a `gpudoc` run in it,
    /// beside the program's own).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Write one self-contained HTML page of the run to FILE when it ends: memory over time per GPU and
    /// process, PyTorch's per-step view, the diagnoses linked to their moments, the OOM, the gate.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// This machine's name in the report and the metrics (default: its hostname): for containers whose
    /// hostname is random, and for merging the reports of a job's nodes.
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// No live status line and no summary (errors still print).
    #[arg(short, long)]
    pub quiet: bool,
    /// End the job early, as Ctrl-C would (SIGINT to its process group; then SIGTERM, then SIGKILL to its
    /// tree, if it goes on), once one of these rules is told during the run (a rule judged live:
    /// step-leak, steady-growth, near-capacity, stray-context, others-arrived); gpudoc then exits 123.
    #[arg(long, value_name = "RULE", value_delimiter = ',')]
    pub stop_on: Vec<String>,
    /// Run the command twice, as is and with a remedy that needs no code change, and compare them:
    /// expandable_segments, max_split_size_mb:N, garbage_collection_threshold:F, fraction:F, or '{}=N'
    /// for a parameter marked with its value as is (`--batch-size {64}`) (docs/fit.md). Not with the
    /// CI gate's flags: it runs the command twice to compare them, and the gate judges one run.
    #[arg(long = "try", value_name = "REMEDY", conflicts_with_all = ["max_peak", "baseline", "fail_on", "junit"])]
    pub try_remedy: Option<String>,
    /// With --try: spend at most this long on the two runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m", value_name = "DUR", requires = "try_remedy")]
    pub try_budget: Duration,
    #[command(flatten)]
    pub rules: RulesArgs,
    #[command(flatten)]
    pub gate: GateArgs,
    /// The command to run, after `--`.
    #[arg(required = true, trailing_var_arg = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Debug, clap::Args)]
pub struct FitArgs {
    /// The smallest value tried (the first run).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub min: u64,
    /// The largest value tried.
    #[arg(long, default_value_t = 1 << 20, value_name = "N")]
    pub max: u64,
    /// End each run once this many optimizer steps have passed (SIGINT, as a Ctrl-C).
    #[arg(long, default_value_t = 5, value_name = "K")]
    pub steps: u64,
    /// Also end each run after this long: for programs that step no optimizer (inference, serving).
    #[arg(long = "for", value_parser = humantime::parse_duration, value_name = "DUR")]
    pub run_for: Option<Duration>,
    /// Run the command at most N times.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub runs: u64,
    /// Spend at most this long in all (a run still going when it is spent is ended).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30m", value_name = "DUR")]
    pub budget: Duration,
    /// Write the result as JSON to FILE (not `-`: stdout is the command's).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Don't put the PyTorch shim in place (no steps are counted: give --for).
    #[arg(long)]
    pub no_torch: bool,
    /// The command, after `--`, with `{}` where the value goes.
    #[arg(required = true, trailing_var_arg = true, num_args = 1.., value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// The shortest sampling interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_micros(100);
/// The longest: a sampler that looks once a minute sees nothing worth the name.
pub const MAX_INTERVAL: Duration = Duration::from_secs(60);

/// A duration as people write it (`500ms`, `10s`, `2m`); an error says so in words, where humantime
/// says "expected number at 0" of `forever`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| match e {
        humantime::DurationError::UnknownUnit { unit, .. } => {
            format!("`{s}`: unknown unit `{unit}` (ns, us, ms, s, m, h, d; like 500ms, 10s or 2m)")
        }
        _ => format!("`{s}` is not a duration: write a number and a unit, like 500ms, 10s or 2m"),
    })
}

#[cfg(test)]
#[test]
fn a_duration_that_is_not_one_is_said_in_words() {
    assert_eq!(
        parse_duration("forever").unwrap_err(),
        "`forever` is not a duration: write a number and a unit, like 500ms, 10s or 2m"
    );
    assert!(
        parse_duration("10x")
            .unwrap_err()
            .contains("unknown unit `x`")
    );
    assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < MIN_INTERVAL {
        return Err(format!("{s} is too short: the shortest interval is 100us"));
    }
    if d > MAX_INTERVAL {
        return Err(format!("{s} is too long: the longest interval is 60s"));
    }
    Ok(d)
}

/// Flags that choose the rules, shared by `run`, `report`, `compare`, `rules` and `watch`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RulesArgs {
    /// A folder of rule files (*.toml) added to the bundled ones; a rule with a bundled rule's id replaces it,
    /// its words/oom-cause.toml the words of an OOM's cause, its words/process-reason.toml those of why a
    /// process is judged an orphan (or not), and its words/hunt.toml those of a leak hunt.
    #[arg(long, value_name = "DIR", global = true)]
    pub rules: Option<PathBuf>,
    /// Switch a rule off (repeatable).
    #[arg(long, value_name = "ID", global = true)]
    pub disable_rule: Vec<String>,
}

/// The CI gate's flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GateArgs {
    /// Fail if the job's peak on a GPU exceeds SIZE: `40GiB` for every GPU, `1=20GiB` for GPU 1
    /// (repeatable).
    #[arg(long, value_name = "[GPU=]SIZE")]
    pub max_peak: Vec<String>,
    /// A baseline file holding the peaks of named jobs.
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,
    /// Allowed growth over the baseline: `5%`, `512MiB`, or both (`5%,512MiB`: the larger applies).
    #[arg(
        long,
        value_name = "PCT|SIZE",
        default_value = "0%",
        requires = "baseline"
    )]
    pub tolerance: String,
    /// Write this run's peaks into the baseline (creating the entry or the file).
    #[arg(long, requires = "baseline")]
    pub update_baseline: bool,
    /// Which measure is gated.
    #[arg(long, value_enum, default_value_t = GateMeasure::Nvml, value_name = "MEASURE")]
    pub gate: GateMeasure,
    /// Also fail on diagnoses of this severity or worse (`info`: any diagnosis).
    #[arg(long, value_name = "info|warn|error", value_enum)]
    pub fail_on: Option<FailOn>,
    /// Write the gate's checks as a JUnit XML file, for CI systems other than GitHub Actions.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Let the gate pass when it measured nothing (GPU sampling off, or a job that held no GPU memory
    /// gpudoc saw); by default that fails it.
    #[arg(long)]
    pub allow_no_gpu: bool,
}

/// `--gate`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum GateMeasure {
    /// The job's peak as NVML sees it (its processes' memory, CUDA contexts included).
    #[default]
    Nvml,
    /// PyTorch's peak reserved memory (the framework view; less noisy).
    Reserved,
    /// PyTorch's peak allocated memory (live tensors).
    Allocated,
}

#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// How often to look (e.g. 500ms, 2s).
    #[arg(long, value_parser = parse_watch_interval, default_value = "1s")]
    pub interval: Duration,
    /// `tui` (the default on a terminal), `jsonl` (one JSON line per change, the default otherwise) or
    /// `csv` (rows per change).
    #[arg(long, value_enum)]
    pub format: Option<WatchFormat>,
    /// Serve Prometheus metrics at ADDR: PORT (on 127.0.0.1) or HOST:PORT. With no terminal and no
    /// --format, only that (a node exporter).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// This machine's name in the metrics' `host` label (default: its hostname): for a container, whose
    /// hostname is its pod's (a DaemonSet passes the node's name).
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// As root, let `e` end other users' leftovers too.
    #[arg(long)]
    pub all_users: bool,
    #[command(flatten)]
    pub rules: RulesArgs,
}

/// `gpudoc watch --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WatchFormat {
    Tui,
    Jsonl,
    Csv,
}

fn parse_watch_interval(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(3600) {
        return Err(format!("{s}: from 100ms to 1h"));
    }
    Ok(d)
}

/// `--hunt-leaks`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum HuntLeaks {
    /// Once allocated memory grows step after step past warm-up.
    #[default]
    Auto,
    /// From warm-up on.
    On,
    /// Never.
    Off,
}

/// `--fail-on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    Info,
    Warn,
    Error,
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// A report (`gpudoc run --json`) or a JSON-lines trace (`gpudoc run --trace FILE.jsonl`); several, or
    /// a folder of them, are one job's nodes, merged into one report.
    #[arg(required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// With one trace: the command's captured output (stderr), scanned for an out-of-memory report (`-`
    /// for standard input).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Write TensorBoard event files of the run's memory into DIR (a `gpudoc` run in it).
    #[arg(long, value_name = "DIR")]
    pub tensorboard: Option<PathBuf>,
    /// Write one self-contained HTML page of the run to FILE (`-` for stdout); from a trace it has every
    /// sample, from a report the report's summary of them.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Print the facts the rules read (JSON) instead of the summary: for writing and checking rules.
    #[arg(long)]
    pub facts: bool,
    /// Write the re-diagnosed report as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// With one trace: judge the live rules again over its samples in time order, a look every 2 s as
    /// `gpudoc run` did, to say when each diagnosis was known during the run and what it forecast.
    #[arg(long)]
    pub live_verdicts: bool,
    #[command(flatten)]
    pub rules: RulesArgs,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The earlier run: a report or a JSON-lines trace.
    pub old: PathBuf,
    /// The later run.
    pub new: PathBuf,
    /// Write the comparison as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub rules: RulesArgs,
}

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

#[derive(Debug, clap::Args)]
pub struct OrphansArgs {
    /// End the leftovers (orphans): SIGTERM, wait --grace, then SIGKILL.
    #[arg(long)]
    pub kill: bool,
    /// Don't ask before ending them.
    #[arg(short, long)]
    pub yes: bool,
    /// How long to wait after SIGTERM before SIGKILL.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// As root, also end other users' processes.
    #[arg(long)]
    pub all_users: bool,
    /// With --kill, also end processes detached on purpose (they ignore SIGHUP: `nohup`) that hold GPU
    /// memory.
    #[arg(long, requires = "kill")]
    pub detached: bool,
    /// With --kill, also end what a `gpudoc run` recorded it left running that holds no GPU memory or
    /// device file (a tmux server, tensorboard or Jupyter server started from a run).
    #[arg(long, requires = "kill")]
    pub without_gpu: bool,
    /// Write the listing (and what was ended) as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}
