//! What `gpudoc run` left running, kept for `gpudoc orphans`. While the job runs, gpudoc is its subreaper
//! and knows exactly which processes it leaves behind; once gpudoc has exited, nothing else does: in a
//! script (CI, sbatch) a leftover's process group is still led by the script's shell, which looks like a
//! living job. So each run records its leftovers by PID and start time (a PID reused since is never taken
//! for one), with the run's command, in a file of the user's own (folder 0700, file 0600); `gpudoc orphans`
//! judges a recorded process with certainty. An entry is dropped once its process is gone, or when the
//! machine has booted since; the file keeps at most [`MAX_ENTRIES`].

use crate::procs;
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The file's format.
pub const SCHEMA: &str = "gpudoc.leftovers/1";
/// Entries kept at most, the newest: a bound on a file nothing else cleans.
pub const MAX_ENTRIES: usize = 1000;

/// One process a run left running.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub pid: u32,
    /// Start time in clock ticks since boot: with the PID, the process's identity.
    pub start_ticks: u64,
    /// The kernel's boot and the PID namespace it was seen in: a PID means nothing elsewhere.
    pub boot_id: String,
    pub pid_ns: u64,
    /// The command `gpudoc run` ran.
    pub run: Vec<String>,
    /// When that run ended, seconds since the Unix epoch.
    pub ended_unix_s: f64,
    /// GPU memory it held at the run's last sample, `[gpu, bytes]`.
    pub gpu_bytes: Vec<(u32, u64)>,
    /// gpudoc was started ignoring SIGHUP (`nohup gpudoc run`): the process may ignore it from there.
    pub hup_inherited: bool,
}

#[derive(Serialize, Deserialize)]
struct File {
    schema: String,
    entries: Vec<Entry>,
}

/// Why the record could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Folder(#[from] crate::private::FolderError),
}

/// Where this machine is: its boot and this process's PID namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Here {
    pub boot_id: String,
    pub pid_ns: u64,
}

impl Here {
    /// Read from /proc; `None` where it can't be (then nothing is recorded or believed).
    pub fn read() -> Option<Here> {
        let boot_id = fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        let pid_ns = fs::metadata("/proc/self/ns/pid").ok()?.ino();
        Some(Here {
            boot_id: boot_id.trim().to_string(),
            pid_ns,
        })
    }
}

/// The entries still worth keeping: of this boot; of this namespace only those whose process still runs
/// (`running(pid, start_ticks)`); another namespace's kept, as it can't be checked from here; the newest
/// [`MAX_ENTRIES`].
pub fn prune(
    mut entries: Vec<Entry>,
    here: &Here,
    running: impl Fn(u32, u64) -> bool,
) -> Vec<Entry> {
    entries.retain(|e| {
        e.boot_id == here.boot_id && (e.pid_ns != here.pid_ns || running(e.pid, e.start_ticks))
    });
    entries.sort_by(|a, b| a.ended_unix_s.total_cmp(&b.ended_unix_s));
    let excess = entries.len().saturating_sub(MAX_ENTRIES);
    entries.drain(..excess);
    entries
}

/// Whether the process `pid` that started at `start_ticks` still runs.
pub fn running(pid: u32, start_ticks: u64) -> bool {
    procs::read(pid).is_some_and(|p| p.start_ticks == start_ticks && !p.zombie)
}

/// The record file of one user.
#[derive(Debug, Clone)]
pub struct Record {
    pub path: PathBuf,
}

impl Record {
    pub fn at(path: PathBuf) -> Record {
        Record { path }
    }

    /// The entries of this machine whose process still runs, seen from here; none where there is no record
    /// (`None`: no state folder) or this machine can't be told apart (see [`Here::read`]).
    pub fn living_here(record: Option<&Record>) -> Result<Vec<Entry>, RecordError> {
        match (record, Here::read()) {
            (Some(record), Some(here)) => record.living(&here),
            _ => Ok(Vec::new()),
        }
    }

    /// The entries of this machine whose process still runs; none where there is no record yet.
    pub fn living(&self, here: &Here) -> Result<Vec<Entry>, RecordError> {
        if !self.path.exists() {
            return Ok(Vec::new());
        }
        self.update(here, Vec::new())
    }

