//! Ends a probe run of `gpudoc fit` once it has run far enough, as a user's Ctrl-C would: SIGINT to its
//! process group first (Python raises KeyboardInterrupt, a training script's own handler saves or cleans
//! up), then SIGTERM, then SIGKILL, each once the job has written nothing for [`GRACE`] (a handler saving
//! a checkpoint gets the time it takes: [`crate::supervise::signals::Ending`]), each said. Steps are read
//! live from the shim's timeline (the optimizer's step records, [`crate::torch::TorchTimeline`]), the same
//! one `gpudoc run` fills.

use crate::supervise::signals::Ending;
use crate::supervise::{Writes, end_step};
use crate::torch::TorchTimeline;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the job must write nothing after each signal before the next, stronger one.
pub const GRACE: Duration = Duration::from_secs(5);
/// How often the step count is looked at (the shim's pipe is read every 20 ms).
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// When to end the job.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EndWhen {
    /// Once this many optimizer steps have passed (the shim saw them).
    pub steps: Option<u64>,
    /// Once the run has lasted this long (for programs that step no optimizer).
    pub after: Option<Duration>,
    /// Not past this moment, whatever happened: the fit's time budget.
    pub deadline: Instant,
}

/// Why gpudoc ended the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// It ran the steps asked for.
    Steps(u64),
    /// It ran the time asked for (`--for`).
    Time,
    /// The time budget ran out first.
    Budget,
}

/// What the ender did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub why: Why,
    /// Signals sent, in order (SIGINT, then SIGTERM and SIGKILL if the job did not end).
    pub signals: Vec<i32>,
}

impl Ended {
    /// The job did not end at the SIGINT: gpudoc went on to SIGTERM or SIGKILL, which may have cut its
    /// handler's work short.
    pub fn forced(&self) -> bool {
        self.signals.len() > 1
    }
}

/// The thread that watches the run and ends it.
pub struct Ender {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Option<Ended>>,
}

fn steps_seen(t: &Mutex<TorchTimeline>) -> u64 {
    t.lock().unwrap().steps_seen()
}

/// Whether the run has gone far enough: why, if so (pure).
pub fn due(w: &EndWhen, steps: u64, started: Instant, now: Instant) -> Option<Why> {
    if let Some(k) = w.steps
        && steps >= k
    {
        return Some(Why::Steps(steps));
    }
    if let Some(after) = w.after
        && now.duration_since(started) >= after
    {
        return Some(Why::Time);
    }
    (now >= w.deadline).then_some(Why::Budget)
}

impl Ender {
    /// Starts watching the job whose main process is `pid`; `steps` is the shim's timeline (none with
    /// `--no-torch`: then only time ends it).
    pub fn start(w: EndWhen, pid: u32, steps: Option<Arc<Mutex<TorchTimeline>>>) -> Ender {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("gpudoc-fit-end".into())
            .spawn(move || watch(w, pid, steps, &stopped))
            .expect("spawn the fit's ender");
        Ender { stop, thread }
    }

    /// The job has ended: stops watching; what the ender did, if anything.
    pub fn stop(self) -> Option<Ended> {
        let _ = self.stop.send(());
        self.thread.join().ok().flatten()
    }
}

fn watch(
    w: EndWhen,
    pid: u32,
    steps: Option<Arc<Mutex<TorchTimeline>>>,
    stopped: &mpsc::Receiver<()>,
) -> Option<Ended> {
    let started = Instant::now();
    let why = loop {
        match stopped.recv_timeout(LOOK_EVERY) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return None,
        }
        let seen = steps.as_deref().map_or(0, steps_seen);
        if let Some(why) = due(&w, seen, started, Instant::now()) {
            break why;
        }
    };
    say_ending(why);
    let mut ending = Ending::new(GRACE);
    let mut writes = Writes::default();
    loop {
        let work = steps.as_deref().map_or(0, steps_seen);
        if ending.due(Instant::now(), writes.wrote(), work).is_some() {
            end_step(pid, &ending);
        }
        match stopped.recv_timeout(LOOK_EVERY * 10) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => break,
        }
    }
    Some(Ended {
        why,
        signals: ending.sent().to_vec(),
    })
}

/// Says why gpudoc ends the run, before its SIGINT; the first time in this gpudoc, also that the
/// KeyboardInterrupt traceback a Python job prints for it is gpudoc's doing, not the program's fault.
fn say_ending(why: Why) {
    static SAID: AtomicBool = AtomicBool::new(false);
    let reason = match why {
        Why::Steps(k) => format!("{k} optimizer steps ran"),
        Why::Time => "the run lasted the time asked (--for)".to_string(),
        Why::Budget => "the time budget is spent".to_string(),
    };
    let note = if SAID.swap(true, Ordering::Relaxed) {
        ""
    } else {
        " (the KeyboardInterrupt traceback a Python job prints for it, here and at each run gpudoc ends, \
         is this Ctrl-C, not a fault of the program)"
    };
    crate::sayln!("gpudoc: {reason}: SIGINT to the job, as a Ctrl-C{note}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_is_due_at_its_steps_its_time_or_the_budget_whichever_comes_first() {
        let t0 = Instant::now();
        let w = EndWhen {
            steps: Some(5),
            after: Some(Duration::from_secs(10)),
            deadline: t0 + Duration::from_secs(60),
        };
        assert_eq!(due(&w, 4, t0, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            due(&w, 5, t0, t0 + Duration::from_secs(1)),
            Some(Why::Steps(5))
        );
        assert_eq!(
            due(&w, 0, t0, t0 + Duration::from_secs(10)),
            Some(Why::Time)
        );
        let no_time = EndWhen { after: None, ..w };
        assert_eq!(due(&no_time, 0, t0, t0 + Duration::from_secs(59)), None);
        assert_eq!(
            due(&no_time, 0, t0, t0 + Duration::from_secs(60)),
            Some(Why::Budget)
        );
    }
}
