//! Which of fds 0, 1 and 2 were closed when gpudoc was started, and whether SIGPIPE was ignored. Rust's runtime opens /dev/null on a
//! closed one before `main`, so gpudoc's own files never land on them; the command must still find them
//! closed, as it would without gpudoc: a write to a closed stdout fails with EBADF, and a program that checks
//! (a shell's `echo`) reports it; with /dev/null in its place, the write would silently succeed.
//! The binary calls [`record_at_start`] from `.init_array`, before the runtime's own start.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

static CLOSED: AtomicU8 = AtomicU8::new(0);
static SIGPIPE_IGNORED: AtomicBool = AtomicBool::new(false);

/// Notes which of fds 0-2 are closed, and whether SIGPIPE is ignored (Rust's runtime ignores it for
/// itself before `main`; a command started by a caller that ignored it inherits that, as it would without
/// gpudoc). Called before `main` (see the binary's `.init_array` entry).
pub extern "C" fn record_at_start() {
    let mut closed = 0;
    for fd in 0..3 {
        // SAFETY: F_GETFD only asks about the descriptor.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    CLOSED.store(closed, Ordering::SeqCst);
    // SAFETY: sigaction with a null new action only reads the current one.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    if unsafe { libc::sigaction(libc::SIGPIPE, std::ptr::null(), &mut old) } == 0 {
        SIGPIPE_IGNORED.store(old.sa_sigaction == libc::SIG_IGN, Ordering::SeqCst);
    }
}

/// Whether SIGPIPE was ignored when gpudoc started.
pub fn sigpipe_ignored_at_start() -> bool {
    SIGPIPE_IGNORED.load(Ordering::SeqCst)
}

/// Whether `fd` (0, 1 or 2) was closed when gpudoc started.
pub fn closed_at_start(fd: i32) -> bool {
    (0..3).contains(&fd) && CLOSED.load(Ordering::SeqCst) & (1 << fd) != 0
}

/// The standard fds closed at start, for the command to find closed too.
pub fn closed() -> Vec<i32> {
    (0..3).filter(|&fd| closed_at_start(fd)).collect()
}
