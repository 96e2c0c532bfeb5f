//! Runs the wrapped command the way a careful wrapper does: same bytes on the same streams, every signal
//! delivered once, the exit code (or the signal) passed through, every descendant kept in view, and the
//! job ended as a whole when gpudoc is asked to end it.
//!
//! - gpudoc is a subreaper, so descendants whose parent dies are re-parented to it and stay in the job.
//! - Output: see [`streams`]; on an interactive terminal the command gets a terminal of its own that
//!   stands for the user's ([`tty`]).
//! - Signals: the [`guard`] relays what it takes, gpudoc takes its own, and [`signals`] decides what the
//!   command still needs, so that each signal reaches it once, as it would without gpudoc. Stops and
//!   continues travel both ways: a job stopped by Ctrl-Z stops the guard (the shell sees it), a guard
//!   stopped by `kill -STOP` stops the job.
//! - A third quick Ctrl-C that the job did not answer (it wrote nothing since the last) kills the job's
//!   whole process tree (the second says so): [`signals::Presses`].
//! - When gpudoc was asked to end (a TERM, HUP, QUIT or INT that was not the terminal's), the
//!   descendants still running once the command has exited are ended too (SIGTERM, [`END_GRACE`],
//!   SIGKILL): the job ends as a whole.
//! - The command gets SIGTERM if gpudoc itself dies (PR_SET_PDEATHSIG); the [`guard`] covers the rest.

pub mod drain;
mod follow;
pub mod guard;
mod helper;
pub mod keeper;
mod observe;
pub mod signals;
pub mod streams;
pub mod tty;

use crate::procs;
pub use follow::{Pace, Reader};
use nix::sys::signal::{SigSet, Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
pub use observe::{Observer, Sieve, Stream, Watching};
use signals::{Action, Mode, Pairing, Relay, Seen};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
pub use streams::{Terminal, Wiring};

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEnd {
    Exited(i32),
    Signaled { signal: i32, core_dumped: bool },
}

impl ProcessEnd {
    /// The code a shell would report: the exit code, or 128+N for death by signal N.
    pub fn code(&self) -> i32 {
        match *self {
            ProcessEnd::Exited(c) => c,
            ProcessEnd::Signaled { signal, .. } => 128 + signal,
        }
    }
}

/// The command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: cannot execute: {1}")]
    CannotExecute(String, io::Error),
    #[error("cannot start {0}: {1}")]
    Other(String, io::Error),
}

impl SpawnError {
    /// gpudoc's exit code for this failure (as `env` uses them).
    pub fn exit_code(&self) -> u8 {
        match self {
            SpawnError::NotFound(_) => crate::exit::NOT_FOUND,
            SpawnError::CannotExecute(..) => crate::exit::CANNOT_EXECUTE,
            SpawnError::Other(..) => crate::exit::GPUDOC_FAILED,
        }
    }
}

/// What waiting for the command produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub end: ProcessEnd,
    pub duration: Duration,
    /// gpudoc killed the job's tree after a third Ctrl-C.
    pub escalated: bool,
    /// gpudoc was asked to end (a terminating signal that was not the terminal's): what the command left
    /// running is ended too.
    pub terminate: bool,
    /// Signals gpudoc forwarded, by number, in order.
    pub forwarded: Vec<i32>,
    /// gpudoc ended the job when asked to ([`Spawn::stop`]).
    pub stopped: bool,
    /// The first signal by which someone asked the job to end ([`signals::interrupts`]), or SIGINT for a
    /// Ctrl-C typed on the command's own terminal; never one gpudoc sent itself. `gpudoc fit` stops on it.
    pub interrupted: Option<i32>,
}

/// Called when a child of gpudoc has exited, before it is reaped (the sampler looks once more).
pub type OnExit = Box<dyn Fn() + Send>;
/// How far the job's work has come, as its caller counts it (the last optimizer step the shim recorded):
/// a job ended on request whose work goes on has not answered the signal ([`signals::Ending`]).
pub type Work = Box<dyn Fn() -> u64 + Send>;

/// A channel the command's output came through, still held by something it left running, and the fd its
/// bytes go to: handed to a [`drain`]er when gpudoc is done.
type Held = (Arc<OwnedFd>, RawFd);

