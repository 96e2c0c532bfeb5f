//! The one way gpudoc writes what a user asked for (a report, a trace, a baseline, JUnit, an export): a
//! [`Target`] is stdout or a path, and a path is written as what it names.
//!
//! - An open descriptor of gpudoc's (`/dev/stdout`, `/dev/stderr`, `/dev/fd/N`, `/proc/self/fd/N`, or a
//!   link to one) is written through that descriptor, at its offset (at the end where it was opened for
//!   appending): what the file held and what the command wrote to it stay. Opening the path anew would
//!   write from the file's start, and replacing the file would drop the command's output.
//! - An existing regular file is written whole or not at all (a temporary file beside it, then a rename over
//!   it) where that changes nothing a user sees of it: one link, the owner and group a new file there would
//!   get, no extended attributes (ACLs, security labels), a folder gpudoc may write. Otherwise (a read-only
//!   folder, hard links, another owner) it is rewritten in place, keeping its inode, links, owner and mode;
//!   a reader may then see it half written.
//! - A path that names nothing yet is created the first way. Symbolic links are followed, so the file they
//!   point to is written, never the link.
//! - Anything else (a FIFO, `/dev/null`) is opened and written as it is, never blocking gpudoc: a FIFO
//!   nobody reads yet is opened once a reader comes, and at the end gpudoc waits at most [`PATIENCE`] for a
//!   reader to come or to take more, then says what went wrong.
//!
//! A [`Sink`] is written as the run goes (the trace) and never holds its writer up: what the destination
//! does not take at once waits in memory, up to [`BEHIND_MAX`], past which whole lines are dropped and
//! counted.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::AccessFlags;
use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where an output goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Stdout,
    File(PathBuf),
}

impl Target {
    /// `-` is stdout; anything else a path.
    pub fn parse(s: &Path) -> Target {
        if s == Path::new("-") {
            Target::Stdout
        } else {
            Target::File(s.to_path_buf())
        }
    }

    /// How the user wrote it, for messages.
    pub fn display(&self) -> String {
        match self {
            Target::Stdout => "-".into(),
            Target::File(p) => p.display().to_string(),
        }
    }
}

/// The longest gpudoc waits, once the run is over, for a FIFO's reader to come or for a reader to take
/// more: the command's exit code is not held back longer.
pub const PATIENCE: Duration = Duration::from_secs(5);
/// What a [`Sink`] keeps while its destination takes nothing; past it, lines are dropped.
pub const BEHIND_MAX: usize = 16 << 20;
/// Lines are written once this many bytes wait (and at each [`Sink::push`]).
const BATCH: usize = 64 << 10;

/// How a path is written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// Through gpudoc's own open descriptor.
    Descriptor(RawFd),
    /// A temporary file in the same folder, then a rename onto this path (new, or an existing file).
    Replace(PathBuf),
    /// An existing regular file, rewritten in place.
    InPlace(PathBuf),
    /// Opened and written as it is (a device, a FIFO).
    Through(PathBuf),
}

/// Symbolic links followed this many times at most (as the kernel's ELOOP limit).
const MAX_LINKS: usize = 40;

fn plan(path: &Path) -> io::Result<Plan> {
    if let Some(fd) = descriptor(path) {
        return Ok(Plan::Descriptor(fd));
    }
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(io::Error::other("is a folder")),
        Ok(m) if m.is_file() => {
            let p = fs::canonicalize(path)?;
            Ok(if replacing_is_unseen(&p, &m) {
                Plan::Replace(p)
            } else {
                Plan::InPlace(p)
            })
        }
        Ok(_) => Ok(Plan::Through(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => dangling(path).map(Plan::Replace),
        Err(e) => Err(e),
    }
}

/// The descriptor of gpudoc's that `path` names, if it names one (`/dev/stderr`, `/dev/fd/3`, a link to
/// one): followed link by link, since the last link (`/proc/self/fd/2`) names the file behind the
/// descriptor, which opened anew would be written from its start.
fn descriptor(path: &Path) -> Option<RawFd> {
    let me = format!("/proc/{}/", std::process::id());
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        // The folder resolved (`/dev/fd` is `/proc/self/fd`, which is `/proc/<pid>/fd`), the name kept.
        if let (Some(name), Ok(dir)) = (p.file_name(), fs::canonicalize(folder_of(&p))) {
            p = dir.join(name);
        }
        if let Some(fd) = fd_named(p.to_str()?, &me) {
            return Some(fd);
        }
        p = folder_of(&p).join(fs::read_link(&p).ok()?);
    }
    None
}

