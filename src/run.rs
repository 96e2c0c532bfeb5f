//! `gpudoc run`: orchestration only. Start sampling, start the command, wait, then turn the timeline into
//! a report and print it.

use crate::cli::{ColorWhen, RunArgs, use_color};
use crate::exit;
use crate::gpu;
use crate::live::{self, Live};
use crate::oom::{self, scan::Scanner};
use crate::report::{Inputs, Report};
use crate::sample::{Rates, Sampler};
use crate::summary::{self, Paint};
use crate::supervise;
use crate::supervise::ProcessEnd;
use crate::timeline::Micros;
use crate::torch::{self, ShimSettings};
use crate::trace::TraceWriter;
use clap::Parser;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

/// How long `--kill-orphans` waits after SIGTERM before SIGKILL.
const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs the command under gpudoc and returns the exit code to leave with.
pub fn run(args: RunArgs, color: ColorWhen) -> ExitCode {
    let paint = Paint(use_color(color, true));
    let command: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Some(path) = &args.json
        && let Err(e) = check_writable(path)
    {
        eprintln!("gpudoc: --json {}: {e}", path.display());
        return ExitCode::from(exit::GPUDOC_FAILED);
    }
    let rules = match args.rules.load() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpudoc: {e}");
            return ExitCode::from(exit::GPUDOC_FAILED);
        }
    };
    let gate = match crate::gate::Gate::from_args(&args.gate) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("gpudoc: {e}");
            return ExitCode::from(exit::GPUDOC_FAILED);
        }
    };
    let rates = Rates {
        device: args.interval,
        device_idle: args.idle_interval,
        process: args.proc_interval,
    };
    let start_wall = SystemTime::now();
    let start = Instant::now();
    let (nvml, nvml_status, gpus) = gpu::open();
    if !nvml_status.available {
        eprintln!(
            "gpudoc: GPU sampling is off: {}",
            nvml_status.error.as_deref().unwrap_or("NVML unavailable")
        );
    }
    let trace = match &args.trace {
        Some(path) => match TraceWriter::create(path, start_wall, &command, &gpus, &nvml_status) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("gpudoc: --trace {}: {e}", path.display());
                return ExitCode::from(exit::GPUDOC_FAILED);
            }
        },
        None => None,
    };
    let me = std::process::id();
    let cgroup = oom::host::own_cgroup();
    let kills_before = cgroup.as_deref().and_then(oom::host::oom_kills);
    let scanner = Arc::new(Mutex::new(Scanner::new()));
    let observer: supervise::Observer = {
        let scanner = scanner.clone();
        Box::new(move |stream, bytes| {
            let at = start.elapsed().as_micros() as Micros;
            scanner.lock().unwrap().feed(stream, bytes, at);
        })
    };
    let sampler = nvml.map(|n| Sampler::start(n, gpus, me, rates, trace, start));
    let live = match &sampler {
        Some(s) if live::wanted(args.quiet) => Live::start(s.snapshot.clone()),
        _ => Live::off(),
    };
    let (channel, env) = if args.no_torch {
        (None, Vec::new())
    } else {
        let settings = ShimSettings {
            interval: args.torch_interval,
            reset_peaks: !args.keep_torch_peaks,
        };
        match torch::Channel::open(settings, start_wall) {
            Ok((c, env)) => (Some(c), env),
            Err(e) => {
                eprintln!("gpudoc: the PyTorch view is off: cannot set up its shim: {e}");
                (None, Vec::new())
            }
        }
    };
    let child = match supervise::spawn(&args.command, &env, live.guard(), Some(observer)) {
        Ok(c) => c,
        Err(e) => {
            live.finish();
            if let Some(s) = sampler {
                s.stop();
            }
            eprintln!("gpudoc: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let child_pid = child.pid();
    let outcome = child.wait();
    live.finish();
    let (timeline, trace_error) = sampler.map(|s| s.stop()).unwrap_or_default();
    let torch_enabled = channel.is_some();
    let torch_timeline = channel.map(|c| c.close()).unwrap_or_default();
    let leftovers = crate::procs::descendants(me);
    let ended = if args.kill_orphans && !leftovers.is_empty() {
        let holders: Vec<_> = leftovers
            .iter()
            .map(|p| crate::orphans::describe(p.pid, Vec::new(), Vec::new()))
            .collect();
        let r = crate::orphans::end::end(
            &holders,
            ORPHAN_GRACE,
            &crate::orphans::end::Policy::here(false),
        );
        supervise::reap_all();
        r
    } else {
        Vec::new()
    };
    let end_at = start.elapsed().as_micros() as Micros;
    let mut scanner = std::mem::take(&mut *scanner.lock().unwrap());
    scanner.finish(end_at);
    let mut host = oom::HostOom::default();
    if outcome.end != ProcessEnd::Exited(0) {
        let kills_after = cgroup.as_deref().and_then(oom::host::oom_kills);
        host.cgroup_oom_kills = kills_after
            .unwrap_or(0)
            .saturating_sub(kills_before.unwrap_or(0));
        let mut pids: Vec<u32> = timeline
            .procs
            .values()
            .filter(|p| p.in_job)
            .map(|p| p.pid)
            .collect();
        pids.push(child_pid);
        pids.extend(leftovers.iter().map(|p| p.pid));
        if let Some(pid) = scanner.first_failure.as_ref().and_then(|f| f.pid) {
            pids.push(pid);
        }
        host.kernel_log = oom::host::kernel_log_kills(&pids);
    }
    let (ending, mut oom_report, host_oom) = oom::classify(&oom::Evidence {
        end: outcome.end,
        scanner: &scanner,
        timeline: &timeline,
        host,
    });
    let mut notes = Vec::new();
    if let Some(e) = trace_error {
        notes.push(format!("the trace file is incomplete: {e}"));
    }
    if let Some(o) = oom_report.as_mut() {
        // The observer fires just before the exception's text is printed.
        let at = o.event.at_s;
        o.allocator = torch_timeline
            .ooms
            .iter()
            .find(|t| t.at_s >= at - oom::WINDOW_S && t.at_s <= at + 1.0)
            .cloned();
    }
    let torch_report = torch::view::build(
        &torch_timeline,
        &timeline,
        &timeline
            .gpus
            .iter()
            .map(|g| g.info.clone())
            .collect::<Vec<_>>(),
        torch_enabled,
    );
    if !torch_timeline.errors.is_empty() {
        notes.push(format!(
            "the PyTorch view was lost in {} process(es): {}",
            torch_timeline.errors.len(),
            torch_report.errors.join("; ")
        ));
    }
    let mut report = Report::build(Inputs {
        command,
        started_unix_s: start_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64(),
        outcome: &outcome,
        nvml: nvml_status,
        rates,
        timeline: &timeline,
        leftovers: &leftovers,
        ended: &ended,
        ending,
        torch: torch_report,
        oom: oom_report,
        host_oom,
        self_usage: crate::report::self_usage(),
        notes,
    });
    crate::rules::diagnose(&mut report, &rules);
    report.gate = gate.as_ref().map(|g| g.evaluate(&report));
    if !args.quiet {
        eprint!("{}", summary::render(&report, paint));
    }
    if let Some(path) = &args.json
        && let Err(e) = write_json(path, &report)
    {
        eprintln!("gpudoc: --json {}: {e}", path.display());
    }
    if let Some(g) = &report.gate {
        if std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true") {
            // Workflow commands are read from stdout (after the report, with `--json -`).
            print!("{}", crate::gate::annotations(g));
        }
        if let Some(path) = gate.as_ref().and_then(|x| x.junit.as_ref())
            && let Err(e) = std::fs::write(path, crate::gate::junit(g, &report.command.join(" ")))
        {
            eprintln!("gpudoc: --junit {}: {e}", path.display());
        }
        for n in &g.notes {
            eprintln!("gpudoc gate: {n}");
        }
        // The verdict is the last line, also with --quiet.
        eprintln!("{}", crate::gate::verdict(g));
    }
    ExitCode::from(crate::gate::exit_code(outcome.end.code(), report.gate.as_ref()) as u8)
}

/// `-` is stdout; a file is written whole or not at all (temp file, then rename).
fn write_json(path: &Path, report: &Report) -> std::io::Result<()> {
    let text = report.to_json();
    if path == Path::new("-") {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes())?;
        return out.flush();
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Fails early, before the command runs, when the report could not be written at the end.
fn check_writable(path: &Path) -> std::io::Result<()> {
    if path == Path::new("-") {
        return Ok(());
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no folder {}", dir.display()),
        ));
    }
    if path.is_dir() {
        return Err(std::io::Error::other("is a folder"));
    }
    Ok(())
}

