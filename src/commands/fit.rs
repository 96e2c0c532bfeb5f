//! `gpudoc fit`: orchestration only. Prints the bounds, then runs the command at the values the search
//! asks for, each through `gpudoc run`'s own machinery ([`super::run::measure`]) and ended after its steps
//! by [`crate::fit::ender`]; then the answer, and the JSON.

use crate::exit::{self, Failure};
use crate::fit::ender::EndWhen;
use crate::fit::remedy::{self, Remedy};
use crate::fit::search::{Next, Search, Verdict};
use crate::fit::{self, FitReport, Outcome, Probe, Stop, template};
use crate::output::Target;
use crate::report::Report;
use crate::settings::{FitSettings, RunSettings};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

pub fn run(mut s: FitSettings) -> Result<ExitCode, Failure> {
    // SAFETY: no thread has started yet; everything below starts after the split.
    let _ = unsafe { crate::supervise::guard::split() };
    s.run.rules.start();
    crate::say!("{}", fit::render_bounds(&s.bounds));
    let started = Instant::now();
    let deadline = started + s.budget;
    let mut search = Search::new(s.bounds.min, s.bounds.max, None);
    let mut probes: Vec<Probe> = Vec::new();
    let mut signal = None;
    let mut last: Option<Ran> = None;
    let stop = loop {
        let (value, guided) = match search.next() {
            Next::Done(Some(_)) => break Stop::Found,
            Next::Done(None) => break Stop::NothingFits,
            Next::Run { value, guided } => (value, guided),
        };
        if probes.len() as u64 >= s.bounds.runs {
            break Stop::Runs;
        }
        if Instant::now() >= deadline {
            break Stop::Budget;
        }
        let ran = probe(&mut s, value, guided, deadline)?;
        signal = ran.signal;
        let probe = ran.probe.clone();
        last = Some(ran);
        crate::say!(
            "{}",
            fit::render_probe(probes.len() + 1, s.bounds.runs, &probe)
        );
        let outcome = probe.outcome;
        if search.limit.is_none() {
            search.limit = probe.limit_bytes;
        }
        probes.push(probe.clone());
        match outcome {
            Outcome::Fits => search.record(value, Verdict::Fits(probe.peak_bytes), guided),
            Outcome::Oom => search.record(value, Verdict::Oom, guided),
            Outcome::Failed => break Stop::Failed,
            Outcome::Cut => break Stop::Budget,
            Outcome::Interrupted => break Stop::Interrupted,
        }
    };
    if let Some(r) = &mut last {
        after_the_last(&s.run, r);
    }
    let command = s
        .template
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let report = FitReport::build(
        command,
        s.bounds.clone(),
        &search,
        probes,
        stop,
        started.elapsed().as_secs_f64(),
    );
    crate::say!("{}", fit::render(&report));
    if let Some(t) = &s.json {
        crate::output::write(t, report.to_json().as_bytes()).map_err(|e| {
            Failure::new(exit::GPUDOC_FAILED, format!("--json {}: {e}", t.display()))
        })?;
    }
    die_of(signal);
    Ok(ExitCode::from(report.exit_code()))
}

/// One run at `value`, ended after its steps (or its time, or at the budget's end).
fn probe(s: &mut FitSettings, value: u64, guided: bool, deadline: Instant) -> Result<Ran, Failure> {
    s.run.command = fit::command_for(&s.template, value).expect("checked when resolved");
    let end = EndWhen {
        steps: s.bounds.steps,
        after: s.run_for,
        deadline,
    };
    ran(&s.run, value, guided, end)
}

/// One run, done: what it said of its value, its report, its fragmentation, and the signal to die of
/// when something else than gpudoc ended it (a Ctrl-C).
struct Ran {
    probe: Probe,
    report: Report,
    /// Kept when an output draws it (`--tensorboard`, `--html`).
    timeline: Option<crate::timeline::Timeline>,
    fragmentation: Option<u64>,
    signal: Option<i32>,
    /// gpudoc was started ignoring SIGHUP: so may the job's leftovers be.
    hup_ignored: bool,
}

fn ran(s: &RunSettings, value: u64, guided: bool, end: EndWhen) -> Result<Ran, Failure> {
    say_ended_before(&super::run::end_earlier_leftovers());
    let super::run::Measured {
        report,
        timeline,
        child,
        ended,
        interrupted,
        hup_ignored,
        ..
    } = super::run::measure(s, Some(end))?;
    let probe = Probe::of(
        value,
        guided,
        &report,
        ended.as_ref(),
        interrupted.is_some(),
    );
    // Asked to end (a Ctrl-C: the job got it too), or killed by a signal gpudoc did not send.
    let signal = if probe.outcome == Outcome::Interrupted {
        interrupted.or(report.exit.signal)
    } else {
        None
    };
    child.finish();
    Ok(Ran {
        probe,
        fragmentation: remedy::fragmentation(&report),
        report,
        timeline,
        signal,
        hup_ignored,
    })
}