/// A started command. Dropping it closes gpudoc's descriptors of the files the command writes to: keep it
/// until gpudoc's own work is done ([`Child::finish`]). On ext4 the first close of a file the shell
/// truncated (`> log`) writes the file out (its `auto_da_alloc`), as the command's own last close would
/// without gpudoc, and filesystem work done after that (removing the shim's folder, writing the report)
/// can wait behind those writes: 35-100 ms after 200 MB on the H200 host.
pub struct Child {
    pid: Pid,
    /// The command's process group: its own on its own terminal, gpudoc's otherwise.
    pgid: i32,
    mode: Mode,
    started: Instant,
    pumps: Vec<JoinHandle<Option<Held>>>,
    held: Vec<Held>,
    /// Pseudo-terminal masters for the command's output, and the fd whose size they follow.
    ptys: Vec<(Arc<OwnedFd>, RawFd)>,
    /// The command's own terminal (Terminal mode).
    pty: Option<tty::Pty>,
    /// The files the command writes to itself, as gpudoc reads them: held open until the child is dropped.
    _followed: Vec<Arc<[std::fs::File]>>,
    exited: Arc<AtomicBool>,
    on_exit: Option<OnExit>,
    guard: Option<Guard>,
    stop: Option<Arc<AtomicBool>>,
    work: Option<Work>,
}

/// The guard, as gpudoc sees it.
struct Guard {
    pid: i32,
    /// Its ancestors: job managers and shells, which signal whole jobs.
    above: Vec<i32>,
    /// Its process group is orphaned (it leads its session, or its parent is in another): the kernel
    /// drops the terminal's stop keys for such a group, as it would for the command's without gpudoc.
    orphaned: bool,
}

/// The signals gpudoc and its guard take and pass on. SIGCONT and SIGTSTP too: a stop or a continue of
/// the guard is the job's.
pub const FORWARDED: [i32; 10] = [
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGINT,
    libc::SIGALRM,
    libc::SIGTSTP,
    libc::SIGCONT,
];
/// How long what is left of a job that gpudoc ends gets between SIGTERM and SIGKILL.
pub const END_GRACE: Duration = Duration::from_secs(5);
/// How often gpudoc looks at what signals cannot tell: a guard stopped by SIGSTOP, keys typed.
const TICK: Duration = Duration::from_millis(100);
/// How long a job gpudoc ends on request ([`Spawn::stop`]) must write nothing after each step (SIGINT,
/// SIGTERM) before the next ([`signals::Ending`]).
pub const STOP_GRACE: Duration = Duration::from_secs(10);

/// What [`spawn`] needs besides the command.
pub struct Spawn<'a> {
    pub argv: &'a [OsString],
    /// Added to the command's environment.
    pub env: &'a [(String, OsString)],
    pub wiring: Wiring,
    /// The terminal shared with the live line, when there is one.
    pub terminal: Option<Arc<Terminal>>,
    pub observer: Option<Box<dyn Observer>>,
    pub on_exit: Option<OnExit>,
    /// Set when the job is to be ended (`--stop-on`): it gets SIGINT, as from the user's Ctrl-C.
    pub stop: Option<Arc<AtomicBool>>,
    /// How far the job's work has come, looked at while it is being ended.
    pub work: Option<Work>,
}

/// Whether the command gets a terminal of its own (gpudoc runs in the foreground of an interactive
/// terminal, with stdout on it).
pub fn on_own_terminal() -> bool {
    guard::start().is_some_and(|s| s.terminal.is_some())
}

/// Whether every byte that reaches the screen passes through gpudoc (the command has a terminal of its
/// own for stdout and stderr): only then can a live line on stderr never be drawn over what the job or
/// the user writes.
pub fn screen_is_ours() -> bool {
    guard::start()
        .and_then(|s| s.terminal)
        .is_some_and(|t| t.screen_is_ours())
}