/// The descriptor a resolved path names, `me` being `/proc/<gpudoc's pid>/`.
fn fd_named(p: &str, me: &str) -> Option<RawFd> {
    match p {
        "/dev/stdin" => return Some(0),
        "/dev/stdout" => return Some(1),
        "/dev/stderr" => return Some(2),
        _ => {}
    }
    let n = match p.strip_prefix(me) {
        // A thread's own table (`/proc/thread-self/fd`) is the process's.
        Some(rest) => rest
            .strip_prefix("fd/")
            .or_else(|| rest.strip_prefix("task/")?.split_once("/fd/").map(|x| x.1))?,
        // Without /proc, `/dev/fd` cannot be resolved.
        None => p.strip_prefix("/dev/fd/")?,
    };
    n.parse().ok()
}

/// Whether replacing the file at `p` (a new file renamed over it) leaves everything a user sees of it as
/// it was, `m` being its metadata: one link (a rename breaks the others), the owner and group a new file
/// in its folder gets, no extended attributes (a new file would not have them), and a folder gpudoc may
/// write (a rename needs it).
fn replacing_is_unseen(p: &Path, m: &fs::Metadata) -> bool {
    let dir = folder_of(p);
    let Ok(d) = fs::metadata(dir) else {
        return false;
    };
    // A new file's group: the folder's where it is set-group-ID, else gpudoc's.
    let gid = if d.mode() & libc::S_ISGID != 0 {
        d.gid()
    } else {
        nix::unistd::getegid().as_raw()
    };
    m.nlink() == 1
        && m.uid() == nix::unistd::geteuid().as_raw()
        && m.gid() == gid
        && !has_xattrs(p)
        && nix::unistd::access(dir, AccessFlags::W_OK).is_ok()
}

fn has_xattrs(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: with no buffer, listxattr only returns the size the names take (-1 where unsupported).
    unsafe { libc::listxattr(c.as_ptr(), std::ptr::null_mut(), 0) > 0 }
}

/// The path a chain of links ends at, when it names nothing yet (`report.json -> out/r.json`).
fn dangling(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p)?;
                p = p.parent().unwrap_or(Path::new(".")).join(to);
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

fn folder_of(p: &Path) -> &Path {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Checks now that `target` can be written later, without leaving anything behind and without opening
/// anything that could block (a FIFO): the descriptor is open for writing, the file may be written, or the
/// folder exists and takes a new file.
pub fn check(target: &Target) -> io::Result<()> {
    let Target::File(path) = target else {
        return Ok(());
    };
    match plan(path)? {
        Plan::Descriptor(fd) => writable(fd),
        Plan::Replace(p) => {
            let dir = folder_of(&p);
            if !dir.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no folder {}", dir.display()),
                ));
            }
            tempfile::Builder::new()
                .prefix(".gpudoc-check.")
                .tempfile_in(dir)
                .map(drop)
        }
        Plan::InPlace(p) | Plan::Through(p) => {
            nix::unistd::access(&p, AccessFlags::W_OK).map_err(io::Error::from)
        }
    }
}

/// Whether gpudoc's descriptor `fd` is open for writing (one of 0-2 closed when gpudoc started is not:
/// the runtime put /dev/null there).
fn writable(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL only asks about the descriptor.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags == -1 || crate::stdfds::closed_at_start(fd) {
        return Err(io::Error::other(format!("descriptor {fd} is not open")));
    }
    if flags & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(io::Error::other(format!(
            "descriptor {fd} is open for reading only"
        )));
    }
    Ok(())
}

