//! Where the shim's files are. Every Python process of a job runs the shim's `sitecustomize.py`, so its
//! folder must be one nobody else can write to; and tools that read source files after the run (coverage,
//! profilers, tracebacks) must still find them. The files are written once into a folder of the user's
//! cache named by their content (`$XDG_CACHE_HOME/gpudoc/shim-<hash>`), checked before each use (owner,
//! mode, every byte); where no such folder can be used, into the run's private folder, removed at its end.
//! Installed by pip, gpudoc uses its package's own `_shim` folder as it is (checked the same way, and only
//! when its files are this binary's, byte for byte). [`shim_folder`] is the one place that decides.

use super::SHIM;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where a shim may already be.
#[derive(Debug, Clone, Copy, Default)]
pub struct Homes<'a> {
    /// The `gpudoc` package folders pip installed beside this binary.
    pub installed: &'a [PathBuf],
    /// The user's cache folder (`$XDG_CACHE_HOME` or `~/.cache`).
    pub cache: Option<&'a Path>,
}

/// The shim's folder for a run: an installed package's, else a checked one in the user's cache, else the
/// run's own `private` folder (written there), with why one was refused when that is worth saying: a
/// folder of gpudoc's that is not the user's alone, or holds other files than gpudoc wrote.
pub fn shim_folder(homes: Homes, private: &Path) -> (PathBuf, Option<String>) {
    let mut refused = None;
    for pkg in homes.installed {
        match installed(&pkg.join("_shim")) {
            Ok(true) => return (pkg.join("_shim"), None),
            Ok(false) => {}
            Err(why) => refused = Some(why),
        }
    }
    let cached = homes.cache.and_then(|c| in_cache(c).transpose());
    match cached {
        Some(Ok(dir)) => (dir, None),
        other => {
            let note = match other {
                Some(Err(Refused::Unsafe(why))) => Some(why),
                _ => refused,
            };
            match write_files(private) {
                Ok(()) => (private.to_path_buf(), note),
                Err(e) => (
                    private.to_path_buf(),
                    Some(format!("cannot write the shim: {e}")),
                ),
            }
        }
    }
}

/// Whether an installed package's shim folder can be used: true when its files are this binary's shim,
/// false when they are another version's (or it has none), an error when someone but the user or root
/// could have changed it.
fn installed(dir: &Path) -> Result<bool, String> {
    if !dir.is_dir() {
        return Ok(false);
    }
    let uid = nix::unistd::geteuid().as_raw();
    for path in [dir.parent().unwrap_or(dir), dir] {
        let m = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(why) = not_private(path, &m, uid, true) {
            return Err(why);
        }
    }
    match check_files(dir, uid, true) {
        Ok(()) => Ok(true),
        Err(Check::Other(_)) => Ok(false),
        Err(Check::Unsafe(why)) => Err(why),
    }
}

/// Why the cache was not used.
#[derive(Debug)]
enum Refused {
    /// Not there and cannot be made (a read-only home): quietly passed over.
    Unavailable,
    /// There, but someone else could have written it: said.
    Unsafe(String),
}

impl From<std::io::Error> for Refused {
    fn from(_: std::io::Error) -> Refused {
        Refused::Unavailable
    }
}

/// The content-addressed folder under `cache` (`$XDG_CACHE_HOME` or `~/.cache`), made if missing. `None`
/// when the path cannot go on PYTHONPATH (a `:` in it).
fn in_cache(cache: &Path) -> Result<Option<PathBuf>, Refused> {
    let base = cache.join("gpudoc");
    let dir = base.join(format!("shim-{:016x}", content_hash()));
    if dir.to_string_lossy().contains(':') || !cache.is_absolute() {
        return Ok(None);
    }
    let uid = nix::unistd::geteuid().as_raw();
    if !base.exists() {
        // Nothing is made in a folder of another user's (a root run with the user's HOME).
        crate::private::make(&base).map_err(|e| match e {
            crate::private::FolderError::NotYours { .. } => Refused::Unsafe(e.to_string()),
            crate::private::FolderError::Io { .. } => Refused::Unavailable,
        })?;
    }
    check_parent(cache, uid, true)?;
    check_parent(&base, uid, false)?;
    if std::fs::symlink_metadata(&dir).is_err() {
        make(&base, &dir)?;
    }
    check_folder(&dir, uid).map_err(Refused::Unsafe)?;
    Ok(Some(dir))
}

