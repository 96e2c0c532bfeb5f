//! Raw flags and the environment, resolved once into what each command runs with. The environment is read
//! here and nowhere else ([`Env::read`]): terminals, colour variables, CI, the NVML library, PYTHONPATH.
//! A value that can't be used is refused here, before anything starts, with the flag and what is wrong.

use crate::cli::{self, ColorWhen};
use crate::exit::{self, Failure};
use crate::gate::{self, Gate};
use crate::output::{self, Target};
use crate::paint::Paint;
use crate::rules::{RuleSet, RunRules};
use crate::sample::Rates;
use crate::supervise::Wiring;
use crate::torch::{HuntMode, ShimSettings};
use crate::units::parse_bytes;
use crate::verdict::{Measure, Severity};
use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// The variables gpudoc reads, as the man page's ENVIRONMENT lists them (docs/run.md's table says more).
pub const VARIABLES: [(&str, &str); 11] = [
    (
        crate::gpu::LIB_ENV,
        "the NVML library to load (default libnvidia-ml.so.1)",
    ),
    (
        "NO_COLOR",
        "non-empty: no colours unless --color always (CLICOLOR and CLICOLOR_FORCE as usual)",
    ),
    ("CI", "set: no live status line"),
    (
        "GITHUB_ACTIONS",
        "true: the memory gate's verdicts as workflow annotations",
    ),
    (
        "CUDA_VISIBLE_DEVICES",
        "the GPUs the job is given (indices or UUIDs): the ones gpudoc run samples (all, when unset or a \
         MIG instance). An entry that is no GPU of the machine is said in the summary and the report's \
         notes: CUDA stops there, so the job has the GPUs before it, or none (then gpudoc samples all)",
    ),
    (
        "PYTORCH_CUDA_ALLOC_CONF",
        "the job's allocator settings, which --try adds its remedy to",
    ),
    (
        "SLURM_JOB_ID",
        "with SLURM_STEP_ID, SLURM_NODEID, SLURM_PROCID (the rank) and SLURM_NTASKS: recorded in the \
         report and named in --report-dir's file names, for merging a job's nodes (docs/cluster.md)",
    ),
    (
        "TORCHELASTIC_RUN_ID",
        "set by torchrun for its workers (torchrun --no-python gpudoc run ...): recorded, with RANK and \
         WORLD_SIZE, as SLURM_JOB_ID is; the rank is torchrun's under srun too",
    ),
    (
        "PMIX_NAMESPACE",
        "set by mpirun (PMIx) for its tasks: recorded, with PMIX_RANK, as SLURM_JOB_ID is",
    ),
    (
        "XDG_CACHE_HOME",
        "where the PyTorch shim is kept when the installed package's cannot be used (~/.cache)",
    ),
    (
        "XDG_STATE_HOME",
        "where gpudoc run records what it left running, for gpudoc orphans (~/.local/state)",
    ),
];