/// Says what an earlier run left running that gpudoc ended before the next run.
fn say_ended_before(ended: &[(crate::procs::ProcInfo, crate::orphans::end::EndResult)]) {
    for (p, r) in ended {
        crate::sayln!(
            "gpudoc: before the next run, ended what an earlier one left running: pid {} {}: {}",
            p.pid,
            crate::units::shorten(&p.cmdline, 60),
            r.result.describe()
        );
    }
}

/// After the last run, what it left running and gpudoc did not end (detached on purpose, `nohup`) is said
/// and recorded for `gpudoc orphans`, as `gpudoc run` does.
fn after_the_last(s: &RunSettings, r: &mut Ran) {
    use crate::orphans::end::Ended;
    super::run::record_leftovers(s, &mut r.report, r.hup_ignored);
    let kept = r
        .report
        .orphans
        .iter()
        .any(|o| !matches!(o.ended, Some(Ended::Ended { .. } | Ended::Gone)));
    if kept {
        let mut o = String::new();
        crate::summary::render_leftovers(&mut o, &r.report, s.paint);
        crate::say!("gpudoc: the last run left running:\n{o}");
    }
}

/// A fit or `--try` that something else interrupted ends as `gpudoc run` does, once its results are out:
/// it dies of the signal (the Ctrl-C's SIGINT, or the one its run died of), so that a shell loop around
/// it stops as it would around the job.
fn die_of(signal: Option<i32>) {
    if let Some(sig) = signal {
        crate::supervise::guard::exit_by_signal(sig);
    }
}

/// `gpudoc run --try REMEDY`: the command as is, then with the remedy (ended [`remedy::TRY_PAST`]
/// optimizer steps past where the first run ran out, or at its own end), both within `budget`; the two
/// compared. A first run that was interrupted stops it there. Exits 0 when the command fits with the
/// remedy, 1 when it still runs out, as `gpudoc fit` otherwise (docs/fit.md).
pub fn try_remedy(
    mut s: RunSettings,
    remedy: Remedy,
    budget: std::time::Duration,
) -> Result<ExitCode, Failure> {
    // SAFETY: no thread has started yet; everything below starts after the split.
    let _ = unsafe { crate::supervise::guard::split() };
    s.rules.start();
    let users = s.env.alloc_conf.clone();
    let conf = remedy.alloc_conf(users.as_deref());
    let TryCommands {
        before: before_cmd,
        after: after_cmd,
        as_is,
    } = try_commands(&s.command, &remedy)?;
    let shown = humantime::format_duration(budget).to_string();
    crate::say!(
        "{}",
        remedy::render_plan(&remedy, conf.as_deref(), as_is, &shown)
    );
    let mut end = EndWhen {
        steps: None,
        after: None,
        deadline: Instant::now() + budget,
    };
    // What each run leaves running is ended after it (docs/fit.md), as `gpudoc fit` ends its runs'.
    s.kill_orphans = true;
    let input = Input::at_start(&s);
    s.command = before_cmd;
    let asked = Outputs::take(&mut s);
    asked.as_is().put(&mut s);
    let before = ran(&s, 0, false, end)?;
    let mut failed = super::run::write_outputs(&s, &before.report, before.timeline.as_ref());
    asked.put(&mut s);
    let after = if before.signal.is_none() {
        if before.probe.outcome == Outcome::Oom {
            end.steps = Some(before.probe.steps + remedy::TRY_PAST);
        }
        s.command = after_cmd;
        s.extra_env = remedy.env(users.as_deref());
        let note = input.again();
        let mut after = ran(&s, 0, false, end)?;
        after.report.notes.extend(note);
        Some(after)
    } else {
        None
    };
    crate::say!("{}", render_try(&remedy, as_is, &before, after.as_ref()));
    let last = after.as_ref().unwrap_or(&before);
    let (mut code, signal) = (remedy::exit_code(&last.probe), last.signal);
    let tried = crate::report::Tried {
        remedy: remedy.name(),
        alloc_conf: conf,
        fits_now: after
            .as_ref()
            .is_some_and(|a| a.probe.outcome == Outcome::Fits),
        before: tried_run(&before),
        after: after.as_ref().map(tried_run),
    };
    let mut last = after.unwrap_or(before);
    after_the_last(&s, &mut last);
    let Ran {
        mut report,
        timeline,
        ..
    } = last;
    report.tried = Some(tried);
    failed.extend(super::run::write_outputs(&s, &report, timeline.as_ref()));
    for f in &failed {
        crate::sayln!("gpudoc: {f}");
    }
    if code == 0 && !failed.is_empty() {
        code = exit::GPUDOC_FAILED;
    }
    die_of(signal);
    Ok(ExitCode::from(code))
}

/// The command's input, which both of `--try`'s runs get: a file is given to each from where it was at the
/// start; a pipe can be read once, so the remedy's run reads on where the first stopped, and is told so.
enum Input {
    /// A regular file, at this offset when gpudoc started.
    File(i64),
    /// A pipe or socket (`seq 1000 | gpudoc run --try ...`).
    Pipe,
    /// A terminal (typed input goes to the run that reads it), /dev/null, or nothing.
    Other,
}

