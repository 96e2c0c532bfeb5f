//! `gpudoc run`: orchestration only, in named stages: start the session (sampling, the shim, the trace),
//! spawn and wait, collect the evidence, analyze it into a report (pure), emit the outputs.

use crate::analysis::{self, EndRow, Evidence};
use crate::exit::{self, Failure};
use crate::gpu::NvmlStatus;
use crate::live::Live;
use crate::oom::{self, scan::Scanner};
use crate::orphans::end::{EndResult, Ended};
use crate::output::{self, Target};
use crate::procs::ProcInfo;
use crate::report::Report;
use crate::sample::Sampler;
use crate::settings::RunSettings;
use crate::supervise::{self, Outcome, ProcessEnd};
use crate::timeline::{Micros, Timeline};
use crate::torch;
use crate::trace::{SharedTrace, TraceWriter};
use crate::{gate, summary};

use crate::live::{metrics as live_metrics, so_far, telling as live_verdicts};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long `--kill-orphans` waits after SIGTERM before SIGKILL.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// Runs the command under gpudoc; the code to leave with.
pub fn run(s: RunSettings) -> Result<ExitCode, Failure> {
    // SAFETY: no thread has started yet; everything below starts after the split.
    let _ = unsafe { supervise::guard::split() };
    s.rules.start();
    let Measured {
        mut report,
        timeline,
        child,
        metrics,
        hup_ignored,
        ..
    } = measure(&s, None)?;
    report.gate = s.gate.as_ref().map(|g| g.evaluate(&report));
    record_leftovers(&s, &mut report, hup_ignored);
    let code = emit(&s, &mut report, timeline.as_ref());
    if let Some(m) = metrics {
        m.finish(&report, s.metrics.map(|m| m.1).unwrap_or_default());
    }
    // Last: closing the files the command wrote can make the filesystem write them out (see Child).
    child.finish();
    // Died of a signal, the command's code is 128+N: gpudoc dies of it too, so that a shell loop or
    // `make` stops at Ctrl-C as it would without gpudoc.
    if let Some(sig) = report.exit.signal
        && i32::from(code) == 128 + sig
    {
        supervise::guard::exit_by_signal(sig);
    }
    Ok(ExitCode::from(code))
}

/// How long `gpudoc run` waits for NVML before the command starts, when a `--max-peak` names a GPU.
const GPU_CHECK_WAIT: Duration = Duration::from_secs(2);

/// A `--max-peak` for a GPU this machine does not have fails before the command runs (exit 125), not
/// after the whole job (exit 122). Only then does the command wait for NVML, at most [`GPU_CHECK_WAIT`]
/// (NVML opens in milliseconds with the driver loaded); without an answer the gate checks at the end.
fn check_budget_gpus(s: &RunSettings, session: &Session) -> Result<(), Failure> {
    let Some(gate) = s
        .gate
        .as_ref()
        .filter(|g| g.budgets.iter().any(|b| b.0.is_some()))
    else {
        return Ok(());
    };
    let Some(present) = session.sampler.gpus(GPU_CHECK_WAIT) else {
        return Ok(());
    };
    match gate.absent_gpu(&present) {
        Some(g) => Err(Failure::new(
            crate::exit::GPUDOC_FAILED,
            format!(
                "{}: the command was not started",
                gate::no_such_gpu(g, &present)
            ),
        )),
        None => Ok(()),
    }
}

/// One run of the command, analyzed.
pub(crate) struct Measured {
    pub report: Report,
    /// The whole timeline, kept when an output draws it (`--tensorboard`, `--html`).
    pub timeline: Option<Timeline>,
    /// Kept until gpudoc's own work is done (see [`supervise::Child`]).
    pub child: supervise::Child,
    metrics: Option<live_metrics::Metrics>,
    /// gpudoc was started ignoring SIGHUP (`nohup gpudoc ...`): so may the job's processes be.
    pub hup_ignored: bool,
    /// Why gpudoc ended the job itself, when an [`crate::fit::ender::Ender`] did (`gpudoc fit`).
    pub ended: Option<crate::fit::ender::Ended>,
    /// The signal by which someone asked the job to end (a Ctrl-C), if anyone did: `gpudoc fit` stops.
    pub interrupted: Option<i32>,
}

