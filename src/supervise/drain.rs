//! What the command leaves running keeps a place to write after gpudoc has gone.
//!
//! Without gpudoc, a process the command started in the background (`server &`) writes to the command's
//! own stdout: the terminal, or the pipe to `tee` or to a CI runner. Under gpudoc it writes into gpudoc's
//! pipe or pseudo-terminal, and once gpudoc exits nobody would read it: the next write would end it with
//! SIGPIPE, or block it for good. So when gpudoc is done and something still holds one of its channels,
//! it hands the channel to a drainer: gpudoc itself, executed afresh as `gpudoc __gpudoc-drain`, in a
//! session of its own, with no descriptor but the channels and their destinations, copying each on until
//! every writer has closed it (or its destination went away, which the writer then learns as it would
//! have). A pipeline after gpudoc (`| cat`) therefore ends when the last writer closes, as without
//! gpudoc.

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, RawFd};
use std::process::ExitCode;

/// The first argument that makes gpudoc a drainer.
pub const ARG: &str = "__gpudoc-drain";

/// Starts a drainer for `pairs` (the channel gpudoc read, the fd it wrote to). It is not waited for.
pub fn hand_over(pairs: &[(RawFd, RawFd)]) -> io::Result<()> {
    if pairs.is_empty() {
        return Ok(());
    }
    let first = super::helper::FIRST_FD;
    let mut args = vec![ARG.to_string()];
    args.extend(
        (0..pairs.len() as RawFd).map(|i| format!("{}:{}", first + 2 * i, first + 2 * i + 1)),
    );
    let fds = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    super::helper::spawn("gpudoc", &args, fds)
}

/// The drainer: copies each `src:dst` pair of fds on until its writers are gone.
pub fn run(args: &[std::ffi::OsString]) -> ExitCode {
    super::helper::set_name("gpudoc");
    let mut pairs: Vec<(RawFd, RawFd)> = args
        .iter()
        .filter_map(|a| {
            let (s, d) = a.to_str()?.split_once(':')?;
            Some((s.parse().ok()?, d.parse().ok()?))
        })
        .collect();
    let mut buf = vec![0u8; 64 * 1024];
    while !pairs.is_empty() {
        let mut fds: Vec<PollFd> = pairs
            .iter()
            // SAFETY: the pairs' fds stay open until they are dropped from the list.
            .map(|&(s, _)| PollFd::new(unsafe { BorrowedFd::borrow_raw(s) }, PollFlags::POLLIN))
            .collect();
        if poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        let mut i = 0;
        pairs.retain(|&(src, dst)| {
            let keep = !ready[i] || copy_once(src, dst, &mut buf);
            i += 1;
            if !keep {
                // SAFETY: closing the source we own: its writers learn that nobody reads it.
                unsafe { libc::close(src) };
            }
            keep
        });
    }
    ExitCode::SUCCESS
}

/// One chunk from `src` to `dst`; false once `src` has no writer left or `dst` takes no more.
fn copy_once(src: RawFd, dst: RawFd, buf: &mut [u8]) -> bool {
    // SAFETY: reading into our buffer from an fd we own.
    let n = unsafe { libc::read(src, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return io::Error::last_os_error().raw_os_error() == Some(libc::EINTR);
    }
    if n == 0 {
        return false;
    }
    let mut out = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(dst) });
    crate::say::write_all(&mut out, &buf[..n as usize]).is_ok()
}