impl Input {
    fn at_start(s: &RunSettings) -> Input {
        if s.env.stdin_pipe {
            return Input::Pipe;
        }
        // SAFETY: lseek on fd 0 with SEEK_CUR and 0 moves nothing.
        match unsafe { libc::lseek(0, 0, libc::SEEK_CUR) } {
            at if s.env.stdin_file && at >= 0 => Input::File(at),
            _ => Input::Other,
        }
    }

    /// Before the remedy's run: a file back to where it was, or what is said of a pipe (for the report
    /// too).
    fn again(&self) -> Option<String> {
        match self {
            Input::File(at) => {
                // SAFETY: lseek on fd 0, which stays open; a failure leaves it where the first run left it.
                unsafe { libc::lseek(0, *at, libc::SEEK_SET) };
                None
            }
            Input::Pipe => {
                let note = "the command's input is a pipe, which can be read once: what the first run \
                            read of it went to that run, and the remedy's run reads on from where it \
                            stopped (give it from a file, `< FILE`, and each run reads all of it)";
                crate::sayln!("gpudoc run --try: {note}");
                Some(note.to_string())
            }
            Input::Other => None,
        }
    }
}

/// The files a run writes (`--json`, `--trace`, `--snapshot`, `--tensorboard`, `--html`), as the user
/// named them or as the first of `--try`'s runs writes them ([`Outputs::as_is`]).
struct Outputs {
    json: Option<Target>,
    trace: Option<PathBuf>,
    snapshot: Option<Target>,
    tensorboard: Option<PathBuf>,
    html: Option<Target>,
}

impl Outputs {
    fn take(s: &mut RunSettings) -> Outputs {
        Outputs {
            json: s.json.take(),
            trace: s.trace.take(),
            snapshot: s.snapshot.take(),
            tensorboard: s.tensorboard.take(),
            html: s.html.take(),
        }
    }

    fn put(&self, s: &mut RunSettings) {
        s.json = self.json.clone();
        s.trace = self.trace.clone();
        s.snapshot = self.snapshot.clone();
        s.tensorboard = self.tensorboard.clone();
        s.html = self.html.clone();
    }

    /// Where the command as is writes, so that the remedy's run, written where the user said, leaves
    /// it: a file beside the one named, `.as-is` before its extensions ([`remedy::as_is_path`]); the
    /// TensorBoard run in `DIR/as-is`, beside the remedy's (TensorBoard shows both). A stream (`-`, a FIFO,
    /// /dev/stderr) gets the remedy's run only: two reports one after the other would read as one.
    fn as_is(&self) -> Outputs {
        let beside = |p: &Path| {
            std::fs::metadata(p)
                .map_or(true, |m| m.is_file())
                .then(|| remedy::as_is_path(p))
        };
        let target = |t: &Option<Target>| match t {
            Some(Target::File(p)) => beside(p).map(Target::File),
            _ => None,
        };
        Outputs {
            json: target(&self.json),
            trace: self.trace.as_deref().and_then(beside),
            snapshot: target(&self.snapshot),
            tensorboard: self.tensorboard.as_ref().map(|d| d.join("as-is")),
            html: target(&self.html),
        }
    }
}

fn tried_run(r: &Ran) -> crate::report::TriedRun {
    remedy::tried_run(&r.probe, r.fragmentation, r.report.command.clone())
}

/// The comparison: a line for each run made.
fn render_try(remedy: &Remedy, as_is: Option<u64>, before: &Ran, after: Option<&Ran>) -> String {
    let (label_before, label_after) = match (remedy, as_is) {
        (Remedy::Value(v), Some(a)) => (format!("at {a}"), format!("at {v}")),
        _ => ("as is".to_string(), "with it".to_string()),
    };
    let mut o = format!("gpudoc run --try {}:\n", remedy.name());
    o.push_str(&remedy::render_side(
        &label_before,
        &before.probe,
        before.fragmentation,
    ));
    if let Some(a) = after {
        o.push_str(&remedy::render_side(
            &label_after,
            &a.probe,
            a.fragmentation,
        ));
    }
    o
}

/// The commands of `--try`'s two runs, and for a value of `{}` the marked parameter's value as is.
struct TryCommands {
    before: Vec<OsString>,
    after: Vec<OsString>,
    as_is: Option<u64>,
}

/// The commands of `--try`'s two runs, checked before anything runs.
fn try_commands(command: &[OsString], remedy: &Remedy) -> Result<TryCommands, Failure> {
    let Remedy::Value(v) = remedy else {
        return Ok(TryCommands {
            before: command.to_vec(),
            after: command.to_vec(),
            as_is: None,
        });
    };
    let refuse =
        |what: String| Failure::new(exit::GPUDOC_FAILED, format!("--try {{}}={v}: {what}"));
    let as_is = template::value_as_is(command).map_err(refuse)?;
    if as_is == *v {
        return Err(refuse(format!("{v} is the value as is: give another")));
    }
    Ok(TryCommands {
        before: template::command_at(command, as_is),
        after: template::command_at(command, *v),
        as_is: Some(as_is),
    })
}
