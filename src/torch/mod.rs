//! The framework view: PyTorch's caching allocator seen from inside every Python process of the job,
//! through a shim (`python/gpudoc/_shim/`, embedded here) that gpudoc puts first on `PYTHONPATH`: a tiny
//! `sitecustomize.py` that watches for `import torch`, and `_gpudoc_torch.py`, loaded only then, that
//! records the allocator from the optimizer's step hook at a cost kept under 0.5% of the step time. The
//! shim writes JSON lines to a named pipe in a private folder (mode 0700); this module reads them into a
//! [`TorchTimeline`]. The pipe is opened by path, not inherited: `subprocess` and torchrun close inherited
//! descriptors, and every rank must still reach gpudoc.

pub mod activity;
mod catch_up;
pub mod cells;
pub mod framework;
pub mod home;
pub mod hunt;
pub mod inside;
pub mod message;
mod stale;
pub mod view;
pub mod warmup;

use crate::timeline::{Micros, Series};
use crate::trace::SharedTrace;
use message::Kind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

/// The shim's files (the marker tells other shims the folder is one), written where [`home::shim_folder`]
/// says: every file of `python/gpudoc/_shim/` (tests/torch_shim.rs checks that none is left out).
pub const SHIM: [(&str, &str); 19] = [
    (
        "sitecustomize.py",
        include_str!("../../python/gpudoc/_shim/sitecustomize.py"),
    ),
    (
        "_gpudoc_site.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_site.py"),
    ),
    (
        "_gpudoc_torch.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch.py"),
    ),
    (
        "_gpudoc_torch_pipe.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_pipe.py"),
    ),
    (
        "_gpudoc_torch_peaks.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_peaks.py"),
    ),
    (
        "_gpudoc_torch_steps.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_steps.py"),
    ),
    (
        "_gpudoc_torch_clock.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_clock.py"),
    ),
    (
        "_gpudoc_torch_leaks.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_leaks.py"),
    ),
    (
        "_gpudoc_torch_phase.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_phase.py"),
    ),
    (
        "_gpudoc_torch_events.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_events.py"),
    ),
    (
        "_gpudoc_torch_start.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_start.py"),
    ),
    (
        "_gpudoc_torch_cells.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_cells.py"),
    ),
    (
        "_gpudoc_torch_notebook.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_torch_notebook.py"),
    ),
    (
        "_gpudoc_hunt.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_hunt.py"),
    ),
    (
        "_gpudoc_where.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_where.py"),
    ),
    (
        "_gpudoc_patch.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_patch.py"),
    ),
    (
        "_gpudoc_frameworks.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_frameworks.py"),
    ),
    (
        "_gpudoc_pipe.py",
        include_str!("../../python/gpudoc/_shim/_gpudoc_pipe.py"),
    ),
    (".gpudoc-shim", ""),
];
/// Longest line accepted from the shim (it writes under PIPE_BUF).
const MAX_LINE: usize = 8192;
/// Points kept per series of the framework view (about 1.5 MB each); past that, neighbours are merged.
pub const MAX_POINTS: usize = 100_000;
/// Step records kept per process and device; past this, every other one is dropped (the log thins evenly,
/// so slopes over the whole run survive).
pub const MAX_STEPS: usize = 4096;

/// Settings for the shim.
#[derive(Debug, Clone, Copy)]
pub struct ShimSettings {
    /// Reset PyTorch's peak counters at each record, so per-record peaks are exact (the program's own
    /// view of them is kept as if they were never reset).
    pub reset_peaks: bool,
    pub hunt: HuntMode,
    /// Write the allocator's snapshot (`--snapshot`): memory history is recorded from CUDA's start to the
    /// measured step.
    pub snapshot: bool,
}

/// When the shim hunts leaks (`--hunt-leaks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HuntMode {
    /// When allocated memory grows step after step past warm-up.
    #[default]
    Auto,
    /// From warm-up on, whatever memory does.
    On,
    /// Never.
    Off,
}

impl HuntMode {
    fn env(self) -> &'static str {
        match self {
            HuntMode::Auto => "auto",
            HuntMode::On => "on",
            HuntMode::Off => "off",
        }
    }
}
/// Hunts kept per run.
const MAX_HUNTS: usize = 64;
/// Largest hunt file read from the shim's folder.
const MAX_HUNT_FILE: u64 = 4 << 20;

