//! The command's output: how its stdout and stderr are wired, and the pumps that pass every byte through
//! unchanged while the OOM scanner reads along.
//!
//! - A stream that is a terminal gets a pseudo-terminal of its own (raw mode, the terminal's size), so the
//!   command still sees a terminal and prints colours and progress bars.
//! - A stream that is a regular file (`> log`) is the command's own, as without gpudoc: gpudoc reads the
//!   file behind it ([`follow`]), so the output costs nothing and its order is the command's.
//! - A stdout that is a character device other than a terminal (`> /dev/null`) is the command's own too,
//!   and not read.
//! - Anything else (a pipe to `tee` or a CI runner, a stderr sent to `/dev/null`) gets a pipe that gpudoc
//!   copies on: inside the kernel (tee(2)) where the destination is a pipe too, gpudoc reading the bytes
//!   only to scan them.
//! - When stdout and stderr are the same file (`2>&1`), the command gets one channel for both, so the
//!   order of its writes is kept exactly.
//! - The terminal is shared with gpudoc's live line ([`Terminal`]): the command's bytes go out as they
//!   came, and the live line is drawn only on a line the command has finished.

use super::observe::{Stream, Watching};
use crate::say::{wait_writable, write_all};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one of gpudoc's output fds is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Kind {
    Terminal,
    /// A regular file.
    File,
    /// A character device that is not a terminal (`/dev/null`): as stdout, the command's own.
    Device,
    /// A pipe, a socket: anything else.
    #[default]
    Other,
    /// Closed when gpudoc started: the command finds it closed too.
    Closed,
}

/// What gpudoc's own stdout and stderr are, as settings found them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Wiring {
    pub stdout: Kind,
    pub stderr: Kind,
    /// fd 1 and fd 2 are the same file (a terminal, a pipe or a file given as `2>&1`).
    pub shared: bool,
}

impl Wiring {
    /// Reads fds 1 and 2 of this process.
    pub fn of_this_process(stdout_tty: bool, stderr_tty: bool) -> Wiring {
        // SAFETY: fds 1 and 2 stay open for gpudoc's whole life.
        let stat = |fd| nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) }).ok();
        let kind = |fd, tty: bool, st: &Option<libc::stat>| match st {
            _ if crate::stdfds::closed_at_start(fd) => Kind::Closed,
            _ if tty => Kind::Terminal,
            Some(s) if s.st_mode & libc::S_IFMT == libc::S_IFREG => Kind::File,
            Some(s) if s.st_mode & libc::S_IFMT == libc::S_IFCHR => Kind::Device,
            _ => Kind::Other,
        };
        let (a, b) = (stat(1), stat(2));
        let (stdout, stderr) = (kind(1, stdout_tty, &a), kind(2, stderr_tty, &b));
        let id = |s: &Option<libc::stat>| s.map(|s| (s.st_dev, s.st_ino));
        Wiring {
            stdout,
            stderr,
            shared: id(&a).is_some()
                && id(&a) == id(&b)
                && stdout == stderr
                // A device keeps no order between its writers (`&> /dev/null`): see `channel`.
                && !matches!(stdout, Kind::Closed | Kind::Device),
        }
    }
}

/// The terminal the command and gpudoc's live line share. The live line is drawn only when the command
/// has finished its line (its last byte was a newline) and has been quiet a while; it is cleared before
/// the command's next byte, so the command's lines, progress bars (`\r`) and partial lines reach the
/// terminal exactly as they would without gpudoc.
pub struct Terminal {
    state: Mutex<TermState>,
}

struct TermState {
    at_line_start: bool,
    drawn: bool,
    last_output: Instant,
}

/// How long the command must be quiet before the live line is drawn.
pub const QUIET_BEFORE_DRAW: Duration = Duration::from_millis(500);
const CLEAR: &[u8] = b"\r\x1b[K";

impl Default for Terminal {
    fn default() -> Self {
        Terminal {
            state: Mutex::new(TermState {
                at_line_start: true,
                drawn: false,
                last_output: Instant::now(),
            }),
        }
    }
}

impl Terminal {
    /// Writes the command's bytes to `out`, clearing the live line first if it is drawn.
    fn pass(&self, out: &mut std::fs::File, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock().unwrap();
        if s.drawn {
            s.drawn = false;
            let _ = crate::say::to_fd(2, CLEAR);
        }
        let r = write_all(out, bytes);
        if let Some(&last) = bytes.last() {
            s.at_line_start = last == b'\n';
        }
        s.last_output = Instant::now();
        r
    }

