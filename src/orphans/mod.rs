//! Who holds the GPUs: every process with GPU memory (NVML) or an open NVIDIA device file (/proc/*/fd),
//! with the facts `ps` would give, and a verdict on whether it is a leftover. `gpudoc orphans` lists them;
//! [`end`] ends leftovers safely.

pub mod end;
pub mod record;
pub mod table;

use crate::gpu;
use crate::units::{printable, shorten};
use procfs::process::{FDTarget, Process};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Test-only: the device path prefix to look for instead of `/dev/nvidia` (a test holds a fake file).
pub const DEV_PREFIX_ENV: &str = "GPUDOC_NVIDIA_DEV_PREFIX";
/// Where NVIDIA device files are.
pub const DEV_PREFIX: &str = "/dev/nvidia";

/// Processes that hold NVIDIA devices by design: never leftovers.
const SERVICES: [&str; 8] = [
    "nvidia-persistenced",
    "nv-hostengine",
    "nvidia-smi",
    "dcgm",
    "Xorg",
    "Xwayland",
    "gnome-shell",
    "nvidia-fabricmanager",
];

/// Subreapers (by `comm`) that adopt the processes whose parent died, as init does: under one of them, a
/// process whose job is gone is a leftover. Under any other living parent it is that parent's business.
const SUBREAPERS: [&str; 7] = [
    "systemd",
    "tini",
    "dumb-init",
    "catatonit",
    "s6-svscan",
    "docker-init",
    "gpudoc",
];

/// Why a process detached on purpose is not ended.
pub const DETACHED: &str = "detached on purpose (it ignores SIGHUP, as under nohup): `gpudoc orphans --kill --detached` ends it";

/// Why a recorded leftover that holds no GPU is not ended.
pub const HOLDS_NO_GPU: &str = "holds no GPU memory or device (a tmux server, tensorboard or Jupyter server started from a run, say): `gpudoc orphans --kill --without-gpu` ends it";

/// What `--kill` ends beyond the leftovers, each asked for by its flag.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Widen {
    /// `--detached`: what was detached on purpose (`nohup`) and holds GPU memory.
    pub detached: bool,
    /// `--without-gpu`: what a `gpudoc run` recorded it left that holds no GPU memory or device.
    pub without_gpu: bool,
}

/// What gpudoc makes of a GPU-holding process.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Its parent died: re-parented to init or a subreaper, or its process group's leader is gone.
    Orphan,
    /// Would be an orphan, but it ignores SIGHUP (`nohup`): detached on purpose to outlive its shell.
    Detached,
    /// Dead or dying; its memory goes back once its parent reaps it.
    Zombie,
    /// NVML lists it but /proc does not have it.
    Ghost,
    /// A system service that holds the devices by design.
    Service,
    /// Part of a running job.
    Live,
}

/// One process that holds GPU memory or an NVIDIA device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Holder {
    pub pid: u32,
    pub verdict: Verdict,
    /// Why, in one line: `why` in the words of `rules/words/process-reason.toml`, said by whoever shows
    /// the holder (empty until then).
    pub reason: String,
    /// Why, as data: the kind of reason and its figures (none in what was saved before it was kept).
    #[serde(default)]
    pub why: Option<Why>,
    /// GPU memory per GPU index, from NVML.
    pub gpu_bytes: Vec<(u32, u64)>,
    /// NVIDIA device files it has open.
    pub devices: Vec<String>,
    pub ppid: Option<u32>,
    pub parent_cmd: Option<String>,
    pub pgid: Option<u32>,
    pub sid: Option<u32>,
    pub tty: Option<String>,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub state: Option<String>,
    /// Start time in clock ticks since boot (with the PID, the process's identity).
    pub start_ticks: Option<u64>,
    pub age_s: Option<f64>,
    pub cmdline: String,
    /// The `gpudoc run` that left it running, when one recorded it (see [`record`]).
    #[serde(default)]
    pub left_by: Option<String>,
}

impl Holder {
    pub fn total_bytes(&self) -> u64 {
        self.gpu_bytes.iter().map(|&(_, b)| b).sum()
    }