/// A record of the optimizer's steps as the shim saw it: the numbers after step `step`, and the peaks over
/// the `steps` steps it covers (the shim records every Nth step when steps are fast, to keep its cost down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Step {
    pub step: u64,
    /// Steps this record covers (1: every step recorded).
    #[serde(default = "one")]
    pub steps: u64,
    pub at_s: f64,
    pub allocated_bytes: u64,
    /// What the allocator holds from the device; absent where the framework does not say (TensorFlow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// Peaks over the steps covered (exact when peaks are reset at each record; since the start with
    /// `--keep-torch-peaks`).
    pub peak_allocated_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    /// PyTorch's counters by then: alloc retries, cudaMalloc and cudaFree calls (absent for the other
    /// frameworks, which keep none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_retries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_allocs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_frees: Option<u64>,
}

fn one() -> u64 {
    1
}

/// Bounded step log: keeps every `stride`-th record, doubling the stride when full.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepLog {
    pub steps: Vec<Step>,
    pub stride: u64,
    pub total: u64,
}

impl StepLog {
    pub fn push(&mut self, s: Step) {
        self.total += 1;
        let stride = self.stride.max(1);
        if !(self.total - 1).is_multiple_of(stride) {
            return;
        }
        self.steps.push(s);
        if self.steps.len() >= MAX_STEPS {
            let mut keep = false;
            self.steps.retain(|_| {
                keep = !keep;
                keep
            });
            self.stride = stride * 2;
        }
    }
}

/// One process's allocator on one device: PyTorch's, or another framework's (`framework`).
#[derive(Debug, Clone, Default)]
pub struct TorchProc {
    pub pid: u32,
    pub framework: framework::Framework,
    pub rank: Option<serde_json::Value>,
    pub local_rank: Option<serde_json::Value>,
    /// torch's device index (after CUDA_VISIBLE_DEVICES).
    pub device: u32,
    /// The device's UUID, to find it among NVML's GPUs.
    pub uuid: Option<String>,
    pub allocated: Series,
    /// Its readings of reserved memory: none where its records never said it (TensorFlow's).
    pub reserved: Series,
    pub inactive_split: Series,
    /// The allocator's own peaks (exact, not sampled); reserved's `None` where never said.
    pub peak_allocated: u64,
    pub peak_reserved: Option<u64>,
    pub alloc_retries: u64,
    pub ooms: u64,
    pub device_allocs: u64,
    pub device_frees: u64,
    pub steps: StepLog,
    /// Optimizer steps seen (the last record's step number).
    pub last_step: u64,
    /// Steps per record the shim settled on last.
    pub record_every: u64,
    /// The shim's measured cost over its records, and the time of the steps those records covered, in µs
    /// (each message carries the previous record's cost).
    pub shim_cost_us: u64,
    pub covered_us: u64,
    /// Notebook cells run in this process (a kernel), in order.
    pub cells: Vec<cells::Cell>,
    /// When it first did its work (seconds into the run): the shim's first record at a forward call of
    /// the outermost model or at an optimizer step.
    pub first_work_s: Option<f64>,
    /// What only some frameworks tell: the allocator's limit, its largest free block (last read), the
    /// allocations it made, its free blocks; `None` where the records never said.
    pub limit: Option<u64>,
    pub largest_free_block: Option<u64>,
    pub allocations: Option<u64>,
    pub free_blocks: Option<u64>,
    pub pinned_free_blocks: Option<u64>,
}

/// The allocator's state at an OOM, from PyTorch's OOM observer (before the exception unwinds).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TorchOom {
    pub pid: u32,
    /// The framework whose allocator failed (absent: PyTorch's).
    #[serde(default, skip_serializing_if = "framework::Framework::is_torch")]
    pub framework: framework::Framework,
    pub rank: Option<serde_json::Value>,
    pub device: u32,
    pub uuid: Option<String>,
    pub at_s: f64,
    /// The allocation that failed (PyTorch's observer; the other frameworks' records do not say: absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// What the observer was told: the device's limit (another framework's: its allocator's limit) and
    /// its free memory; absent where not told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_limit_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_free_bytes: Option<u64>,
    pub allocated_bytes: u64,
    /// What the allocator held (absent where the framework does not say: TensorFlow), and of it in split
    /// blocks not in use (PyTorch's only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// What the program was doing then (the shim's reading; absent from a shim that did not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<activity::Activity>,
}