/// What gpudoc reads of its environment, once.
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub stdin_tty: bool,
    /// fd 0 is a regular file (`< data.txt`): `--try` gives it to both of its runs.
    pub stdin_file: bool,
    /// fd 0 is a pipe or socket (`seq 1000 | gpudoc ...`): `--try` says its input went to the first run.
    pub stdin_pipe: bool,
    pub stdout_tty: bool,
    pub stderr_tty: bool,
    /// gpudoc's process group is its terminal's foreground (stdin's): false for a background job (`&`,
    /// `timeout`'s own group), whose changes to the terminal's modes would stop it (SIGTTOU).
    pub foreground: bool,
    /// `CI` is set: no live line.
    pub ci: bool,
    /// `GITHUB_ACTIONS=true`: the gate prints workflow commands.
    pub github_actions: bool,
    /// `NO_COLOR`, `CLICOLOR`, `CLICOLOR_FORCE`, `TERM`, as `anstyle-query` reads them.
    pub no_color: bool,
    pub clicolor: Option<bool>,
    pub clicolor_force: bool,
    pub term_color: bool,
    /// `GPUDOC_NVML_LIB`, or the driver's library.
    pub nvml_lib: String,
    /// The command's `PYTHONPATH`, which the shim goes in front of.
    pub pythonpath: Option<OsString>,
    /// Where temporary folders go (`TMPDIR`).
    pub tmpdir: PathBuf,
    /// The user's cache folder (`XDG_CACHE_HOME`, else `~/.cache`), where the PyTorch shim is kept.
    pub cache_home: Option<PathBuf>,
    /// The `gpudoc` package's folders beside this binary when it was installed by pip (`PREFIX/bin/gpudoc`
    /// and `PREFIX/lib/pythonX.Y/site-packages/gpudoc`): its shim is used as it is.
    pub installed_packages: Vec<PathBuf>,
    /// Test-only: the device-file prefix `gpudoc orphans` looks for.
    pub dev_prefix: String,
    /// What fds 1 and 2 are, for wiring the command's output.
    pub wiring: Wiring,
    /// This machine's name (`gpudoc run --host` overrides it).
    pub host: String,
    /// `CUDA_VISIBLE_DEVICES`: the GPUs a job is given, the ones `gpudoc run` samples.
    pub visible_devices: Option<String>,
    /// `PYTORCH_CUDA_ALLOC_CONF`: the user's allocator settings, which `--try` adds its remedy to.
    pub alloc_conf: Option<String>,
    /// The launch that started gpudoc: Slurm's ids of the job, step and node (`SLURM_JOB_ID`,
    /// `SLURM_STEP_ID`, `SLURM_NODEID`), the launcher's id, the rank ([`crate::origin::Launch::read`]).
    pub launch: crate::origin::Launch,
    /// Where `gpudoc run` records the processes it left running, for `gpudoc orphans`:
    /// `$XDG_STATE_HOME/gpudoc/leftovers.json`, else `~/.local/state/gpudoc/leftovers.json`; `None`
    /// without either.
    pub leftovers: Option<PathBuf>,
}

/// The `gpudoc` package folders a pip install put beside this binary: `PREFIX/lib*/python*/{site,dist}-
/// packages/gpudoc` for the binary at `PREFIX/bin/gpudoc` (a venv, conda, `--user`, the system's).
fn installed_packages() -> Vec<PathBuf> {
    let Some(prefix) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent().map(PathBuf::from))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_name().to_string_lossy().starts_with("python") {
                continue;
            }
            for packages in ["site-packages", "dist-packages"] {
                let pkg = e.path().join(packages).join("gpudoc");
                if pkg.is_dir() {
                    out.push(pkg);
                }
            }
        }
    }
    out.sort();
    out
}

impl Env {
    /// Reads the process's environment and terminals.
    pub fn read() -> Env {
        let (stdout_tty, stderr_tty) = (
            std::io::stdout().is_terminal(),
            std::io::stderr().is_terminal(),
        );
        // SAFETY: fstat on fd 0; a closed one fails, and is neither.
        let stdin = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(0) })
            .ok()
            .map(|st| st.st_mode & libc::S_IFMT);
        Env {
            stdin_tty: std::io::stdin().is_terminal(),
            stdin_file: stdin == Some(libc::S_IFREG),
            stdin_pipe: matches!(stdin, Some(libc::S_IFIFO | libc::S_IFSOCK)),
            // SAFETY: tcgetpgrp and getpgrp only read.
            foreground: unsafe { libc::tcgetpgrp(0) == libc::getpgrp() },
            stdout_tty,
            stderr_tty,
            wiring: Wiring::of_this_process(stdout_tty, stderr_tty),
            ci: std::env::var_os("CI").is_some(),
            github_actions: std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true"),
            no_color: anstyle_query::no_color(),
            clicolor: anstyle_query::clicolor(),
            clicolor_force: anstyle_query::clicolor_force(),
            term_color: anstyle_query::term_supports_color() || anstyle_query::is_ci(),
            nvml_lib: std::env::var(crate::gpu::LIB_ENV)
                .unwrap_or_else(|_| crate::gpu::DEFAULT_LIB.to_string()),
            pythonpath: std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()),
            tmpdir: std::env::temp_dir(),
            cache_home: xdg_home("XDG_CACHE_HOME", ".cache"),
            installed_packages: installed_packages(),
            dev_prefix: std::env::var(crate::orphans::DEV_PREFIX_ENV)
                .unwrap_or_else(|_| crate::orphans::DEV_PREFIX.into()),
            visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
            alloc_conf: std::env::var(crate::fit::remedy::ALLOC_CONF).ok(),
            host: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default(),
            launch: crate::origin::Launch::read(|var| std::env::var(var).ok()),
            leftovers: state_home().map(|d| d.join("gpudoc").join("leftovers.json")),
        }
    }

    /// Colours for a stream, by the ecosystem's rules: `--color` first, then `NO_COLOR`, `CLICOLOR_FORCE`,
    /// `CLICOLOR=0`, then a terminal that supports colour.
    pub fn paint(&self, when: ColorWhen, tty: bool) -> Paint {
        Paint(match when {
            ColorWhen::Always => true,
            ColorWhen::Never => false,
            ColorWhen::Auto => {
                if self.no_color {
                    false
                } else if self.clicolor_force {
                    true
                } else if self.clicolor == Some(false) {
                    false
                } else {
                    tty && (self.term_color || self.clicolor == Some(true))
                }
            }
        })
    }
}

