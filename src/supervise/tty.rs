//! The command's own terminal, when gpudoc runs in the foreground of a terminal with its stdout on it (an
//! interactive shell, `ssh -t`, `tmux new`, `docker run -t`, also with `2> log` or `< data`).
//!
//! The command gets a pseudo-terminal with the user's terminal's modes and size, as its controlling
//! terminal and as each of its standard fds that is the user's terminal (the others stay as they are: a
//! `2> log` is the command's own file), in a session gpudoc leads ([`super::guard::split`] made it) and a
//! process group of its own, in that terminal's foreground. The user's terminal is put in raw mode and
//! every byte passes through gpudoc both ways ([`relay`]): the command's own line discipline echoes what is
//! typed, turns Ctrl-C, Ctrl-\ and Ctrl-Z into signals for its foreground group, and sees the modes the
//! command sets (a full-screen program's single keys: curses sets the modes of the terminal it writes to
//! and reads fd 0, `more` reads its stderr); gpudoc sees every byte that reaches the screen, so its live
//! line is never drawn over a prompt or over what the user types. This is what `script`, `ssh`, `sudo` and
//! `tmux` do.
//!
//! Where stdout is not the terminal (`| tee log`) the command shares the user's terminal instead: the
//! terminal stays in its own modes, since what the pipe's reader writes to it never passes through gpudoc.
//!
//! What this changes: type-ahead while the command runs goes to the command (or is lost with it), as under
//! `script` or `ssh`; `tcgetattr` on the command's terminal shows its own pseudo-terminal.

use super::Writes;
use super::observe::{Stream, Watching};
use super::streams::{Moved, Terminal, copy_chunk};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// The user's terminal as gpudoc found it: its modes (given back at the end, and whenever the job
/// stops), and the descriptor gpudoc sets them and reads the keys through.
#[derive(Clone, Copy)]
pub struct Saved {
    termios: libc::termios,
    /// fd 0, or gpudoc's own descriptor of the terminal when stdin is not on it (`< data`).
    fd: RawFd,
}

/// The user's terminal, and which of gpudoc's standard fds are on it.
#[derive(Clone, Copy)]
pub struct Found {
    pub saved: Saved,
    /// fds 0, 1 and 2: each is the terminal (fd 1 always is).
    pub on: [bool; 3],
}

impl Found {
    /// Whether stdout and stderr are both the terminal: every byte that reaches the screen passes through
    /// gpudoc, and its words on stderr reach the terminal it set raw.
    pub fn screen_is_ours(&self) -> bool {
        self.on[1] && self.on[2]
    }
}

/// The user's terminal, if gpudoc was started in its foreground with stdout on it. Called before gpudoc
/// splits (single-threaded), while the terminal is still gpudoc's controlling terminal.
pub fn detect() -> Option<Found> {
    let rdev = |fd| {
        // SAFETY: isatty and fstat on an fd of ours only read.
        unsafe {
            if libc::isatty(fd) != 1 {
                return None;
            }
            let mut st: libc::stat = std::mem::zeroed();
            (libc::fstat(fd, &mut st) == 0).then_some(st.st_rdev)
        }
    };
    let dev = rdev(1)?;
    // SAFETY: tcgetpgrp/getpgrp only read; tcgetpgrp fails unless fd 1 is our controlling terminal.
    if unsafe { libc::tcgetpgrp(1) != libc::getpgrp() } {
        return None;
    }
    let on = [rdev(0) == Some(dev), true, rdev(2) == Some(dev)];
    let fd = if on[0] { 0 } else { open_own()? };
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr fills our struct.
    (unsafe { libc::tcgetattr(fd, &mut termios) } == 0).then_some(Found {
        saved: Saved { termios, fd },
        on,
    })
}

