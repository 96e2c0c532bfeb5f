//! What a `gpudoc run` in progress publishes for `gpudoc watch`: its forecasts, one small JSON file per run
//! (`$XDG_STATE_HOME/gpudoc/live/PID.json`), written whole (a temporary file renamed over it) when they
//! change, and removed when the run ends. A file whose gpudoc is gone (killed before it could remove it, or
//! its PID now another process's) is passed over. Errors are kept quiet: a folder that cannot be written
//! never costs the run anything but this.

use crate::verdict::Forecast;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One run's forecasts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Published {
    /// gpudoc's own PID and start time (clock ticks since boot): together, that process.
    pub pid: u32,
    pub start_ticks: u64,
    pub command: String,
    pub started_unix_s: f64,
    pub forecasts: Vec<Forecast>,
}

/// A GPU a run in progress forecasts full, as seen at one moment (`gpudoc watch`'s look).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunForecast {
    pub gpu: u32,
    /// Seconds from this moment until it is full.
    pub full_in_s: f64,
    /// The run's gpudoc, its command, and the rule that forecast it.
    pub pid: u32,
    pub command: String,
    pub rule: String,
    /// In words, as the run says its forecasts, with the run named (the look rule `forecast` says it).
    #[serde(skip)]
    pub words: String,
}

/// What the runs in progress forecast, seen at `now_unix_s`: each run's latest estimate, brought to now.
pub fn forecasts_at(runs: &[Published], now_unix_s: f64) -> Vec<RunForecast> {
    let mut out = Vec::new();
    for r in runs {
        let at_s = now_unix_s - r.started_unix_s;
        for f in &r.forecasts {
            let now = crate::verdict::Estimate { at_s, ..f.last };
            let command = crate::units::shorten(&crate::units::printable(&r.command), 60);
            out.push(RunForecast {
                gpu: f.gpu,
                full_in_s: now.full_in_s().max(0.0),
                pid: r.pid,
                command: r.command.clone(),
                rule: f.rule.clone(),
                words: format!(
                    "{} (gpudoc run, pid {}, {}: {command})",
                    f.words(&now),
                    r.pid,
                    f.rule
                ),
            });
        }
    }
    out
}

fn file(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.json"))
}

/// Writes (or replaces) this run's file.
pub fn publish(dir: &Path, p: &Published) -> std::io::Result<()> {
    // The first run to make the state folder may be one that publishes: it is made private as the
    // leftovers' record would make it.
    for d in dir.parent().into_iter().chain([dir]) {
        crate::private::make(d).map_err(std::io::Error::other)?;
    }
    let tmp = dir.join(format!(".{}.json.tmp", p.pid));
    std::fs::write(&tmp, serde_json::to_vec(p).map_err(std::io::Error::other)?)?;
    std::fs::rename(&tmp, file(dir, p.pid))
}

/// Removes this run's file.
pub fn withdraw(dir: &Path, pid: u32) {
    let _ = std::fs::remove_file(file(dir, pid));
}

/// The runs in progress: the files in `dir` whose gpudoc is still running.
pub fn read(dir: &Path) -> Vec<Published> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| serde_json::from_slice::<Published>(&std::fs::read(e.path()).ok()?).ok())
        .filter(|p| crate::procs::read(p.pid).is_some_and(|i| i.start_ticks == p.start_ticks))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn the_first_run_to_publish_makes_the_state_folder_private() {
        let d = tempfile::tempdir().unwrap();
        let gpudoc = d.path().join("state/gpudoc");
        let me = crate::procs::read(std::process::id()).unwrap();
        let p = Published {
            pid: me.pid,
            start_ticks: me.start_ticks,
            command: "python3 train.py".into(),
            started_unix_s: 1.0,
            forecasts: Vec::new(),
        };
        publish(&gpudoc.join("live"), &p).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&gpudoc), 0o700, "the leftovers' folder");
        assert_eq!(mode(&gpudoc.join("live")), 0o700);
        assert_eq!(read(&gpudoc.join("live")), [p]);
    }
}
