//! The live status line on a terminal: current and peak job memory per GPU, on stderr. It is drawn only
//! on a line the command has finished and while the command is quiet, and cleared before the command's
//! next byte ([`Terminal`]), so it never touches a progress bar or a partial line. Off when stderr is not
//! a terminal, in CI (`CI` set) and with `--quiet`.

use crate::sample::Snapshot;
use crate::supervise::Terminal;
use crate::units::fmt_bytes;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

const REDRAW: Duration = Duration::from_millis(100);
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// The live line, or nothing.
pub struct Live {
    terminal: Option<Arc<Terminal>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Live {
    pub fn off() -> Live {
        Live {
            terminal: None,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        }
    }

    /// Starts redrawing from `snapshot`, with `note` (the live verdicts' forecast) after it.
    pub fn start(snapshot: Arc<Mutex<Snapshot>>, note: Arc<Mutex<String>>) -> Live {
        let terminal = Arc::new(Terminal::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (t, s) = (terminal.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gpudoc-live".into())
            .spawn(move || {
                let mut tick = 0;
                while !s.load(Ordering::Relaxed) {
                    let mut text = line(&snapshot.lock().unwrap());
                    let note = note.lock().unwrap().clone();
                    if !note.is_empty() {
                        text = format!("{text}  ·  {note}");
                    }
                    let spin = SPINNER[tick % SPINNER.len()];
                    t.draw(&format!("{spin} gpudoc {text}"), width());
                    tick += 1;
                    std::thread::sleep(REDRAW);
                }
            })
            .ok();
        Live {
            terminal: Some(terminal),
            stop,
            thread,
        }
    }

    /// The terminal the command's output passes through, when the line is on.
    pub fn terminal(&self) -> Option<Arc<Terminal>> {
        self.terminal.clone()
    }

    /// Removes the line for good.
    pub fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(t) = &self.terminal {
            t.clear();
        }
    }
}

/// Columns of the terminal on stderr (80 when it can't be read).
fn width() -> usize {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into `ws`.
    if unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0 && ws.ws_col > 0 {
        ws.ws_col as usize
    } else {
        80
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