    /// Draws (or redraws) `line` on stderr, if the command's last line is finished and it has been quiet.
    /// `line` is cut to `width - 1` columns so it never wraps.
    pub fn draw(&self, line: &str, width: usize) {
        let mut s = self.state.lock().unwrap();
        if !s.at_line_start || s.last_output.elapsed() < QUIET_BEFORE_DRAW {
            return;
        }
        let cut: String = line.chars().take(width.saturating_sub(1)).collect();
        let mut buf = CLEAR.to_vec();
        buf.extend_from_slice(cut.as_bytes());
        if crate::say::to_fd(2, &buf).is_ok() {
            s.drawn = true;
        }
    }

    /// Removes the live line, if drawn.
    pub fn clear(&self) {
        let mut s = self.state.lock().unwrap();
        if s.drawn {
            s.drawn = false;
            let _ = crate::say::to_fd(2, CLEAR);
        }
    }
}

/// One channel from the command, and how gpudoc sees what goes through it.
pub(super) enum Source {
    /// gpudoc copies the bytes on: from `ours` (a pseudo-terminal master or a pipe's read end) to its fd
    /// `to` (1 or 2).
    Pump {
        stream: Stream,
        ours: Arc<OwnedFd>,
        to: RawFd,
        /// A pseudo-terminal (its size follows the terminal's).
        pty: bool,
    },
    /// The command writes to gpudoc's fd (a regular file) itself; gpudoc reads the same file through
    /// `files` (descriptions of its own, see [`super::follow::open`]), from `from` on.
    Follow {
        stream: Stream,
        files: Arc<[std::fs::File]>,
        pace: super::follow::Pace,
        from: super::follow::Start,
    },
}

impl Source {
    pub(super) fn stream(&self) -> Stream {
        match self {
            Source::Pump { stream, .. } | Source::Follow { stream, .. } => *stream,
        }
    }

    /// A pseudo-terminal master and the fd whose size it follows.
    pub(super) fn pty(&self) -> Option<(Arc<OwnedFd>, RawFd)> {
        match self {
            Source::Pump {
                ours,
                to,
                pty: true,
                ..
            } => Some((ours.clone(), *to)),
            _ => None,
        }
    }

    /// The descriptions gpudoc reads a file the command writes through.
    pub(super) fn followed(&self) -> Option<Arc<[std::fs::File]>> {
        match self {
            Source::Follow { files, .. } => Some(files.clone()),
            _ => None,
        }
    }
}

/// The command's standard fds (stdin: gpudoc's own, unless given).
pub(super) struct Ends {
    pub stdin: Option<Stdio>,
    pub stdout: Stdio,
    pub stderr: Stdio,
}

/// A pipe's capacity: room for a burst of output without blocking the command.
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Makes the channels for `w`.
pub(super) fn open(w: Wiring) -> io::Result<(Vec<Source>, Ends)> {
    if w.shared {
        let (source, end) = channel(w.stdout, 1, Stream::Both)?;
        let source = source.into_iter().collect();
        let stderr = match &end {
            End::Inherit => Stdio::inherit(),
            End::Fd(fd) => Stdio::from(fd.try_clone()?),
        };
        return Ok((
            source,
            Ends {
                stdin: None,
                stdout: end.into(),
                stderr,
            },
        ));
    }
    let (out, stdout) = channel(w.stdout, 1, Stream::Stdout)?;
    let (err, stderr) = channel(w.stderr, 2, Stream::Stderr)?;
    Ok((
        out.into_iter().chain(err).collect(),
        Ends {
            stdin: None,
            stdout: stdout.into(),
            stderr: stderr.into(),
        },
    ))
}

/// The channel for stderr alone, for a command whose stdout is its own terminal ([`super::tty`]) while
/// stderr is something else (`2> log`: the command's own file, read along).
pub(super) fn open_stderr(kind: Kind) -> io::Result<(Option<Source>, Stdio)> {
    let (source, end) = channel(kind, 2, Stream::Stderr)?;
    Ok((source, end.into()))
}

/// The command's end of a channel.
enum End {
    /// gpudoc's own fd, inherited as it is.
    Inherit,
    Fd(OwnedFd),
}

impl From<End> for Stdio {
    fn from(e: End) -> Stdio {
        match e {
            End::Inherit => Stdio::inherit(),
            End::Fd(fd) => Stdio::from(fd),
        }
    }
}