    /// Its owner in words: the user's name, else `uid N`; `None` when /proc can't tell (a ghost).
    pub fn owner(&self) -> Option<String> {
        let uid = self.uid?;
        Some(self.user.clone().unwrap_or_else(|| format!("uid {uid}")))
    }

    /// Leftovers are what `--kill` ends: orphans that hold GPU memory, and what a `gpudoc run` recorded it
    /// left (it said so, and pointed here) that holds GPU memory or a device. An orphan with only a device
    /// file open (an NVML-reading tool, say) holds nothing worth ending; nor does a recorded one that holds
    /// no GPU at all: a tmux server first started from a run serves every session made on it since.
    pub fn is_leftover(&self) -> bool {
        self.verdict == Verdict::Orphan && self.worth_ending()
    }

    /// What `--kill` ends: the leftovers, and what `widen`'s flags ask for too (what is spared without
    /// them, and not with them).
    pub fn is_target(&self, widen: Widen) -> bool {
        self.is_leftover()
            || (self.spared(Widen::default()).is_some() && self.spared(widen).is_none())
    }

    /// Why `--kill` leaves a process that a flag would have it end (the flag named), when `widen` does not
    /// ask for it.
    pub fn spared(&self, widen: Widen) -> Option<&'static str> {
        let recorded_idle = self.verdict == Verdict::Orphan
            && self.left_by.is_some()
            && self.total_bytes() == 0
            && self.devices.is_empty();
        if self.verdict == Verdict::Detached && self.worth_ending() && !widen.detached {
            Some(DETACHED)
        } else if recorded_idle && !widen.without_gpu {
            Some(HOLDS_NO_GPU)
        } else {
            None
        }
    }

    fn worth_ending(&self) -> bool {
        self.total_bytes() > 0 || (self.left_by.is_some() && !self.devices.is_empty())
    }
}

/// The listing, and what could not be seen.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Listing {
    pub holders: Vec<Holder>,
    /// Processes whose open files could not be read (another user's, without root).
    pub unreadable: u64,
    /// Why NVML could not be asked, if it could not.
    pub nvml_error: Option<String>,
    /// Device memory in use per GPU (NVML `used`), at listing time.
    pub gpu_used: Vec<(u32, u64)>,
}

/// Per PID, its memory on each GPU: `[(gpu, bytes)]`.
pub type PerPid = BTreeMap<u32, Vec<(u32, u64)>>;

/// NVML's per-process memory on every GPU, and device memory in use per GPU; the reason when NVML is not
/// available.
pub fn nvml_memory(library: &str) -> Result<(PerPid, Vec<(u32, u64)>), String> {
    let (nvml, status, gpus) = gpu::open(library);
    let Some(nvml) = nvml else {
        return Err(status.error.unwrap_or_else(|| "NVML unavailable".into()));
    };
    Ok(read_memory(&nvml, &gpus))
}

/// Per-process memory and device memory in use, from an NVML already open.
pub fn read_memory(nvml: &nvml_wrapper::Nvml, gpus: &[gpu::GpuInfo]) -> (PerPid, Vec<(u32, u64)>) {
    let mut by_pid: BTreeMap<u32, Vec<(u32, u64)>> = BTreeMap::new();
    let mut used = Vec::new();
    for g in gpus {
        let Ok(dev) = nvml.device_by_index(g.index) else {
            continue;
        };
        if let Ok(m) = dev.memory_info() {
            used.push((g.index, m.used));
        }
        let mut here: BTreeMap<u32, u64> = BTreeMap::new();
        for list in [
            dev.running_compute_processes(),
            dev.running_graphics_processes(),
        ] {
            for p in list.unwrap_or_default() {
                let b = match p.used_gpu_memory {
                    nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                    nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                };
                let e = here.entry(p.pid).or_insert(0);
                *e = (*e).max(b);
            }
        }
        for (pid, b) in here {
            by_pid.entry(pid).or_default().push((g.index, b));
        }
    }
    (by_pid, used)
}