/// Starts the command. The signals stay blocked (gpudoc takes them in [`Child::wait`]), so nothing the
/// command does is missed.
pub fn spawn(s: Spawn) -> Result<Child, SpawnError> {
    let name = s.argv[0].to_string_lossy().into_owned();
    let other = |e: io::Error| SpawnError::Other(name.clone(), e);
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| other(e.into()))?;
    // gpudoc split off a session of its own for a terminal: the command is in no group of the guard's.
    let separate = on_own_terminal();
    let pty = own_terminal();
    let (ends, sources) = match &pty {
        Some((p, slave)) => tty_ends(slave, p.on(), s.wiring).map_err(other)?,
        None => {
            let (sources, ends) = streams::open(s.wiring).map_err(other)?;
            (ends, sources)
        }
    };
    let mut cmd = command(s.argv, s.env, ends, separate);
    let child = cmd.spawn().map_err(|e| spawn_error(&name, e));
    // Our copies of the command's ends close with `cmd`, so a stream ends when the command's side does.
    drop(cmd);
    let pty = pty.map(|(p, _slave)| p);
    let child = child.inspect_err(|_| {
        if let Some(p) = &pty {
            p.stand_aside();
        }
    })?;
    let pid = child.id() as i32;
    let watch = Watch {
        term: s.terminal,
        observer: Arc::new(Mutex::new(s.observer)),
        exited: Arc::new(AtomicBool::new(false)),
    };
    let ptys = sources.iter().filter_map(streams::Source::pty).collect();
    let followed = sources
        .iter()
        .filter_map(streams::Source::followed)
        .collect();
    let mut pumps: Vec<_> = sources.into_iter().map(|src| watch.pump(src)).collect();
    if let Some(p) = &pty {
        p.foreground(pid);
        pumps.push(watch.relay(p));
    }
    Ok(Child {
        pid: Pid::from_raw(pid),
        pgid: if separate {
            pid
        } else {
            nix::unistd::getpgrp().as_raw()
        },
        mode: if separate {
            Mode::Terminal
        } else {
            Mode::Shared
        },
        started: Instant::now(),
        pumps,
        held: Vec::new(),
        ptys,
        pty,
        _followed: followed,
        exited: watch.exited,
        on_exit: s.on_exit,
        guard: guard::start().map(|st| read_guard(st.guard)),
        stop: s.stop,
        work: s.work,
    })
}

/// The command's own terminal, when gpudoc stands in the foreground of the user's (said when one cannot
/// be made: the command then shares the user's terminal, in a process group of its own).
fn own_terminal() -> Option<(tty::Pty, OwnedFd)> {
    match guard::start()
        .and_then(|st| Some((st.terminal?, st.guard)))
        .map(|(terminal, guard)| tty::Pty::open(terminal, guard))?
    {
        Ok(p) => Some(p),
        Err(e) => {
            crate::sayln!("gpudoc: the command shares gpudoc's terminal: {e}");
            None
        }
    }
}

fn spawn_error(name: &str, e: io::Error) -> SpawnError {
    match e.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound(name.to_string()),
        io::ErrorKind::PermissionDenied => SpawnError::CannotExecute(name.to_string(), e),
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => {
            SpawnError::CannotExecute(name.to_string(), e)
        }
        _ => SpawnError::Other(name.to_string(), e),
    }
}

/// What the threads that watch the command's output share.
struct Watch {
    term: Option<Arc<Terminal>>,
    observer: Arc<Watching>,
    exited: Arc<AtomicBool>,
}

impl Watch {
    /// A thread copying (or reading) one output channel.
    fn pump(&self, src: streams::Source) -> JoinHandle<Option<Held>> {
        let (term, observer, exited) = (
            self.term.clone(),
            self.observer.clone(),
            self.exited.clone(),
        );
        thread(src.stream().name(), move || {
            streams::watch(src, term, observer, exited)
        })
    }

    /// The thread passing bytes both ways between the user's terminal and the command's own.
    fn relay(&self, p: &tty::Pty) -> JoinHandle<Option<Held>> {
        let (master, ctl) = (p.master.clone(), p.ctl.clone());
        let (term, observer, exited) = (
            self.term.clone(),
            self.observer.clone(),
            self.exited.clone(),
        );
        let stream = p.stream();
        thread("terminal", move || {
            match tty::relay(&master, &ctl, stream, term.as_deref(), &observer, &exited) {
                tty::Ended::Closed => None,
                tty::Ended::StillHeld => Some((master, 1)),
            }
        })
    }
}

