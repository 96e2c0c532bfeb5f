//! `gpudoc watch`: looks every `--interval` and shows it: a terminal screen (keys to sort, select and end a
//! leftover), JSON lines or CSV rows when something changed, and `/metrics` with `--metrics`.

use crate::cli::WatchFormat;
use crate::exit::{self, Failure};
use crate::gpu;
use crate::orphans::{self, end::Policy};
use crate::serve::Server;
use crate::settings::WatchSettings;
use crate::watch::{CSV_HEADER, Frame, Ui, screen};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyModifiers};
use crossterm::{cursor, execute, queue, terminal};
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How long `e` waits after SIGTERM before SIGKILL.
const END_GRACE: Duration = Duration::from_secs(5);

pub fn run(s: WatchSettings) -> Result<ExitCode, Failure> {
    let (nvml, status, gpus) = gpu::open(&s.nvml_lib);
    let me = nix::unistd::geteuid().as_raw();
    // Looks taken through NVML: each reads every GPU's memory and process list once, the samples
    // `gpudoc_samples_total` counts.
    let looks = Arc::new(AtomicU64::new(0));
    // Each diagnosis the looks found, each time it began to hold for its subject:
    // `gpudoc_diagnoses_total` counts them, whether or not a scrape came while it held.
    let known = Arc::new(Mutex::new(crate::metrics::Episodes::default()));
    let look = || {
        let memory = match &nvml {
            Some(n) => {
                looks.fetch_add(1, Ordering::Relaxed);
                Ok(orphans::read_memory(n, &gpus))
            }
            None => Err(status
                .error
                .clone()
                .unwrap_or_else(|| "NVML unavailable".into())),
        };
        // What runs recorded they left, judged as `gpudoc orphans` judges it; where the record can't
        // be read, without it (`gpudoc orphans` says why).
        let left = orphans::record::Record::living_here(s.leftovers.as_ref()).unwrap_or_default();
        let listing = orphans::listing(memory, &s.dev_prefix, &left);
        let runs = s.runs.as_deref().map(crate::runs::read).unwrap_or_default();
        let frame = Frame::of(listing, &gpus, me, &s.rules, &runs, unix_s());
        known.lock().unwrap().look(&frame.active());
        frame
    };
    let latest = Arc::new(Mutex::new(look()));
    let server = match s.metrics {
        Some(addr) => {
            let (frame, host, looks) = (latest.clone(), s.host.clone(), looks.clone());
            let known = known.clone();
            let per_look = gpus.len() as u64;
            let source = Arc::new(move || {
                let mut v = frame.lock().unwrap().view(&host);
                v.device_samples = looks.load(Ordering::Relaxed) * per_look;
                v.process_samples = v.device_samples;
                v.seen = known.lock().unwrap().counts();
                v
            });
            Some(
                Server::start(addr, source)
                    .map_err(|e| Failure::new(exit::USAGE, format!("--metrics {e}")))?,
            )
        }
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Which signal stopped it: once the terminal is given back, gpudoc dies of it (a signal death is a
    // signal death: a script's `timeout` or a supervisor sees 124 or 128+N, not a clean 0).
    let caught = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let _ = signal_hook::flag::register(sig, stop.clone());
        let _ = signal_hook::flag::register_usize(sig, caught.clone(), sig as usize);
    }
    let result = match s.output {
        Some(WatchFormat::Tui) => tui(&s, &look, &latest, &stop),
        Some(format) => lines(&s, format, &look, &latest, &stop),
        None => {
            while !stop.load(Ordering::SeqCst) {
                sleep_unless(&stop, s.interval);
                *latest.lock().unwrap() = look();
            }
            Ok(())
        }
    };
    if let Some(server) = server {
        server.stop();
    }
    let sig = caught.load(Ordering::SeqCst);
    if sig != 0 {
        crate::supervise::guard::die_of(sig as i32);
    }
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Err(e) => Err(Failure::new(exit::USAGE, format!("gpudoc watch: {e}"))),
    }
}

fn sleep_unless(stop: &AtomicBool, d: Duration) {
    let until = Instant::now() + d;
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
    }
}