/// Runs the command once under the session's machinery (sampling, the shim, the OOM reader) and analyzes
/// it into a report. With `end` (`gpudoc fit`), gpudoc ends the job itself once it has run far enough.
pub(crate) fn measure(
    s: &RunSettings,
    end: Option<crate::fit::ender::EndWhen>,
) -> Result<Measured, Failure> {
    let mut session = Session::start(s)?;
    if let Err(e) = check_budget_gpus(s, &session) {
        session.abandon();
        return Err(e);
    }
    let mut child = match session.spawn(s) {
        Ok(c) => c,
        Err(e) => {
            session.abandon();
            return Err(Failure::new(e.exit_code(), e.to_string()));
        }
    };
    // The command's duration is counted from its spawn; the report's times, from the session's start.
    let spawned_after = session.start.elapsed();
    let child_pid = child.pid();
    let ender = end.map(|w| {
        let steps = session.channel.as_ref().map(|c| c.timeline());
        crate::fit::ender::Ender::start(w, child_pid, steps)
    });
    let mut outcome = child.wait();
    outcome.duration += spawned_after;
    let ended = ender.and_then(|e| e.stop());
    let interrupted = outcome.interrupted;
    let metrics = session.metrics.take();
    let hup_ignored = session.hup_ignored;
    let verdicts = session.verdicts.verdicts.clone();
    let (evidence, stopped_on) = session.collect(s, outcome, child_pid);
    let timeline = (s.tensorboard.is_some() || s.html.is_some()).then(|| evidence.timeline.clone());
    let mut report = analysis::analyze(evidence, s.rules.get());
    verdicts.lock().unwrap().annotate(&mut report);
    report.exit.stopped_on = stopped_on;
    Ok(Measured {
        report,
        timeline,
        child,
        metrics,
        hup_ignored,
        ended,
        interrupted,
    })
}

/// Everything running beside the command.
struct Session {
    start: Instant,
    start_wall: SystemTime,
    sampler: Sampler,
    live: Live,
    channel: Option<torch::Channel>,
    shim_env: Vec<(String, std::ffi::OsString)>,
    scanner: Arc<Mutex<Scanner>>,
    cgroup: Option<std::path::PathBuf>,
    kills_before: Option<u64>,
    trace: Option<SharedTrace>,
    metrics: Option<live_metrics::Metrics>,
    verdicts: live_verdicts::LiveVerdicts,
    /// gpudoc was started ignoring SIGHUP (`nohup gpudoc run`): the job's processes may have it from
    /// there, so ignoring it tells nothing of theirs.
    hup_ignored: bool,
    /// What could not be set up beside the command, for the report.
    notes: Vec<String>,
}

impl Session {
    /// Starts everything that runs beside the command. Nothing here waits for NVML: it is opened on the
    /// sampler's own thread.
    fn start(s: &RunSettings) -> Result<Session, Failure> {
        let start_wall = SystemTime::now();
        let start = Instant::now();
        // Before `spawn` puts gpudoc's own handlers in place.
        let hup_ignored = crate::procs::ignores_hup(std::process::id());
        let trace = open_trace(s, start_wall)?;
        let cgroup = oom::host::own_cgroup();
        let kills_before = cgroup.as_deref().and_then(oom::host::oom_kills);
        let me = std::process::id();
        let sampler = Sampler::start(
            (s.env.nvml_lib.clone(), s.env.visible_devices.clone()),
            me,
            s.rates,
            trace.clone(),
            start,
        );
        let (channel, shim_env) = open_shim(s, start_wall, &trace);
        let scanner = Arc::new(Mutex::new(Scanner::new()));
        let sources = Arc::new(so_far::Sources {
            timeline: Box::new(sampler.reader()),
            torch: channel.as_ref().map(|c| c.timeline()),
            scanner: scanner.clone(),
            rules: s.rules.clone(),
            origin: origin(s),
            command: lossy(&s.command),
            started_unix_s: unix_s(start_wall),
            rates: s.rates,
            seen: Default::default(),
        });
        let verdicts = live_verdicts::LiveVerdicts::start(
            sources.clone(),
            live_verdicts::Asked {
                live_rules: s.rules.live_ids().to_vec(),
                stop_on: s.stop_on.clone(),
                quiet: s.quiet,
                start,
                publish: published(s, unix_s(start_wall)),
            },
        );
        // Drawn only where gpudoc sees every byte that reaches the screen: on the command's own
        // terminal, never over a prompt the job wrote to /dev/tty or keys the user typed.
        let live = if s.live && supervise::screen_is_ours() {
            Live::start(sampler.snapshot.clone(), verdicts.note.clone())
        } else {
            Live::off()
        };
        let mut notes = Vec::new();
        let metrics = match s.metrics {
            Some((addr, _)) => {
                // A port taken (another job's gpudoc on the node, one per rank) must not keep the job
                // from running: it runs without the endpoint, and the report says so.
                live_metrics::Metrics::start(addr, sources, verdicts.verdicts.clone())
                    .inspect_err(|e| {
                        crate::sayln!("gpudoc: --metrics {e}: the job runs without the endpoint");
                        notes.push(format!("--metrics {e}: the job ran without the endpoint"));
                    })
                    .ok()
            }
            None => None,
        };
        Ok(Session {
            start,
            start_wall,
            sampler,
            live,
            channel,
            shim_env,
            scanner,
            cgroup,
            kills_before,
            trace,
            metrics,
            verdicts,
            hup_ignored,
            notes,
        })
    }