/// Everything the shim reported in a run.
#[derive(Debug, Clone, Default)]
pub struct TorchTimeline {
    /// Per (pid, device, framework): a process may use two frameworks on one GPU.
    pub procs: BTreeMap<(u32, u32, framework::Framework), TorchProc>,
    /// What each other framework's part of the shim said of itself, per (pid, framework).
    pub frameworks: BTreeMap<(u32, framework::Framework), framework::Hello>,
    pub ooms: Vec<TorchOom>,
    /// torch version per pid, from each process's first message.
    pub versions: BTreeMap<u32, String>,
    /// Shim failures: (pid, where, error).
    pub errors: Vec<(u32, String, String)>,
    pub messages: u64,
    /// Lines that were not valid shim messages.
    pub bad_lines: u64,
    /// Leak hunts, and what filled the GPU at OOMs.
    pub hunts: Vec<hunt::Hunt>,
    /// Where the memory went inside the model: at OOMs, and on the measured step.
    pub inside: Vec<inside::Inside>,
    /// `--snapshot`: the shim's snapshot that went to the user's file, and that file.
    pub snapshot_file: Option<SnapshotFile>,
}

/// The allocator snapshot `--snapshot` wrote: the shim's name for it, and the user's file it went to
/// (recorded in the trace's end row, so that a replay names the file as the run did).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotFile {
    pub shim: String,
    pub file: String,
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v.get(k).and_then(|x| x.as_u64()).unwrap_or(0)
}

impl TorchTimeline {
    /// Optimizer steps seen so far: the most any process of the job reported (ranks step together).
    pub fn steps_seen(&self) -> u64 {
        self.procs.values().map(|p| p.last_step).max().unwrap_or(0)
    }

    /// The shim's snapshot `shim` went to `file`: the record it belongs to names the file, and the
    /// others none (only one is written). `None`: no file was written (it could not be, or an older
    /// trace does not say which): no record names one, as the shim's own name is no file of the user's.
    pub fn name_snapshot(&mut self, snapshot: Option<SnapshotFile>) {
        for w in &mut self.inside {
            w.snapshot = snapshot
                .as_ref()
                .filter(|s| w.snapshot.as_deref() == Some(s.shim.as_str()))
                .map(|s| s.file.clone());
        }
        self.snapshot_file = snapshot;
    }

    /// Applies one line from the shim; whether it was a shim message. `start_unix` turns its wall-clock
    /// times into run time.
    pub fn apply(&mut self, line: &[u8], start_unix: f64) -> bool {
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(line) else {
            self.bad_lines += 1;
            return false;
        };
        let Some(pid) = v.get("pid").and_then(|p| p.as_u64()).map(|p| p as u32) else {
            self.bad_lines += 1;
            return false;
        };
        self.messages += 1;
        let Some(kind) = v.get("k").and_then(|k| k.as_str()).and_then(Kind::of) else {
            self.bad_lines += 1;
            return false;
        };
        let t = v
            .get("t")
            .and_then(|t| t.as_f64())
            .map(|t| (t - start_unix).max(0.0));
        let at: Micros = (t.unwrap_or(0.0) * 1e6) as Micros;
        let Some(fw) = framework::Framework::of(&v) else {
            self.bad_lines += 1;
            return false;
        };
        match kind {
            Kind::Hello if !fw.is_torch() => {
                self.frameworks
                    .insert((pid, fw), framework::Hello::from_message(&v));
            }
            Kind::Hello => {
                let version = v.get("torch").and_then(|x| x.as_str()).unwrap_or("?");
                self.versions.insert(pid, version.to_string());
            }
            Kind::Error => {
                let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
                self.errors.push((pid, s("where"), s("error")));
            }
            Kind::Hunt => {
                if self.hunts.len() < MAX_HUNTS
                    && let Some(h) = hunt::Hunt::from_message(&v, start_unix)
                {
                    self.hunts.push(h);
                }
            }
            Kind::Where => {
                if let Some(w) = inside::Inside::from_message(&v, start_unix) {
                    inside::keep(&mut self.inside, w, MAX_HUNTS);
                }
            }
            Kind::Sample | Kind::Step | Kind::Oom => self.sample(kind, (pid, fw), &v, t, at),
            Kind::Cell => {
                self.sample(kind, (pid, fw), &v, t, at);
                let p = self.procs.get_mut(&(pid, u(&v, "dev") as u32, fw));
                if let Some(p) = p {
                    if p.cells.len() >= cells::MAX_CELLS {
                        p.cells.remove(0);
                    }
                    p.cells.push(cells::Cell::from_message(&v, start_unix));
                }
            }
        }
        true
    }