/// Writes `bytes` to `target` as the module says. Stdout is flushed; a broken pipe is returned as such.
pub fn write(target: &Target, bytes: &[u8]) -> io::Result<()> {
    let path = match target {
        Target::Stdout => {
            let mut out = io::stdout().lock();
            out.write_all(bytes)?;
            return out.flush();
        }
        Target::File(path) => path,
    };
    match plan(path)? {
        Plan::Replace(p) => replace(&p, bytes),
        Plan::InPlace(p) => in_place(&p, bytes),
        p @ (Plan::Descriptor(_) | Plan::Through(_)) => {
            let mut sink = Sink::of(p)?;
            sink.behind = bytes.to_vec();
            sink.finish(PATIENCE)
        }
    }
}

fn replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .tempfile_in(folder_of(path))?;
    let mode = match fs::metadata(path) {
        Ok(m) => m.permissions().mode(),
        Err(_) => new_file_mode(),
    };
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    // On failure the temporary file is removed with `tmp`.
    tmp.persist(path).map(drop).map_err(|e| e.error)
}

/// The mode a new file gets (0666 less the umask), not a temporary file's 0600.
fn new_file_mode() -> u32 {
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    nix::sys::stat::umask(umask);
    0o666 & !umask.bits()
}

/// Makes the folder `dir` if it is missing and checks that it takes a new file, leaving nothing behind.
pub fn check_folder(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    tempfile::Builder::new()
        .prefix(".gpudoc-check.")
        .tempfile_in(dir)
        .map(drop)
}

/// Writes `bytes` as a new file in the folder `dir` named `STEM.EXT`, or `STEM-2.EXT`, `STEM-3.EXT`, ...
/// (the first name nothing holds): whole (a hidden temporary file, then moved to the name, which fails
/// rather than replace a file), so runs writing into one shared folder at once never lose each other's,
/// and a reader never sees half a file under the name. The path written.
pub fn write_new(dir: &Path, stem: &str, ext: &str, bytes: &[u8]) -> io::Result<PathBuf> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{stem}."))
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(new_file_mode()))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    for n in 1..=MAX_SAME_NAME {
        let path = dir.join(match n {
            1 => format!("{stem}.{ext}"),
            n => format!("{stem}-{n}.{ext}"),
        });
        match tmp.persist_noclobber(&path) {
            Ok(_) => return Ok(path),
            Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => tmp = e.file,
            Err(e) => return Err(e.error),
        }
    }
    Err(io::Error::other(format!(
        "{} files named {stem}-N.{ext} already",
        MAX_SAME_NAME
    )))
}

/// The most [`write_new`] numbers one name.
const MAX_SAME_NAME: u32 = 10_000;

/// Rewrites an existing file in place: the new bytes over the old, then cut to their length.
fn in_place(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(bytes)?;
    f.set_len(bytes.len() as u64)?;
    f.sync_all()
}

/// Runs `f` (a read-modify-write of `path`, such as updating a baseline) holding an exclusive lock on the
/// folder the file is in, so parallel jobs updating the same file never lose each other's changes. A
/// read-only folder can be locked too.
pub fn locked<T>(path: &Path, f: impl FnOnce() -> T) -> io::Result<T> {
    let dir = match plan(path)? {
        Plan::Descriptor(_) => return Ok(f()),
        Plan::Replace(p) | Plan::InPlace(p) | Plan::Through(p) => folder_of(&p).to_path_buf(),
    };
    let folder = fs::File::open(&dir)?;
    // SAFETY: flock on a descriptor we own; released when `folder` is closed.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&folder), libc::LOCK_EX) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let out = f();
    drop(folder);
    Ok(out)
}

/// Writes to stdout; for commands whose result is their output.
pub fn stdout(text: &str) -> io::Result<()> {
    write(&Target::Stdout, text.as_bytes())
}

/// An output written line by line as the run goes (the trace), never holding its writer up.
pub struct Sink {
    to: To,
    /// Bytes the destination has not taken yet.
    behind: Vec<u8>,
    /// Lines dropped because the destination was [`BEHIND_MAX`] behind.
    dropped: u64,
    /// Lines end with `\r\n`: the destination is a terminal in raw mode.
    crlf: bool,
}

