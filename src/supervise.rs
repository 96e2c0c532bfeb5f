//! Runs the wrapped command the way a careful wrapper does: same bytes on the same streams, signals
//! forwarded, the exit code passed through, and every descendant kept in view.
//!
//! - gpudoc is a subreaper, so descendants whose parent dies are re-parented to it and stay in the job.
//! - stdout and stderr: a stream that is a terminal gets a pseudo-terminal of its own (raw mode, the
//!   terminal's size), so the child still sees a terminal and prints colours and progress bars; stderr that
//!   is not a terminal gets a pipe. gpudoc copies the bytes unchanged to its own stream and shows them to an
//!   observer (the OOM scanner). stdout that is not a terminal is inherited untouched.
//! - Signals: TERM, HUP, QUIT, USR1, USR2, WINCH and INT are forwarded, except those the terminal already
//!   delivered to the whole foreground process group (Ctrl-C, Ctrl-\, hang-up), so the child gets them once.
//!   A second Ctrl-C kills the job's whole process tree.
//! - The child gets SIGTERM if gpudoc itself dies (PR_SET_PDEATHSIG), so it never outlives gpudoc unnoticed.

use crate::procs;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use signal_hook::consts::signal::*;
use signal_hook::iterator::SignalsInfo;
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::low_level::siginfo::Cause;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Which of the child's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Sees every chunk of captured output, after it was passed on.
pub type Observer = Box<dyn FnMut(Stream, &[u8]) + Send>;
/// Runs a write with gpudoc's live line out of the way (it clears and redraws it).
pub type Guard = Arc<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

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
    /// Signals gpudoc forwarded, by number, in order.
    pub forwarded: Vec<i32>,
}

/// A started command.
pub struct Child {
    pid: Pid,
    started: Instant,
    signals: SignalsInfo<WithOrigin>,
    pumps: Vec<JoinHandle<()>>,
    /// Pseudo-terminal masters, kept to follow the terminal's size.
    ptys: Vec<(Arc<OwnedFd>, RawFd)>,
    exited: Arc<AtomicBool>,
}

const FORWARDED: [i32; 7] = [SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH, SIGINT];

/// Starts `argv`. Signal handlers are installed first, so nothing the child does is missed.
/// `env` is added to the command's environment.
pub fn spawn(
    argv: &[OsString],
    env: &[(String, OsString)],
    guard: Guard,
    observer: Option<Observer>,
) -> Result<Child, SpawnError> {
    let name = argv[0].to_string_lossy().into_owned();
    let other = |e: io::Error| SpawnError::Other(name.clone(), e);
    nix::sys::prctl::set_child_subreaper(true).map_err(|e| other(e.into()))?;
    let mut sigs: Vec<i32> = FORWARDED.to_vec();
    sigs.push(SIGCHLD);
    let signals = SignalsInfo::<WithOrigin>::new(&sigs).map_err(other)?;

    let observer = Arc::new(Mutex::new(observer));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut sources: Vec<(Stream, Source)> = Vec::new();
    let mut ptys = Vec::new();
    for (stream, our_fd) in [(Stream::Stdout, 1), (Stream::Stderr, 2)] {
        if nix::unistd::isatty(unsafe { BorrowedFd::borrow_raw(our_fd) }).unwrap_or(false) {
            let (master, slave) = open_pty(our_fd).map_err(other)?;
            let master = Arc::new(master);
            ptys.push((master.clone(), our_fd));
            set_stream(&mut cmd, stream, Stdio::from(slave));
            sources.push((stream, Source::Pty(master)));
        } else if stream == Stream::Stderr {
            let (r, w) = nix::unistd::pipe().map_err(|e| other(e.into()))?;
            set_cloexec(r.as_raw_fd());
            set_cloexec(w.as_raw_fd());
            set_stream(&mut cmd, stream, Stdio::from(w));
            sources.push((stream, Source::Pipe(r)));
        }
    }
    let parent = std::process::id() as i32;
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // gpudoc died before the prctl: don't run orphaned from the start.
            if libc::getppid() != parent {
                libc::_exit(crate::exit::GPUDOC_FAILED as i32);
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SpawnError::NotFound(name.clone()),
        io::ErrorKind::PermissionDenied => SpawnError::CannotExecute(name.clone(), e),
        _ if e.raw_os_error() == Some(libc::ENOEXEC) => SpawnError::CannotExecute(name.clone(), e),
        _ => SpawnError::Other(name.clone(), e),
    })?;
    // Our copies of the child's ends close with `cmd`, so a stream ends when the child's side does.
    drop(cmd);
    let exited = Arc::new(AtomicBool::new(false));
    let pumps = sources
        .into_iter()
        .map(|(stream, src)| {
            let (guard, observer, exited) = (guard.clone(), observer.clone(), exited.clone());
            std::thread::Builder::new()
                .name(format!("gpudoc-{stream:?}"))
                .spawn(move || pump(stream, src, guard, observer, exited))
                .expect("spawn an output thread")
        })
        .collect();
    Ok(Child {
        pid: Pid::from_raw(child.id() as i32),
        started: Instant::now(),
        signals,
        pumps,
        ptys,
        exited,
    })
}