    /// A record of the allocator (`s`: at CUDA's start, `step`: at an optimizer step, `oom`: at an OOM,
    /// `cell`: at a notebook cell's end).
    fn sample(
        &mut self,
        kind: Kind,
        (pid, fw): (u32, framework::Framework),
        v: &serde_json::Value,
        t: Option<f64>,
        at: Micros,
    ) {
        let dev = u(v, "dev") as u32;
        let p = self
            .procs
            .entry((pid, dev, fw))
            .or_insert_with(|| TorchProc {
                pid,
                framework: fw,
                device: dev,
                ..Default::default()
            });
        let got = |k: &str| v.get(k).and_then(|x| x.as_u64());
        p.limit = got("lim").or(p.limit);
        p.largest_free_block = got("lfb").or(p.largest_free_block);
        p.allocations = got("na").or(p.allocations);
        p.free_blocks = got("nfb").or(p.free_blocks);
        p.pinned_free_blocks = got("pfb").or(p.pinned_free_blocks);
        p.rank = v.get("rank").cloned().or(p.rank.take());
        p.local_rank = v.get("local_rank").cloned().or(p.local_rank.take());
        if let Some(id) = v.get("uuid").and_then(|x| x.as_str()) {
            p.uuid = Some(id.to_string());
        }
        // What a record leaves out its framework does not tell (TensorFlow's reserved): absent, never 0.
        let (a, r) = (u(v, "a"), got("r"));
        p.allocated.push(at, a);
        if let Some(r) = r {
            p.reserved.push(at, r);
        }
        p.inactive_split.push(at, u(v, "i"));
        // Allocated memory changes at nearly every sample of a training loop: bound what is kept.
        for s in [&mut p.allocated, &mut p.reserved, &mut p.inactive_split] {
            s.thin_to(MAX_POINTS);
        }
        p.peak_allocated = p.peak_allocated.max(u(v, "pa")).max(a);
        p.peak_reserved = [p.peak_reserved, got("pr"), r].into_iter().flatten().max();
        p.alloc_retries = p.alloc_retries.max(u(v, "nr"));
        p.ooms = p.ooms.max(u(v, "no"));
        p.device_allocs = p.device_allocs.max(u(v, "nda"));
        p.device_frees = p.device_frees.max(u(v, "ndf"));
        if matches!(kind, Kind::Step | Kind::Sample) {
            p.last_step = p.last_step.max(u(v, "step"));
        }
        // A record at a step, or one of the forward clock's (its first comes at the first call).
        if kind == Kind::Step || (kind == Kind::Sample && u(v, "fwd") > 0) {
            p.first_work_s = p.first_work_s.or(t);
        }
        if kind == Kind::Step {
            p.record_every = u(v, "n").max(1);
            if u(v, "c") > 0 {
                p.shim_cost_us += u(v, "c");
                p.covered_us += u(v, "n").max(1) * u(v, "p");
            }
            p.steps.push(Step {
                step: u(v, "step"),
                steps: u(v, "n").max(1),
                at_s: t.unwrap_or(0.0),
                allocated_bytes: a,
                reserved_bytes: r,
                peak_allocated_bytes: u(v, "pa"),
                peak_reserved_bytes: got("pr").or(r),
                alloc_retries: got("nr"),
                device_allocs: got("nda"),
                device_frees: got("ndf"),
            });
        }
        if kind == Kind::Oom && self.ooms.len() < 32 {
            self.ooms.push(TorchOom {
                pid,
                framework: fw,
                rank: p.rank.clone(),
                device: dev,
                uuid: p.uuid.clone(),
                at_s: t.unwrap_or(0.0),
                requested_bytes: got("alloc"),
                device_limit_bytes: got("device_allocated").or(got("lim")),
                device_free_bytes: got("device_free"),
                allocated_bytes: a,
                reserved_bytes: r,
                inactive_split_bytes: got("i"),
                activity: activity::Activity::from_message(v),
            });
        }
    }
}

