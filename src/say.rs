//! gpudoc's own words, on stderr, never on stdout (the command's, under `gpudoc run`). They never cost the
//! job anything: a reader that went away (`2>&1 | head`) loses them, and a terminal or pipe left non-blocking
//! by whoever started gpudoc delays them. std's `eprint!` would panic on either, and gpudoc would leave with
//! 101 instead of the command's exit code. The command's own bytes go through [`write_all`] too.

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, RawFd};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Formats and writes to stderr, like `eprint!`, never failing.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => { $crate::say::to_stderr(&format!($($arg)*)) };
}

/// Formats and writes a line to stderr, like `eprintln!`, never failing.
#[macro_export]
macro_rules! sayln {
    ($($arg:tt)*) => { $crate::say::to_stderr(&format!("{}\n", format_args!($($arg)*))) };
}

/// The terminal gpudoc writes to is in raw mode (the command has a terminal of its own, see
/// `supervise::tty`): lines end with `\r\n`, as the terminal's own output processing would have made them.
static RAW: AtomicBool = AtomicBool::new(false);

/// The command left the screen in the middle of a line (gpudoc sees every byte that reaches it only when
/// the command has a terminal of its own): gpudoc's own words start on a line of their own.
static MID_LINE: AtomicBool = AtomicBool::new(false);

/// Says whether gpudoc's terminal is in raw mode now.
pub fn set_raw_terminal(raw: bool) {
    RAW.store(raw, Ordering::SeqCst);
}

/// Says whether the last byte the command put on the screen ended a line.
pub fn set_mid_line(mid: bool) {
    MID_LINE.store(mid, Ordering::SeqCst);
    passed(!mid);
}

/// Whether the command's last byte on gpudoc's stderr that gpudoc passed on (on its own terminal or
/// through a pipe) left a line unfinished, and when it passed, in milliseconds since [`epoch`].
static TAIL_MID: AtomicBool = AtomicBool::new(false);
static TAIL_AT_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// The command's bytes bound for gpudoc's stderr passed on, the last of them ending a line or not.
pub fn passed(line_ended: bool) {
    TAIL_MID.store(!line_ended, Ordering::SeqCst);
    TAIL_AT_MS.store(epoch().elapsed().as_millis() as u64, Ordering::SeqCst);
}

/// Writes `text` (whole lines) to stderr only between the command's lines: its last line is finished
/// and it has written nothing for `quiet`, so the words never land inside a partial line or a progress
/// bar. False, writing nothing, when that is not so now: the caller tries again later. Where the command
/// writes its stderr to a file itself (`2> log`), gpudoc reads the file's end to know.
pub fn between_lines(text: &str, quiet: Duration) -> bool {
    let since = epoch()
        .elapsed()
        .saturating_sub(Duration::from_millis(TAIL_AT_MS.load(Ordering::SeqCst)));
    let passing = TAIL_AT_MS.load(Ordering::SeqCst) > 0;
    if (passing && (TAIL_MID.load(Ordering::SeqCst) || since < quiet)) || !file_between_lines(quiet)
    {
        return false;
    }
    if RAW.load(Ordering::SeqCst) {
        // On the command's own terminal the live line may be drawn: cleared first (it is drawn again
        // on its next tick). Never in a file or a pipe, where the escape would stay in the log.
        to_stderr(&format!("\r\x1b[K{text}"));
    } else {
        to_stderr(text);
    }
    true
}

/// Where stderr is a regular file: its last byte ends a line and it was last written `quiet` ago or more
/// (its modification time). True where it is no file, or one gpudoc cannot read.
fn file_between_lines(quiet: Duration) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return true;
    };
    if !meta.is_file() || meta.len() == 0 {
        return true;
    }
    let written = meta
        .modified()
        .ok()
        .and_then(|m| m.elapsed().ok())
        .unwrap_or(Duration::MAX);
    let mut byte = [0u8];
    let ends_line = std::fs::File::open("/proc/self/fd/2")
        .and_then(|f| f.read_exact_at(&mut byte, meta.len() - 1))
        .map_or(true, |_| byte[0] == b'\n');
    ends_line && written >= quiet
}

fn lines(text: &str) -> std::borrow::Cow<'_, str> {
    let fresh = MID_LINE.swap(false, Ordering::SeqCst) && !text.is_empty();
    let text: std::borrow::Cow<'_, str> = if fresh {
        format!("\n{text}").into()
    } else {
        text.into()
    };
    if RAW.load(Ordering::SeqCst) && text.contains('\n') {
        text.replace('\n', "\r\n").into()
    } else {
        text
    }
}

/// Writes `text` to gpudoc's stderr; what cannot be written is dropped.
pub fn to_stderr(text: &str) {
    let _ = to_fd(2, lines(text).as_bytes());
}

/// Writes to one of gpudoc's standard fds, unbuffered, without closing it.
pub fn to_fd(fd: RawFd, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: fds 1 and 2 stay open for gpudoc's whole life; ManuallyDrop leaves them open.
    let mut f = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    write_all(&mut f, bytes)
}

/// `write_all`, waiting (rather than failing) when the fd was left non-blocking by whoever started gpudoc.
pub fn write_all(out: &mut std::fs::File, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match out.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(out.as_fd()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits (at most a tenth of a second at a time) until `fd` takes more bytes.
pub fn wait_writable(fd: BorrowedFd) {
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    let _ = poll(&mut fds, PollTimeout::from(100u16));
}