/// The folders above the shim's: a folder others can write to lets them replace the shim's (rename
/// needs only the parent's write permission). The cache root may be root's (a shared `/var/cache`) when
/// sticky.
fn check_parent(dir: &Path, uid: u32, root_ok: bool) -> Result<(), Refused> {
    let m = std::fs::symlink_metadata(dir)?;
    let owner_ok = m.uid() == uid || (root_ok && m.uid() == 0);
    let others_write = m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0;
    if !m.is_dir() || !owner_ok || others_write {
        return Err(Refused::Unsafe(format!(
            "{} is not the user's alone (owner {}, mode {:o})",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Writes the files into a fresh folder beside `dir` and renames it into place: a folder is either
/// whole or absent, and of two gpudocs writing at once one wins and the other uses its folder.
fn make(base: &Path, dir: &Path) -> std::io::Result<()> {
    let tmp = tempfile::Builder::new().prefix(".shim-").tempdir_in(base)?;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700))?;
    write_files(tmp.path())?;
    let tmp = tmp.keep();
    if std::fs::rename(&tmp, dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(())
}

/// The shim's files, read-only.
fn write_files(dir: &Path) -> std::io::Result<()> {
    for (name, text) in SHIM {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444))?;
    }
    Ok(())
}

/// Why a folder's files are not the shim's.
enum Check {
    /// Someone else could have written them.
    Unsafe(String),
    /// Other files or other bytes than this binary's shim.
    Other(String),
}

/// Who owns `path` and who may write it: `None` when only the user (or, where `root_ok`, root: a
/// system-wide install) can change it.
fn not_private(path: &Path, m: &std::fs::Metadata, uid: u32, root_ok: bool) -> Option<String> {
    let owner_ok = m.uid() == uid || (root_ok && m.uid() == 0);
    if owner_ok && m.mode() & 0o022 == 0 && !m.file_type().is_symlink() {
        return None;
    }
    Some(format!(
        "{} is not the user's alone (owner {}, mode {:o})",
        path.display(),
        m.uid(),
        m.mode() & 0o7777
    ))
}

/// The folder holds exactly the shim's files (and Python's `__pycache__`: another `.py` there would be
/// imported in its module's place by every Python process of a job), each this binary's, byte for byte,
/// and changeable by nobody else.
fn check_files(dir: &Path, uid: u32, root_ok: bool) -> Result<(), Check> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Check::Other(format!("{}: {e}", dir.display())))?;
    for e in entries.flatten() {
        let name = e.file_name();
        let known = SHIM.iter().any(|(n, _)| name == *n) || name == "__pycache__";
        if !known {
            return Err(Check::Other(format!(
                "{} is not one of the shim's files",
                e.path().display()
            )));
        }
    }
    for (name, text) in SHIM {
        let path = dir.join(name);
        let m = std::fs::symlink_metadata(&path)
            .map_err(|e| Check::Other(format!("{}: {e}", path.display())))?;
        if let Some(why) = not_private(&path, &m, uid, root_ok) {
            return Err(Check::Unsafe(why));
        }
        let same = m.is_file()
            && m.len() == text.len() as u64
            && std::fs::read(&path).is_ok_and(|b| b == text.as_bytes());
        if !same {
            return Err(Check::Other(format!(
                "{} is not the shim gpudoc wrote",
                path.display()
            )));
        }
    }
    Ok(())
}

/// The cache folder is the user's alone (no one else may even read it) and holds exactly the shim's files.
fn check_folder(dir: &Path, uid: u32) -> Result<(), String> {
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if m.uid() != uid || m.mode() & 0o077 != 0 || m.file_type().is_symlink() {
        return Err(format!(
            "{} is not the user's alone (owner {}, mode {:o})",
            dir.display(),
            m.uid(),
            m.mode() & 0o7777
        ));
    }
    check_files(dir, uid, false).map_err(|c| match c {
        Check::Unsafe(why) | Check::Other(why) => why,
    })
}