    fn spawn(&self, s: &RunSettings) -> Result<supervise::Child, supervise::SpawnError> {
        let observer = Box::new(crate::oom::scan::Reading {
            scanner: self.scanner.clone(),
            start: self.start,
        });
        let env: Vec<_> = self.shim_env.iter().chain(&s.extra_env).cloned().collect();
        supervise::spawn(supervise::Spawn {
            argv: &s.command,
            env: &env,
            wiring: s.env.wiring,
            terminal: self.live.terminal(),
            observer: Some(observer),
            on_exit: Some(Box::new(self.sampler.looker())),
            stop: Some(self.verdicts.stop.clone()),
            work: self.channel.as_ref().map(|c| {
                let t = c.timeline();
                Box::new(move || t.lock().unwrap().steps_seen()) as supervise::Work
            }),
        })
    }

    /// The command could not start: stop what runs beside it.
    fn abandon(self) {
        if let Some(m) = self.metrics {
            m.stop();
        }
        self.verdicts.finish();
        self.live.finish();
        self.sampler.stop();
        if let Some(c) = self.channel {
            c.close();
        }
    }

    /// Stops sampling and reading, then gathers what the end of the run tells: leftovers (ended with
    /// `--kill-orphans`), the OOM scanner's findings, the kernel's OOM-killer evidence. The trace gets it
    /// as its end row; with the rule `--stop-on` ended the job on, if it did.
    fn collect(
        self,
        s: &RunSettings,
        outcome: Outcome,
        child_pid: u32,
    ) -> (Evidence, Option<String>) {
        let stopped_on = self.verdicts.finish().filter(|_| outcome.stopped);
        self.live.finish();
        let sampled = self.sampler.stop();
        let closed = self.channel.map(|c| c.finish(s.snapshot.is_some()));
        let mut notes = self.notes;
        let torch = closed.map(|(mut t, snap)| {
            notes.extend(write_snapshot(s, &mut t, snap));
            t
        });
        let leftovers = settled_leftovers();
        let ended = if s.kill_orphans && !leftovers.is_empty() {
            end_leftovers(&leftovers, self.hup_ignored)
        } else {
            Vec::new()
        };
        let mut scanner = std::mem::take(&mut *self.scanner.lock().unwrap());
        scanner.finish(self.start.elapsed().as_micros() as Micros);
        let kills = (self.cgroup.as_deref(), self.kills_before);
        let host = host_evidence(
            kills,
            &outcome,
            &sampled.timeline,
            &scanner,
            child_pid,
            &leftovers,
        );
        let nvml = sampled.nvml.clone().unwrap_or_else(|| NvmlStatus {
            library: s.env.nvml_lib.clone(),
            error: sampled.stalled.clone(),
            ..Default::default()
        });
        let mut ev = Evidence {
            origin: origin(s),
            command: lossy(&s.command),
            started_unix_s: unix_s(self.start_wall),
            outcome: Some(outcome),
            nvml,
            rates: s.rates,
            timeline: sampled.timeline,
            torch,
            scanner,
            host,
            leftovers,
            ended,
            notes: notes
                .into_iter()
                .chain(sampled.stalled.clone())
                .chain(sampled.notes)
                .collect(),
            self_usage: crate::report::self_usage(),
        };
        if let Some(t) = self.trace {
            let mut t = t.lock().unwrap();
            t.start(&[], &ev.nvml);
            t.end(&EndRow::of(&ev));
            ev.notes.extend(
                t.error()
                    .map(|e| format!("the trace file is incomplete: {e}")),
            );
        }
        (ev, stopped_on)
    }
}

