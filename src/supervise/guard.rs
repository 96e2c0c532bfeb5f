//! The guard: the process the shell, the scheduler or the container runtime started, standing for the job.
//!
//! `PR_SET_PDEATHSIG` reaches only a dead process's direct child, so when gpudoc is SIGKILLed its
//! command's own children would run on under PID 1. Before any thread starts, [`split`] forks gpudoc in
//! two: the original process (the PID the shell or CI waits on) becomes a small guard, and the child
//! carries on as gpudoc. The guard decides nothing about the job:
//!
//! - every signal it takes is relayed to gpudoc with where it came from (a real-time signal whose value
//!   is a [`Relay`]: a relay is never merged with gpudoc's own copy of the same signal), and gpudoc decides
//!   what reaches the command ([`super::signals`]);
//! - it leaves as gpudoc leaves: with its exit code, or, when the command died of a signal and gpudoc
//!   passes that on, by the same signal, so that a shell loop stops at Ctrl-C as it would without gpudoc;
//! - if gpudoc itself is killed, the guard, a subreaper above the whole job, ends every process
//!   re-parented to it, and gives the terminal its modes back.
//!
//! The guard waits for signals with `sigwaitinfo` (no handler, no thread): signals the caller ignored
//! (`nohup`, a background job of a script) stay ignored, here and for the command. They stay blocked in
//! gpudoc, which takes them the same way.

use super::signals::Relay;
use super::{END_GRACE, FORWARDED, end_descendants, tty};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

/// The real-time signal that carries the guard's relays to gpudoc.
pub fn relay_signal() -> i32 {
    libc::SIGRTMIN() + 2
}

/// What gpudoc learnt before it split, for the command and for the terminal.
pub struct Start {
    /// The signal mask gpudoc was started with: the command's.
    pub mask: SigSet,
    /// The terminal gpudoc was started in the foreground of, with stdout on it: the command gets a
    /// terminal of its own that stands for it ([`tty`]).
    pub terminal: Option<tty::Found>,
    /// The guard's pid (gpudoc's parent).
    pub guard: i32,
    /// Written to with the signal number before gpudoc dies of the command's signal on purpose.
    exit_note: Option<OwnedFd>,
    /// gpudoc's copy of the keeper's pipe: the keeper acts only once the guard's and this are closed.
    _keeper: OwnedFd,
}

static START: OnceLock<Start> = OnceLock::new();

/// What gpudoc learnt before it split (nothing when it did not: then the command gets the mask as it
/// is, and no terminal of its own).
pub fn start() -> Option<&'static Start> {
    START.get()
}

/// The signals the guard and gpudoc take: those they relay or forward, SIGCHLD, and the relay's own.
pub(super) fn handled() -> SigSet {
    // SAFETY: sigemptyset and sigaddset on a set we own, with valid signal numbers (nix's Signal has no
    // real-time ones).
    unsafe {
        let mut raw: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut raw);
        for s in FORWARDED.iter().chain(&[libc::SIGCHLD, relay_signal()]) {
            libc::sigaddset(&mut raw, *s);
        }
        SigSet::from_sigset_t_unchecked(raw)
    }
}

/// Forks the guard. Returns in the child, which carries on as gpudoc with the handled signals blocked
/// (taken by [`super::Child::wait`]); the guard never returns.
///
/// # Safety
/// No other thread may exist: the guard runs ordinary code after the fork.
pub unsafe fn split() -> std::io::Result<()> {
    let set = handled();
    let mut mask = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut mask))?;
    let terminal = tty::detect();
    let (note_r, note_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    let guard = getpid();
    // The keeper learns from this pipe whether the guard left or was killed (gpudoc keeps a copy of
    // the write end: the pipe closes only when both are gone). Best effort: without it, what the job
    // detached outlives a `pkill -9 gpudoc`, as it did before.
    let (keep_r, keep_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let saved = terminal.map(|t| t.saved);
    let _ = super::keeper::start(guard.as_raw() as u32, keep_r.as_raw_fd(), saved.as_ref());
    drop(keep_r);
    // SAFETY: single-threaded (the caller's promise).
    match unsafe { fork() }.map_err(std::io::Error::from)? {
        ForkResult::Child => {
            drop(note_r);
            // SAFETY: prctl with constant arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
            if nix::unistd::getppid() != guard {
                // The guard died before the prctl: its death signal, pending until it is taken.
                let _ = kill(getpid(), Signal::SIGTERM);
            }
            // Gpudoc writes to and sets the modes of terminals it is not in the foreground of (its own
            // pseudo-terminals, the user's terminal once it stands aside): never stopped for it.
            let mut tty_signals = SigSet::empty();
            tty_signals.add(Signal::SIGTTOU);
            tty_signals.add(Signal::SIGTTIN);
            pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&tty_signals), None)?;
            if terminal.is_some() {
                // A session of gpudoc's own, led by it, for the command's terminal.
                nix::unistd::setsid()?;
            }
            let _ = START.set(Start {
                mask,
                terminal,
                guard: guard.as_raw(),
                exit_note: Some(note_w),
                _keeper: keep_w,
            });
            Ok(())
        }
        ForkResult::Parent { child } => {
            drop(note_w);
            guard_loop(&set, child, (note_r, keep_w), saved)
        }
    }
}