/// A descriptor of gpudoc's own of its controlling terminal (the one on fd 1: `tcgetpgrp` said so), kept
/// for gpudoc's whole life: the keys are read through it when stdin is elsewhere. Not the command's
/// (close-on-exec). `/dev/tty`'s own device number is not the terminal's, so it is not compared.
fn open_own() -> Option<RawFd> {
    // SAFETY: open with a constant path.
    let fd = unsafe { libc::open(c"/dev/tty".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// Whether the user's terminal's foreground is the guard's process group: only then are the terminal's
/// modes gpudoc's to change. From the background (`bg` after a Ctrl-Z) a change would stop the guard
/// (SIGTTOU) and set modes under the shell that has the terminal. Asked in gpudoc after it split, `guard`
/// is the guard's pid (`guard::Start::guard`, its one owner); in the guard itself, or where gpudoc did
/// not split, `None`: the asker's own process group is the one.
pub fn in_foreground(guard: Option<i32>) -> bool {
    match guard {
        // gpudoc leads a session of its own: the terminal is the guard's.
        Some(guard) => procfs::process::Process::new(guard)
            .and_then(|p| p.stat())
            .is_ok_and(|st| st.tpgid == st.pgrp),
        // SAFETY: tcgetpgrp and getpgrp only read.
        None => unsafe { libc::tcgetpgrp(0) == libc::getpgrp() },
    }
}

impl Saved {
    /// Gives the user's terminal its modes back, if gpudoc is in its foreground: a background gpudoc
    /// never touches the modes (the shell that has the terminal set its own, and the guard would stop
    /// for it, SIGTTOU: "Stopped (tty output)" where the job was done). `guard` as [`in_foreground`]
    /// takes it.
    pub fn restore(&self, guard: Option<i32>) {
        if in_foreground(guard) {
            // SAFETY: tcsetattr with modes read from the same terminal.
            unsafe { libc::tcsetattr(self.fd, libc::TCSADRAIN, &self.termios) };
        }
        crate::say::set_raw_terminal(false);
    }

    /// Raw mode: every byte typed reaches gpudoc as it is, every byte written reaches the screen as it is.
    fn raw(&self) {
        let t = self.raw_modes();
        // SAFETY: tcsetattr applies our modes to our terminal.
        unsafe { libc::tcsetattr(self.fd, libc::TCSADRAIN, &t) };
    }

    /// The modes gpudoc sets while the command runs.
    fn raw_modes(&self) -> libc::termios {
        let mut t = self.termios;
        // SAFETY: cfmakeraw edits our copy.
        unsafe { libc::cfmakeraw(&mut t) };
        t
    }

    /// The descriptor of the terminal gpudoc holds.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The saved modes as text, for the job keeper's command line ([`Saved::from_text`]).
    pub fn to_text(&self) -> String {
        // SAFETY: termios is plain data; we read its bytes.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&self.termios as *const libc::termios).cast::<u8>(),
                std::mem::size_of::<libc::termios>(),
            )
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Modes written by [`Saved::to_text`] (by the same binary), of the terminal at `fd`.
    pub fn from_text(text: &str, fd: RawFd) -> Option<Saved> {
        let n = std::mem::size_of::<libc::termios>();
        if text.len() != 2 * n || !text.is_ascii() {
            return None;
        }
        let bytes = (0..n)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        // SAFETY: any bytes make a termios (plain integers); the length is the struct's.
        let termios = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<libc::termios>()) };
        Some(Saved { termios, fd })
    }

    /// Gives the terminal its modes back if it still has the ones gpudoc set (no shell or program has
    /// set its own since): what the job keeper does when every gpudoc process was killed at once.
    pub fn restore_if_raw(&self) {
        let fd = self.fd;
        let raw = self.raw_modes();
        // SAFETY: tcgetattr fills our struct; tcsetattr applies saved modes to the same terminal.
        unsafe {
            let mut now: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(fd, &mut now) == 0 && same_modes(&now, &raw) {
                libc::tcsetattr(fd, libc::TCSADRAIN, &self.termios);
            }
        }
    }
}

fn same_modes(a: &libc::termios, b: &libc::termios) -> bool {
    a.c_iflag == b.c_iflag
        && a.c_oflag == b.c_oflag
        && a.c_cflag == b.c_cflag
        && a.c_lflag == b.c_lflag
        && a.c_cc == b.c_cc
}

/// What the main thread and the relay tell each other.
pub struct Ctl {
    /// The relay reads the user's keys (off while the job is stopped or in the background).
    input: AtomicBool,
    /// Ctrl-C keys typed while they made a signal, as they came: when, and whether the job had written
    /// since the one before (it answered it). Keys read together are one press: the job had no time to
    /// answer between them.
    pub presses: Mutex<Vec<(Instant, bool)>>,
    writes: Mutex<Writes>,
    /// The user's terminal hung up (reading it ended).
    pub hung_up: AtomicBool,
    /// The user's terminal, where the keys are read.
    keys: RawFd,
    wake_r: OwnedFd,
    wake_w: OwnedFd,
}

impl Ctl {
    fn wake(&self) {
        // SAFETY: a one-byte write to our non-blocking pipe.
        unsafe { libc::write(self.wake_w.as_raw_fd(), b"w".as_ptr().cast(), 1) };
    }
}

/// The command's terminal.
pub struct Pty {
    pub master: Arc<OwnedFd>,
    pub ctl: Arc<Ctl>,
    found: Found,
    /// The guard's pid, which stands for the job at the user's terminal.
    guard: i32,
}

impl Pty {
    /// A pseudo-terminal with the user's terminal's modes and size, made gpudoc's controlling terminal
    /// (gpudoc leads its session), and the slave end for the command. The user's terminal goes raw;
    /// `guard` is the guard's pid, whose process group has the user's terminal.
    pub fn open(found: Found, guard: i32) -> io::Result<(Pty, OwnedFd)> {
        let saved = found.saved;
        let ws = super::streams::winsize(saved.fd);
        let termios = nix::sys::termios::Termios::from(saved.termios);
        let pty = nix::pty::openpty(ws.as_ref(), Some(&termios))?;
        super::streams::set_cloexec(pty.master.as_raw_fd());
        super::streams::set_cloexec(pty.slave.as_raw_fd());
        set_nonblocking(pty.master.as_raw_fd());
        // SAFETY: TIOCSCTTY on a terminal we opened, as the leader of a session without one.
        if unsafe { libc::ioctl(pty.slave.as_raw_fd(), libc::TIOCSCTTY, 0) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let (wake_r, wake_w) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let ctl = Arc::new(Ctl {
            input: AtomicBool::new(true),
            presses: Mutex::new(Vec::new()),
            writes: Mutex::new(Writes::default()),
            hung_up: AtomicBool::new(false),
            keys: saved.fd,
            wake_r,
            wake_w,
        });
        let slave = pty.slave;
        let pty = Pty {
            master: Arc::new(pty.master),
            ctl,
            found,
            guard,
        };
        pty.raw();
        Ok((pty, slave))
    }

    /// Which of the command's standard fds are its terminal: those of gpudoc's that are the user's.
    pub fn on(&self) -> [bool; 3] {
        self.found.on
    }

    /// What the command writes to its terminal: its stdout, and its stderr if that is the terminal too.
    pub fn stream(&self) -> Stream {
        if self.found.on[2] {
            Stream::Both
        } else {
            Stream::Stdout
        }
    }

    /// The user's terminal in raw mode; gpudoc's own words on stderr end their lines with `\r\n` when
    /// stderr is that terminal (never in a `2> log`).
    fn raw(&self) {
        self.found.saved.raw();
        crate::say::set_raw_terminal(self.found.on[2]);
    }

    /// The command's terminal takes the user's terminal's size (the kernel tells its foreground group).
    pub fn resize(&self) {
        if let Some(ws) = super::streams::winsize(self.found.saved.fd) {
            // SAFETY: TIOCSWINSZ reads a winsize.
            unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        }
    }

    /// Makes process group `pgid` the command's terminal's foreground.
    pub fn foreground(&self, pgid: i32) {
        // SAFETY: tcsetpgrp on our controlling terminal (SIGTTOU is blocked in gpudoc).
        unsafe { libc::tcsetpgrp(self.master.as_raw_fd(), pgid) };
    }

    /// The job stopped (or gpudoc is done): the user's terminal gets its modes back and gpudoc stops
    /// reading it, so the shell has it to itself.
    pub fn stand_aside(&self) {
        self.ctl.input.store(false, Ordering::SeqCst);
        self.ctl.wake();
        self.found.saved.restore(Some(self.guard));
    }

    /// The job goes on in the foreground: raw mode and the keys again, at the terminal's current size.
    pub fn take_back(&self) {
        self.raw();
        self.resize();
        self.ctl.input.store(true, Ordering::SeqCst);
        self.ctl.wake();
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
}

/// Keys typed but not yet taken by the command's terminal, at most.
const PENDING_KEYS: usize = 64 * 1024;

/// How one relay ended.
pub enum Ended {
    /// Every holder of the command's terminal closed it.
    Closed,
    /// The command is gone and its terminal was quiet, but something it started still holds it.
    StillHeld,
}

/// Passes bytes both ways between the user's terminal and the command's until every holder of the
/// command's terminal has closed it (or, once the command exited, it stays quiet): the command's output
/// (`stream`) to fd 1 through the live line's [`Terminal`], seen by the observer; the user's keys while
/// [`Ctl`] allows, on a thread of their own, so that a key (a Ctrl-C) never waits behind output a stalled
/// terminal (an ssh connection that stopped reading) does not take. If the user's terminal goes away, its
/// output is read and dropped, so the command never blocks writing.
pub fn relay(
    master: &OwnedFd,
    ctl: &Ctl,
    stream: Stream,
    term: Option<&Terminal>,
    observer: &Watching,
    exited: &AtomicBool,
) -> Ended {
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let keys = std::thread::Builder::new()
            .name("gpudoc-keys".into())
            .spawn_scoped(scope, || pass_keys(master, ctl, &done));
        let end = pass_output(master, stream, term, observer, exited);
        done.store(true, Ordering::SeqCst);
        ctl.wake();
        if let Ok(k) = keys {
            let _ = k.join();
        }
        end
    })
}

/// The command's output to the user's terminal, until its terminal is closed or quiet after its exit.
fn pass_output(
    master: &OwnedFd,
    stream: Stream,
    term: Option<&Terminal>,
    observer: &Watching,
    exited: &AtomicBool,
) -> Ended {
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    let mut buf = vec![0u8; 64 * 1024];
    let mut screen_gone = false;
    let mut quiet_since: Option<Instant> = None;
    loop {
        let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
        let from_job = match poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(_) => fds[0].revents().is_some_and(|r| {
                r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR)
            }),
            Err(_) => continue,
        };
        if from_job {
            let dest = (!screen_gone).then_some(&mut *out);
            match pass(master.as_fd(), dest, term, &mut buf) {
                Moved::Bytes(n, passed) => {
                    screen_gone |= !passed;
                    quiet_since = None;
                    // gpudoc's words go where stderr goes: they mind the screen's line only there.
                    if n > 0 && stream == Stream::Both {
                        crate::say::set_mid_line(buf[n - 1] != b'\n');
                    }
                    if let Some(obs) = observer.lock().unwrap().as_mut() {
                        obs.feed(stream, &buf[..n], Instant::now());
                    }
                }
                Moved::End => return Ended::Closed,
                Moved::Retry | Moved::NotPipes => {}
            }
        } else if exited.load(Ordering::SeqCst) {
            let since = *quiet_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= super::streams::DRAIN_QUIET {
                return Ended::StillHeld;
            }
        }
    }
}