    /// Adds `new` (a run's leftovers) and drops what is gone, under a lock so parallel runs keep each
    /// other's entries; this machine's living entries.
    pub fn update(&self, here: &Here, new: Vec<Entry>) -> Result<Vec<Entry>, RecordError> {
        let dir = self.folder()?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RecordError::Io { path, source }
        };
        let lock = fs::File::open(&dir).map_err(io(&dir))?;
        // SAFETY: flock on a descriptor we own; released when `lock` is closed.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) } != 0 {
            return Err(io(&dir)(io::Error::last_os_error()));
        }
        // Unreadable or garbled: it is gpudoc's own state, started again.
        let before: Vec<Entry> = fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice::<File>(&b).ok())
            .filter(|f| f.schema == SCHEMA)
            .map(|f| f.entries)
            .unwrap_or_default();
        let changed = !new.is_empty();
        let mut entries = before.clone();
        entries.extend(new);
        let entries = prune(entries, here, running);
        if changed || entries != before {
            let file = File {
                schema: SCHEMA.into(),
                entries: entries.clone(),
            };
            let text = serde_json::to_vec_pretty(&file).expect("a record serializes");
            write_private(&dir, &self.path, &text).map_err(io(&self.path))?;
        }
        Ok(entries
            .into_iter()
            .filter(|e| e.boot_id == here.boot_id && e.pid_ns == here.pid_ns)
            .collect())
    }

    /// The record's folder, made private to the user if it is new; refused if it is someone else's (a
    /// `sudo` that kept the user's HOME).
    fn folder(&self) -> Result<PathBuf, RecordError> {
        let dir = self.path.parent().unwrap_or(Path::new(".")).to_path_buf();
        crate::private::make(&dir)?;
        Ok(dir)
    }
}

/// Writes `path` whole through a new file in `dir` (mode 0600) renamed over it: a reader sees the old
/// record or the new one, never half of one.
fn write_private(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!(".leftovers.{}.tmp", std::process::id()));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let written = f.write_all(bytes).and_then(|()| f.sync_all());
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: u32, boot: &str, ns: u64, ended: f64) -> Entry {
        Entry {
            pid,
            start_ticks: 100,
            boot_id: boot.into(),
            pid_ns: ns,
            run: vec!["python3".into(), "train.py".into()],
            ended_unix_s: ended,
            gpu_bytes: vec![(0, 1 << 30)],
            hup_inherited: false,
        }
    }

    #[test]
    fn gone_processes_and_earlier_boots_are_dropped_other_namespaces_kept() {
        let here = Here {
            boot_id: "b".into(),
            pid_ns: 7,
        };
        let kept = prune(
            vec![
                entry(10, "b", 7, 1.0),
                entry(11, "b", 7, 2.0),
                entry(12, "a", 7, 3.0),
                entry(13, "b", 8, 4.0),
            ],
            &here,
            |pid, _| pid == 10,
        );
        let pids: Vec<u32> = kept.iter().map(|e| e.pid).collect();
        assert_eq!(pids, [10, 13]);
    }

    #[test]
    fn the_record_keeps_the_newest_entries_only() {
        let here = Here {
            boot_id: "b".into(),
            pid_ns: 7,
        };
        let many = (0..MAX_ENTRIES as u32 + 5)
            .map(|i| entry(i, "b", 7, f64::from(i)))
            .collect();
        let kept = prune(many, &here, |_, _| true);
        assert_eq!(kept.len(), MAX_ENTRIES);
        assert_eq!(kept[0].pid, 5, "the oldest went first");
    }

    #[test]
    fn the_record_is_private_to_its_user() {
        let d = tempfile::tempdir().unwrap();
        let r = Record::at(d.path().join("state/gpudoc/leftovers.json"));
        let here = Here::read().unwrap();
        let me = procs::read(std::process::id()).unwrap();
        let mine = Entry {
            pid: me.pid,
            start_ticks: me.start_ticks,
            boot_id: here.boot_id.clone(),
            pid_ns: here.pid_ns,
            ..entry(0, "", 0, 1.0)
        };
        let gone = Entry {
            start_ticks: me.start_ticks + 1,
            ..mine.clone()
        };
        let kept = r.update(&here, vec![mine.clone(), gone]).unwrap();
        assert_eq!(
            kept,
            std::slice::from_ref(&mine),
            "a PID now another process is dropped"
        );
        assert_eq!(r.living(&here).unwrap(), kept);
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&r.path), 0o600);
        assert_eq!(mode(r.path.parent().unwrap()), 0o700);
    }
}