/// Every PID with an NVIDIA device file open, with those files; and how many processes could not be read.
pub fn device_holders(prefix: &str) -> (BTreeMap<u32, Vec<String>>, u64) {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut unreadable = 0;
    let Ok(all) = procfs::process::all_processes() else {
        return (out, 0);
    };
    for p in all.flatten() {
        let fds = match p.fd() {
            Ok(fds) => fds,
            Err(procfs::ProcError::PermissionDenied(_)) => {
                unreadable += 1;
                continue;
            }
            Err(_) => continue,
        };
        let fds: Vec<_> = fds.flatten().collect();
        let mut files: Vec<String> = fds
            .iter()
            .filter_map(|fd| match &fd.target {
                FDTarget::Path(path) => {
                    let s = path.to_string_lossy().into_owned();
                    s.starts_with(prefix).then_some(s)
                }
                _ => None,
            })
            .collect();
        if fds.is_empty() {
            files = thread_files(p.pid as u32, prefix);
        }
        if !files.is_empty() {
            files.sort();
            files.dedup();
            out.insert(p.pid as u32, files);
        }
    }
    (out, unreadable)
}

/// The device files a process whose main thread has exited holds: /proc shows its files through that
/// thread, which has none left, while its other threads still share them.
fn thread_files(pid: u32, prefix: &str) -> Vec<String> {
    let Some(tid) = crate::procs::other_threads(pid).into_iter().next() else {
        return Vec::new();
    };
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/task/{tid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|path| path.to_string_lossy().into_owned())
        .filter(|s| s.starts_with(prefix))
        .collect()
}

/// Lists every holder with its verdict, and every process a run recorded it left (`left`).
pub fn list(library: &str, prefix: &str, left: &[record::Entry]) -> Listing {
    listing(nvml_memory(library), prefix, left)
}

/// The holders, given NVML's memory (or why there is none), the device files open now and what runs
/// recorded they left.
pub fn listing(
    memory: Result<(PerPid, Vec<(u32, u64)>), String>,
    prefix: &str,
    left: &[record::Entry],
) -> Listing {
    let (mem, used, nvml_error) = match memory {
        Ok((m, u)) => (m, u, None),
        Err(e) => (BTreeMap::new(), Vec::new(), Some(e)),
    };
    let (devs, unreadable) = device_holders(prefix);
    let mut pids: Vec<u32> = mem
        .keys()
        .chain(devs.keys())
        .copied()
        .chain(left.iter().map(|e| e.pid))
        .collect();
    pids.sort();
    pids.dedup();
    let me = std::process::id();
    let holders = pids
        .into_iter()
        .filter(|&pid| pid != me)
        .map(|pid| {
            judged(
                pid,
                mem.get(&pid).cloned().unwrap_or_default(),
                devs.get(&pid).cloned().unwrap_or_default(),
                left,
            )
        })
        .collect();
    Listing {
        holders,
        unreadable,
        nvml_error,
        gpu_used: used,
    }
}

fn comm_of(pid: u32) -> Option<String> {
    Process::new(pid as i32).ok()?.stat().ok().map(|s| s.comm)
}

/// Reads a process's facts and judges it.
pub fn describe(pid: u32, gpu_bytes: Vec<(u32, u64)>, devices: Vec<String>) -> Holder {
    judged(pid, gpu_bytes, devices, &[])
}

