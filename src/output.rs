//! The one way gpudoc writes what a user asked for (a report, a trace, a baseline, JUnit, an export):
//! a [`Target`] is stdout or a path. A regular file (or a path that does not exist yet) is written whole
//! or not at all: a temporary file beside it with a unique name, then a rename over it, keeping the old
//! file's permissions. Symbolic links are followed, so the file they point to is replaced, never the
//! link. Anything else (`/dev/null`, a FIFO, `/dev/fd/3`) is written through as it is: gpudoc never
//! replaces what it does not own.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

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

/// How a path is written.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Plan {
    /// Temporary file in the same folder, then rename onto this path.
    Replace(PathBuf),
    /// Opened and written as it is (a device, a FIFO).
    Through(PathBuf),
}

/// Symbolic links followed this many times at most (as the kernel's ELOOP limit).
const MAX_LINKS: usize = 40;

fn plan(path: &Path) -> io::Result<Plan> {
    match fs::metadata(path) {
        Ok(m) if m.is_dir() => Err(io::Error::other("is a folder")),
        Ok(m) if m.is_file() => Ok(Plan::Replace(fs::canonicalize(path)?)),
        Ok(_) => Ok(Plan::Through(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => dangling(path).map(Plan::Replace),
        Err(e) => Err(e),
    }
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

/// Checks now that `target` can be written later, without leaving anything behind: the folder exists and
/// takes a new file, or the device can be opened for writing.
pub fn check(target: &Target) -> io::Result<()> {
    let Target::File(path) = target else {
        return Ok(());
    };
    match plan(path)? {
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
        Plan::Through(p) => {
            nix::unistd::access(&p, nix::unistd::AccessFlags::W_OK).map_err(io::Error::from)
        }
    }
}

/// Writes `bytes` to `target` as the module says. Stdout is flushed; a broken pipe is returned as such.
pub fn write(target: &Target, bytes: &[u8]) -> io::Result<()> {
    match target {
        Target::Stdout => {
            let mut out = io::stdout().lock();
            out.write_all(bytes)?;
            out.flush()
        }
        Target::File(path) => match plan(path)? {
            Plan::Replace(p) => replace(&p, bytes),
            Plan::Through(p) => fs::OpenOptions::new()
                .write(true)
                .open(&p)?
                .write_all(bytes),
        },
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
    if let Ok(m) = fs::metadata(path) {
        tmp.as_file()
            .set_permissions(fs::Permissions::from_mode(m.permissions().mode()))?;
    } else {
        // A new file gets the usual mode (0666 less the umask), not the temporary file's 0600.
        let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        nix::sys::stat::umask(umask);
        let mode = 0o666 & !umask.bits();
        tmp.as_file()
            .set_permissions(fs::Permissions::from_mode(mode))?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    // On failure the temporary file is removed with `tmp`.
    tmp.persist(path).map(drop).map_err(|e| e.error)
}

/// Runs `f` (a read-modify-write of `path`, such as updating a baseline) holding an exclusive lock on the
/// folder the file is in, so parallel jobs updating the same file never lose each other's changes.
pub fn locked<T>(path: &Path, f: impl FnOnce() -> T) -> io::Result<T> {
    let dir = match plan(path)? {
        Plan::Replace(p) => folder_of(&p).to_path_buf(),
        Plan::Through(p) => folder_of(&p).to_path_buf(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

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