/// The channel for gpudoc's fd `like`, of kind `kind`.
fn channel(kind: Kind, like: RawFd, stream: Stream) -> io::Result<(Option<Source>, End)> {
    let (source, end) = match kind {
        // Inherited, and closed in the command before it starts (see `stdfds`).
        Kind::Closed => return Ok((None, End::Inherit)),
        // Stdout inherited: a pipe in between made a 2 GiB write to /dev/null 4x slower, and hid from the
        // command what the device does (/dev/full's ENOSPC). What it writes there is not read; stderr,
        // where OOM reports are printed, still passes through gpudoc (below, as a pipe's).
        Kind::Device if stream == Stream::Stdout => return Ok((None, End::Inherit)),
        Kind::Terminal => {
            let (master, slave) = open_pty(like)?;
            let source = Source::Pump {
                stream,
                ours: Arc::new(master),
                to: like,
                pty: true,
            };
            (source, End::Fd(slave))
        }
        Kind::File => {
            let pace = super::follow::Pace::for_this_machine();
            match super::follow::open(like, pace.threads) {
                Ok(files) => {
                    let source = Source::Follow {
                        stream,
                        files: files.into(),
                        pace,
                        from: super::follow::output_start(like),
                    };
                    (source, End::Inherit)
                }
                // Not readable by gpudoc (another user's file): copied on instead, as a pipe is.
                Err(_) => return channel(Kind::Other, like, stream),
            }
        }
        Kind::Other | Kind::Device => {
            let (r, w) = nix::unistd::pipe()?;
            set_cloexec(r.as_raw_fd());
            set_cloexec(w.as_raw_fd());
            // SAFETY: fcntl on a pipe we own; failure leaves the default size.
            unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES) };
            let source = Source::Pump {
                stream,
                ours: Arc::new(r),
                to: like,
                pty: false,
            };
            (source, End::Fd(w))
        }
    };
    Ok((Some(source), end))
}

pub(super) fn set_cloexec(fd: RawFd) {
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

pub(super) fn winsize(fd: RawFd) -> Option<nix::pty::Winsize> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into `ws`.
    (unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0).then_some(ws)
}

/// After the command exits, output still buffered is drained; a descendant that keeps the stream open is
/// given this long of silence (and at most [`DRAIN_MAX`]) before gpudoc stops reading.
pub(super) const DRAIN_QUIET: Duration = Duration::from_millis(100);
pub const DRAIN_MAX: Duration = Duration::from_secs(2);
/// One read of a pipe or terminal: small enough that the buffer stays in the processor's cache between
/// the read and the scan.
const READ_BYTES: usize = 64 * 1024;

/// Watches one channel until it ends: copies it on ([`pump`]) or reads the file behind it ([`follow`]).
/// A channel something the command left running still holds is returned, with the fd it goes to.
pub(super) fn watch(
    src: Source,
    term: Option<Arc<Terminal>>,
    observer: Arc<Watching>,
    exited: Arc<AtomicBool>,
) -> Option<(Arc<OwnedFd>, RawFd)> {
    match src {
        Source::Pump {
            stream,
            ours,
            to,
            pty,
        } => {
            let held = pump(stream, &ours, to, (term, pty), &observer, &exited);
            held.then_some((ours, to))
        }
        Source::Follow {
            stream,
            files,
            pace,
            from,
        } => {
            super::follow::follow(stream, &files, from, &observer, &exited, (pace, DRAIN_MAX));
            None
        }
    }
}

/// Copies one channel to gpudoc's fd `to` until it ends (or, once the command exited, goes quiet),
/// showing every chunk to the observer after it was passed on. True when it stopped with something (a
/// process the command left running) still holding the channel's other end.
fn pump(
    stream: Stream,
    ours: &OwnedFd,
    to: RawFd,
    (term, pty): (Option<Arc<Terminal>>, bool),
    observer: &Watching,
    exited: &AtomicBool,
) -> bool {
    let term = term.filter(|_| pty);
    // Unbuffered: each chunk reaches the terminal as the command wrote it.
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(to) });
    let mut buf = vec![0u8; READ_BYTES];
    let mut drain_started: Option<Instant> = None;
    // Pipe to pipe, the kernel duplicates the bytes into `to` and gpudoc reads them only to scan.
    let mut by_tee = !pty;
    // A full buffer means more is waiting: read again without asking poll first.
    let mut more = false;
    // The terminal the bytes went to is gone: they are still read, so the command never blocks.
    let mut screen_gone = false;
    loop {
        if !more && !readable(ours.as_fd(), exited) {
            return still_held(ours.as_fd());
        }
        if exited.load(Ordering::SeqCst) {
            let started = *drain_started.get_or_insert_with(Instant::now);
            if started.elapsed() > DRAIN_MAX {
                return still_held(ours.as_fd());
            }
        }
        let moved = if screen_gone {
            discard_chunk(ours.as_fd(), &mut buf)
        } else if by_tee {
            tee_chunk(ours.as_fd(), out.as_fd(), &mut buf)
        } else {
            copy_chunk(ours.as_fd(), &mut out, term.as_deref(), &mut buf)
        };
        let (n, passed) = match moved {
            Moved::Bytes(n, passed) => (n, passed),
            Moved::Retry => continue,
            Moved::NotPipes => {
                by_tee = false;
                continue;
            }
            Moved::End => return false,
        };
        more = n == buf.len();
        if n > 0 && (to == 2 || stream == Stream::Both) {
            // gpudoc's own words on stderr wait for the end of the command's line (`say::between_lines`).
            crate::say::passed(buf[n - 1] == b'\n');
        }
        if let Some(obs) = observer.lock().unwrap().as_mut() {
            obs.feed(stream, &buf[..n], Instant::now());
        }
        if !passed && pty {
            // A hung-up terminal: the command learns it from its own terminal's hang-up, not by
            // blocking on a full one.
            screen_gone = true;
        } else if !passed {
            // Our reader went away (`| head`): closing our end lets the command see EPIPE as it would have.
            return false;
        }
    }
}