/// The user's keys to the command's terminal while [`Ctl`] allows, until `done`.
fn pass_keys(master: &OwnedFd, ctl: &Ctl, done: &AtomicBool) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut keys: Vec<u8> = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let reading = ctl.input.load(Ordering::SeqCst)
            && !ctl.hung_up.load(Ordering::SeqCst)
            && keys.len() < PENDING_KEYS;
        let Some((to_job, woken, typed)) = wait(
            master.as_fd(),
            ctl.wake_r.as_fd(),
            !keys.is_empty(),
            reading.then_some(ctl.keys),
        ) else {
            continue;
        };
        if woken {
            drain_pipe(ctl.wake_r.as_fd());
        }
        if typed {
            take_keys(master.as_raw_fd(), ctl, &mut keys, &mut buf);
        }
        if to_job && !keys.is_empty() {
            give_keys(master.as_raw_fd(), &mut keys);
        }
    }
}

/// Waits for room for keys, a wake-up or a key (on the user's terminal `reading`, if given): which are
/// ready.
fn wait(
    master: BorrowedFd,
    wake: BorrowedFd,
    keys_waiting: bool,
    reading: Option<RawFd>,
) -> Option<(bool, bool, bool)> {
    let room = if keys_waiting {
        PollFlags::POLLOUT
    } else {
        PollFlags::empty()
    };
    let mut fds = vec![
        PollFd::new(master, room),
        PollFd::new(wake, PollFlags::POLLIN),
    ];
    if let Some(fd) = reading {
        // SAFETY: the user's terminal's descriptor stays open for gpudoc's whole life.
        fds.push(PollFd::new(
            unsafe { BorrowedFd::borrow_raw(fd) },
            PollFlags::POLLIN,
        ));
    }
    match poll(&mut fds, PollTimeout::from(100u16)) {
        Ok(0) => Some((false, false, false)),
        Ok(_) => {
            let got = |i: usize, f: PollFlags| {
                fds.get(i)
                    .and_then(|p| p.revents())
                    .is_some_and(|r| r.intersects(f))
            };
            let hup = PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR;
            Some((
                got(0, PollFlags::POLLOUT),
                got(1, PollFlags::POLLIN),
                reading.is_some() && got(2, hup),
            ))
        }
        Err(_) => None,
    }
}

