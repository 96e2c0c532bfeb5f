//! Runs the wrapped command the way a careful wrapper does: same bytes on the same streams, signals
//! forwarded, the exit code passed through, every descendant kept in view, and the job ended as a whole
//! when gpudoc is asked to end it.
//!
//! - gpudoc is a subreaper, so descendants whose parent dies are re-parented to it and stay in the job.
//! - Output: see [`streams`]. Signals: TERM, HUP, QUIT, USR1, USR2, WINCH and INT are forwarded, except
//!   those the terminal already delivered to the whole foreground process group (Ctrl-C, Ctrl-\,
//!   hang-up), so the command gets them once. A second Ctrl-C kills the job's whole process tree.
//! - When gpudoc was asked to end (a forwarded TERM, HUP, QUIT or INT that was not the terminal's), the
//!   descendants still running once the command has exited are ended too (SIGTERM, [`END_GRACE`],
//!   SIGKILL): the job ends as a whole.
//! - The command gets SIGTERM if gpudoc itself dies (PR_SET_PDEATHSIG); the [`guard`] covers the rest.

mod follow;
pub mod guard;
pub mod streams;

use crate::procs;
pub use follow::{Pace, Reader};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use signal_hook::consts::signal::*;
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
pub use streams::{Observer, Sieve, Stream, Terminal, Watching, Wiring};

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
    /// gpudoc killed the job's tree after a second Ctrl-C.
    pub escalated: bool,
    /// gpudoc was asked to end (a terminating signal that was not the terminal's): what the command left
    /// running is ended too.
    pub terminate: bool,
    /// Signals gpudoc forwarded, by number, in order.
    pub forwarded: Vec<i32>,
}

/// Called when a child of gpudoc has exited, before it is reaped (the sampler looks once more).
pub type OnExit = Box<dyn Fn() + Send>;

/// A started command. Dropping it closes gpudoc's descriptors of the files the command writes to: keep it
/// until gpudoc's own work is done. On ext4 the first close of a file the shell truncated (`> log`) writes
/// the file out (its `auto_da_alloc`), as the command's own last close would without gpudoc, and
/// filesystem work done after that (removing the shim's folder, writing the report) can wait behind
/// those writes: 35-100 ms after 200 MB on the H200 host.
pub struct Child {
    pid: Pid,
    started: Instant,
    signals: SignalsInfo<WithOrigin>,
    /// SIGINTs received, counted as they arrive: the iterator gives two that come close together as one.
    ints: Arc<AtomicUsize>,
    pumps: Vec<JoinHandle<()>>,
    /// Pseudo-terminal masters and the fd whose size they follow.
    ptys: Vec<(Arc<OwnedFd>, RawFd)>,
    /// The files the command writes to itself, as gpudoc reads them: held open until the child is dropped.
    _followed: Vec<Arc<[std::fs::File]>>,
    exited: Arc<AtomicBool>,
    on_exit: Option<OnExit>,
}

pub const FORWARDED: [i32; 7] = [SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGINT];
/// Signals that ask gpudoc to end (when not the terminal's own delivery to the whole group).
const TERMINATING: [i32; 4] = [SIGTERM, SIGHUP, SIGQUIT, SIGINT];
/// How long what is left of a job that gpudoc ends gets between SIGTERM and SIGKILL.
pub const END_GRACE: Duration = Duration::from_secs(5);

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
}

/// Starts the command. Signal handlers are installed first, so nothing the command does is missed.
pub fn spawn(s: Spawn) -> Result<Child, SpawnError> {
    let name = s.argv[0].to_string_lossy().into_owned();
    let other = |e: io::Error| SpawnError::Other(name.clone(), e);
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| other(e.into()))?;
    let (signals, ints) = handle_signals().map_err(other)?;
    // Blocked since the guard split off; the handlers are in place now.
    guard::unblock();
    let (sources, ends) = streams::open(s.wiring).map_err(other)?;
    let mut cmd = command(s.argv, s.env, ends);
    let child = cmd.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound(name.clone()),
        io::ErrorKind::PermissionDenied => SpawnError::CannotExecute(name.clone(), e),
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => SpawnError::CannotExecute(name.clone(), e),
        _ => SpawnError::Other(name.clone(), e),
    })?;
    // Our copies of the command's ends close with `cmd`, so a stream ends when the command's side does.
    drop(cmd);
    let exited = Arc::new(AtomicBool::new(false));
    let observer = Arc::new(Mutex::new(s.observer));
    let ptys = sources
        .iter()
        .filter_map(|src| match src {
            streams::Source::Pump {
                ours,
                to,
                pty: true,
                ..
            } => Some((ours.clone(), *to)),
            _ => None,
        })
        .collect();
    let followed = sources
        .iter()
        .filter_map(|src| match src {
            streams::Source::Follow { files, .. } => Some(files.clone()),
            _ => None,
        })
        .collect();
    let pumps = sources
        .into_iter()
        .map(|src| {
            let (term, observer, exited) = (s.terminal.clone(), observer.clone(), exited.clone());
            std::thread::Builder::new()
                .name(format!("gpudoc-{}", src.stream().name()))
                .spawn(move || streams::watch(src, term, observer, exited))
                .expect("spawn an output thread")
        })
        .collect();
    Ok(Child {
        pid: Pid::from_raw(child.id() as i32),
        started: Instant::now(),
        signals,
        ints,
        pumps,
        ptys,
        _followed: followed,
        exited,
        on_exit: s.on_exit,
    })
}