fn thread<F>(name: &str, f: F) -> JoinHandle<Option<Held>>
where
    F: FnOnce() -> Option<Held> + Send + 'static,
{
    std::thread::Builder::new()
        .name(format!("gpudoc-{name}"))
        .spawn(f)
        .expect("spawn an output thread")
}

/// The command's standard fds with its own terminal: the terminal for each of gpudoc's that is the
/// user's terminal (`on`); a stdin elsewhere is gpudoc's own, a stderr elsewhere is wired as `w` says
/// (`2> log` stays the command's own file, read along), with its channel.
fn tty_ends(
    slave: &OwnedFd,
    on: [bool; 3],
    w: Wiring,
) -> io::Result<(streams::Ends, Vec<streams::Source>)> {
    let (stderr, sources) = if on[2] {
        (slave.try_clone()?.into(), Vec::new())
    } else {
        let (source, end) = streams::open_stderr(w.stderr)?;
        (end, source.into_iter().collect())
    };
    let stdin = if on[0] {
        Some(slave.try_clone()?.into())
    } else {
        None
    };
    let ends = streams::Ends {
        stdin,
        stdout: slave.try_clone()?.into(),
        stderr,
    };
    Ok((ends, sources))
}

/// The guard's ancestors and whether its process group is orphaned.
fn read_guard(pid: i32) -> Guard {
    let stat = |p: i32| procfs::process::Process::new(p).and_then(|p| p.stat()).ok();
    let mut above = Vec::new();
    let mut p = stat(pid).map(|s| s.ppid).unwrap_or(0);
    while p > 0 && above.len() < 64 {
        above.push(p);
        p = stat(p).map(|s| s.ppid).unwrap_or(0);
    }
    let orphaned = match (stat(pid), above.first().and_then(|&pp| stat(pp))) {
        (Some(g), Some(parent)) => parent.session != g.session || parent.pgrp == g.pgrp,
        _ => true,
    };
    Guard {
        pid,
        above,
        orphaned,
    }
}

/// The command with its environment and standard fds. In the child, before exec: its own process
/// group in the foreground of its own terminal (`separate`), the signal mask and the SIGPIPE disposition
/// gpudoc was started with, the standard fds that were closed then closed again, and SIGTERM if gpudoc
/// dies.
fn command(
    argv: &[OsString],
    env: &[(String, OsString)],
    ends: streams::Ends,
    separate: bool,
) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(ends.stdout)
        .stderr(ends.stderr);
    if let Some(stdin) = ends.stdin {
        cmd.stdin(stdin);
    }
    let parent = std::process::id() as i32;
    let closed = crate::stdfds::closed();
    let pipe_ignored = crate::stdfds::sigpipe_ignored_at_start();
    let mask = guard::start().map(|s| *s.mask.as_ref());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if separate {
                libc::setpgid(0, 0);
                // Its terminal's foreground before it reads a key (SIGTTOU is still blocked here).
                libc::tcsetpgrp(0, libc::getpid());
            }
            if let Some(m) = &mask {
                libc::pthread_sigmask(libc::SIG_SETMASK, m, std::ptr::null_mut());
            }
            if pipe_ignored {
                libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            }
            for &fd in &closed {
                libc::close(fd);
            }
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // gpudoc died before the prctl: don't run orphaned from the start.
            if libc::getppid() != parent {
                libc::_exit(crate::exit::GPUDOC_FAILED as i32);
            }
            Ok(())
        });
    }
    cmd
}

/// What waiting has seen so far, besides the outcome.
#[derive(Default)]
struct Waiting {
    pairing: Pairing,
    /// Ctrl-C presses the job did not answer.
    presses: signals::Presses,
    /// What the job had written at the last press (Shared mode; the relay keeps its own): a job that
    /// wrote since answered it.
    writes: Writes,
    hung_up: bool,
    /// gpudoc stopped the job because the guard was stopped.
    stopped_by_us: bool,
    /// gpudoc ending the job on request, and what the job wrote meanwhile.
    ending: Option<(signals::Ending, Writes)>,
}