/// Reads a process's facts and judges it, knowing what runs recorded they left (`left`).
fn judged(
    pid: u32,
    gpu_bytes: Vec<(u32, u64)>,
    devices: Vec<String>,
    left: &[record::Entry],
) -> Holder {
    let mut h = Holder {
        pid,
        verdict: Verdict::Ghost,
        reason: String::new(),
        why: Some(Why::default()),
        gpu_bytes,
        devices,
        ppid: None,
        parent_cmd: None,
        pgid: None,
        sid: None,
        tty: None,
        uid: None,
        user: None,
        state: None,
        start_ticks: None,
        age_s: None,
        cmdline: String::new(),
        left_by: None,
    };
    let proc_ = Process::new(pid as i32).ok();
    let stat = proc_.as_ref().and_then(|p| p.stat().ok());
    let Some(stat) = stat else {
        return h;
    };
    let p = proc_.unwrap();
    h.ppid = Some(stat.ppid as u32);
    h.parent_cmd = comm_of(stat.ppid as u32);
    h.pgid = Some(stat.pgrp as u32);
    h.sid = Some(stat.session as u32);
    h.tty = (stat.tty_nr != 0).then(|| tty_name(stat.tty_nr()));
    h.uid = p.uid().ok();
    h.user = h.uid.and_then(user_name);
    h.state = Some(stat.state.to_string());
    h.start_ticks = Some(stat.starttime);
    h.age_s = age_s(stat.starttime);
    h.cmdline = crate::procs::cmdline(pid, &stat.comm);
    let left_by = left
        .iter()
        .find(|e| e.pid == pid && e.start_ticks == stat.starttime)
        .map(LeftBy::of);
    h.left_by = left_by.as_ref().map(|l| l.run.clone());
    let parent_comm = h.parent_cmd.clone().unwrap_or_default();
    let (verdict, why) = judge(&lineage(&stat, parent_comm, left_by));
    (h.verdict, h.why) = (verdict, Some(why));
    h
}

/// What [`judge`] reads of a process and around it, from its `stat` and /proc.
fn lineage(stat: &procfs::process::Stat, parent_comm: String, left_by: Option<LeftBy>) -> Lineage {
    let pid = stat.pid as u32;
    Lineage {
        pid,
        ppid: stat.ppid as u32,
        pgid: stat.pgrp as u32,
        sid: stat.session as u32,
        state: stat.state,
        other_threads: crate::procs::other_threads(pid).len(),
        comm: stat.comm.clone(),
        parent_comm,
        init_comm: comm_of(1).unwrap_or_default(),
        pgid_alive: leads(stat.pgrp as u32),
        sid_alive: leads(stat.session as u32),
        ignores_hup: crate::procs::ignores_hup(pid),
        left_by,
    }
}

/// A terminal's name from its device numbers: `pts/N` for a pseudo-terminal.
fn tty_name((major, minor): (i32, i32)) -> String {
    if major == 136 {
        format!("pts/{minor}")
    } else {
        format!("tty({major},{minor})")
    }
}

fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}

/// Seconds since a process started, from its start time in clock ticks since boot.
fn age_s(start_ticks: u64) -> Option<f64> {
    let boot = procfs::boot_time_secs().ok()?;
    let started = boot as f64 + start_ticks as f64 / procfs::ticks_per_second() as f64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some((now - started).max(0.0))
}

/// What judging a process reads of it and around it: the input of [`judge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lineage {
    pub pid: u32,
    pub ppid: u32,
    /// Its process group and session; 0 when their leader is outside this PID namespace.
    pub pgid: u32,
    pub sid: u32,
    pub state: char,
    /// Its threads other than the main one: a process whose main thread has exited shows the state of a
    /// zombie while they run on.
    pub other_threads: usize,
    pub comm: String,
    pub parent_comm: String,
    /// The command of this namespace's PID 1.
    pub init_comm: String,
    /// The leaders of its process group and session still run (a dead leader no one has reaped is a
    /// zombie: gone).
    pub pgid_alive: bool,
    pub sid_alive: bool,
    /// It ignores SIGHUP.
    pub ignores_hup: bool,
    /// The `gpudoc run` that recorded it left it running.
    pub left_by: Option<LeftBy>,
}

/// The run that left a process running, as [`record`] has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeftBy {
    /// `gpudoc run` of `CMD`, which ended at TIME.
    pub run: String,
    /// That gpudoc was started ignoring SIGHUP: the process may ignore it from there.
    pub hup_inherited: bool,
}

impl LeftBy {
    pub fn of(e: &record::Entry) -> LeftBy {
        let ended =
            std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(e.ended_unix_s.max(0.0));
        let ago = std::time::SystemTime::now()
            .duration_since(ended)
            .map(|d| format!(" ({} ago)", crate::units::fmt_secs(d.as_secs_f64())))
            .unwrap_or_default();
        LeftBy {
            run: format!(
                "`gpudoc run {}`, which ended at {}{ago}",
                shorten(&printable(&e.run.join(" ")), 80),
                humantime::format_rfc3339_seconds(ended)
            ),
            hup_inherited: e.hup_inherited,
        }
    }
}

