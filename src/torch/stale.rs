//! Shim folders whose gpudoc was killed. A SIGKILL gives gpudoc no time to remove its folder
//! (`$TMPDIR/gpudoc-XXXXXX`), so each run holds a lock on a file in its own folder for as long as it lives
//! (the kernel releases it however the process ends), and each run removes, on a thread of its own, the
//! folders of the same user that nobody holds: their gpudoc is gone.
//!
//! A folder is removed only when all of these hold: its name starts with `gpudoc-`; it is a folder (not a
//! link) owned by this user with mode 0700, as gpudoc makes them; it has the lock file (folders of gpudoc
//! versions that never held one are left alone: one of them may still be running); nobody holds the lock;
//! and it was last changed over [`MIN_AGE`] ago (a run that just made its folder may not hold the lock yet).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// The file whose lock says a folder's gpudoc is alive.
pub const LOCK: &str = ".gpudoc-lock";
/// A folder changed more recently than this is never removed.
pub const MIN_AGE: Duration = Duration::from_secs(60);

/// This run's hold on its folder, and the sweep of the others.
pub struct Held {
    _lock: File,
    sweep: Option<JoinHandle<()>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(t) = self.sweep.take() {
            let _ = t.join();
        }
    }
}

/// Locks `dir` (this run's folder) for as long as the returned value lives, and starts removing what
/// killed runs left beside it.
pub fn hold(dir: &Path) -> io::Result<Held> {
    let lock = File::create(dir.join(LOCK))?;
    flock(&lock)?;
    let (base, own) = (dir.parent().map(Path::to_path_buf), dir.to_path_buf());
    let sweep = base.and_then(|base| {
        std::thread::Builder::new()
            .name("gpudoc-sweep".into())
            .spawn(move || _ = sweep(&base, &own, SystemTime::now()))
            .ok()
    });
    Ok(Held { _lock: lock, sweep })
}

/// An exclusive lock on `f`, or an error at once if someone holds it.
fn flock(f: &File) -> io::Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes the folders in `base` that killed runs of this user left (all but `own`); the paths removed.
pub fn sweep(base: &Path, own: &Path, now: SystemTime) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let me = nix::unistd::geteuid().as_raw();
    let mut removed = Vec::new();
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with("gpudoc-") {
            continue;
        }
        let path = e.path();
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = m
            .modified()
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > MIN_AGE));
        let ours = m.is_dir() && m.uid() == me && m.permissions().mode() & 0o777 == 0o700;
        if path == own || !ours || !old {
            continue;
        }
        // Held while removing, so two runs never remove the same folder at once.
        let Ok(lock) = File::open(path.join(LOCK)) else {
            continue;
        };
        if flock(&lock).is_ok() && remove(&path).is_ok() {
            removed.push(path);
        }
    }
    removed
}

/// Removes a left folder, its lock file last: a removal cut short leaves a folder the next run finishes.
fn remove(dir: &Path) -> io::Result<()> {
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_name() == LOCK {
            continue;
        }
        match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(e.path())?,
            _ => std::fs::remove_file(e.path())?,
        }
    }
    std::fs::remove_file(dir.join(LOCK))?;
    std::fs::remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(base: &Path, name: &str, lock: bool) -> PathBuf {
        let d = base.join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(d.join("sitecustomize.py"), "").unwrap();
        if lock {
            File::create(d.join(LOCK)).unwrap();
        }
        d
    }

    #[test]
    fn only_old_unheld_folders_of_gpudoc_are_removed() {
        let base = tempfile::tempdir().unwrap();
        let left = folder(base.path(), "gpudoc-left", true);
        let held = folder(base.path(), "gpudoc-held", true);
        let _alive = File::open(held.join(LOCK)).unwrap();
        flock(&_alive).unwrap();
        let older = folder(base.path(), "gpudoc-older-version", false);
        let other = folder(base.path(), "other-left", true);
        let own = folder(base.path(), "gpudoc-own", true);
        let later = SystemTime::now() + MIN_AGE + Duration::from_secs(1);
        assert_eq!(sweep(base.path(), &own, later), vec![left.clone()]);
        assert!(!left.exists());
        for kept in [&held, &older, &other, &own] {
            assert!(kept.exists(), "{}", kept.display());
        }
        // A folder changed within MIN_AGE may belong to a run that has not locked it yet.
        let young = folder(base.path(), "gpudoc-young", true);
        assert!(sweep(base.path(), &own, SystemTime::now()).is_empty());
        assert!(young.exists());
    }
}