/// One signal taken by gpudoc.
enum Taken {
    Nothing,
    Child,
    Seen(Seen),
}

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Waits for the command to end, passing on what signals it needs and reaping re-parented
    /// descendants; then drains its output.
    pub fn wait(&mut self) -> Outcome {
        let mut o = Outcome {
            end: ProcessEnd::Exited(0),
            duration: Duration::ZERO,
            escalated: false,
            terminate: false,
            forwarded: Vec::new(),
            stopped: false,
            interrupted: None,
        };
        let mut w = Waiting::default();
        let set = guard::handled();
        let end = loop {
            if let Some(end) = self.reap() {
                break end;
            }
            let now = Instant::now();
            let wait_for = w
                .pairing
                .deadline()
                .map_or(TICK, |d| d.saturating_duration_since(now))
                .min(TICK);
            match self.take(&set, wait_for) {
                Taken::Seen(seen) => {
                    if let Some(e) = w.pairing.seen(seen, Instant::now()) {
                        self.act(&e, &mut o, &mut w);
                    }
                }
                Taken::Child | Taken::Nothing => {}
            }
            for e in w.pairing.expired(Instant::now()) {
                self.act(&e, &mut o, &mut w);
            }
            self.follow_guard(&mut w);
            self.follow_keys(&mut o, &mut w);
            self.follow_stop(&mut o, &mut w);
        };
        o.duration = self.started.elapsed();
        o.end = end;
        if o.terminate {
            end_descendants(std::process::id(), END_GRACE);
        }
        self.exited.store(true, Ordering::SeqCst);
        for p in &self.pumps {
            p.thread().unpark();
        }
        for p in self.pumps.drain(..) {
            if let Ok(Some(held)) = p.join() {
                self.held.push(held);
            }
        }
        if let Some(p) = &self.pty {
            // The user's terminal is the shell's again; what the command left running on its own
            // terminal is in the background there, and is not hung up when gpudoc leaves.
            p.stand_aside();
            p.foreground(nix::unistd::getpgrp().as_raw());
        }
        o
    }

    /// gpudoc's work is done: what the command left running keeps a place to write ([`drain`]), then
    /// the files it writes are closed.
    pub fn finish(self) {
        let pairs: Vec<(RawFd, RawFd)> = self
            .held
            .iter()
            .map(|(src, dst)| (src.as_raw_fd(), *dst))
            .collect();
        if let Err(e) = drain::hand_over(&pairs) {
            crate::sayln!("gpudoc: what the command left running loses its output: {e}");
        }
    }

    /// Takes one signal, waiting at most `timeout`.
    fn take(&self, set: &SigSet, timeout: Duration) -> Taken {
        take(set, timeout, self.guard.as_ref().map(|g| g.pid))
    }

    /// Does what one signal event asks for.
    fn act(&mut self, e: &signals::Event, o: &mut Outcome, w: &mut Waiting) {
        if signals::asks_to_end(e) {
            o.terminate = true;
        }
        if signals::interrupts(self.mode, e) {
            o.interrupted.get_or_insert(e.sig);
        }
        if self.mode == Mode::Shared && signals::is_keypress(e) {
            let answered = w.writes.wrote();
            self.press(o, w, Instant::now(), answered);
        }
        let above = self
            .guard
            .as_ref()
            .is_some_and(|g| g.above.contains(&e.sender));
        match signals::decide(self.mode, e, above) {
            Action::Nothing => {}
            Action::Forward(sig) => self.forward(sig, o),
            Action::Resize { also } => {
                self.resize();
                if also {
                    self.forward(libc::SIGWINCH, o);
                }
            }
            Action::HangUp => self.hang_up(w),
            Action::Continue => self.resume(w),
        }
    }

    fn forward(&self, sig: i32, o: &mut Outcome) {
        if let Ok(s) = Signal::try_from(sig)
            && kill(self.pid, s).is_ok()
        {
            o.forwarded.push(sig);
        }
    }

    /// The pseudo-terminals take the user's terminal's new size.
    fn resize(&self) {
        if let Some(p) = &self.pty {
            p.resize();
        }
        for (master, like) in &self.ptys {
            if let Some(ws) = streams::winsize(*like) {
                // SAFETY: TIOCSWINSZ reads a winsize.
                unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
            }
        }
    }

    /// The user's terminal hung up: the command's terminal's foreground gets what a hang-up gives.
    fn hang_up(&self, w: &mut Waiting) {
        if w.hung_up {
            return;
        }
        w.hung_up = true;
        let group = Pid::from_raw(self.pgid);
        let _ = killpg(group, Signal::SIGHUP);
        let _ = killpg(group, Signal::SIGCONT);
    }

    /// The guard was continued: so is the job, if it is stopped; on its own terminal it gets the keys
    /// back when the shell gave gpudoc the foreground.
    fn resume(&self, w: &mut Waiting) {
        let foreground = tty::in_foreground(self.guard.as_ref().map(|g| g.pid));
        if job_stopped(self.pid.as_raw()) {
            if let Some(p) = &self.pty
                && foreground
            {
                p.take_back();
            }
            let _ = match self.mode {
                Mode::Terminal => killpg(Pid::from_raw(self.pgid), Signal::SIGCONT),
                Mode::Shared => kill(self.pid, Signal::SIGCONT),
            };
        } else if let Some(p) = &self.pty
            && foreground
        {
            p.take_back();
        }
        w.stopped_by_us = false;
    }

    /// A guard stopped by SIGSTOP (which it cannot take) stops the job.
    fn follow_guard(&self, w: &mut Waiting) {
        let Some(g) = &self.guard else { return };
        if w.stopped_by_us || !job_stopped(g.pid) || job_stopped(self.pid.as_raw()) {
            return;
        }
        w.stopped_by_us = true;
        let _ = kill(self.pid, Signal::SIGSTOP);
    }

    /// Ctrl-C keys typed on the command's own terminal (the relay counts them), and its hang-up.
    fn follow_keys(&self, o: &mut Outcome, w: &mut Waiting) {
        let Some(p) = &self.pty else { return };
        if p.ctl.hung_up.load(Ordering::SeqCst) {
            self.hang_up(w);
        }
        let presses = std::mem::take(&mut *p.ctl.presses.lock().unwrap());
        for (at, answered) in presses {
            o.interrupted.get_or_insert(libc::SIGINT);
            self.interrupt_callers();
            self.press(o, w, at, answered);
        }
    }

    /// A Ctrl-C typed on the command's own terminal reaches what runs gpudoc too, as the user's terminal
    /// gives it to its whole foreground group: every other process of the guard's process group (a script
    /// looping over `gpudoc run`, `make`), which the raw terminal no longer signals. Such a shell then
    /// stops once gpudoc dies of the command's SIGINT, as it would without gpudoc.
    fn interrupt_callers(&self) {
        let Some(g) = &self.guard else { return };
        if !tty::in_foreground(Some(g.pid)) {
            return;
        }
        let Ok(group) = nix::unistd::getpgid(Some(Pid::from_raw(g.pid))) else {
            return;
        };
        let Ok(all) = procfs::process::all_processes() else {
            return;
        };
        for p in all.flatten() {
            if p.pid != g.pid && p.stat().is_ok_and(|s| s.pgrp == group.as_raw()) {
                let _ = kill(Pid::from_raw(p.pid), Signal::SIGINT);
            }
        }
    }

    /// One Ctrl-C: the job's, unless it is the third quick one the job did not answer (it wrote nothing
    /// since the last), which kills its tree; the second such is told so first.
    /// `answered`: the job wrote since the press before.
    fn press(&self, o: &mut Outcome, w: &mut Waiting, at: Instant, answered: bool) {
        if o.escalated {
            return;
        }
        match w.presses.press(at, answered) {
            signals::Press::Jobs => {}
            signals::Press::Warn(n) => crate::sayln!(
                "gpudoc: the job wrote nothing since the last {n} Ctrl-C; one more within {} s, unanswered too, ends it and everything it started (SIGKILL)",
                signals::PRESS_WINDOW.as_secs()
            ),
            signals::Press::Kill => {
                o.escalated = true;
                kill_tree(std::process::id(), self.pid);
            }
        }
    }

    /// Ends the job when asked to, as the user's Ctrl-C would: SIGINT to its process group, then, once it
    /// has written nothing for [`STOP_GRACE`] or its work went on past the signal ([`Spawn::work`]),
    /// SIGTERM, then SIGKILL to its whole tree ([`end_step`]).
    /// What it leaves running is ended too.
    fn follow_stop(&self, o: &mut Outcome, w: &mut Waiting) {
        if !self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) || o.escalated {
            return;
        }
        o.stopped = true;
        o.terminate = true;
        let (ending, writes) = w
            .ending
            .get_or_insert_with(|| (signals::Ending::new(STOP_GRACE), Writes::default()));
        let work = self.work.as_ref().map_or(0, |f| f());
        if let Some(sig) = ending.due(Instant::now(), writes.wrote(), work) {
            end_step(self.pid(), ending);
            o.escalated |= sig == libc::SIGKILL;
        }
    }

    /// Reaps every exited child (descendants re-parented to gpudoc included), letting the sampler look
    /// once more first; the command's end if it was among them. A stop of the command is the job's.
    fn reap(&self) -> Option<ProcessEnd> {
        if let Some(f) = &self.on_exit
            && has_exited_child()
        {
            f();
        }
        let flags = WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED | WaitPidFlag::WCONTINUED;
        let mut end = None;
        loop {
            match waitpid(Pid::from_raw(-1), Some(flags)) {
                Ok(WaitStatus::Exited(p, code)) if p == self.pid => {
                    end = Some(ProcessEnd::Exited(code))
                }
                Ok(WaitStatus::Signaled(p, sig, core)) if p == self.pid => {
                    end = Some(ProcessEnd::Signaled {
                        signal: sig as i32,
                        core_dumped: core,
                    })
                }
                Ok(WaitStatus::Stopped(p, sig)) if p == self.pid => self.stopped(sig as i32),
                Ok(WaitStatus::StillAlive) | Err(_) => return end,
                Ok(_) => {}
            }
        }
    }

    /// The command stopped. Its terminal (if its own) goes back to the shell and the guard stops, so the
    /// shell sees the job stopped; for an orphaned group the terminal's stop keys are dropped, as the
    /// kernel would drop them without gpudoc.
    fn stopped(&self, sig: i32) {
        let Some(g) = &self.guard else { return };
        let by_terminal = matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU);
        if g.orphaned && by_terminal && self.pty.is_some() {
            let _ = killpg(Pid::from_raw(self.pgid), Signal::SIGCONT);
            return;
        }
        if let Some(p) = &self.pty {
            p.stand_aside();
        }
        if !job_stopped(g.pid) {
            let _ = kill(Pid::from_raw(g.pid), Signal::SIGSTOP);
        }
    }
}

