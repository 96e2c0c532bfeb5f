//! The job keeper: what ends the job when every gpudoc process is killed at once (`pkill -9 gpudoc`).
//!
//! The command gets SIGTERM when gpudoc dies (`PR_SET_PDEATHSIG`) and the guard ends the rest when gpudoc
//! alone is killed; but when the guard is killed too, what the command started and detached (`sleep &`,
//! `setsid server`) would run on under PID 1, holding GPU memory, with nothing left that knows it was the
//! job's. So the guard starts one more small process before anything else: gpudoc executed afresh as
//! `gpu-job-keeper` (a name `pkill gpudoc` does not match), in a session of its own, holding nothing but
//! the read end of a pipe the guard writes to. Every half second it notes the guard's descendants (PID and
//! start time). When the guard leaves it says so on the pipe, and the keeper leaves too; when the pipe
//! closes without a word, the guard was killed: the keeper ends every process it noted that still runs
//! (SIGTERM, then SIGKILL after [`super::END_GRACE`]) and leaves.
//!
//! On a terminal the keeper also holds the user's terminal and the modes gpudoc found it in: when the guard
//! was killed, a terminal gpudoc left raw gets them back (a shell like dash does not repair it), unless
//! something set modes of its own since.
//!
//! What it cannot keep: a process started and detached within the last half second before the kill, and
//! one that a `kill -9 -1` ends together with the keeper.

use super::tty;
use crate::procs;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, RawFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The keeper's name (its process name and `argv[0]`) and the argument that makes gpudoc one.
pub const NAME: &str = "gpu-job-keeper";
pub const ARG: &str = "__keep-job-of";
/// The byte the guard writes when it leaves as it should.
pub const LEAVING: u8 = b'.';
/// How often the keeper notes the job's processes.
const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The fd the pipe's read end is moved to in the keeper.
const PIPE_FD: RawFd = super::helper::FIRST_FD;

/// The fd the user's terminal is given at in the keeper, on a terminal.
const TERMINAL_FD: RawFd = PIPE_FD + 1;

/// Starts the keeper for the guard `guard`, reading `pipe` (the guard keeps its other end), and holding
/// the user's terminal with the modes gpudoc found it in, if there is one. Called by the guard before
/// anything else runs.
pub fn start(guard: u32, pipe: RawFd, terminal: Option<&tty::Saved>) -> std::io::Result<()> {
    let mut args = vec![ARG.to_string(), guard.to_string()];
    let mut fds = vec![pipe];
    if let Some(t) = terminal {
        args.push(t.to_text());
        fds.push(t.fd());
    }
    super::helper::spawn(NAME, &args, fds)
}

/// The keeper: notes the guard's descendants until the guard leaves; ends them if it was killed.
pub fn run(args: &[std::ffi::OsString]) -> ExitCode {
    super::helper::set_name(NAME);
    let Some(guard) = args.first().and_then(|a| a.to_str()?.parse::<u32>().ok()) else {
        return ExitCode::from(crate::exit::USAGE);
    };
    let terminal = args
        .get(1)
        .and_then(|a| tty::Saved::from_text(a.to_str()?, TERMINAL_FD));
    let me = std::process::id();
    // pid -> start ticks of every process of the job seen.
    let mut noted: BTreeMap<u32, u64> = BTreeMap::new();
    loop {
        for p in procs::descendants(guard) {
            if p.pid != me {
                noted.insert(p.pid, p.start_ticks);
            }
        }
        match guard_news() {
            News::Nothing => {}
            News::Leaving => return ExitCode::SUCCESS,
            News::Killed => {
                if let Some(t) = &terminal {
                    t.restore_if_raw();
                }
                end(&noted);
                return ExitCode::SUCCESS;
            }
        }
    }
}

enum News {
    Nothing,
    Leaving,
    Killed,
}

/// Waits up to [`LOOK_EVERY`] for word from the guard.
fn guard_news() -> News {
    // SAFETY: the pipe's read end stays open for the keeper's life.
    let fd = unsafe { BorrowedFd::borrow_raw(PIPE_FD) };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let wait = PollTimeout::try_from(LOOK_EVERY.as_millis() as i32).unwrap_or(PollTimeout::NONE);
    if !matches!(poll(&mut fds, wait), Ok(n) if n > 0) {
        return News::Nothing;
    }
    let mut byte = [0u8; 1];
    match nix::unistd::read(fd, &mut byte) {
        Ok(1) if byte[0] == LEAVING => News::Leaving,
        Ok(_) => News::Killed,
        Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => News::Nothing,
        Err(_) => News::Killed,
    }
}

/// Ends every noted process that still runs (the same process: same start time): SIGTERM, then
/// SIGKILL for what is left after the grace.
fn end(noted: &BTreeMap<u32, u64>) {
    let alive = || {
        noted
            .iter()
            .filter(|&(&pid, &ticks)| {
                procs::read(pid).is_some_and(|p| p.start_ticks == ticks && !p.zombie)
            })
            .map(|(&pid, _)| pid as i32)
            .collect::<Vec<_>>()
    };
    for pid in alive() {
        // SAFETY: kill with a pid we checked is the process we noted.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let until = Instant::now() + super::END_GRACE;
    while Instant::now() < until && !alive().is_empty() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for pid in alive() {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
}
