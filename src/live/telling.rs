//! The live verdicts of `gpudoc run`, on a thread of gpudoc's own (nothing runs in the job's processes):
//! the run so far ([`Sources`]) is analyzed and diagnosed by the same code as at the end, at most every
//! [`EVERY`] and never more than 1/[`CPU_SHARE`] of one core (an evaluation that took T waits T ×
//! CPU_SHARE before the next); [`Verdicts`] decides what is told. What is told is said on stderr between
//! the command's lines (`say::between_lines`), its forecast shown in the live line; a `--stop-on` rule told
//! ends the job.

use super::so_far::Sources;
use super::verdicts::{EVERY, Told, Verdicts};
use crate::verdict::Forecast;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An evaluation that took T is followed by at least T × CPU_SHARE of rest: at most 2% of one core.
const CPU_SHARE: u32 = 50;
/// How often words waiting for the end of the command's line are tried again.
const TICK: Duration = Duration::from_millis(100);
/// How long the command must have been quiet before words are said. Short: a job that logs a line
/// every step must not hold them back for long, and a line is one write (print, logging); what matters
/// is that the last byte ended a line.
const QUIET: Duration = Duration::from_millis(10);

/// The thread, and what it shares.
pub struct LiveVerdicts {
    pub verdicts: Arc<Mutex<Verdicts>>,
    /// Set when a `--stop-on` rule was told: the supervisor ends the job.
    pub stop: Arc<AtomicBool>,
    /// The forecast, in a few words, for the live line.
    pub note: Arc<Mutex<String>>,
    stopped_on: Arc<Mutex<Option<String>>>,
    /// Words waiting for the end of the command's line.
    pending: Arc<Mutex<VecDeque<String>>>,
    end: Arc<AtomicBool>,
    published: Option<(PathBuf, u32)>,
}

/// What the thread needs besides the sources.
pub struct Asked {
    pub live_rules: Vec<String>,
    pub stop_on: Vec<String>,
    /// `--quiet`: nothing said but why the job is ended.
    pub quiet: bool,
    pub start: Instant,
    /// Where to publish the forecasts for `gpudoc watch`, and how the run is named there.
    pub publish: Option<(PathBuf, crate::runs::Published)>,
}

struct Worker {
    sources: Arc<Sources>,
    asked: Asked,
    verdicts: Arc<Mutex<Verdicts>>,
    stop: Arc<AtomicBool>,
    note: Arc<Mutex<String>>,
    stopped_on: Arc<Mutex<Option<String>>>,
    pending: Arc<Mutex<VecDeque<String>>>,
}

impl LiveVerdicts {
    pub fn start(sources: Arc<Sources>, asked: Asked) -> LiveVerdicts {
        let verdicts = Arc::new(Mutex::new(Verdicts::new(asked.live_rules.clone())));
        let stop = Arc::new(AtomicBool::new(false));
        let note = Arc::new(Mutex::new(String::new()));
        let stopped_on = Arc::new(Mutex::new(None));
        let end = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(Mutex::new(VecDeque::new()));
        let published = asked.publish.as_ref().map(|(dir, p)| (dir.clone(), p.pid));
        let mut w = Worker {
            sources,
            asked,
            verdicts: verdicts.clone(),
            stop: stop.clone(),
            note: note.clone(),
            stopped_on: stopped_on.clone(),
            pending: pending.clone(),
        };
        let e = end.clone();
        // Without a thread to be had, the run goes on without live verdicts.
        let _ = std::thread::Builder::new()
            .name("gpudoc-verdicts".into())
            .spawn(move || w.run(&e));
        LiveVerdicts {
            verdicts,
            stop,
            note,
            stopped_on,
            pending,
            end,
            published,
        }
    }

    /// Stops the thread without waiting for it (a look in progress would hold the exit back: it ends
    /// at its next tick, having said nothing more); words still waiting for the end of a line are said
    /// now (the command is over). The rule that ended the job, if one did.
    pub fn finish(self) -> Option<String> {
        self.end.store(true, Ordering::SeqCst);
        for words in self.pending.lock().unwrap().drain(..) {
            crate::say::to_stderr(&words);
        }
        if let Some((dir, pid)) = &self.published {
            crate::runs::withdraw(dir, *pid);
        }
        self.stopped_on.lock().unwrap().clone()
    }
}

impl Worker {
    fn run(&mut self, end: &AtomicBool) {
        let mut next = self.asked.start + EVERY;
        while !end.load(Ordering::SeqCst) {
            if Instant::now() >= next {
                let took = Instant::now();
                self.evaluate(end);
                next = Instant::now() + EVERY.max(took.elapsed() * CPU_SHARE);
            }
            let mut pending = self.pending.lock().unwrap();
            while let Some(words) = pending.front() {
                if end.load(Ordering::SeqCst) || !crate::say::between_lines(words, QUIET) {
                    break;
                }
                pending.pop_front();
            }
            drop(pending);
            std::thread::sleep(TICK);
        }
    }

    /// One look at the run so far; what it finds after the run ended is dropped.
    fn evaluate(&mut self, end: &AtomicBool) {
        let report = self.sources.report();
        if end.load(Ordering::SeqCst) {
            return;
        }
        let now_s = self.asked.start.elapsed().as_secs_f64();
        let mut v = self.verdicts.lock().unwrap();
        let told = v.observe(&report, now_s);
        let forecasts: Vec<Forecast> = v.told().filter_map(|t| t.forecast.clone()).collect();
        drop(v);
        *self.note.lock().unwrap() = note(forecasts.iter());
        if let Some((dir, p)) = &mut self.asked.publish
            && p.forecasts != forecasts
            && !end.load(Ordering::SeqCst)
        {
            p.forecasts = forecasts;
            let _ = crate::runs::publish(dir, p);
        }
        for t in told {
            if !self.asked.quiet {
                self.pending.lock().unwrap().push_back(words(&t));
            }
            self.stop_on(&t);
        }
    }

    /// Ends the job if `t`'s rule is one of `--stop-on`'s (once).
    fn stop_on(&mut self, t: &Told) {
        let rule = &t.diagnosis.rule;
        if !self.asked.stop_on.contains(rule) || self.stop.load(Ordering::SeqCst) {
            return;
        }
        *self.stopped_on.lock().unwrap() = Some(rule.clone());
        self.pending.lock().unwrap().push_back(format!(
            "gpudoc: --stop-on {rule}: ending the job as Ctrl-C would (SIGINT to its process group; SIGTERM once it writes nothing for {} s, then SIGKILL)\n",
            crate::supervise::STOP_GRACE.as_secs()
        ));
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What is said of a diagnosis told during the run: its rule, when, its message, and its forecast.
fn words(t: &Told) -> String {
    let d = &t.diagnosis;
    let mut s = format!(
        "gpudoc: {} [{}] at {}: {}\n",
        d.rule,
        d.severity.name(),
        crate::units::fmt_secs(t.at_s),
        crate::units::printable(&d.message)
    );
    if let Some(f) = &t.forecast {
        s += &format!("gpudoc: {}\n", crate::units::printable(&f.words(&f.first)));
    }
    s
}

/// The live line's words for the latest forecasts: `GPU 0 full in ~42 min`.
fn note<'a>(forecasts: impl Iterator<Item = &'a Forecast>) -> String {
    forecasts
        .map(|f| {
            let left = f.last.full_at_s - f.last.at_s;
            format!("GPU{} full in {}", f.gpu, crate::verdict::about(left))
        })
        .collect::<Vec<_>>()
        .join(" · ")
}