/// The handlers for the forwarded signals and SIGCHLD, and a count of SIGINTs kept as they arrive.
fn handle_signals() -> io::Result<(SignalsInfo<WithOrigin>, Arc<AtomicUsize>)> {
    let mut sigs: Vec<i32> = FORWARDED.to_vec();
    sigs.push(SIGCHLD);
    let signals = SignalsInfo::<WithOrigin>::new(&sigs)?;
    let ints = Arc::new(AtomicUsize::new(0));
    let count = ints.clone();
    // SAFETY: the action only adds to an atomic, which is async-signal-safe.
    unsafe {
        signal_hook::low_level::register(SIGINT, move || _ = count.fetch_add(1, Ordering::SeqCst))
    }?;
    Ok((signals, ints))
}

/// The command with its environment and output ends. In the child, before exec: the standard fds that
/// were closed when gpudoc started are closed again, and the command gets SIGTERM if gpudoc dies.
fn command(argv: &[OsString], env: &[(String, OsString)], ends: streams::Ends) -> Command {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(ends.stdout)
        .stderr(ends.stderr);
    let parent = std::process::id() as i32;
    let closed = crate::stdfds::closed();
    // SAFETY: only async-signal-safe calls (close, prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
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

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Waits for the command to end, forwarding signals and reaping re-parented descendants; then
    /// drains its output.
    pub fn wait(&mut self) -> Outcome {
        let mut o = Outcome {
            end: ProcessEnd::Exited(0),
            duration: Duration::ZERO,
            escalated: false,
            terminate: false,
            forwarded: Vec::new(),
        };
        let (pid, on_exit, ptys) = (self.pid, &self.on_exit, &self.ptys);
        let mut end = reap(pid, on_exit);
        if end.is_none() {
            for origin in self.signals.forever() {
                let sig = origin.signal;
                if sig == SIGCHLD {
                    end = reap(pid, on_exit);
                    if end.is_some() {
                        break;
                    }
                    continue;
                }
                // Sent by the kernel: the terminal gave it to the whole foreground group, command included.
                let from_terminal = matches!(origin.cause, Cause::Kernel);
                if sig == SIGINT && self.ints.load(Ordering::SeqCst) >= 2 {
                    o.escalated = true;
                    kill_tree(std::process::id(), pid);
                    continue;
                }
                if TERMINATING.contains(&sig) && !from_terminal {
                    o.terminate = true;
                }
                if sig == SIGWINCH {
                    follow_size(ptys);
                } else if from_terminal && matches!(sig, SIGINT | SIGQUIT | SIGHUP) {
                    continue;
                }
                if let Ok(s) = Signal::try_from(sig)
                    && kill(pid, s).is_ok()
                {
                    o.forwarded.push(sig);
                }
            }
        }
        o.duration = self.started.elapsed();
        o.end = end.unwrap_or(ProcessEnd::Exited(0));
        if o.terminate {
            end_descendants(std::process::id(), END_GRACE);
        }
        self.exited.store(true, Ordering::SeqCst);
        for p in &self.pumps {
            p.thread().unpark();
        }
        for p in self.pumps.drain(..) {
            let _ = p.join();
        }
        o
    }
}

/// The pseudo-terminals take the terminal's new size.
fn follow_size(ptys: &[(Arc<OwnedFd>, RawFd)]) {
    for (master, like) in ptys {
        if let Some(ws) = streams::winsize(*like) {
            // SAFETY: TIOCSWINSZ reads a winsize.
            unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        }
    }
}

/// Reaps every exited child (descendants re-parented to gpudoc included), letting the sampler look once
/// more first; the command's end if it was among them.
fn reap(pid: Pid, on_exit: &Option<OnExit>) -> Option<ProcessEnd> {
    if let Some(f) = on_exit
        && has_exited_child()
    {
        f();
    }
    reap_until(pid)
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
    reap_until(Pid::from_raw(0));
}

/// Reaps every exited child (descendants re-parented to us included); returns the main child's end if it
/// was among them.
fn reap_until(main: Pid) -> Option<ProcessEnd> {
    let mut end = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, code)) if p == main => end = Some(ProcessEnd::Exited(code)),
            Ok(WaitStatus::Signaled(p, sig, core)) if p == main => {
                end = Some(ProcessEnd::Signaled {
                    signal: sig as i32,
                    core_dumped: core,
                })
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return end,
            Ok(_) => {}
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