/// One chunk of the command's output to the screen (or, once the screen is gone, nowhere).
fn pass(
    master: BorrowedFd,
    dest: Option<&mut std::fs::File>,
    term: Option<&Terminal>,
    buf: &mut [u8],
) -> Moved {
    match dest {
        Some(out) => copy_chunk(master, out, term, buf),
        None => match nix::unistd::read(master, buf) {
            Ok(0) => Moved::End,
            Ok(n) => Moved::Bytes(n, false),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => Moved::Retry,
            Err(_) => Moved::End,
        },
    }
}

/// Reads what the user typed; counts Ctrl-Cs that make a signal on the command's terminal, and stops
/// reading after a Ctrl-Z (the shell's next keys are not the job's).
fn take_keys(master: RawFd, ctl: &Ctl, keys: &mut Vec<u8>, buf: &mut [u8]) {
    let room = PENDING_KEYS.saturating_sub(keys.len()).min(buf.len());
    // SAFETY: read into our buffer from the user's terminal.
    let n = unsafe { libc::read(ctl.keys, buf.as_mut_ptr().cast(), room) };
    if n <= 0 {
        let e = io::Error::last_os_error();
        if n == 0 || !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
            ctl.hung_up.store(true, Ordering::SeqCst);
        }
        return;
    }
    let typed = &buf[..n as usize];
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: tcgetattr on the master reads the slave's modes (the command's).
    if unsafe { libc::tcgetattr(master, &mut t) } == 0 && t.c_lflag & libc::ISIG != 0 {
        let intr = t.c_cc[libc::VINTR];
        let susp = t.c_cc[libc::VSUSP];
        if intr != 0 && typed.contains(&intr) {
            let answered = ctl.writes.lock().unwrap().wrote();
            ctl.presses.lock().unwrap().push((Instant::now(), answered));
        }
        if susp != 0 && typed.contains(&susp) {
            ctl.input.store(false, Ordering::SeqCst);
        }
    }
    keys.extend_from_slice(typed);
}

/// Gives the command's terminal what it takes of the keys waiting.
fn give_keys(master: RawFd, keys: &mut Vec<u8>) {
    // SAFETY: a non-blocking write from our buffer.
    let n = unsafe { libc::write(master, keys.as_ptr().cast(), keys.len()) };
    if n > 0 {
        keys.drain(..n as usize);
    }
}

fn drain_pipe(fd: BorrowedFd) {
    let mut b = [0u8; 64];
    while matches!(nix::unistd::read(fd, &mut b), Ok(n) if n > 0) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_foreground_is_asked_of_the_guard_it_is_given() {
        // A guard that is gone stands for nothing at the terminal.
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let pid = gone.id() as i32;
        gone.wait().unwrap();
        assert!(!in_foreground(Some(pid)));
        // A living one is asked of its own process group, as /proc has it.
        let me = std::process::id() as i32;
        let st = procfs::process::Process::new(me).unwrap().stat().unwrap();
        assert_eq!(in_foreground(Some(me)), st.tpgid == st.pgrp);
    }
}