/// Where and as what this run publishes its forecasts for `gpudoc watch`.
fn published(
    s: &RunSettings,
    started_unix_s: f64,
) -> Option<(std::path::PathBuf, crate::runs::Published)> {
    let me = crate::procs::read(std::process::id())?;
    let p = crate::runs::Published {
        pid: me.pid,
        start_ticks: me.start_ticks,
        command: lossy(&s.command).join(" "),
        started_unix_s,
        forecasts: Vec::new(),
    };
    Some((s.runs.clone()?, p))
}

/// `--snapshot`: the shim's snapshot written to the user's file, which the report then names; a note
/// when there is none or it could not be written.
fn write_snapshot(
    s: &RunSettings,
    t: &mut torch::TorchTimeline,
    snap: Option<(String, Vec<u8>)>,
) -> Option<String> {
    let target = s.snapshot.as_ref()?;
    let Some((name, bytes)) = snap else {
        return Some(format!(
            "--snapshot {}: no snapshot was taken (no out-of-memory failure, and no step measured after warm-up)",
            target.display()
        ));
    };
    if let Err(e) = crate::output::write(target, &bytes) {
        t.name_snapshot(None);
        return Some(format!("--snapshot {}: {e}", target.display()));
    }
    t.name_snapshot(Some(torch::SnapshotFile {
        shim: name,
        file: target.display(),
    }));
    None
}

/// The trace file, when `--trace` asks for one.
fn open_trace(s: &RunSettings, start_wall: SystemTime) -> Result<Option<SharedTrace>, Failure> {
    let Some(path) = &s.trace else {
        return Ok(None);
    };
    let writer =
        TraceWriter::create(path, start_wall, &lossy(&s.command), &origin(s)).map_err(|e| {
            Failure::new(
                exit::GPUDOC_FAILED,
                format!("--trace {}: {e}", path.display()),
            )
        })?;
    Ok(Some(Arc::new(Mutex::new(writer))))
}

/// The PyTorch shim's channel and the environment that loads it; without them (`--no-torch`, or a shim
/// that cannot be set up, which is said) the command runs all the same.
fn open_shim(
    s: &RunSettings,
    start_wall: SystemTime,
    trace: &Option<SharedTrace>,
) -> (Option<torch::Channel>, Vec<(String, std::ffi::OsString)>) {
    let Some(settings) = s.torch else {
        return (None, Vec::new());
    };
    let opened = torch::Channel::open(
        settings,
        start_wall,
        s.env.pythonpath.as_deref(),
        (
            &s.env.tmpdir,
            torch::home::Homes {
                installed: &s.env.installed_packages,
                cache: s.env.cache_home.as_deref(),
            },
        ),
        trace.clone(),
    );
    match opened {
        Ok((c, env)) => {
            if let Some(note) = &c.note {
                crate::sayln!("gpudoc: the PyTorch shim runs from a copy of this run's: {note}");
            }
            (Some(c), env)
        }
        Err(e) => {
            crate::sayln!("gpudoc: the PyTorch view is off: cannot set up its shim: {e}");
            (None, Vec::new())
        }
    }
}

/// The kernel's OOM-killer evidence for a run that failed: the cgroup's counter, the kernel log's lines
/// that name a job process.
fn host_evidence(
    (cgroup, kills_before): (Option<&std::path::Path>, Option<u64>),
    outcome: &Outcome,
    timeline: &Timeline,
    scanner: &Scanner,
    child_pid: u32,
    leftovers: &[ProcInfo],
) -> oom::HostOom {
    let mut host = oom::HostOom::default();
    if outcome.end == ProcessEnd::Exited(0) {
        return host;
    }
    let kills_after = cgroup.and_then(oom::host::oom_kills);
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
    pids.extend(scanner.first_failure.as_ref().and_then(|f| f.pid));
    host.kernel_log = oom::host::kernel_log_kills(&pids);
    host
}

/// How long descendants get, once the command has ended, to end on their own before they count as left
/// running (a worker that exits right after the main process is not a leftover).
const LEFTOVER_SETTLE: Duration = Duration::from_millis(200);

