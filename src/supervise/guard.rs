//! The guard: what ends the job as a whole if gpudoc itself is killed.
//!
//! `PR_SET_PDEATHSIG` reaches only a dead process's direct child, so when gpudoc is SIGKILLed its
//! command's own children would run on under PID 1. Before any thread starts, [`split`] forks gpudoc in
//! two: the original process (the PID the shell or CI waits on) becomes a small guard, and the child
//! carries on as gpudoc. The guard forwards signals to gpudoc and leaves with its exit code. If the guard
//! is killed, gpudoc gets SIGTERM (its death signal) and ends the job as for any SIGTERM: the command
//! first, then every descendant left. If gpudoc itself is killed, the guard, a subreaper above the whole
//! job, ends every process re-parented to it.
//!
//! The guard waits for signals with `sigwaitinfo` (no handler, no thread); the signals stay blocked in
//! gpudoc until [`super::spawn`] has its handlers in place, so none sent in between is lost.

use super::{END_GRACE, FORWARDED, end_descendants};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, pthread_sigmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork, getpid};

/// The signals the guard and gpudoc handle: those forwarded, and SIGCHLD.
pub(super) fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED.iter().chain([&libc::SIGCHLD]) {
        if let Ok(sig) = Signal::try_from(*s) {
            set.add(sig);
        }
    }
    set
}

/// Lets the handled signals through again (once their handlers are in place).
pub(super) fn unblock() {
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&handled()), None);
}

/// Forks the guard. Returns in the child, which carries on as gpudoc with the handled signals blocked
/// until [`super::spawn`]; the guard never returns.
///
/// # Safety
/// No other thread may exist: the guard runs ordinary code after the fork.
pub unsafe fn split() -> std::io::Result<()> {
    let set = handled();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None)?;
    let guard = getpid();
    // SAFETY: single-threaded (the caller's promise).
    match unsafe { fork() }.map_err(std::io::Error::from)? {
        ForkResult::Child => {
            // SAFETY: prctl with constant arguments.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) };
            if nix::unistd::getppid() != guard {
                // The guard died before the prctl: its death signal, pending until the handlers exist.
                let _ = kill(getpid(), Signal::SIGTERM);
            }
            Ok(())
        }
        ForkResult::Parent { child } => guard_loop(&set, child),
    }
}

fn guard_loop(set: &SigSet, gpudoc: Pid) -> ! {
    let _ = nix::sys::prctl::set_child_subreaper(true);
    loop {
        // SAFETY: sigwaitinfo fills `info`; the set is blocked in this thread.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let sig = unsafe { libc::sigwaitinfo(set.as_ref(), &mut info) };
        if sig < 0 {
            continue;
        }
        if sig == libc::SIGCHLD {
            if let Some(code) = gpudoc_ended(gpudoc) {
                std::process::exit(code);
            }
            continue;
        }
        // Sent by the kernel: the terminal gave it to the whole foreground group, gpudoc included.
        if info.si_code == libc::SI_KERNEL {
            continue;
        }
        if let Ok(s) = Signal::try_from(sig) {
            let _ = kill(gpudoc, s);
        }
    }
}

/// Reaps what ended; when gpudoc did, the code to leave with. If gpudoc died of a signal, its job's
/// processes, re-parented to the guard, are ended first.
fn gpudoc_ended(gpudoc: Pid) -> Option<i32> {
    let mut code = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(p, c)) if p == gpudoc => code = Some(c),
            Ok(WaitStatus::Signaled(p, sig, _)) if p == gpudoc => {
                end_descendants(std::process::id(), END_GRACE);
                code = Some(128 + sig as i32);
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return code,
            Ok(_) => {}
        }
    }
}