/// FNV-1a over the files' names and contents: the folder's name changes with any byte of the shim.
fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, text) in SHIM {
        for &b in name
            .as_bytes()
            .iter()
            .chain([0u8].iter())
            .chain(text.as_bytes())
        {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(cache: &Path) -> Homes<'_> {
        Homes {
            installed: &[],
            cache: Some(cache),
        }
    }

    #[test]
    fn an_installed_packages_shim_is_used_as_it_is_when_it_is_this_binarys() {
        let site = tempfile::tempdir().unwrap();
        let pkg = site.path().join("gpudoc");
        let shim = pkg.join("_shim");
        std::fs::create_dir_all(&shim).unwrap();
        std::fs::set_permissions(&pkg, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        write_files(&shim).unwrap();
        std::fs::create_dir(shim.join("__pycache__")).unwrap();
        let private = tempfile::tempdir().unwrap();
        let installed = [pkg.clone()];
        let homes = Homes {
            installed: &installed,
            cache: None,
        };
        assert_eq!(shim_folder(homes, private.path()), (shim.clone(), None));
        assert!(!private.path().join("sitecustomize.py").exists(), "no copy");
        // Another version's shim: passed over quietly.
        std::fs::set_permissions(
            shim.join("_gpudoc_torch.py"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        std::fs::write(shim.join("_gpudoc_torch.py"), "# older\n").unwrap();
        assert_eq!(
            shim_folder(homes, private.path()),
            (private.path().to_path_buf(), None)
        );
        // A module that would shadow one of the standard library's in every Python process: not used.
        std::fs::set_permissions(
            shim.join("_gpudoc_torch.py"),
            std::fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let torch_py = SHIM
            .iter()
            .find(|(n, _)| *n == "_gpudoc_torch.py")
            .unwrap()
            .1;
        std::fs::write(shim.join("_gpudoc_torch.py"), torch_py).unwrap();
        std::fs::write(shim.join("json.py"), "").unwrap();
        assert_eq!(shim_folder(homes, private.path()).0, private.path());
        std::fs::remove_file(shim.join("json.py")).unwrap();
        // Writable by others: said.
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (used, note) = shim_folder(homes, private.path());
        assert_eq!(used, private.path());
        assert!(note.unwrap().contains("not the user's alone"));
    }

    #[test]
    fn the_shim_is_written_once_into_its_cache_folder_and_reused() {
        let cache = tempfile::tempdir().unwrap();
        let private = tempfile::tempdir().unwrap();
        let (dir, note) = shim_folder(cached(cache.path()), private.path());
        assert_eq!(note, None);
        assert!(dir.starts_with(cache.path().join("gpudoc")), "{dir:?}");
        let mode = std::fs::metadata(&dir).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let before = std::fs::metadata(dir.join("sitecustomize.py")).unwrap();
        let (again, _) = shim_folder(cached(cache.path()), private.path());
        assert_eq!(again, dir);
        let after = std::fs::metadata(dir.join("sitecustomize.py")).unwrap();
        assert_eq!(before.ino(), after.ino(), "not written again");
        assert!(!private.path().join("sitecustomize.py").exists());
    }

    #[test]
    fn a_changed_or_opened_shim_folder_is_not_used() {
        let cache = tempfile::tempdir().unwrap();
        let private = tempfile::tempdir().unwrap();
        let (dir, _) = shim_folder(cached(cache.path()), private.path());
        // A byte changed: the run uses a copy of its own and says why.
        let file = dir.join("_gpudoc_torch.py");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&file, "import os\n").unwrap();
        let (used, note) = shim_folder(cached(cache.path()), private.path());
        assert_eq!(used, private.path());
        assert!(note.unwrap().contains("is not the shim gpudoc wrote"));
        assert!(private.path().join("sitecustomize.py").exists());
        // A folder others may write to.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        let (used, note) = shim_folder(cached(cache.path()), private.path());
        assert_eq!(used, private.path());
        assert!(note.unwrap().contains("not the user's alone"), "mode");
        std::fs::set_permissions(
            cache.path().join("gpudoc"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let (_, note) = shim_folder(cached(cache.path()), private.path());
        assert!(note.unwrap().contains("gpudoc is not the user's alone"));
    }

    #[test]
    fn without_a_usable_cache_the_run_has_its_own_copy() {
        let private = tempfile::tempdir().unwrap();
        let (dir, note) = shim_folder(Homes::default(), private.path());
        assert_eq!((dir.as_path(), note), (private.path(), None));
        let colon = tempfile::tempdir().unwrap();
        let odd = colon.path().join("a:b");
        let (dir, note) = shim_folder(cached(&odd), private.path());
        assert_eq!((dir.as_path(), note), (private.path(), None));
        assert!(!odd.exists(), "nothing made where it cannot be used");
    }
}