/// Takes one of the signals in `set` (blocked in every thread of gpudoc), waiting at most `timeout`;
/// a relay counts only when it came from the guard.
fn take(set: &SigSet, timeout: Duration, guard: Option<i32>) -> Taken {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: sigtimedwait fills `info`.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let sig = unsafe { libc::sigtimedwait(set.as_ref(), &mut info, &ts) };
    if sig < 0 {
        return Taken::Nothing;
    }
    if sig == libc::SIGCHLD {
        return Taken::Child;
    }
    // SAFETY: si_pid and si_int are valid for signals sent by kill, sigqueue and the kernel.
    let sender = unsafe { info.si_pid() };
    if sig == guard::relay_signal() {
        if info.si_code != libc::SI_QUEUE || guard != Some(sender) {
            return Taken::Nothing;
        }
        let r = Relay::decode(unsafe { info.si_int() });
        return Taken::Seen(Seen {
            sig: r.sig,
            kernel: r.kernel,
            sender: r.sender,
            relayed: true,
        });
    }
    let kernel = info.si_code == libc::SI_KERNEL;
    Taken::Seen(Seen {
        sig,
        kernel,
        sender: if kernel { 0 } else { sender },
        relayed: false,
    })
}

/// Waits `d` (gpudoc's work is done: a scraper is given time to see the end), or less if gpudoc is asked
/// to end meanwhile.
pub fn linger(d: Duration) {
    let set = guard::handled();
    let guard = guard::start().map(|s| s.guard);
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if let Taken::Seen(s) = take(&set, left.min(TICK), guard)
            && matches!(
                s.sig,
                libc::SIGTERM | libc::SIGINT | libc::SIGHUP | libc::SIGQUIT
            )
        {
            return;
        }
    }
}

