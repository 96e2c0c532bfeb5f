//! The scripted state of the fake GPUs: one JSON file, named by `FAKE_NVML_STATE`.
//!
//! Writers (tests, the `fakegpu` helper) take an exclusive `flock` on a lock file beside it and replace
//! the file by rename, so the library, which reads it on every call, never sees half a write.

use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Environment variable naming the state file.
pub const STATE_ENV: &str = "FAKE_NVML_STATE";

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// Everything the fake library reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct State {
    pub driver: String,
    /// CUDA driver version as NVML encodes it (13000 for 13.0).
    pub cuda: i32,
    pub devices: Vec<Device>,
    #[serde(default)]
    pub procs: Vec<Proc>,
    #[serde(default)]
    pub errors: Vec<Injected>,
    /// Calls that take this long before answering (a wedged driver).
    #[serde(default)]
    pub delays: Vec<Delay>,
}

/// A function that answers only after `ms` milliseconds (`*`: every function).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Delay {
    pub func: String,
    pub ms: u64,
}

/// One fake GPU. `used` as NVML reports it is `base_used` plus the bytes of its live processes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Device {
    pub name: String,
    pub uuid: String,
    pub total: u64,
    /// Memory the driver keeps for itself (NVML v2 `reserved`).
    pub reserved: u64,
    /// Memory in use that no listed process accounts for.
    #[serde(default)]
    pub base_used: u64,
}

/// A process holding memory on a fake GPU.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Proc {
    pub pid: u32,
    pub gpu: u32,
    pub bytes: u64,
    /// Listed by the graphics-process call instead of the compute one.
    #[serde(default)]
    pub graphics: bool,
    /// Listed even when no such PID exists (memory held for a dead or foreign-namespace process).
    #[serde(default)]
    pub ghost: bool,
}

/// An error code a function returns, for one GPU or all of them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Injected {
    pub func: String,
    #[serde(default)]
    pub gpu: Option<u32>,
    pub code: i32,
}

impl State {
    /// `n` H200s as measured (143771 MiB total, 615 MiB driver reserve), nothing running.
    pub fn h200s(n: u32) -> State {
        State {
            driver: "580.159.04".into(),
            cuda: 13000,
            devices: (0..n)
                .map(|i| Device {
                    name: "NVIDIA H200".into(),
                    uuid: format!("GPU-fa4e0000-0000-0000-0000-00000000000{i}"),
                    total: 143771 * MIB,
                    reserved: 615 * MIB,
                    base_used: 0,
                })
                .collect(),
            procs: Vec::new(),
            errors: Vec::new(),
            delays: Vec::new(),
        }
    }

    pub fn load(path: &Path) -> Result<State, String> {
        let text = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes atomically (temp file + rename).
    pub fn store(&self, path: &Path) -> Result<(), String> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut f = fs::File::create(&tmp).map_err(|e| e.to_string())?;
        f.write_all(&serde_json::to_vec_pretty(self).unwrap())
            .map_err(|e| e.to_string())?;
        fs::rename(&tmp, path).map_err(|e| e.to_string())
    }

    /// Read-modify-write under an exclusive lock, so concurrent helpers don't lose each other's edits.
    pub fn update(path: &Path, f: impl FnOnce(&mut State)) -> Result<(), String> {
        let lock_path = lock_path(path);
        let lock = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        // SAFETY: flock on an fd we own; released when `lock` is dropped.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("flock {}", lock_path.display()));
        }
        let mut state = State::load(path)?;
        f(&mut state);
        state.store(path)
    }

    /// Memory in use on `gpu`, counting only processes that are listed right now.
    pub fn used(&self, gpu: u32) -> u64 {
        let dev = &self.devices[gpu as usize];
        dev.base_used + self.listed_procs(gpu).map(|p| p.bytes).sum::<u64>()
    }

    /// The processes NVML would list on `gpu`: live ones (the driver frees a dead process's memory) and
    /// ghosts.
    pub fn listed_procs(&self, gpu: u32) -> impl Iterator<Item = &Proc> {
        self.procs
            .iter()
            .filter(move |p| p.gpu == gpu && (p.ghost || alive(p.pid)))
    }

    /// How long `func` takes to answer, if it was slowed down.
    pub fn delay(&self, func: &str) -> Option<std::time::Duration> {
        self.delays
            .iter()
            .find(|d| d.func == func || d.func == "*")
            .map(|d| std::time::Duration::from_millis(d.ms))
    }

    /// The code injected for `func` on `gpu`, if any.
    pub fn injected(&self, func: &str, gpu: Option<u32>) -> Option<i32> {
        self.errors
            .iter()
            .find(|e| e.func == func && (e.gpu.is_none() || e.gpu == gpu))
            .map(|e| e.code)
    }
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// A PID counts as alive while /proc has it and it is not a zombie. As for the real driver, a process whose
/// main thread has exited while others run on (it reads as a zombie) still holds its memory.
pub fn alive(pid: u32) -> bool {
    let zombie = match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .is_none_or(|(_, rest)| rest.trim_start().starts_with('Z')),
        Err(_) => return false,
    };
    !zombie
        || fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
            tasks
                .flatten()
                .any(|t| t.file_name().to_str() != Some(pid.to_string().as_str()))
        })
}

/// Parses `123`, `512MiB`, `1.5GiB`, `4KiB`, `10B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => MIB,
        "GiB" => GIB,
        other => return Err(format!("bad unit {other:?} in {s:?}")),
    };
    Ok((n * mult as f64).round() as u64)
}