fn set_stream(cmd: &mut Command, stream: Stream, stdio: Stdio) {
    match stream {
        Stream::Stdout => cmd.stdout(stdio),
        Stream::Stderr => cmd.stderr(stdio),
    };
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// A pseudo-terminal the size of our terminal on `like`, in raw mode so bytes pass unchanged.
fn open_pty(like: RawFd) -> io::Result<(OwnedFd, OwnedFd)> {
    let size = winsize(like);
    let pty = nix::pty::openpty(size.as_ref(), None)?;
    let mut t = nix::sys::termios::tcgetattr(&pty.slave)?;
    nix::sys::termios::cfmakeraw(&mut t);
    nix::sys::termios::tcsetattr(&pty.slave, nix::sys::termios::SetArg::TCSANOW, &t)?;
    set_cloexec(pty.master.as_raw_fd());
    set_cloexec(pty.slave.as_raw_fd());
    Ok((pty.master, pty.slave))
}

fn winsize(fd: RawFd) -> Option<nix::pty::Winsize> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into `ws`.
    (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0).then_some(ws)
}

enum Source {
    Pty(Arc<OwnedFd>),
    Pipe(OwnedFd),
}

impl Source {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Source::Pty(f) => f.as_fd(),
            Source::Pipe(f) => f.as_fd(),
        }
    }
}

/// After the child exits, output still buffered is drained; a descendant that keeps the stream open is
/// given this long of silence (and at most [`DRAIN_MAX`]) before gpudoc stops reading.
const DRAIN_QUIET: Duration = Duration::from_millis(100);
const DRAIN_MAX: Duration = Duration::from_secs(2);

fn pump(
    stream: Stream,
    src: Source,
    guard: Guard,
    observer: Arc<Mutex<Option<Observer>>>,
    exited: Arc<AtomicBool>,
) {
    let our_fd = match stream {
        Stream::Stdout => 1,
        Stream::Stderr => 2,
    };
    // Unbuffered: each chunk reaches the terminal as the child wrote it.
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(our_fd) });
    let mut reader =
        std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(src.fd().as_raw_fd()) });
    let mut buf = vec![0u8; 64 * 1024];
    let mut drain_started: Option<Instant> = None;
    loop {
        let mut fds = [PollFd::new(src.fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(DRAIN_QUIET.as_millis() as u16)) {
            Ok(0) => {
                if exited.load(Ordering::SeqCst) {
                    break;
                }
                continue;
            }
            Err(Errno::EINTR) => continue,
            Err(_) => break,
            Ok(_) => {}
        }
        if exited.load(Ordering::SeqCst) {
            let started = *drain_started.get_or_insert_with(Instant::now);
            if started.elapsed() > DRAIN_MAX {
                break;
            }
        }
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // EIO: every holder of the pseudo-terminal's other side closed it.
            Err(_) => break,
        };
        let chunk = &buf[..n];
        let mut result = Ok(());
        guard(&mut || result = out.write_all(chunk));
        if let Some(obs) = observer.lock().unwrap().as_mut() {
            obs(stream, chunk);
        }
        if result.is_err() {
            // Our reader went away (`| head`): closing our end lets the child see EPIPE as it would have.
            break;
        }
    }
    drop(src);
}

impl Child {
    pub fn pid(&self) -> u32 {
        self.pid.as_raw() as u32
    }

    /// Waits for the command to end, forwarding signals and reaping re-parented descendants; then
    /// drains its output.
    pub fn wait(mut self) -> Outcome {
        let me = std::process::id();
        let mut ints = 0;
        let mut escalated = false;
        let mut forwarded = Vec::new();
        let mut end = self.reap();
        let pid = self.pid;
        if end.is_none() {
            for origin in self.signals.forever() {
                let sig = origin.signal;
                if sig == SIGCHLD {
                    end = reap_until(pid);
                    if end.is_some() {
                        break;
                    }
                    continue;
                }
                // Sent by the kernel: the terminal gave it to the whole foreground group, child included.
                let from_terminal = matches!(origin.cause, Cause::Kernel);
                if sig == SIGINT {
                    ints += 1;
                    if ints >= 2 {
                        escalated = true;
                        kill_tree(me, pid);
                        continue;
                    }
                }
                if sig == SIGWINCH {
                    for (master, like) in &self.ptys {
                        if let Some(ws) = winsize(*like) {
                            // SAFETY: TIOCSWINSZ reads a winsize.
                            unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
                        }
                    }
                } else if from_terminal && matches!(sig, SIGINT | SIGQUIT | SIGHUP) {
                    continue;
                }
                if let Ok(s) = Signal::try_from(sig)
                    && kill(pid, s).is_ok()
                {
                    forwarded.push(sig);
                }
            }
        }
        let duration = self.started.elapsed();
        self.exited.store(true, Ordering::SeqCst);
        for p in self.pumps.drain(..) {
            let _ = p.join();
        }
        Outcome {
            end: end.unwrap_or(ProcessEnd::Exited(0)),
            duration,
            escalated,
            forwarded,
        }
    }

    fn reap(&self) -> Option<ProcessEnd> {
        reap_until(self.pid)
    }
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
