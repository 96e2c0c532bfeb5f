//! The folders gpudoc keeps for itself in the user's home (the shim's cache, the leftovers' record, the
//! live forecasts). Run as root with another user's HOME (`sudo -E`, an older sudo, a root container with
//! the home mounted), a folder made there would be root's: the user could then no longer make
//! `~/.local/bin` or `~/.cache/huggingface`. So gpudoc makes nothing inside a folder another user owns
//! ([`yours`]), and its own folders are the user's alone (mode 0700) however they are first made
//! ([`make`]). This module is the one place that decides both.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a private folder could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FolderError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("{}: not yours (owned by uid {owner}): nothing is made there", path.display())]
    NotYours { path: PathBuf, owner: u32 },
}

/// The nearest folder of `path` (itself or above) that exists, with its owner and mode.
fn nearest(path: &Path) -> Option<(PathBuf, std::fs::Metadata)> {
    path.ancestors()
        .find_map(|p| Some((p.to_path_buf(), std::fs::metadata(p).ok()?)))
}

/// Whether a folder made at `path` would be the effective user's to make: the nearest folder that exists
/// (`path` itself or one above) is theirs, or shared on purpose (sticky, as `/tmp`). `Err` names the
/// folder and its owner when it is another user's.
pub fn yours(path: &Path) -> Result<(), FolderError> {
    let uid = nix::unistd::geteuid().as_raw();
    match nearest(path) {
        Some((_, m)) if m.uid() == uid || m.mode() & 0o1000 != 0 => Ok(()),
        Some((at, m)) => Err(FolderError::NotYours {
            path: at,
            owner: m.uid(),
        }),
        None => Err(FolderError::Io {
            path: path.to_path_buf(),
            source: io::ErrorKind::NotFound.into(),
        }),
    }
}

/// Makes `dir` the user's alone (mode 0700; an existing one of theirs with wider modes is narrowed) and
/// the folders above it that are missing (with the usual modes, as `mkdir -p`); refused where `dir`, or
/// the nearest folder above it that exists, is another user's.
pub fn make(dir: &Path) -> Result<(), FolderError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FolderError::Io { path, source }
    };
    if std::fs::metadata(dir).is_err() {
        yours(dir)?;
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        // Another gpudoc may make it at the same time: what is there is checked below either way.
        let _ = std::fs::DirBuilder::new().mode(0o700).create(dir);
    }
    let m = std::fs::metadata(dir).map_err(io(dir))?;
    let uid = nix::unistd::geteuid().as_raw();
    if m.uid() != uid {
        return Err(FolderError::NotYours {
            path: dir.to_path_buf(),
            owner: m.uid(),
        });
    }
    if !m.is_dir() {
        return Err(io(dir)(io::ErrorKind::NotADirectory.into()));
    }
    if m.mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io(dir))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_folder_is_private_and_the_ones_above_it_are_not_narrowed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("state/gpudoc");
        make(&dir).unwrap();
        make(&dir.join("live")).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("live")), 0o700);
        assert_ne!(mode(&d.path().join("state")), 0o700, "not gpudoc's own");
        // One an older gpudoc left open to others is narrowed.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        make(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
    }

    #[test]
    fn nothing_is_made_in_another_users_folder() {
        if !nix::unistd::geteuid().is_root() {
            return; // only root can hand a folder to another user
        }
        let d = tempfile::tempdir().unwrap();
        let home = d.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
        let err = make(&home.join(".local/state/gpudoc")).unwrap_err();
        assert!(
            matches!(err, FolderError::NotYours { owner: 65534, .. }),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(&home).unwrap().count(), 0);
        // A sticky shared folder (as /tmp) is anyone's to make a folder in.
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(yours(&home.join("x")).is_ok());
    }
}