/// The shim's folder, pipe and reader thread for one run.
pub struct Channel {
    _dir: tempfile::TempDir,
    /// Dropped after the folder is removed: until then, no other run takes it for a killed run's.
    _held: stale::Held,
    /// Why the shim's cached folder was not used, when that is worth saying.
    pub note: Option<String>,
    stop: Arc<AtomicBool>,
    reader: JoinHandle<()>,
    timeline: Arc<std::sync::Mutex<TorchTimeline>>,
}

impl Channel {
    /// Finds the shim's folder ([`home::shim_folder`]: an installed package's, or the user's cache), makes the pipe
    /// in a private folder of the run's, starts reading it, and returns the environment the command needs
    /// (`PYTHONPATH` first, the pipe's path, the settings).
    pub fn open(
        settings: ShimSettings,
        start_wall: SystemTime,
        pythonpath: Option<&std::ffi::OsStr>,
        (tmpdir, homes): (&std::path::Path, home::Homes),
        trace: Option<SharedTrace>,
    ) -> std::io::Result<(Channel, Vec<(String, OsString)>)> {
        let dir = private_dir(tmpdir)?;
        let held = stale::hold(dir.path())?;
        let (shim, note) = home::shim_folder(homes, dir.path());
        let fifo = dir.path().join("torch.pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))?;
        // Read-write, so the pipe never reports end-of-file while no writer is open.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&fifo)?;
        let mut path = OsString::from(&shim);
        if let Some(old) = pythonpath {
            path.push(":");
            path.push(old);
        }
        // One variable: hunt mode, peaks, where, warm-up, then the pipe's path (last: a path may hold
        // any character).
        let mut setting = OsString::from(format!(
            "hunt={};peaks={};where={};warmup={};pipe=",
            settings.hunt.env(),
            if settings.reset_peaks {
                "reset"
            } else {
                "keep"
            },
            if settings.snapshot { "snapshot" } else { "on" },
            warmup::STEPS
        ));
        setting.push(&fifo);
        let env = vec![
            ("PYTHONPATH".to_string(), path),
            ("GPUDOC_TORCH".to_string(), setting),
        ];
        let start_unix = start_wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let folder = dir.path().to_path_buf();
        let timeline = Arc::new(std::sync::Mutex::new(TorchTimeline::default()));
        let into = timeline.clone();
        let reader = std::thread::Builder::new()
            .name("gpudoc-torch".into())
            .spawn(move || read_loop(file, &flag, start_unix, &folder, trace, &into))?;
        Ok((
            Channel {
                _dir: dir,
                _held: held,
                note,
                stop,
                reader,
                timeline,
            },
            env,
        ))
    }

    /// The timeline so far, shared with the reader (locked only while a message is applied).
    pub fn timeline(&self) -> Arc<std::sync::Mutex<TorchTimeline>> {
        self.timeline.clone()
    }

    /// Reads what is left and returns the timeline; the folder is removed.
    pub fn close(self) -> TorchTimeline {
        self.finish(false).0
    }

    /// Reads what is left and returns the timeline, and with `snapshot` the allocator snapshot the shim
    /// wrote (the first OOM's, else the measured step's: [`chosen_snapshot`]), read before the folder is
    /// removed.
    pub fn finish(self, snapshot: bool) -> (TorchTimeline, Option<(String, Vec<u8>)>) {
        self.stop.store(true, Ordering::SeqCst);
        self.reader.thread().unpark();
        let _ = self.reader.join();
        let t = std::mem::take(&mut *self.timeline.lock().unwrap());
        let bytes = snapshot
            .then(|| chosen_snapshot(&t))
            .flatten()
            .and_then(|name| Some((name.clone(), read_snapshot(self._dir.path(), &name)?)));
        (t, bytes)
    }
}

/// The snapshot `--snapshot` writes: the first OOM's, else the measured step's.
pub fn chosen_snapshot(t: &TorchTimeline) -> Option<String> {
    let with = |why: &str| {
        t.inside
            .iter()
            .filter(|w| w.why == why)
            .find_map(|w| w.snapshot.clone())
    };
    with("oom").or_else(|| with("peak"))
}

/// A snapshot file of the shim's, by the name its message gave (a plain name in the folder, nothing
/// else).
fn read_snapshot(folder: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    if !name.starts_with("snapshot-") || !name.ends_with(".pickle") || name.contains('/') {
        return None;
    }
    std::fs::read(folder.join(name)).ok()
}

/// A private folder (mode 0700) for the shim. Its path goes on PYTHONPATH, where `:` separates entries:
/// a TMPDIR with one in it is passed over for /tmp.
fn private_dir(tmp: &std::path::Path) -> std::io::Result<tempfile::TempDir> {
    let base = if tmp.to_string_lossy().contains(':') {
        std::path::PathBuf::from("/tmp")
    } else {
        tmp.to_path_buf()
    };
    let dir = tempfile::Builder::new()
        .prefix("gpudoc-")
        .tempdir_in(base)?;
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )?;
    Ok(dir)
}

