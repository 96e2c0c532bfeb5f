//! The live status line on a terminal: current and peak job memory per GPU, redrawn ten times a second on
//! stderr. Hidden when stderr is not a terminal, in CI (`CI` set) and with `--quiet`.

use crate::sample::Snapshot;
use crate::supervise::Guard;
use crate::units::fmt_bytes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Whether a live line may be drawn: a terminal on stderr, not CI, not quiet.
pub fn wanted(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal() && std::env::var_os("CI").is_none()
}

/// The live line, or nothing.
pub struct Live {
    bar: Option<ProgressBar>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Live {
    pub fn off() -> Live {
        Live {
            bar: None,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Starts redrawing from `snapshot`.
    pub fn start(snapshot: Arc<Mutex<Snapshot>>) -> Live {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
        bar.set_style(ProgressStyle::with_template("{spinner} gpudoc {msg}").unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (bar.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gpudoc-live".into())
            .spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    let msg = line(&snapshot.lock().unwrap());
                    b.set_message(msg);
                    b.tick();
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
            .ok();
        Live {
            bar: Some(bar),
            stop,
            thread,
        }
    }

    /// Clears the line around the child's writes, so they are never mangled.
    pub fn guard(&self) -> Guard {
        match self.bar.clone() {
            Some(bar) => Arc::new(move |f: &mut dyn FnMut()| bar.suspend(f)),
            None => Arc::new(|f: &mut dyn FnMut()| f()),
        }
    }

    /// Removes the line for good.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

fn line(s: &Snapshot) -> String {
    if s.gpus.is_empty() {
        return "sampling…".into();
    }
    s.gpus
        .iter()
        .enumerate()
        .map(|(i, g)| match g {
            Some(g) => format!(
                "GPU{} job {} (peak {}) · device {}/{}",
                g.index,
                fmt_bytes(g.job),
                fmt_bytes(g.job_peak),
                fmt_bytes(g.used),
                fmt_bytes(g.total)
            ),
            None => format!("GPU#{i} lost"),
        })
        .collect::<Vec<_>>()
        .join("  |  ")
}