/// Why a process is judged as it is: the kind of reason and its figures. The words are the rules
/// layer's (`rules/words/process-reason.toml`), which `gpudoc orphans`, `gpudoc watch` and the
/// `leftover-holder` rule say them in; rules read it as `process.why`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Why {
    pub kind: WhyKind,
    /// The `gpudoc run` that left it running (`` `gpudoc run CMD`, which ended at TIME (AGO ago) ``), where
    /// one recorded it.
    pub left_by: Option<String>,
    /// Its parent's PID, and its parent's command.
    pub ppid: Option<u32>,
    pub parent: Option<String>,
    /// The leaders of its process group (its job) and of its session (the shell it was started from).
    pub pgid: Option<u32>,
    pub sid: Option<u32>,
    /// Its own command (`comm`).
    pub comm: Option<String>,
    /// The command of this PID namespace's PID 1.
    pub init: Option<String>,
    /// It would be an orphan, but ignores SIGHUP itself (not as the run that left it did): detached on
    /// purpose, its verdict `detached`.
    pub ignores_sighup: bool,
    /// Its main thread has exited while `threads` other threads run on: it reads as a zombie in /proc,
    /// and is not one.
    pub main_thread_exited: bool,
    pub threads: u32,
}

/// The kinds of [`Why`].
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum WhyKind {
    /// A `gpudoc run` recorded it left it running (`left_by`).
    LeftByRun,
    /// Every thread of it has exited; its parent (`ppid`) has not reaped it.
    Exited,
    /// A system service (`comm`) that holds the devices by design.
    Service,
    /// Re-parented to init, and its job's leader (process group `pgid`) is gone.
    GroupGone,
    /// Re-parented to init, and the session it was started in (`sid`) is gone.
    SessionGone,
    /// A child of PID 1 (`init`) that nothing shows was re-parented: PID 1 may have started it.
    UnderInit,
    /// Its job's leader (`pgid`) is gone, and a subreaper (`ppid`, `parent`) adopted it.
    Adopted,
    /// Its job's leader (`pgid`) is gone, but its parent (`ppid`, `parent`) is alive.
    ParentAlive,
    /// Part of a running job: its parent (`ppid`, `parent`) is alive.
    InJob,
    /// NVML lists its PID but /proc does not have it: a process in another PID namespace (a container),
    /// or memory the driver still holds for a dead process.
    #[default]
    NotInProc,
}

impl Why {
    /// One of every kind and figure, each modifier on and off: what the words are checked on.
    pub fn examples() -> Vec<Why> {
        let kinds = [
            WhyKind::LeftByRun,
            WhyKind::Exited,
            WhyKind::Service,
            WhyKind::GroupGone,
            WhyKind::SessionGone,
            WhyKind::UnderInit,
            WhyKind::Adopted,
            WhyKind::ParentAlive,
            WhyKind::InJob,
            WhyKind::NotInProc,
        ];
        let mut out = Vec::new();
        for kind in kinds {
            for (ignores_sighup, main_thread_exited) in
                [(false, false), (true, false), (false, true), (true, true)]
            {
                out.push(Why {
                    kind,
                    left_by: Some(
                        "`gpudoc run python train.py`, which ended at 2026-01-02T03:04:05Z (5m ago)"
                            .into(),
                    ),
                    ppid: Some(700),
                    parent: Some("systemd".into()),
                    pgid: Some(33),
                    sid: Some(20),
                    comm: Some("nvidia-persistenced".into()),
                    init: Some("tini".into()),
                    ignores_sighup,
                    main_thread_exited,
                    threads: u32::from(main_thread_exited) * 2,
                });
            }
        }
        out
    }