/// The job's descendants still running [`LEFTOVER_SETTLE`] after the command ended, reaping as they go:
/// one that already exited is never counted.
fn settled_leftovers() -> Vec<ProcInfo> {
    let me = std::process::id();
    let until = Instant::now() + LEFTOVER_SETTLE;
    loop {
        supervise::reap_all();
        let left = crate::procs::descendants(me);
        if left.is_empty() || Instant::now() >= until {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `--kill-orphans`: ends the leftovers, except those detached on purpose (they ignore SIGHUP, which the
/// job was not started ignoring: `nohup` inside the job), as `gpudoc orphans --kill` spares them.
fn end_leftovers(leftovers: &[ProcInfo], hup_ignored: bool) -> Vec<EndResult> {
    let (spared, holders): (Vec<_>, Vec<_>) = leftovers
        .iter()
        .map(|p| crate::orphans::describe(p.pid, Vec::new(), Vec::new()))
        .partition(|h| !hup_ignored && crate::procs::ignores_hup(h.pid));
    let mut r = crate::orphans::end::end(
        &holders,
        ORPHAN_GRACE,
        &crate::orphans::end::Policy::here(false),
    );
    supervise::reap_all();
    r.extend(spared.iter().map(|h| EndResult {
        pid: h.pid,
        result: Ended::Skipped {
            why: crate::orphans::DETACHED.into(),
        },
    }));
    r
}

/// Before another run of the same command (`gpudoc fit`, `--try`): ends whatever earlier runs left running
/// that is still there, those detached on purpose (`nohup`) included, which `--kill-orphans` spared. Each
/// would hold memory the next run needs and be counted as that run's (it is gpudoc's descendant, as the
/// job's processes are), and each run would start another. What was ended, to be said.
pub(crate) fn end_earlier_leftovers() -> Vec<(ProcInfo, EndResult)> {
    supervise::reap_all();
    let left = crate::procs::descendants(std::process::id());
    if left.is_empty() {
        return Vec::new();
    }
    let holders: Vec<_> = left
        .iter()
        .map(|p| crate::orphans::describe(p.pid, Vec::new(), Vec::new()))
        .collect();
    let ended = crate::orphans::end::end(
        &holders,
        ORPHAN_GRACE,
        &crate::orphans::end::Policy::here(false),
    );
    supervise::reap_all();
    left.into_iter()
        .filter_map(|p| Some((p.clone(), ended.iter().find(|r| r.pid == p.pid)?.clone())))
        .collect()
}

/// Records what the job left running (and `--kill-orphans` did not end), so `gpudoc orphans` knows them for
/// certain; a record that can't be written is a note of the report, never a failure of the run.
pub(crate) fn record_leftovers(s: &RunSettings, report: &mut Report, hup_ignored: bool) {
    use crate::orphans::record::{Entry, Here};
    let left: Vec<_> = report
        .orphans
        .iter()
        .filter(|o| !matches!(o.ended, Some(Ended::Ended { .. } | Ended::Gone)))
        .collect();
    if left.is_empty() {
        return;
    }
    let (Some(record), Some(here)) = (&s.leftovers, Here::read()) else {
        report.notes.push(
            "what the job left running is not recorded for `gpudoc orphans` (no $XDG_STATE_HOME or $HOME, or no /proc)"
                .into(),
        );
        return;
    };
    let entries = left
        .iter()
        .filter_map(|o| {
            Some(Entry {
                pid: o.pid,
                start_ticks: o.start_ticks?,
                boot_id: here.boot_id.clone(),
                pid_ns: here.pid_ns,
                run: report.command.clone(),
                ended_unix_s: report.started_unix_s + report.duration_s,
                gpu_bytes: o.gpu_bytes.clone(),
                hup_inherited: hup_ignored,
            })
        })
        .collect();
    if let Err(e) = record.update(&here, entries) {
        report.notes.push(format!(
            "what the job left running could not be recorded for `gpudoc orphans`: {e}"
        ));
    }
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn origin(s: &RunSettings) -> crate::origin::Origin {
    crate::origin::Origin {
        host: s.host.clone(),
        name: s.name.clone(),
        slurm: s.env.launch.slurm.clone(),
        cuda_visible_devices: s.env.visible_devices.clone(),
        launch: s.env.launch.id.clone(),
        rank: s.env.launch.rank,
        world_size: s.env.launch.world_size,
    }
}

fn lossy(argv: &[std::ffi::OsString]) -> Vec<String> {
    argv.iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

/// Prints the summary and writes every output asked for; the exit code. A job `--stop-on` ended gives 123;
/// otherwise a failing command's code always wins; then a failed gate (122); then an output the user
/// asked for and did not get (125).
fn emit(s: &RunSettings, report: &mut Report, timeline: Option<&Timeline>) -> u8 {
    let mut failed_output = false;
    let mut fail = |what: String| {
        crate::sayln!("gpudoc: {what}");
        failed_output = true;
    };
    if let Some(g) = s.gate.as_ref().filter(|g| g.update)
        && let Some((path, name)) = &g.baseline
    {
        let note = match write_baseline(path, name, g, report) {
            Ok(()) => format!("baseline `{name}` written to {}", path.display()),
            Err(e) => {
                fail(format!("--update-baseline {}: {e}", path.display()));
                format!("baseline not written: {e}")
            }
        };
        if let Some(gr) = report.gate.as_mut() {
            gr.notes.push(note);
        }
    }
    if !s.quiet {
        crate::say!("{}", summary::render(report, s.paint));
    } else if !report.nvml.available {
        // Said once, also with --quiet (the summary says it otherwise).
        let why = report.nvml.error.as_deref().unwrap_or("NVML unavailable");
        crate::sayln!("gpudoc: GPU sampling was off: {why}");
    }
    write_outputs(s, report, timeline)
        .into_iter()
        .for_each(&mut fail);
    if let Some(g) = &report.gate {
        if s.github_actions {
            // The runner reads workflow commands from stderr as from stdout (actions/runner's
            // ScriptHandler gives both to an OutputManager), and stdout is the job's.
            crate::say::to_stderr(&gate::annotations(g));
        }
        if let Some(path) = s.gate.as_ref().and_then(|x| x.junit.as_ref()) {
            let xml = gate::junit(g, &report.command.join(" "));
            if let Err(e) = output::write(&Target::File(path.clone()), xml.as_bytes()) {
                fail(format!("--junit {}: {e}", path.display()));
            }
        }
        for n in &g.notes {
            crate::sayln!("gpudoc gate: {n}");
        }
        // The verdict is the last line, also with --quiet.
        crate::sayln!("{}", gate::verdict(g));
    }
    let child = report.exit.code.unwrap_or(i32::from(exit::GPUDOC_FAILED));
    let code = gate::exit_code(child, report.gate.as_ref());
    if report.exit.stopped_on.is_some() {
        // The command's code is what gpudoc's SIGINT made of it: the stop is the news.
        exit::STOPPED
    } else if code == 0 && failed_output {
        exit::GPUDOC_FAILED
    } else {
        code as u8
    }
}

/// Writes the report's files the user asked for (`--json`, `--report-dir`, `--tensorboard`, `--html`); what could not be
/// written, one line each.
pub(crate) fn write_outputs(
    s: &RunSettings,
    report: &Report,
    timeline: Option<&Timeline>,
) -> Vec<String> {
    let mut failed = Vec::new();
    if let Some(t) = &s.json
        && let Err(e) = output::write(t, report.to_json().as_bytes())
    {
        failed.push(format!("--json {}: {e}", t.display()));
    }
    if let Some(dir) = &s.report_dir {
        let stem = report.origin.report_stem();
        if let Err(e) = output::write_new(dir, &stem, "json", report.to_json().as_bytes()) {
            failed.push(format!("--report-dir {}: {e}", dir.display()));
        }
    }
    if let Some(dir) = &s.tensorboard
        && let Err(e) = crate::tensorboard::write(dir, report, timeline)
    {
        failed.push(format!("--tensorboard {}: {e}", dir.display()));
    }
    if let Some(t) = &s.html
        && let Err(e) = crate::html::write(t, report, timeline)
    {
        failed.push(format!("--html {}: {e}", t.display()));
    }
    failed
}

fn write_baseline(
    path: &std::path::Path,
    name: &str,
    g: &gate::Gate,
    report: &Report,
) -> Result<(), String> {
    // Re-read under the lock: another job may have written its entry while this one ran.
    output::locked(path, || {
        let current = gate::read_baseline(path)?.or(g.file.clone());
        let file = gate::updated_baseline(current, name, g.measure, report);
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())? + "\n";
        output::write(&Target::File(path.to_path_buf()), text.as_bytes()).map_err(|e| e.to_string())
    })
    .map_err(|e| e.to_string())?
}