/// Whether a writer still holds the other end of the channel (no hang-up on ours).
fn still_held(fd: BorrowedFd) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => !fds[0]
            .revents()
            .is_some_and(|r| r.intersects(PollFlags::POLLHUP | PollFlags::POLLERR)),
        Err(_) => false,
    }
}

/// Reads one chunk and drops it.
fn discard_chunk(ours: BorrowedFd, buf: &mut [u8]) -> Moved {
    match nix::unistd::read(ours, buf) {
        Ok(0) => Moved::End,
        Ok(n) => Moved::Bytes(n, true),
        Err(Errno::EINTR | Errno::EAGAIN) => Moved::Retry,
        Err(_) => Moved::End,
    }
}

/// What one step of a pump did.
pub(super) enum Moved {
    /// `n` bytes are in the buffer (to be scanned); whether they reached the destination.
    Bytes(usize, bool),
    /// Nothing moved; try again.
    Retry,
    /// tee(2) needs a pipe on both sides: copy instead.
    NotPipes,
    /// The command's side is closed (or failed).
    End,
}

/// Reads one chunk and writes it on (through the terminal's live-line bookkeeping, if it is one).
pub(super) fn copy_chunk(
    ours: BorrowedFd,
    out: &mut std::fs::File,
    term: Option<&Terminal>,
    buf: &mut [u8],
) -> Moved {
    let n = match nix::unistd::read(ours, buf) {
        Ok(0) => return Moved::End,
        Ok(n) => n,
        Err(Errno::EINTR | Errno::EAGAIN) => return Moved::Retry,
        // EIO: every holder of the pseudo-terminal's other side closed it.
        Err(_) => return Moved::End,
    };
    let passed = match term {
        Some(t) => t.pass(out, &buf[..n]),
        None => write_all(out, &buf[..n]),
    };
    Moved::Bytes(n, passed.is_ok())
}

/// Duplicates what is waiting in `ours` into `to` in the kernel, then reads the same bytes out of `ours`
/// to scan them: one copy fewer than read and write.
fn tee_chunk(ours: BorrowedFd, to: BorrowedFd, buf: &mut [u8]) -> Moved {
    let n = match nix::fcntl::tee(ours, to, buf.len(), nix::fcntl::SpliceFFlags::empty()) {
        Ok(0) => return Moved::End,
        Ok(n) => n,
        Err(Errno::EINTR) => return Moved::Retry,
        Err(Errno::EINVAL) => return Moved::NotPipes,
        Err(Errno::EAGAIN) => {
            wait_writable(to);
            return Moved::Retry;
        }
        // EPIPE: our reader went away. What is waiting is still read, to be scanned.
        Err(_) => {
            return match nix::unistd::read(ours, buf) {
                Ok(n) if n > 0 => Moved::Bytes(n, false),
                _ => Moved::End,
            };
        }
    };
    // The `n` bytes are waiting in the pipe: read them all.
    let mut got = 0;
    while got < n {
        match nix::unistd::read(ours, &mut buf[got..n]) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    Moved::Bytes(got, true)
}

/// Waits until `fd` has data; false when the command is gone and the stream stayed quiet, or on error.
fn readable(fd: BorrowedFd, exited: &AtomicBool) -> bool {
    loop {
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(DRAIN_QUIET.as_millis() as u16)) {
            Ok(0) if exited.load(Ordering::SeqCst) => return false,
            Ok(0) | Err(Errno::EINTR) => continue,
            Err(_) => return false,
            Ok(_) => return true,
        }
    }
}