    /// A reason of `kind`, with what [`judge`] read of the process as its figures.
    fn of(kind: WhyKind, l: &Lineage) -> Why {
        Why {
            kind,
            left_by: l.left_by.as_ref().map(|r| r.run.clone()),
            ppid: Some(l.ppid),
            parent: Some(printable(&l.parent_comm).into_owned()),
            pgid: Some(l.pgid),
            sid: Some(l.sid),
            comm: Some(printable(&l.comm).into_owned()),
            init: Some(printable(&l.init_comm).into_owned()),
            ..Why::default()
        }
    }
}

/// The verdict and why. An orphan is a process whose parent died: one that sits under PID 1 (or a
/// subreaper) only counts as one when something shows it was re-parented: the leader of its process group
/// (the job it was started as) or of its session (the shell it was started from) is gone. A child that
/// PID 1 started itself (a container's entrypoint script running the job, a systemd service) shows no
/// such loss, and is never judged a leftover: when it can't be told, nothing is ended.
///
/// A process that would be an orphan but ignores SIGHUP was detached on purpose (`nohup python train.py &`
/// and log out): it is listed, and ended only when asked by name (`--detached`).
pub fn judge(l: &Lineage) -> (Verdict, Why) {
    let (mut verdict, kind) = match &l.left_by {
        Some(_) if !is_zombie(l) => (Verdict::Orphan, WhyKind::LeftByRun),
        _ => judge_lineage(l),
    };
    let mut why = Why::of(kind, l);
    let hup_its_own = !l.left_by.as_ref().is_some_and(|r| r.hup_inherited);
    if verdict == Verdict::Orphan && l.ignores_hup && hup_its_own {
        verdict = Verdict::Detached;
        why.ignores_sighup = true;
    }
    if matches!(l.state, 'Z' | 'X' | 'x') && verdict != Verdict::Zombie {
        why.main_thread_exited = true;
        why.threads = l.other_threads as u32;
    }
    (verdict, why)
}

/// Every thread of it has exited.
fn is_zombie(l: &Lineage) -> bool {
    matches!(l.state, 'Z' | 'X' | 'x') && l.other_threads == 0
}

fn judge_lineage(l: &Lineage) -> (Verdict, WhyKind) {
    if is_zombie(l) {
        return (Verdict::Zombie, WhyKind::Exited);
    }
    if SERVICES.iter().any(|s| l.comm.starts_with(s)) {
        return (Verdict::Service, WhyKind::Service);
    }
    let group_gone = l.pgid != 0 && l.pgid != l.pid && !l.pgid_alive;
    let session_gone = l.sid != 0 && l.sid != l.pid && !l.sid_alive;
    let under_init = l.ppid <= 1;
    let under_subreaper = SUBREAPERS.contains(&l.parent_comm.as_str());
    match (group_gone, session_gone, under_init) {
        (true, _, true) => (Verdict::Orphan, WhyKind::GroupGone),
        (false, true, true) => (Verdict::Orphan, WhyKind::SessionGone),
        (false, false, true) => (Verdict::Live, WhyKind::UnderInit),
        (true, _, false) if under_subreaper => (Verdict::Orphan, WhyKind::Adopted),
        (true, _, false) => (Verdict::Live, WhyKind::ParentAlive),
        (false, _, false) => (Verdict::Live, WhyKind::InJob),
    }
}

/// Whether the leader of a process group or session runs; 0 (a leader outside this PID namespace) counts
/// as running.
fn leads(pid: u32) -> bool {
    pid == 0 || crate::procs::alive(pid)
}