/// Whether process `pid` is stopped.
fn job_stopped(pid: i32) -> bool {
    procfs::process::Process::new(pid)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state == 'T')
}

/// Whether a child of gpudoc has exited and waits to be reaped.
fn has_exited_child() -> bool {
    matches!(
        waitpid(
            Pid::from_raw(-1),
            Some(WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT | WaitPidFlag::WEXITED)
        ),
        Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..))
    )
}

/// Reaps every exited child of gpudoc (descendants re-parented to it included).
pub fn reap_all() {
    while matches!(
        waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)),
        Ok(s) if s != WaitStatus::StillAlive
    ) {}
}

/// What each of the job's processes (gpudoc's descendants) had written when last looked at, by pid: every
/// byte to its terminal, pipes and files (`/proc/PID/io`'s `wchar`; a terminal's echo of a key is the
/// kernel's, not the job's).
#[derive(Debug, Default)]
pub struct Writes(BTreeMap<u32, u64>);

impl Writes {
    /// Whether any process of the job wrote since the last look.
    pub fn wrote(&mut self) -> bool {
        let now: BTreeMap<u32, u64> = procs::descendants(std::process::id())
            .into_iter()
            .filter_map(|p| {
                let io = procfs::process::Process::new(p.pid as i32)
                    .ok()?
                    .io()
                    .ok()?;
                Some((p.pid, io.wchar))
            })
            .collect();
        let wrote = now
            .iter()
            .any(|(pid, &n)| n > self.0.get(pid).copied().unwrap_or(0));
        self.0 = now;
        wrote
    }
}