/// How often the pipe is emptied. Reading in batches, not on every line, keeps gpudoc's wake-ups few when
/// a fast training loop reports every step; the pipe is made large enough to hold a batch.
const READ_EVERY: Duration = Duration::from_millis(20);
/// The pipe's capacity (the unprivileged maximum on Linux by default).
const PIPE_BYTES: libc::c_int = 1 << 20;

/// Reads the pipe until stopped; each message is applied and, with a trace, written to it as it came.
fn read_loop(
    mut file: std::fs::File,
    stop: &AtomicBool,
    start_unix: f64,
    folder: &std::path::Path,
    trace: Option<SharedTrace>,
    t: &std::sync::Mutex<TorchTimeline>,
) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor we own; failure leaves the default size, which is only less roomy.
    unsafe {
        libc::fcntl(file.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_BYTES);
        let flags = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(file.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
    let mut buf = vec![0u8; 64 * 1024];
    let mut line: Vec<u8> = Vec::new();
    let mut skipping = false;
    loop {
        // Stopping is checked before the read, so the last batch is read after the command ended.
        let last = stop.load(Ordering::SeqCst);
        loop {
            let n = match file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break, // WouldBlock: empty for now
            };
            for &b in &buf[..n] {
                if b == b'\n' {
                    if !skipping && !line.is_empty() {
                        let message = from_file(&line, folder).unwrap_or_else(|| line.clone());
                        if t.lock().unwrap().apply(&message, start_unix)
                            && let Some(tr) = &trace
                        {
                            tr.lock().unwrap().torch(&message);
                        }
                    } else if skipping {
                        t.lock().unwrap().bad_lines += 1;
                    }
                    line.clear();
                    skipping = false;
                } else if !skipping {
                    line.push(b);
                    if line.len() > MAX_LINE {
                        line.clear();
                        skipping = true;
                    }
                }
            }
        }
        if last {
            return;
        }
        // Parked, so closing the channel wakes it at once.
        std::thread::park_timeout(READ_EVERY);
    }
}