fn unix_s() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Whether two looks differ in what is shown: memory, processes and their verdicts, diagnoses (ages and
/// the like move on every look).
fn changed(a: &Frame, b: &Frame) -> bool {
    let same = a.processes.len() == b.processes.len()
        && a.processes
            .iter()
            .zip(&b.processes)
            .all(|(x, y)| (x.pid, x.verdict, &x.gpu_bytes) == (y.pid, y.verdict, &y.gpu_bytes));
    a.gpus != b.gpus || !same || a.diagnoses != b.diagnoses || a.rule_errors != b.rule_errors
}

/// JSON lines or CSV rows on stdout, each time the machine changed.
fn lines(
    s: &WatchSettings,
    format: WatchFormat,
    look: &dyn Fn() -> Frame,
    latest: &Mutex<Frame>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if format == WatchFormat::Csv {
        out.write_all(CSV_HEADER.as_bytes())?;
    }
    let mut shown: Option<Frame> = None;
    while !stop.load(Ordering::SeqCst) {
        let frame = latest.lock().unwrap().clone();
        if shown.as_ref().is_none_or(|old| changed(old, &frame)) {
            let t = unix_s();
            let text = match format {
                WatchFormat::Csv => frame.csv(t),
                _ => {
                    let mut v = serde_json::to_value(&frame).expect("a frame serializes");
                    v["unix_s"] = t.into();
                    format!("{v}\n")
                }
            };
            out.write_all(text.as_bytes())?;
            out.flush()?;
            shown = Some(frame);
        }
        sleep_unless(stop, s.interval);
        *latest.lock().unwrap() = look();
    }
    Ok(())
}

/// The terminal: the alternate screen in raw mode, given back however the loop ends.
struct Screen;

impl Screen {
    fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let guard = Screen;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        Ok(guard)
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// What a key asks for.
enum Act {
    Quit,
    Redraw,
    Nothing,
}

fn tui(
    s: &WatchSettings,
    look: &dyn Fn() -> Frame,
    latest: &Mutex<Frame>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let _screen = Screen::enter()?;
    let mut ui = Ui {
        host: s.host.clone(),
        interval: humantime::format_duration(s.interval).to_string(),
        ..Default::default()
    };
    let mut pending: Option<u32> = None;
    let mut next = Instant::now() + s.interval;
    let mut dirty = true;
    while !stop.load(Ordering::SeqCst) {
        if Instant::now() >= next {
            let now = look();
            let mut old = latest.lock().unwrap();
            dirty |= changed(&old, &now);
            *old = now;
            next = Instant::now() + s.interval;
        }
        let frame = latest.lock().unwrap().clone();
        if dirty {
            draw(&frame, &ui, s)?;
            dirty = false;
        }
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        if !event::poll(wait)? {
            continue;
        }
        match event::read()? {
            Event::Key(k) => match key(k, &frame, &mut ui, &mut pending, s) {
                Act::Quit => break,
                Act::Redraw => dirty = true,
                Act::Nothing => {}
            },
            Event::Resize(..) => dirty = true,
            _ => {}
        }
    }
    Ok(())
}

fn draw(frame: &Frame, ui: &Ui, s: &WatchSettings) -> std::io::Result<()> {
    // A terminal that reports no size (0×0) gets the classic one.
    let (w, h) = match terminal::size() {
        Ok((w, h)) if w > 0 && h > 0 => (w, h),
        _ => (80, 24),
    };
    let text = screen(frame, ui, w as usize, h as usize, s.paint).join("\r\n");
    let mut out = std::io::stdout().lock();
    queue!(
        out,
        cursor::MoveTo(0, 0),
        terminal::Clear(terminal::ClearType::All)
    )?;
    out.write_all(text.as_bytes())?;
    out.flush()
}

fn key(
    k: KeyEvent,
    frame: &Frame,
    ui: &mut Ui,
    pending: &mut Option<u32>,
    s: &WatchSettings,
) -> Act {
    if k.kind != event::KeyEventKind::Press {
        return Act::Nothing;
    }
    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl_c {
        return Act::Quit;
    }
    if let Some(pid) = pending.take() {
        ui.status = if k.code == KeyCode::Char('y') {
            end_one(frame, pid, s.all_users)
        } else {
            format!("pid {pid} left running")
        };
        return Act::Redraw;
    }
    let rows = frame.sorted(ui.sort);
    match k.code {
        KeyCode::Char('q') | KeyCode::Esc => return Act::Quit,
        KeyCode::Up | KeyCode::Char('k') => ui.selected = ui.selected.saturating_sub(1),
        KeyCode::Down | KeyCode::Char('j') => {
            ui.selected = (ui.selected + 1).min(rows.len().saturating_sub(1))
        }
        KeyCode::Char('s') => ui.sort = ui.sort.next(),
        KeyCode::Char('e') => match rows.get(ui.selected) {
            Some(h) if h.is_leftover() => {
                ui.status = format!(
                    "end pid {} ({})? SIGTERM, then SIGKILL after {}s [y/N]",
                    h.pid,
                    crate::units::shorten(&h.cmdline, 40),
                    END_GRACE.as_secs()
                );
                *pending = Some(h.pid);
            }
            Some(h) => {
                ui.status = format!(
                    "pid {} is {}, not a leftover: gpudoc ends only leftovers",
                    h.pid,
                    crate::watch::verdict_words(h.verdict)
                )
            }
            None => {}
        },
        _ => return Act::Nothing,
    }
    Act::Redraw
}

/// Ends one leftover as `gpudoc orphans --kill` would, after the question was answered yes.
fn end_one(frame: &Frame, pid: u32, all_users: bool) -> String {
    let Some(h) = frame.processes.iter().find(|h| h.pid == pid) else {
        return format!("pid {pid} is gone");
    };
    let results = orphans::end::end(std::slice::from_ref(h), END_GRACE, &Policy::here(all_users));
    results
        .first()
        .map(|r| format!("pid {pid}: {}", r.result.describe()))
        .unwrap_or_default()
}