/// One step of ending the job whose command is `child` (a child of this process), said on stderr after
/// the first: SIGINT and SIGTERM as the terminal's Ctrl-C reaches a job, its whole process group (the
/// command's own on its own terminal; sharing gpudoc's group, every process of the job in that group, not
/// gpudoc, its guard or a pipeline's other commands); SIGKILL to the command and every descendant.
/// `ending`: the steps sent so far, this one last.
pub fn end_step(child: u32, ending: &signals::Ending) {
    let Some(&sig) = ending.sent().last() else {
        return;
    };
    if let [.., before, _] = ending.sent() {
        crate::sayln!(
            "gpudoc: the job still runs {} s after {}{}: {} to {}",
            ending.waited().as_secs(),
            signals::signal_name(*before),
            if ending.worked_on() {
                ", its optimizer steps going on"
            } else {
                ""
            },
            signals::signal_name(sig),
            if sig == libc::SIGKILL {
                "it and everything it started"
            } else {
                "its process group"
            }
        );
    }
    let me = std::process::id();
    if sig == libc::SIGKILL {
        kill_tree(me, Pid::from_raw(child as i32));
        return;
    }
    let Ok(s) = Signal::try_from(sig) else { return };
    let child = Pid::from_raw(child as i32);
    if nix::unistd::getpgid(Some(child)) == Ok(child) {
        let _ = killpg(child, s);
        return;
    }
    let group = nix::unistd::getpgrp();
    for p in procs::descendants(me) {
        let pid = Pid::from_raw(p.pid as i32);
        if nix::unistd::getpgid(Some(pid)) == Ok(group) {
            let _ = kill(pid, s);
        }
    }
}

/// SIGKILL to the child and every descendant of `root` (gpudoc).
fn kill_tree(root: u32, child: Pid) {
    let _ = kill(child, Signal::SIGKILL);
    for p in procs::descendants(root) {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
}

/// Ends every live descendant of `root`: SIGTERM, up to `grace` for them to go, then SIGKILL; reaping
/// as they exit (`root` is this process, their subreaper).
pub fn end_descendants(root: u32, grace: Duration) {
    let alive = || procs::descendants(root);
    let first = alive();
    if first.is_empty() {
        return;
    }
    for p in &first {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGTERM);
    }
    let until = Instant::now() + grace;
    while Instant::now() < until {
        reap_all();
        if alive().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in alive() {
        let _ = kill(Pid::from_raw(p.pid as i32), Signal::SIGKILL);
    }
    reap_all();
}