/// The guard's two pipes: gpudoc's note that it dies of the command's signal on purpose, and the
/// keeper's word that the guard leaves as it should.
type Pipes = (OwnedFd, OwnedFd);

fn guard_loop(set: &SigSet, gpudoc: Pid, pipes: Pipes, terminal: Option<tty::Saved>) -> ! {
    let _ = nix::sys::prctl::set_child_subreaper(true);
    let me = std::process::id() as i32;
    loop {
        // SAFETY: sigwaitinfo fills `info`; the set is blocked in this thread.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let sig = unsafe { libc::sigwaitinfo(set.as_ref(), &mut info) };
        if sig < 0 {
            continue;
        }
        if sig == libc::SIGCHLD {
            if let Some(end) = gpudoc_ended(gpudoc) {
                leave(end, &pipes, terminal.as_ref());
            }
            continue;
        }
        if sig == relay_signal() {
            continue;
        }
        // SAFETY: si_pid is valid for the signals taken here (kill, sigqueue, the kernel's own).
        let sender = unsafe { info.si_pid() };
        let relay = Relay {
            sig,
            kernel: info.si_code == libc::SI_KERNEL,
            sender: if sender == me { 0 } else { sender },
        };
        send_relay(gpudoc.as_raw(), relay);
    }
}

unsafe extern "C" {
    // glibc's and musl's sigqueue(3): SI_QUEUE, the caller's pid and uid, and the value.
    fn sigqueue(pid: libc::pid_t, sig: libc::c_int, value: libc::sigval) -> libc::c_int;
}

fn send_relay(to: i32, r: Relay) {
    let value = libc::sigval {
        sival_ptr: r.encode() as usize as *mut libc::c_void,
    };
    // SAFETY: sigqueue with a valid pid and signal; the value is an int in the pointer's place.
    unsafe { sigqueue(to, relay_signal(), value) };
}

/// How gpudoc ended.
enum GpudocEnd {
    Exited(i32),
    Signaled(i32),
}

/// Reaps what ended; gpudoc's end, if it was among them.
fn gpudoc_ended(gpudoc: Pid) -> Option<GpudocEnd> {
    let mut end = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, c)) if p == gpudoc => end = Some(GpudocEnd::Exited(c)),
            Ok(WaitStatus::Signaled(p, sig, _)) if p == gpudoc => {
                end = Some(GpudocEnd::Signaled(sig as i32))
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return end,
            Ok(_) => {}
        }
    }
}

/// Leaves as gpudoc left. If gpudoc was killed (it did not say it was dying of the command's signal),
/// the job's processes, re-parented to the guard, are ended first.
fn leave(end: GpudocEnd, (note, keeper): &Pipes, terminal: Option<&tty::Saved>) -> ! {
    if let Some(t) = terminal {
        // The guard asks of its own process group.
        t.restore(None);
    }
    match end {
        GpudocEnd::Exited(c) => {
            tell_keeper(keeper);
            std::process::exit(c)
        }
        GpudocEnd::Signaled(sig) => {
            let mut said = [0u8; 1];
            // SAFETY: a non-blocking read of one byte from our pipe.
            let n = unsafe { libc::read(note.as_raw_fd(), said.as_mut_ptr().cast(), 1) };
            if n != 1 || i32::from(said[0]) != sig {
                end_descendants(std::process::id(), END_GRACE);
            }
            tell_keeper(keeper);
            die_of(sig)
        }
    }
}

/// The guard leaves as it should: the keeper leaves too, ending nothing.
fn tell_keeper(keeper: &OwnedFd) {
    let byte = [super::keeper::LEAVING];
    // SAFETY: a one-byte write to our pipe.
    unsafe { libc::write(keeper.as_raw_fd(), byte.as_ptr().cast(), 1) };
}

/// Dies of `sig` as the command did: the default action, no core file of gpudoc's own (the command's is
/// the one that matters), and 128+N should the signal not end the process.
pub fn die_of(sig: i32) -> ! {
    // SAFETY: plain calls with valid arguments; nothing runs after the signal but the fallback exit.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
    }
    std::process::exit(128 + sig)
}

/// gpudoc dies of the signal the command died of, telling the guard it means it (so the guard passes it
/// on rather than ending the job's leftovers as for a killed gpudoc).
pub fn exit_by_signal(sig: i32) -> ! {
    if let Some(fd) = START.get().and_then(|s| s.exit_note.as_ref()) {
        let byte = [sig as u8];
        // SAFETY: a one-byte write to our pipe.
        unsafe { libc::write(fd.as_raw_fd(), byte.as_ptr().cast(), 1) };
    }
    die_of(sig)
}