/// Polls NVML until device memory stops falling (the driver frees a dead process's memory shortly after
/// it exits), up to 3 s; returns what came back per GPU.
pub fn memory_back(library: &str, before: &[(u32, u64)]) -> Vec<(u32, u64)> {
    use std::time::{Duration, Instant};
    let until = Instant::now() + Duration::from_secs(3);
    let mut last: Vec<(u32, u64)> = Vec::new();
    loop {
        let now = nvml_memory(library).map(|(_, u)| u).unwrap_or_default();
        if now == last || Instant::now() >= until {
            last = now;
            break;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(200));
    }
    before
        .iter()
        .filter_map(|&(g, b)| {
            let after = last.iter().find(|&&(x, _)| x == g)?.1;
            (b > after).then_some((g, b - after))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn under_init(pgid: u32, sid: u32, pgid_alive: bool, sid_alive: bool) -> Lineage {
        Lineage {
            pid: 40,
            ppid: 1,
            pgid,
            sid,
            state: 'S',
            other_threads: 0,
            comm: "python3".into(),
            parent_comm: "bash".into(),
            init_comm: "bash".into(),
            pgid_alive,
            sid_alive,
            ignores_hup: false,
            left_by: None,
        }
    }

    #[test]
    fn a_job_started_by_pid_1_is_live() {
        // `unshare -pf ./entry.sh`: the group and session leaders are outside the namespace (0).
        assert_eq!(judge(&under_init(0, 0, true, true)).0, Verdict::Live);
        // `docker run ... bash -c`: PID 1 leads the group and the session.
        assert_eq!(judge(&under_init(1, 1, true, true)).0, Verdict::Live);
        // A systemd service, or a daemon: a session of its own.
        assert_eq!(judge(&under_init(40, 40, true, true)).0, Verdict::Live);
    }

    #[test]
    fn a_process_whose_job_or_shell_died_is_an_orphan() {
        // A DataLoader worker whose main process was killed: its group's leader is gone.
        let (v, why) = judge(&under_init(33, 20, false, true));
        assert_eq!(v, Verdict::Orphan, "{why:?}");
        assert_eq!((why.kind, why.pgid), (WhyKind::GroupGone, Some(33)));
        // `nohup python train.py &` from a shell that has exited: its own group, the session gone.
        let (v, why) = judge(&under_init(40, 20, true, false));
        assert_eq!(v, Verdict::Orphan, "{why:?}");
        assert_eq!((why.kind, why.sid), (WhyKind::SessionGone, Some(20)));
        // Re-parented to a subreaper rather than init.
        let mut l = under_init(33, 20, false, true);
        l.ppid = 700;
        l.parent_comm = "systemd".into();
        assert_eq!(judge(&l).0, Verdict::Orphan);
        l.pgid_alive = true;
        assert_eq!(judge(&l).0, Verdict::Live);
    }

    #[test]
    fn an_orphan_that_ignores_sighup_was_detached_on_purpose() {
        // `nohup python train.py &`, then the shell exited.
        let mut l = under_init(40, 20, true, false);
        l.ignores_hup = true;
        let (v, why) = judge(&l);
        assert_eq!(v, Verdict::Detached, "{why:?}");
        assert_eq!((why.kind, why.ignores_sighup), (WhyKind::SessionGone, true));
        // Under a living parent it is someone's job, whatever it ignores.
        l.ppid = 700;
        assert_eq!(judge(&l).0, Verdict::Live);
    }

    #[test]
    fn a_process_whose_parent_lives_is_never_a_leftover() {
        // Its group's leader exited (the first command of a pipeline, a launcher that left), but the
        // parent that started it is alive: it is still someone's job.
        let mut l = under_init(33, 20, false, false);
        l.ppid = 700;
        l.parent_comm = "bash".into();
        let (v, why) = judge(&l);
        assert_eq!(v, Verdict::Live, "{why:?}");
        assert_eq!(
            (why.kind, why.ppid, why.parent.as_deref()),
            (WhyKind::ParentAlive, Some(700), Some("bash"))
        );
    }

    #[test]
    fn zombies_and_services() {
        let mut l = under_init(33, 20, false, false);
        l.state = 'Z';
        assert_eq!(judge(&l).0, Verdict::Zombie);
        // Its main thread exited (pthread_exit in main), two threads run on: it is not dead.
        l.other_threads = 2;
        let (v, why) = judge(&l);
        assert_eq!(v, Verdict::Orphan, "{why:?}");
        assert_eq!(
            (why.kind, why.main_thread_exited, why.threads),
            (WhyKind::GroupGone, true, 2)
        );
        let mut l = under_init(33, 20, false, false);
        l.comm = "nvidia-persistenced".into();
        assert_eq!(judge(&l).0, Verdict::Service);
    }
}