/// The recorded run `gpudoc demo` shows where there is no GPU.
pub const DEMO_REPORT: &str = "fixtures/runs/cache_bloat.report.json";
/// What `gpudoc demo` runs on a GPU machine.
pub const DEMO_SCRIPT: [&str; 3] = ["python3", "tests/gpu/scenarios.py", "cache_bloat"];

/// `gpudoc demo`: on a machine with a GPU and PyTorch, run the example under gpudoc; elsewhere show the
/// diagnosis of the same example recorded on an H200.
pub fn demo(color: ColorWhen) -> ExitCode {
    let (nvml, _, gpus) = gpu::open();
    drop(nvml);
    let torch = std::process::Command::new("python3")
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
        ])
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !gpus.is_empty() && torch && Path::new(DEMO_SCRIPT[1]).exists() {
        eprintln!(
            "gpudoc demo: running `{}` under gpudoc on this machine's GPU",
            DEMO_SCRIPT.join(" ")
        );
        let argv = ["gpudoc", "run", "--"].into_iter().chain(DEMO_SCRIPT);
        if let Ok(crate::cli::Cli {
            cmd: crate::cli::Cmd::Run(a),
            ..
        }) = crate::cli::Cli::try_parse_from(argv)
        {
            return run(a, color);
        }
    }
    if !Path::new(DEMO_REPORT).exists() {
        eprintln!("gpudoc demo: run it from the repository's folder ({DEMO_REPORT} is not here)");
        return ExitCode::from(exit::USAGE);
    }
    println!(
        "gpudoc demo: no GPU with PyTorch here, so this is the diagnosis of `{}` recorded on an NVIDIA H200 \
         ({DEMO_REPORT}); `gpudoc report FILE` does the same for any saved report.\n",
        DEMO_SCRIPT.join(" ")
    );
    crate::replay::run(
        crate::replay::ReportArgs {
            file: DEMO_REPORT.into(),
            output: None,
            facts: false,
            json: None,
            rules: Default::default(),
        },
        Paint(use_color(color, false)),
    )
}