enum To {
    /// A regular file: takes everything at once.
    File(Fd),
    /// A pipe, FIFO, terminal or device: takes what it can.
    Stream(Fd),
    /// A FIFO nobody has opened for reading yet.
    Unread(PathBuf),
}

enum Fd {
    Own(OwnedFd),
    /// One of gpudoc's own descriptors (`/dev/fd/3`): written through, never closed here.
    Shared(RawFd),
}

impl Fd {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Fd::Own(f) => f.as_fd(),
            // SAFETY: gpudoc's inherited descriptors stay open for its whole life.
            Fd::Shared(fd) => unsafe { BorrowedFd::borrow_raw(*fd) },
        }
    }
}

impl Sink {
    /// Opens `path` for writing as it goes: a regular file is created or emptied now; a FIFO nobody reads
    /// yet is opened once a reader comes.
    pub fn open(path: &Path) -> io::Result<Sink> {
        Sink::of(plan(path)?)
    }

    fn of(plan: Plan) -> io::Result<Sink> {
        let to = match plan {
            Plan::Descriptor(fd) => {
                writable(fd)?;
                // SAFETY: fstat on an open descriptor of gpudoc's.
                let st = nix::sys::stat::fstat(unsafe { BorrowedFd::borrow_raw(fd) })?;
                if st.st_mode & libc::S_IFMT == libc::S_IFREG {
                    To::File(Fd::Shared(fd))
                } else {
                    To::Stream(Fd::Shared(fd))
                }
            }
            Plan::Through(p) => open_through(&p)?,
            // Written as it goes, so never through a temporary file: emptied in place, or created.
            Plan::Replace(p) | Plan::InPlace(p) => To::File(Fd::Own(fs::File::create(p)?.into())),
        };
        Ok(Sink {
            to,
            behind: Vec::new(),
            dropped: 0,
            crlf: false,
        })
    }

    /// Adds `line` and a newline, written once enough waits or at the next [`Sink::push`]. Dropped (and
    /// counted) where the destination is too far behind.
    pub fn line(&mut self, line: &str) -> io::Result<()> {
        let file = matches!(self.to, To::File(_));
        if !file && self.behind.len() + line.len() >= BEHIND_MAX {
            self.dropped += 1;
            return Ok(());
        }
        self.behind.extend_from_slice(line.as_bytes());
        self.behind
            .extend_from_slice(if self.crlf { b"\r\n" } else { b"\n" });
        if self.behind.len() >= BATCH && !matches!(self.to, To::Unread(_)) {
            self.push()?;
        }
        Ok(())
    }

    /// Writes what the destination takes now, without waiting (a regular file takes everything).
    pub fn push(&mut self) -> io::Result<()> {
        if let To::Unread(p) = &self.to {
            self.to = open_through(p)?;
        }
        if let To::Stream(f) = &self.to {
            self.follow_raw_mode(f.fd().as_raw_fd());
        }
        let n = match &self.to {
            To::File(f) => write_all(f.fd(), &self.behind).map(|()| self.behind.len())?,
            To::Stream(f) => take_now(f.fd(), &self.behind)?,
            To::Unread(_) => 0,
        };
        self.behind.drain(..n);
        Ok(())
    }