/// A message too large for one pipe write comes as `{"k":"file","name":...}`: the file in the shim's folder
/// holds it (read once, then removed).
fn from_file(line: &[u8], folder: &std::path::Path) -> Option<Vec<u8>> {
    if !line.starts_with(br#"{"k":"file""#) {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(line).ok()?;
    let name = v.get("name")?.as_str()?;
    if !name.starts_with("hunt-") || name.contains('/') {
        return None;
    }
    let path = folder.join(name);
    let size = std::fs::metadata(&path).ok()?.len();
    let text = (size <= MAX_HUNT_FILE).then(|| std::fs::read(&path).ok())??;
    let _ = std::fs::remove_file(&path);
    let end = text.iter().rposition(|&b| b == b'}')?;
    Some(text[..=end].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_log_thins_evenly_and_stays_bounded() {
        let mut log = StepLog::default();
        for i in 1..=100_000u64 {
            log.push(Step {
                step: i,
                steps: 1,
                at_s: i as f64,
                allocated_bytes: i,
                reserved_bytes: Some(i),
                peak_allocated_bytes: i,
                peak_reserved_bytes: Some(i),
                alloc_retries: Some(0),
                device_allocs: Some(0),
                device_frees: Some(0),
            });
        }
        assert!(log.steps.len() < MAX_STEPS);
        assert_eq!(log.total, 100_000);
        assert_eq!(log.steps[0].step, 1);
        let gaps: Vec<u64> = log
            .steps
            .windows(2)
            .map(|w| w[1].step - w[0].step)
            .collect();
        assert!(gaps.iter().all(|&g| g == gaps[0]), "even spacing");
    }

    #[test]
    fn a_large_message_is_read_from_its_file_once_and_only_from_the_shims_folder() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            r#"{{"k":"hunt","why":"auto","sites":[],"pad":"{}","pid":7}}"#,
            "x".repeat(9000)
        );
        std::fs::write(dir.path().join("hunt-7-1.json"), format!("{body}\n")).unwrap();
        let msg = br#"{"k":"file","name":"hunt-7-1.json","pid":7}"#;
        assert_eq!(from_file(msg, dir.path()).unwrap(), body.as_bytes());
        assert!(
            !dir.path().join("hunt-7-1.json").exists(),
            "removed once read"
        );
        assert_eq!(from_file(msg, dir.path()), None);
        for name in ["../hunt-7-1.json", "/etc/passwd", "other.json"] {
            let msg = format!(r#"{{"k":"file","name":"{name}","pid":7}}"#);
            assert_eq!(from_file(msg.as_bytes(), dir.path()), None, "{name}");
        }
        assert_eq!(from_file(br#"{"k":"step"}"#, dir.path()), None);
    }

    #[test]
    fn each_framework_of_a_process_has_its_own_view_and_an_unknown_one_is_no_message() {
        use framework::Framework;
        let mut t = TorchTimeline::default();
        t.apply(
            br#"{"k":"step","step":1,"dev":0,"t":101.0,"a":10,"r":20,"pid":7}"#,
            100.0,
        );
        t.apply(br#"{"k":"hello","fw":"jax","version":"0.11.2","settings":{"XLA_PYTHON_CLIENT_PREALLOCATE":"false"},"pid":7}"#, 100.0);
        t.apply(br#"{"k":"step","fw":"jax","step":1,"n":1,"dev":0,"t":101.0,"a":30,"pa":40,"r":64,"lim":96,"lfb":50,"na":3,"pid":7}"#, 100.0);
        assert!(!t.apply(br#"{"k":"step","fw":"mxnet","dev":0,"a":1,"pid":7}"#, 100.0));
        let torch = &t.procs[&(7, 0, Framework::Torch)];
        let jax = &t.procs[&(7, 0, Framework::Jax)];
        assert_eq!((torch.peak_allocated, torch.limit), (10, None));
        assert_eq!(
            (
                jax.peak_allocated,
                jax.peak_reserved,
                jax.limit,
                jax.largest_free_block
            ),
            (40, Some(64), Some(96), Some(50))
        );
        assert_eq!(t.procs.len(), 2);
        let hello = &t.frameworks[&(7, Framework::Jax)];
        assert_eq!(hello.settings["XLA_PYTHON_CLIENT_PREALLOCATE"], "false");
        assert!(t.versions.is_empty(), "JAX's hello is no torch version");
    }

    #[test]
    fn messages_build_the_timeline() {
        let mut t = TorchTimeline::default();
        t.apply(br#"{"k":"hello","torch":"2.11.0","pid":7,"rank":1}"#, 100.0);
        t.apply(br#"{"k":"s","dev":0,"uuid":"GPU-1","t":101.0,"a":10,"r":20,"pa":15,"pr":20,"i":3,"nr":0,"no":0,"nda":2,"ndf":0,"pid":7,"rank":1}"#, 100.0);
        t.apply(br#"{"k":"step","step":1,"dev":0,"t":101.5,"a":12,"r":20,"pa":18,"pr":20,"i":3,"nr":1,"no":0,"nda":2,"ndf":0,"pid":7,"rank":1}"#, 100.0);
        t.apply(b"not json", 100.0);
        let p = &t.procs[&(7, 0, framework::Framework::Torch)];
        assert_eq!(
            (p.peak_allocated, p.peak_reserved, p.alloc_retries),
            (18, Some(20), 1)
        );
        assert_eq!(p.steps.steps[0].at_s, 1.5);
        assert_eq!(p.rank, Some(serde_json::json!(1)));
        assert_eq!(t.versions[&7], "2.11.0");
        assert_eq!((t.messages, t.bad_lines), (3, 1));
    }
}