/// `gpudoc run`, resolved.
#[derive(Debug)]
pub struct RunSettings {
    pub command: Vec<OsString>,
    pub rates: Rates,
    pub json: Option<Target>,
    /// `--report-dir`: the folder the report goes into, under a name of its own.
    pub report_dir: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    /// `--snapshot`: where the allocator's snapshot goes.
    pub snapshot: Option<Target>,
    /// `None` with `--no-torch`.
    pub torch: Option<ShimSettings>,
    pub kill_orphans: bool,
    /// Where to record what the job left running.
    pub leftovers: Option<crate::orphans::record::Record>,
    pub quiet: bool,
    /// Draw the live status line (a terminal on stderr, not CI, not quiet).
    pub live: bool,
    /// Colours on stderr, where the summary goes.
    pub paint: Paint,
    /// Compiled beside the command once `start`ed (see [`RunRules`]).
    pub rules: std::sync::Arc<RunRules>,
    pub gate: Option<Gate>,
    pub github_actions: bool,
    /// `--metrics`: where to serve, and how long to go on after the job.
    pub metrics: Option<(std::net::SocketAddr, std::time::Duration)>,
    /// `--name`.
    pub name: Option<String>,
    /// `--host`, else the hostname.
    pub host: String,
    /// `--tensorboard DIR`.
    pub tensorboard: Option<PathBuf>,
    /// `--html FILE`.
    pub html: Option<Target>,
    /// `--stop-on`: rules judged live whose verdict ends the job.
    pub stop_on: Vec<String>,
    /// Where runs in progress publish their forecasts for `gpudoc watch` ([`crate::runs`]).
    pub runs: Option<PathBuf>,
    /// `--try REMEDY` and `--try-budget`.
    pub try_remedy: Option<(crate::fit::remedy::Remedy, Duration)>,
    /// Added to the command's environment (a `--try` remedy's run).
    pub extra_env: Vec<(String, OsString)>,
    pub env: Env,
}