    /// Writes everything left, waiting while the destination makes progress: at most `patience` for a
    /// FIFO's reader to come, or for a reader to take more.
    pub fn finish(&mut self, patience: Duration) -> io::Result<()> {
        let mut progress = Instant::now();
        loop {
            let (left, unread) = (self.behind.len(), matches!(self.to, To::Unread(_)));
            self.push()?;
            if self.behind.is_empty() {
                return Ok(());
            }
            if self.behind.len() < left || unread != matches!(self.to, To::Unread(_)) {
                progress = Instant::now();
            }
            if progress.elapsed() >= patience {
                let why = match self.to {
                    To::Unread(_) => "nobody opened it for reading",
                    _ => "its reader took nothing more",
                };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{why} in {} s", patience.as_secs()),
                ));
            }
            match &self.to {
                To::Stream(f) => crate::say::wait_writable(f.fd()),
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// A terminal in raw mode (gpudoc's own, while the command has a terminal of its own: `--trace
    /// /dev/stderr`) gets `\r\n`, as its output processing would have made it, from the first byte that
    /// reaches it raw (lines wait here from before it went raw).
    fn follow_raw_mode(&mut self, fd: RawFd) {
        // SAFETY: the Sink's descriptor is open while the Sink lives.
        let raw = raw_terminal(unsafe { BorrowedFd::borrow_raw(fd) });
        if raw && !self.crlf {
            let mut crlf = Vec::with_capacity(self.behind.len() + self.behind.len() / 32);
            for &b in &self.behind {
                if b == b'\n' {
                    crlf.push(b'\r');
                }
                crlf.push(b);
            }
            self.behind = crlf;
        }
        self.crlf = raw;
    }

    /// Lines dropped because the destination fell [`BEHIND_MAX`] behind.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

impl Drop for Sink {
    /// What a regular file has waiting is written (a run that could not start ends without a finish).
    fn drop(&mut self) {
        let _ = self.push();
    }
}

/// A terminal whose output processing is off: its `\n` would not return to the left margin.
fn raw_terminal(fd: BorrowedFd<'_>) -> bool {
    nix::sys::termios::tcgetattr(fd).is_ok_and(|t| {
        !t.output_flags
            .contains(nix::sys::termios::OutputFlags::OPOST)
    })
}

/// Opens a FIFO or device for writing without blocking; a FIFO nobody reads yet waits for its reader.
fn open_through(p: &Path) -> io::Result<To> {
    match fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p)
    {
        Ok(f) => Ok(To::Stream(Fd::Own(f.into()))),
        // ENXIO: a FIFO with no reader (a socket gives it too, and never gets a reader).
        Err(e)
            if e.raw_os_error() == Some(libc::ENXIO)
                && fs::metadata(p).is_ok_and(|m| m.file_type().is_fifo()) =>
        {
            Ok(To::Unread(p.to_path_buf()))
        }
        Err(e) => Err(e),
    }
}

/// Writes all of `bytes` to a regular file.
fn write_all(fd: BorrowedFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match nix::unistd::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Writes what `fd` takes now of `bytes`, without waiting; how many it took. A descriptor gpudoc shares
/// with others (`/dev/fd/3` onto a pipe) stays blocking, as they expect: after poll says it takes more, a
/// write of at most PIPE_BUF bytes does not block.
fn take_now(fd: BorrowedFd, bytes: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < bytes.len() {
        let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(0) => break,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
        let end = (done + libc::PIPE_BUF).min(bytes.len());
        match nix::unistd::write(fd, &bytes[done..end]) {
            Ok(0) | Err(Errno::EAGAIN) => break,
            Ok(n) => done += n,
            Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    #[test]
    fn a_new_file_never_replaces_one_and_leaves_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_new(dir.path(), "77.0-node-rank1", "json", b"one").unwrap();
        let second = write_new(dir.path(), "77.0-node-rank1", "json", b"two").unwrap();
        assert_eq!(first, dir.path().join("77.0-node-rank1.json"));
        assert_eq!(second, dir.path().join("77.0-node-rank1-2.json"));
        assert_eq!(fs::read(&first).unwrap(), b"one");
        assert_eq!(fs::read(&second).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_regular_file_is_replaced_whole_keeping_its_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.json");
        fs::write(&p, "old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
        write(&Target::File(p.clone()), b"new").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o640
        );
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn a_symlink_is_followed_and_kept() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.json");
        let link = d.path().join("link.json");
        std::os::unix::fs::symlink("real.json", &link).unwrap();
        write(&Target::File(link.clone()), b"one").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&real).unwrap(), "one");
        write(&Target::File(link.clone()), b"two").unwrap();
        assert!(
            fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_to_string(&real).unwrap(), "two");
    }

    #[test]
    fn a_fifo_is_written_through_not_replaced() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || fs::read(p).unwrap())
        };
        write(&Target::File(p.clone()), b"through").unwrap();
        assert_eq!(reader.join().unwrap(), b"through");
        assert!(fs::metadata(&p).unwrap().file_type().is_fifo());
    }

    #[test]
    fn paths_that_name_a_descriptor_are_known_through_links() {
        let d = tempfile::tempdir().unwrap();
        let link = d.path().join("report.json");
        std::os::unix::fs::symlink("/dev/stderr", &link).unwrap();
        let me = std::process::id();
        for (path, fd) in [
            ("/dev/stdout".to_string(), Some(1)),
            ("/dev/./stderr".into(), Some(2)),
            ("/dev/fd/7".into(), Some(7)),
            ("/proc/self/fd/3".into(), Some(3)),
            ("/proc/thread-self/fd/4".into(), Some(4)),
            (format!("/proc/{me}/fd/5"), Some(5)),
            (link.display().to_string(), Some(2)),
            ("/proc/1/fd/1".into(), None),
            (d.path().join("r.json").display().to_string(), None),
        ] {
            assert_eq!(descriptor(Path::new(&path)), fd, "{path}");
        }
    }

    #[test]
    fn a_file_with_other_links_is_rewritten_in_place() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.json"), d.path().join("b.json"));
        fs::write(&a, "a longer old content").unwrap();
        assert!(matches!(plan(&a).unwrap(), Plan::Replace(_)));
        fs::hard_link(&a, &b).unwrap();
        assert!(matches!(plan(&a).unwrap(), Plan::InPlace(_)));
        write(&Target::File(a.clone()), b"new").unwrap();
        assert_eq!(fs::read_to_string(&b).unwrap(), "new");
    }

    #[test]
    fn a_fifo_nobody_reads_waits_for_its_reader_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let mut sink = Sink::open(&p).unwrap();
        sink.line("one").unwrap();
        sink.push().unwrap();
        let t = Instant::now();
        let e = sink.finish(Duration::from_millis(200)).unwrap_err();
        assert!(
            e.to_string().contains("nobody opened it for reading"),
            "{e}"
        );
        assert!(t.elapsed() < Duration::from_secs(2));
        // A reader that comes gets what waited.
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || fs::read(p).unwrap())
        };
        sink.line("two").unwrap();
        sink.finish(Duration::from_secs(5)).unwrap();
        drop(sink);
        assert_eq!(reader.join().unwrap(), b"one\ntwo\n");
    }

    #[test]
    fn a_reader_that_falls_behind_loses_whole_lines_never_parts() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        // A reader that takes nothing until the writer is done.
        let mut reader = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let mut sink = Sink::open(&p).unwrap();
        let line = "x".repeat(99);
        let n = 2 * BEHIND_MAX / 100;
        for _ in 0..n {
            sink.line(&line).unwrap();
        }
        assert!(sink.dropped() > 0 && sink.behind.len() <= BEHIND_MAX);
        let kept = n as u64 - sink.dropped();
        let got = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match io::Read::read(&mut reader, &mut buf) {
                    Ok(0) => return got,
                    Ok(k) => got.extend_from_slice(&buf[..k]),
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        sink.finish(Duration::from_secs(5)).unwrap();
        drop(sink);
        let got = got.join().unwrap();
        assert_eq!(got.len() as u64, kept * 100);
        assert!(
            got.chunks(100)
                .all(|l| l[..99] == *line.as_bytes() && l[99] == b'\n')
        );
    }

    #[test]
    fn checks_name_the_problem() {
        let d = tempfile::tempdir().unwrap();
        let missing = Target::File(d.path().join("no/such/r.json"));
        assert!(
            check(&missing)
                .unwrap_err()
                .to_string()
                .contains("no folder")
        );
        let dir = Target::File(d.path().to_path_buf());
        assert!(check(&dir).unwrap_err().to_string().contains("folder"));
        assert!(check(&Target::File(d.path().join("ok.json"))).is_ok());
        assert_eq!(
            fs::read_dir(d.path()).unwrap().count(),
            0,
            "the check leaves nothing"
        );
        assert!(check(&Target::File("/proc/gpudoc-x".into())).is_err());
    }
}