/// Each `--stop-on` rule is one judged during the run: no other can stop it.
fn check_stop_on(stop_on: &[String], live: &[String]) -> Result<(), Failure> {
    match stop_on.iter().find(|id| !live.contains(id)) {
        Some(id) => Err(run_failure(
            "--stop-on",
            format!(
                "`{id}` is not a rule judged during the run (those with `live = true`: {})",
                live.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

fn run_failure(flag: &str, what: impl std::fmt::Display) -> Failure {
    Failure::new(exit::GPUDOC_FAILED, format!("{flag}: {what}"))
}

/// The longest `--metrics-linger`: a scraper sees a run's end within a few of its intervals.
const MAX_LINGER: std::time::Duration = std::time::Duration::from_secs(3600);

fn linger(d: std::time::Duration) -> Result<std::time::Duration, Failure> {
    if d > MAX_LINGER {
        return Err(run_failure(
            "--metrics-linger",
            format!(
                "{} is longer than the most gpudoc lingers (1h): a scraper sees the end within a few intervals",
                humantime::format_duration(d)
            ),
        ));
    }
    Ok(d)
}

impl RunSettings {
    pub fn resolve(a: cli::RunArgs, color: ColorWhen, env: Env) -> Result<RunSettings, Failure> {
        let json = a
            .json
            .as_deref()
            .map(|p| run_output("--json", p))
            .transpose()?;
        if let Some(t) = &a.trace {
            run_output("--trace", t)?;
        }
        if let Some(dir) = &a.report_dir {
            crate::output::check_folder(dir)
                .map_err(|e| run_failure(&format!("--report-dir {}", dir.display()), e))?;
        }
        let snapshot = a
            .snapshot
            .as_deref()
            .map(|p| run_output("--snapshot", p))
            .transpose()?;
        let rules = RunRules::load(a.rules.rules.as_deref(), &a.rules.disable_rule)
            .map_err(|e| Failure::new(exit::GPUDOC_FAILED, e.to_string()))?;
        check_stop_on(&a.stop_on, rules.live_ids())?;
        let gate = resolve_gate(&a.gate, a.name.as_deref())
            .map_err(|e| Failure::new(exit::GPUDOC_FAILED, e))?;
        if let Some(g) = &gate {
            check_gate_outputs(g)?;
        }
        let torch = (!a.no_torch).then_some(ShimSettings {
            reset_peaks: !a.keep_torch_peaks,
            hunt: match a.hunt_leaks {
                crate::cli::HuntLeaks::Auto => HuntMode::Auto,
                crate::cli::HuntLeaks::On => HuntMode::On,
                crate::cli::HuntLeaks::Off => HuntMode::Off,
            },
            snapshot: snapshot.is_some(),
        });
        let metrics = match &a.metrics {
            Some(m) => Some((
                crate::serve::parse_addr(m).map_err(|e| run_failure("--metrics", e))?,
                linger(a.metrics_linger)?,
            )),
            None => None,
        };
        Ok(RunSettings {
            command: a.command,
            rates: Rates {
                device: a.interval,
                device_idle: a.idle_interval,
                process: a.proc_interval,
            },
            json,
            report_dir: a.report_dir,
            trace: a.trace,
            snapshot,
            torch,
            kill_orphans: a.kill_orphans,
            leftovers: env
                .leftovers
                .clone()
                .map(crate::orphans::record::Record::at),
            quiet: a.quiet,
            live: !a.quiet && env.stderr_tty && !env.ci,
            paint: env.paint(color, env.stderr_tty),
            rules: std::sync::Arc::new(rules),
            gate,
            github_actions: env.github_actions,
            metrics,
            name: a.name,
            host: a.host.unwrap_or_else(|| env.host.clone()),
            tensorboard: match a.tensorboard {
                Some(dir) => {
                    std::fs::create_dir_all(dir.join("gpudoc"))
                        .map_err(|e| run_failure(&format!("--tensorboard {}", dir.display()), e))?;
                    Some(dir)
                }
                None => None,
            },
            html: a
                .html
                .as_deref()
                .map(|p| run_output("--html", p))
                .transpose()?,
            stop_on: a.stop_on,
            runs: runs_dir(&env),
            try_remedy: match &a.try_remedy {
                Some(r) => Some((
                    crate::fit::remedy::Remedy::parse(r).map_err(|e| run_failure("--try", e))?,
                    a.try_budget,
                )),
                None => None,
            },
            extra_env: Vec::new(),
            env,
        })
    }
}

/// `gpudoc fit`, resolved: the bounds, and the settings each run is made with (`gpudoc run`'s own
/// defaults, quiet, no leak hunt, what a run leaves running ended).
#[derive(Debug)]
pub struct FitSettings {
    pub template: Vec<OsString>,
    pub bounds: crate::fit::Bounds,
    pub budget: Duration,
    pub run_for: Option<Duration>,
    pub json: Option<Target>,
    pub run: RunSettings,
}

impl FitSettings {
    pub fn resolve(a: cli::FitArgs, color: ColorWhen, env: Env) -> Result<FitSettings, Failure> {
        let refuse = |flag: &str, what: &str| Err(run_failure(flag, what));
        if crate::fit::command_for(&a.command, 0).is_none() {
            return refuse(
                "the command",
                "no `{}` in it: put `{}` where the value goes (`--batch-size {}`)",
            );
        }
        if a.min > a.max {
            return refuse("--min", "larger than --max");
        }
        if a.runs == 0 {
            return refuse("--runs", "at least one run");
        }
        if a.steps == 0 {
            return refuse("--steps", "at least one step");
        }
        if a.no_torch && a.run_for.is_none() {
            return refuse(
                "--no-torch",
                "without the shim no steps are counted: give --for DUR to end each run",
            );
        }
        let json = a
            .json
            .as_deref()
            .map(|p| run_output("--json", p))
            .transpose()?;
        // Each run: `gpudoc run`'s defaults, as clap gives them, so the two never drift apart.
        let mut argv: Vec<OsString> = ["run", "--quiet", "--kill-orphans", "--hunt-leaks", "off"]
            .map(OsString::from)
            .to_vec();
        if a.no_torch {
            argv.push("--no-torch".into());
        }
        argv.push("--".into());
        argv.extend(a.command.iter().cloned());
        let run_args = <cli::RunArgs as clap::FromArgMatches>::from_arg_matches(
            &<cli::RunArgs as clap::Args>::augment_args(clap::Command::new("run"))
                .try_get_matches_from(argv)
                .map_err(|e| Failure::new(exit::GPUDOC_FAILED, e.to_string()))?,
        )
        .map_err(|e| Failure::new(exit::GPUDOC_FAILED, e.to_string()))?;
        Ok(FitSettings {
            template: a.command,
            bounds: crate::fit::Bounds {
                min: a.min,
                max: a.max,
                runs: a.runs,
                budget_s: a.budget.as_secs_f64(),
                steps: (!a.no_torch).then_some(a.steps),
                run_for_s: a.run_for.map(|d| d.as_secs_f64()),
            },
            budget: a.budget,
            run_for: a.run_for,
            json,
            run: RunSettings::resolve(run_args, color, env)?,
        })
    }
}

/// A file `gpudoc run` writes, checked before the command runs. `-` is refused: stdout is the command's,
/// and gpudoc's own output never goes into it.
fn run_output(flag: &str, path: &std::path::Path) -> Result<Target, Failure> {
    let t = Target::parse(path);
    if t == Target::Stdout {
        return Err(run_failure(
            &format!("{flag} -"),
            format!(
                "the command's own output goes to stdout, so gpudoc's can't go there too: give a \
                 file, or a descriptor ({flag} /dev/fd/3 3>&1 1>&2)"
            ),
        ));
    }
    output::check(&t).map_err(|e| run_failure(&format!("{flag} {}", t.display()), e))?;
    Ok(t)
}

/// The gate's files must be writable before the command runs: a JUnit file, a baseline to update.
fn check_gate_outputs(g: &Gate) -> Result<(), Failure> {
    if let Some(j) = &g.junit {
        run_output("--junit", j)?;
    }
    if let (true, Some((b, _))) = (g.update, &g.baseline) {
        output::check(&Target::File(b.clone()))
            .map_err(|e| run_failure(&format!("--update-baseline {}", b.display()), e))?;
    }
    Ok(())
}

/// A percentage a person could mean: finite, 0 to 1000.
fn percentage(part: &str, p: &str) -> Result<f64, String> {
    match p.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=1000.0).contains(&v) => Ok(v),
        Ok(_) => Err(format!("--tolerance {part}: a percentage from 0% to 1000%")),
        Err(_) => Err(format!("--tolerance {part}: not a percentage")),
    }
}

/// `--tolerance`: a percentage, a size, or one of each (`5%,512MiB`); (percent, bytes), 0 for the one not
/// given. An empty or repeated part is refused: `5%,` or `5%,10%` says something the user did not mean.
fn tolerance(t: &str) -> Result<(f64, u64), String> {
    let refuse = |what: &str| {
        format!(
            "--tolerance {t}: {what}: give a percentage, a size, or one of each (5%, 512MiB, 5%,512MiB)"
        )
    };
    let (mut pct, mut bytes) = (None, None);
    for part in t.split(',').map(str::trim) {
        if part.is_empty() {
            return Err(refuse("an empty part"));
        }
        if let Some(p) = part.strip_suffix('%') {
            // One spelling, the help's (5%): `5 %` is said, not guessed at.
            if p.ends_with(char::is_whitespace) {
                return Err(refuse(&format!("a space before % (write {}%)", p.trim())));
            }
            if pct.replace(percentage(part, p)?).is_some() {
                return Err(refuse("a second percentage"));
            }
        } else {
            let b =
                parse_bytes(part).map_err(|e| format!("--tolerance {e} (or a percentage: 5%)"))?;
            if bytes.replace(b).is_some() {
                return Err(refuse("a second size"));
            }
        }
    }
    Ok((pct.unwrap_or(0.0), bytes.unwrap_or(0)))
}

/// The rules in force: the bundled ones, a folder's, less the disabled ones.
pub fn load_rules(a: &cli::RulesArgs) -> Result<RuleSet, String> {
    RuleSet::load(a.rules.as_deref(), &a.disable_rule).map_err(|e| e.to_string())
}

fn severity(f: cli::FailOn) -> Severity {
    match f {
        cli::FailOn::Info => Severity::Info,
        cli::FailOn::Warn => Severity::Warn,
        cli::FailOn::Error => Severity::Error,
    }
}

fn measure(m: cli::GateMeasure) -> Measure {
    match m {
        cli::GateMeasure::Nvml => Measure::Nvml,
        cli::GateMeasure::Reserved => Measure::Reserved,
        cli::GateMeasure::Allocated => Measure::Allocated,
    }
}

/// The gate's flags; `None` when no gate was asked for. Reads the baseline file now, so a corrupt one stops
/// gpudoc before the command runs.
pub fn resolve_gate(a: &cli::GateArgs, name: Option<&str>) -> Result<Option<Gate>, String> {
    // Checked even when no gate is asked for: a value that can't be used is never passed over.
    let (pct, bytes) = tolerance(&a.tolerance)?;
    if a.max_peak.is_empty() && a.baseline.is_none() && a.fail_on.is_none() && a.junit.is_none() {
        return Ok(None);
    }
    let mut budgets = Vec::new();
    for m in &a.max_peak {
        let (gpu, size) = match m.split_once('=') {
            Some((g, s)) => (
                Some(
                    g.trim()
                        .parse::<u32>()
                        .map_err(|_| format!("--max-peak {m}: `{g}` is not a GPU index"))?,
                ),
                s,
            ),
            None => (None, m.as_str()),
        };
        budgets.push((
            gpu,
            parse_bytes(size).map_err(|e| format!("--max-peak {m}: {e}"))?,
        ));
    }
    let baseline = match (&a.baseline, name) {
        (Some(f), Some(n)) => Some((f.clone(), n.to_string())),
        (Some(_), None) => return Err("--baseline needs --name: the job's name in the file".into()),
        _ => None,
    };
    let file = match &baseline {
        Some((path, _)) => gate::read_baseline(path)?,
        None => None,
    };
    Ok(Some(Gate {
        budgets,
        baseline,
        tolerance_pct: pct,
        tolerance_bytes: bytes,
        update: a.update_baseline,
        measure: measure(a.gate),
        fail_on: a.fail_on.map(severity),
        junit: a.junit.clone(),
        allow_no_gpu: a.allow_no_gpu,
        file,
    }))
}

/// `gpudoc report`, resolved.
pub struct ReportSettings {
    /// The files to read: reports or traces, a folder's expanded.
    pub files: Vec<PathBuf>,
    pub output: Option<PathBuf>,
    pub tensorboard: Option<PathBuf>,
    pub html: Option<Target>,
    pub facts: bool,
    pub json: Option<Target>,
    /// `--live-verdicts`: the trace's live verdicts judged again.
    pub live_verdicts: bool,
    pub rules: RuleSet,
    /// Colours where the summary goes: stdout, or stderr when the JSON takes stdout.
    pub paint: Paint,
}

impl ReportSettings {
    pub fn resolve(a: cli::ReportArgs, color: ColorWhen, env: &Env) -> Result<Self, Failure> {
        let rules = load_rules(&a.rules).map_err(|e| Failure::new(exit::USAGE, e))?;
        let json = a.json.as_deref().map(Target::parse);
        let html = a.html.as_deref().map(Target::parse);
        let on_stdout = [
            json == Some(Target::Stdout),
            html == Some(Target::Stdout),
            a.facts,
        ];
        if on_stdout.iter().filter(|&&x| x).count() > 1 {
            return Err(Failure::new(
                exit::USAGE,
                "only one of --json -, --html - and --facts can write to stdout",
            ));
        }
        // The summary goes to stderr when the JSON or the page takes stdout.
        let summary_tty = if on_stdout[0] || on_stdout[1] {
            env.stderr_tty
        } else {
            env.stdout_tty
        };
        let files = expand_folders(&a.files).map_err(|e| Failure::new(exit::USAGE, e))?;
        if a.output.is_some() && files.len() > 1 {
            return Err(Failure::new(
                exit::USAGE,
                "--output goes with one trace, not a merge of several",
            ));
        }
        if a.live_verdicts && files.len() > 1 {
            return Err(Failure::new(
                exit::USAGE,
                "--live-verdicts goes with one trace, not a merge of several",
            ));
        }
        Ok(ReportSettings {
            files,
            output: a.output,
            tensorboard: a.tensorboard,
            html,
            facts: a.facts,
            json,
            live_verdicts: a.live_verdicts,
            rules,
            paint: env.paint(color, summary_tty),
        })
    }
}

/// Files as given; a folder becomes the reports and traces in it (`*.json`, `*.jsonl`), sorted.
fn expand_folders(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    for p in paths {
        if !p.is_dir() {
            out.push(p.clone());
            continue;
        }
        let mut found: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|f| f.extension().is_some_and(|x| x == "json" || x == "jsonl"))
            .collect();
        if found.is_empty() {
            return Err(format!(
                "{}: no report (*.json) or trace (*.jsonl) in it",
                p.display()
            ));
        }
        found.sort();
        // A run's report stands for its trace beside it.
        let reports: Vec<String> = found
            .iter()
            .filter_map(|f| f.to_str()?.strip_suffix(".report.json").map(String::from))
            .collect();
        found.retain(|f| {
            f.to_str()
                .and_then(|s| s.strip_suffix(".trace.jsonl"))
                .is_none_or(|stem| !reports.iter().any(|r| r == stem))
        });
        out.extend(found);
    }
    Ok(out)
}

/// `gpudoc compare`, resolved.
pub struct CompareSettings {
    pub old: PathBuf,
    pub new: PathBuf,
    pub json: Option<Target>,
    pub rules: RuleSet,
    pub paint: Paint,
}

impl CompareSettings {
    pub fn resolve(a: cli::CompareArgs, color: ColorWhen, env: &Env) -> Result<Self, Failure> {
        let rules = load_rules(&a.rules).map_err(|e| Failure::new(exit::USAGE, e))?;
        Ok(CompareSettings {
            old: a.old,
            new: a.new,
            json: a.json.as_deref().map(Target::parse),
            rules,
            paint: env.paint(color, env.stdout_tty),
        })
    }
}

/// `gpudoc orphans`, resolved.
pub struct OrphansSettings {
    pub kill: bool,
    pub yes: bool,
    pub grace: Duration,
    pub all_users: bool,
    /// `--detached`, `--without-gpu`: what `--kill` ends beyond the leftovers.
    pub widen: crate::orphans::Widen,
    pub json: Option<Target>,
    /// A person can be asked (stdin and stderr are terminals).
    pub can_ask: bool,
    pub paint: Paint,
    pub nvml_lib: String,
    pub dev_prefix: String,
    /// What `gpudoc run` recorded it left running.
    pub leftovers: Option<crate::orphans::record::Record>,
}

impl OrphansSettings {
    pub fn resolve(a: cli::OrphansArgs, color: ColorWhen, env: &Env) -> Result<Self, Failure> {
        if a.all_users && !nix::unistd::geteuid().is_root() {
            return Err(Failure::new(exit::USAGE, "--all-users needs root"));
        }
        let json = a.json.as_deref().map(Target::parse);
        let table_tty = if json == Some(Target::Stdout) {
            env.stderr_tty
        } else {
            env.stdout_tty
        };
        Ok(OrphansSettings {
            kill: a.kill,
            yes: a.yes,
            grace: a.grace,
            all_users: a.all_users,
            widen: crate::orphans::Widen {
                detached: a.detached,
                without_gpu: a.without_gpu,
            },
            json,
            can_ask: env.stdin_tty && env.stderr_tty,
            paint: env.paint(color, table_tty),
            nvml_lib: env.nvml_lib.clone(),
            dev_prefix: env.dev_prefix.clone(),
            leftovers: env
                .leftovers
                .clone()
                .map(crate::orphans::record::Record::at),
        })
    }
}

/// Where runs in progress publish their forecasts: `live/` beside the leftovers' record.
fn runs_dir(env: &Env) -> Option<PathBuf> {
    Some(env.leftovers.as_ref()?.parent()?.join("live"))
}

/// The user's state folder: `$XDG_STATE_HOME`, else `~/.local/state` (see [`xdg_home`]).
fn state_home() -> Option<PathBuf> {
    xdg_home("XDG_STATE_HOME", ".local/state")
}

/// An XDG base folder: `$var` where it is absolute (as the XDG spec requires) and gpudoc may make its
/// folder there ([`crate::private::yours`]), else `within` the effective user's home ([`user_home`]).
fn xdg_home(var: &str, within: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && crate::private::yours(p).is_ok())
        .or_else(|| Some(user_home()?.join(within)))
}

/// The effective user's home: `$HOME` when it is theirs, else their home in the user database. Run as
/// root with another user's HOME (`sudo -E`, a root container with the home mounted), a folder gpudoc made
/// there would be root's and stand in the user's way: root's own home is used instead.
fn user_home() -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let euid = nix::unistd::geteuid();
    let theirs = |p: &PathBuf| {
        p.is_absolute() && std::fs::metadata(p).is_ok_and(|m| m.uid() == euid.as_raw())
    };
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(theirs)
        .or_else(|| {
            let user = nix::unistd::User::from_uid(euid).ok()??;
            Some(user.dir).filter(theirs)
        })
}

/// `gpudoc watch`, resolved.
pub struct WatchSettings {
    pub interval: Duration,
    /// What goes to stdout: a terminal screen, JSON lines, CSV, or nothing (an exporter only).
    pub output: Option<cli::WatchFormat>,
    pub metrics: Option<std::net::SocketAddr>,
    pub all_users: bool,
    pub paint: Paint,
    pub nvml_lib: String,
    pub dev_prefix: String,
    pub host: String,
    /// What `gpudoc run` recorded it left running.
    pub leftovers: Option<crate::orphans::record::Record>,
    /// Where runs in progress publish their forecasts ([`crate::runs`]).
    pub runs: Option<PathBuf>,
    /// The rules judged on each look (`look = true`), loaded once.
    pub rules: RuleSet,
}

impl WatchSettings {
    pub fn resolve(a: cli::WatchArgs, color: ColorWhen, env: &Env) -> Result<Self, Failure> {
        if a.all_users && !nix::unistd::geteuid().is_root() {
            return Err(Failure::new(exit::USAGE, "--all-users needs root"));
        }
        let rules = load_rules(&a.rules).map_err(|e| Failure::new(exit::USAGE, e))?;
        let metrics = match &a.metrics {
            Some(m) => Some(
                crate::serve::parse_addr(m)
                    .map_err(|e| Failure::new(exit::USAGE, format!("--metrics {e}")))?,
            ),
            None => None,
        };
        let output = match a.format {
            Some(cli::WatchFormat::Tui) if !(env.stdout_tty && env.stdin_tty) => {
                return Err(Failure::new(
                    exit::USAGE,
                    "--format tui needs a terminal on stdin and stdout",
                ));
            }
            Some(cli::WatchFormat::Tui) if !env.foreground => {
                return Err(Failure::new(
                    exit::USAGE,
                    "--format tui needs the terminal's foreground (under timeout: timeout --foreground)",
                ));
            }
            Some(f) => Some(f),
            // In the background (`timeout N gpudoc watch`, `&`) the screen's raw mode would stop gpudoc
            // (SIGTTOU) until someone brings it to the foreground: lines, which touch no mode, instead.
            None if env.stdout_tty && env.stdin_tty && env.foreground => {
                Some(cli::WatchFormat::Tui)
            }
            None if metrics.is_some() => None,
            None => Some(cli::WatchFormat::Jsonl),
        };
        Ok(WatchSettings {
            interval: a.interval,
            output,
            metrics,
            all_users: a.all_users,
            paint: env.paint(color, env.stdout_tty),
            nvml_lib: env.nvml_lib.clone(),
            dev_prefix: env.dev_prefix.clone(),
            host: a.host.unwrap_or_else(|| env.host.clone()),
            leftovers: env
                .leftovers
                .clone()
                .map(crate::orphans::record::Record::at),
            runs: runs_dir(env),
            rules: rules.looks(),
        })
    }
}
