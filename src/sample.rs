//! The sampler: a thread of its own that opens NVML, then reads device memory for every GPU (1 kHz by
//! default) and the per-process lists (100 Hz by default), and keeps both as a [`Timeline`]. A query that
//! fails as unsupported is not asked again; a GPU that fails otherwise is marked lost from that moment
//! and no longer sampled. Nothing here can delay the command's start or hold back gpudoc's exit: NVML is
//! opened and called on this thread only, the shared state is locked only between NVML calls, and
//! [`Sampler::stop`] waits at most [`STOP_GRACE`] before taking what was sampled.

use crate::gpu::{self, Failure, GpuInfo, NvmlStatus};
use crate::procs::JobCache;
use crate::timeline::{GpuTimeline, Lost, Micros, ProcTimeline, Series, Timeline};
use crate::trace::SharedTrace;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often to sample. Device memory is read every `device` while any memory moves; once nothing has
/// changed for [`IDLE_AFTER`], every `device_idle` until the next change, which brings the fast rate back at
/// once. The process lists are read every `process` while memory moves, ten times less often while it is
/// flat, and right away when the device's memory changes. A flat hour then costs a fifth of the wake-ups,
/// and what moves is still seen at the fast rates.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    pub device: Duration,
    pub device_idle: Duration,
    pub process: Duration,
}

/// Points kept per series (8 MB each at most): memory that changes at every sample for days is thinned,
/// its peaks kept (see [`Series::thin_to`]); the trace file keeps every change.
pub const MAX_POINTS: usize = 500_000;
/// How long memory must stay flat before device sampling slows to `device_idle`.
pub const IDLE_AFTER: Duration = Duration::from_secs(1);
/// While memory is flat, the process lists are read this many times less often (and at once whenever the
/// device's memory moves).
pub const PROCESS_IDLE_FACTOR: u32 = 10;
/// The longest gpudoc waits for NVML once the command has ended: a wedged driver never holds the exit
/// code back longer.
pub const STOP_GRACE: Duration = Duration::from_secs(1);
/// The longest a command's exit waits for the sampler's last look at the process lists.
pub const LOOK_GRACE: Duration = Duration::from_millis(50);

impl Default for Rates {
    fn default() -> Self {
        Rates {
            device: Duration::from_millis(1),
            device_idle: Duration::from_millis(5),
            process: Duration::from_millis(10),
        }
    }
}

/// The latest numbers, for the live status line.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Per GPU; `None` once lost.
    pub gpus: Vec<Option<GpuNow>>,
}

/// One GPU's numbers right now.
#[derive(Debug, Clone, Copy, Default)]
pub struct GpuNow {
    pub index: u32,
    pub job: u64,
    pub job_peak: u64,
    pub used: u64,
    pub total: u64,
}

/// What the sampler thread and the rest of gpudoc share: locked only between NVML calls.
#[derive(Default)]
pub struct Shared {
    pub timeline: Timeline,
    pub trace: Option<SharedTrace>,
    /// NVML's status, once the thread has opened it.
    pub nvml: Option<NvmlStatus>,
    /// What the sampler found worth saying (a `CUDA_VISIBLE_DEVICES` naming no GPU here).
    pub notes: Vec<String>,
}

struct Probe<'n> {
    device: Device<'n>,
    memory: bool,
    compute: bool,
    graphics: bool,
}

/// The sampling state, usable without the thread (benchmarks drive it directly).
pub struct Core<'n> {
    probes: Vec<Probe<'n>>,
    shared: Arc<Mutex<Shared>>,
    cache: JobCache,
    start: Instant,
}

/// One NVML read of a device, done outside the lock.
enum Read<T> {
    Skip,
    Value(T),
    Failed(&'static str, nvml_wrapper::error::NvmlError),
}

impl<'n> Core<'n> {
    /// `job_root`: the PID whose descendants are the job (gpudoc itself, a subreaper). Fills the shared
    /// timeline's GPUs.
    pub fn new(
        nvml: &'n Nvml,
        gpus: &[GpuInfo],
        job_root: u32,
        shared: Arc<Mutex<Shared>>,
        start: Instant,
    ) -> Core<'n> {
        let mut probes = Vec::new();
        let mut timeline = Vec::new();
        for info in gpus {
            let Ok(device) = nvml.device_by_index(info.index) else {
                continue;
            };
            probes.push(Probe {
                device,
                memory: true,
                compute: true,
                graphics: true,
            });
            timeline.push(GpuTimeline::new(info.clone()));
        }
        shared.lock().unwrap().timeline.gpus = timeline;
        Core {
            probes,
            shared,
            cache: JobCache::new(job_root),
            start,
        }
    }

    fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    fn mark(&mut self, s: &mut Shared, i: usize, what: &str, e: &nvml_wrapper::error::NvmlError) {
        let at = self.now();
        let g = &mut s.timeline.gpus[i];
        let text = gpu::describe(e);
        match gpu::failure_kind(e) {
            Failure::Unsupported => {
                let p = &mut self.probes[i];
                match what {
                    "memory" => p.memory = false,
                    "compute processes" => p.compute = false,
                    _ => p.graphics = false,
                }
                g.unsupported.push((what.to_string(), text));
            }
            Failure::Lost => {
                if g.lost.is_none() {
                    if let Some(t) = &s.trace {
                        t.lock().unwrap().lost(at, g.info.index, &text);
                    }
                    g.lost = Some(Lost { at, error: text });
                }
            }
        }
    }

    /// Which GPUs are still sampled (read under the lock, then released).
    fn live_gpus(&self) -> Vec<bool> {
        let s = self.shared.lock().unwrap();
        s.timeline.gpus.iter().map(|g| g.lost.is_none()).collect()
    }

    /// Reads device memory on every GPU still sampled; whether any changed.
    pub fn sample_devices(&mut self) -> bool {
        let live = self.live_gpus();
        let reads: Vec<Read<nvml_wrapper::struct_wrappers::device::MemoryInfo>> = self
            .probes
            .iter()
            .zip(&live)
            .map(
                |(p, &live)| match (live && p.memory).then(|| p.device.memory_info()) {
                    None => Read::Skip,
                    Some(Ok(m)) => Read::Value(m),
                    Some(Err(e)) => Read::Failed("memory", e),
                },
            )
            .collect();
        let at = self.now();
        let shared = self.shared.clone();
        let mut s = shared.lock().unwrap();
        let mut changed = false;
        for (i, r) in reads.into_iter().enumerate() {
            match r {
                Read::Skip => {}
                Read::Failed(what, e) => self.mark(&mut s, i, what, &e),
                Read::Value(m) => {
                    let Shared {
                        timeline, trace, ..
                    } = &mut *s;
                    let g = &mut timeline.gpus[i];
                    g.driver_reserved = m.reserved;
                    if g.used.push(at, m.used) {
                        changed = true;
                        g.used.thin_to(MAX_POINTS);
                        if let Some(t) = trace {
                            t.lock().unwrap().device(at, g.info.index, m.used, m.total);
                        }
                    }
                }
            }
        }
        s.timeline.device_samples += 1;
        changed
    }

    /// One GPU's processes, compute and graphics: pid → bytes (a process in both lists counts once, at
    /// its larger figure).
    fn list(
        &self,
        i: usize,
    ) -> (
        BTreeMap<u32, u64>,
        Vec<(&'static str, nvml_wrapper::error::NvmlError)>,
    ) {
        let p = &self.probes[i];
        let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
        let mut failed = Vec::new();
        for (on, what, listed) in [
            (p.compute, "compute processes", false),
            (p.graphics, "graphics processes", true),
        ] {
            if !on {
                continue;
            }
            let r = if listed {
                p.device.running_graphics_processes()
            } else {
                p.device.running_compute_processes()
            };
            match r {
                Ok(list) => {
                    for pi in list {
                        let bytes = match pi.used_gpu_memory {
                            UsedGpuMemory::Used(b) => b,
                            UsedGpuMemory::Unavailable => 0,
                        };
                        let e = seen.entry(pi.pid).or_insert(0);
                        *e = (*e).max(bytes);
                    }
                }
                Err(e) => failed.push((what, e)),
            }
        }
        (seen, failed)
    }

    /// Reads the compute and graphics process lists on every GPU still sampled, attributes each PID to
    /// the job or not, and sums the job's memory per GPU; whether the job's memory changed.
    pub fn sample_processes(&mut self) -> bool {
        let live = self.live_gpus();
        let lists: Vec<_> = (0..self.probes.len())
            .map(|i| live[i].then(|| self.list(i)))
            .collect();
        // Reading /proc for PIDs not seen before happens outside the lock too.
        for (seen, _) in lists.iter().flatten() {
            for &pid in seen.keys() {
                self.cache.get(pid);
            }
        }
        let at = self.now();
        let shared = self.shared.clone();
        let mut s = shared.lock().unwrap();
        let mut changed = false;
        let mut present = Vec::new();
        for (i, l) in lists.into_iter().enumerate() {
            let Some((seen, failed)) = l else { continue };
            for (what, e) in &failed {
                self.mark(&mut s, i, what, e);
            }
            if s.timeline.gpus[i].lost.is_some() {
                continue;
            }
            present.extend(seen.keys().copied());
            changed |= self.record(&mut s, i, &seen, at);
        }
        self.cache.retain(&present);
        s.timeline.process_samples += 1;
        changed
    }

    /// Stores one GPU's process list at `at`; whether the job's memory on it changed.
    fn record(&mut self, s: &mut Shared, i: usize, seen: &BTreeMap<u32, u64>, at: Micros) -> bool {
        let Shared {
            timeline, trace, ..
        } = s;
        let gpu = timeline.gpus[i].info.index;
        let mut job = 0;
        for (&pid, &bytes) in seen {
            let known = self.cache.get(pid).clone();
            if known.in_job {
                job += bytes;
            }
            let entry = timeline
                .procs
                .entry((gpu, pid))
                .or_insert_with(|| ProcTimeline {
                    pid,
                    gpu,
                    in_job: known.in_job,
                    visible: known.info.is_some(),
                    cmdline: known
                        .info
                        .as_ref()
                        .map(|i| i.cmdline.clone())
                        .unwrap_or_default(),
                    uid: known.info.as_ref().and_then(|i| i.uid),
                    ppid: known.info.as_ref().map(|i| i.ppid),
                    used: Series::default(),
                });
            let first = entry.used.is_empty();
            entry.used.thin_to(MAX_POINTS);
            if entry.used.push(at, bytes)
                && let Some(t) = trace.as_ref()
            {
                let first = first.then_some(&*entry);
                t.lock()
                    .unwrap()
                    .process(at, gpu, pid, bytes, known.in_job, first);
            }
        }
        // Processes that left this GPU drop to zero.
        for p in timeline.procs.values_mut().filter(|p| p.gpu == gpu) {
            if !seen.contains_key(&p.pid)
                && p.used.last() != Some(0)
                && p.used.push(at, 0)
                && let Some(t) = trace.as_ref()
            {
                t.lock().unwrap().process(at, gpu, p.pid, 0, p.in_job, None);
            }
        }
        let g = &mut timeline.gpus[i];
        let changed = g.job.push(at, job);
        g.job.thin_to(MAX_POINTS);
        if changed && let Some(t) = trace.as_ref() {
            t.lock().unwrap().job(at, gpu, job);
        }
        changed
    }

    fn snapshot(&self) -> Snapshot {
        let s = self.shared.lock().unwrap();
        Snapshot {
            gpus: s
                .timeline
                .gpus
                .iter()
                .map(|g| {
                    g.lost.is_none().then(|| GpuNow {
                        index: g.info.index,
                        job: g.job.last().unwrap_or(0),
                        job_peak: g.job.peak(),
                        used: g.used.last().unwrap_or(0),
                        total: g.info.total_bytes,
                    })
                })
                .collect(),
        }
    }

    fn flush_trace_if_due(&self) {
        if let Some(t) = &self.shared.lock().unwrap().trace {
            t.lock().unwrap().flush_if_due();
        }
    }
}

/// A running sampler thread.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    look: Arc<AtomicBool>,
    looks_done: Arc<AtomicU64>,
    sampling: Arc<AtomicBool>,
    done: mpsc::Receiver<()>,
    thread: std::thread::Thread,
    shared: Arc<Mutex<Shared>>,
    pub snapshot: Arc<Mutex<Snapshot>>,
}

/// What the sampler leaves at the end.
#[derive(Default)]
pub struct Sampled {
    pub timeline: Timeline,
    /// NVML's status; `None` when NVML never answered.
    pub nvml: Option<NvmlStatus>,
    /// Said when the sampler did not finish in time (NVML stopped answering).
    pub stalled: Option<String>,
    /// What the sampler found worth saying, for the report.
    pub notes: Vec<String>,
}

/// The flags the sampling loop reads.
struct Flags {
    stop: Arc<AtomicBool>,
    look: Arc<AtomicBool>,
    looks_done: Arc<AtomicU64>,
    /// The loop is running (NVML answered and sampling has not ended).
    sampling: Arc<AtomicBool>,
}

impl Sampler {
    /// Starts the thread, which opens NVML from `library` and samples until stopped. The trace (if any)
    /// gets its start row once NVML has answered.
    /// `visible`: the job's `CUDA_VISIBLE_DEVICES`, the GPUs sampled (all when unset).
    pub fn start(
        (library, visible): (String, Option<String>),
        job_root: u32,
        rates: Rates,
        trace: Option<SharedTrace>,
        start: Instant,
    ) -> Sampler {
        let shared = Arc::new(Mutex::new(Shared {
            trace,
            ..Default::default()
        }));
        let flags = Flags {
            stop: Arc::new(AtomicBool::new(false)),
            look: Arc::new(AtomicBool::new(false)),
            looks_done: Arc::new(AtomicU64::new(0)),
            sampling: Arc::new(AtomicBool::new(false)),
        };
        let (stop, look, looks_done, sampling) = (
            flags.stop.clone(),
            flags.look.clone(),
            flags.looks_done.clone(),
            flags.sampling.clone(),
        );
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let (tx, done) = mpsc::channel();
        let (sh, snap) = (shared.clone(), snapshot.clone());
        let handle = std::thread::Builder::new()
            .name("gpudoc-sampler".into())
            .spawn(move || {
                let lib = (library.as_str(), visible.as_deref());
                sample_thread(lib, job_root, rates, start, &sh, &snap, &flags);
                let _ = tx.send(());
            })
            .expect("spawn the sampler thread");
        Sampler {
            stop,
            look,
            looks_done,
            sampling,
            done,
            thread: handle.thread().clone(),
            shared,
            snapshot,
        }
    }

    /// A function that asks for a look at the process lists now and waits (at most [`LOOK_GRACE`])
    /// until it is taken: a job process that just exited may still be listed, and its memory counted.
    pub fn looker(&self) -> impl Fn() + Send + use<> {
        let (look, done, thread, sampling) = (
            self.look.clone(),
            self.looks_done.clone(),
            self.thread.clone(),
            self.sampling.clone(),
        );
        move || {
            if !sampling.load(Ordering::SeqCst) {
                return;
            }
            let before = done.load(Ordering::SeqCst);
            look.store(true, Ordering::SeqCst);
            thread.unpark();
            let until = Instant::now() + LOOK_GRACE;
            while done.load(Ordering::SeqCst) == before && Instant::now() < until {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// The indices of the GPUs sampled, once NVML has answered; `None` when it is not available or has
    /// not answered within `wait`.
    pub fn gpus(&self, wait: Duration) -> Option<Vec<u32>> {
        let until = Instant::now() + wait;
        while Instant::now() < until {
            // `sampling` is set once the GPUs are in the timeline.
            if self.sampling.load(Ordering::SeqCst) {
                let s = self.shared.lock().unwrap();
                return Some(s.timeline.gpus.iter().map(|g| g.info.index).collect());
            }
            let nvml = self.shared.lock().unwrap().nvml.clone();
            if nvml.is_some_and(|n| !n.available) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        None
    }

    /// A function that brings a copy of the timeline up to date with the timeline so far, taking only
    /// what the copy lacks ([`Timeline::catch_up`]), under the lock the sampler takes between NVML calls;
    /// and gives NVML's status.
    pub fn reader(&self) -> impl Fn(&mut Timeline) -> Option<NvmlStatus> + Send + Sync + use<> {
        let shared = self.shared.clone();
        move |copy| {
            let s = shared.lock().unwrap();
            copy.catch_up(&s.timeline);
            s.nvml.clone()
        }
    }

    /// Takes a last sample and stops; waits at most [`STOP_GRACE`] for NVML, then takes what was sampled.
    pub fn stop(self) -> Sampled {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        let finished = self.done.recv_timeout(STOP_GRACE).is_ok();
        let mut s = self.shared.lock().unwrap();
        let stalled = (!finished).then(|| match &s.nvml {
            None => format!(
                "NVML did not answer within {} s of the command's end: GPU sampling was off",
                STOP_GRACE.as_secs_f64()
            ),
            Some(_) => {
                "NVML stopped answering during the run: the numbers end where it stopped".into()
            }
        });
        let mut timeline = std::mem::take(&mut s.timeline);
        timeline.heap_bytes = heap_bytes(&timeline);
        Sampled {
            timeline,
            nvml: s.nvml.clone(),
            stalled,
            notes: std::mem::take(&mut s.notes),
        }
    }
}

fn heap_bytes(t: &Timeline) -> usize {
    let gpus: usize = t
        .gpus
        .iter()
        .map(|g| g.used.heap_bytes() + g.job.heap_bytes())
        .sum();
    gpus + t.procs.values().map(|p| p.used.heap_bytes()).sum::<usize>()
}

fn sample_thread(
    (library, visible): (&str, Option<&str>),
    job_root: u32,
    rates: Rates,
    start: Instant,
    shared: &Arc<Mutex<Shared>>,
    snapshot: &Mutex<Snapshot>,
    flags: &Flags,
) {
    let (nvml, status, gpus) = gpu::open(library);
    let note = gpu::visible_note(&gpus, visible);
    let gpus = gpu::visible(gpus, visible);
    {
        let mut s = shared.lock().unwrap();
        s.notes.extend(note);
        if let Some(t) = &s.trace {
            t.lock().unwrap().start(&gpus, &status);
        }
        s.nvml = Some(status);
    }
    let Some(nvml) = nvml else { return };
    let mut core = Core::new(&nvml, &gpus, job_root, shared.clone(), start);
    flags.sampling.store(true, Ordering::SeqCst);
    run_loop(&mut core, rates, flags, snapshot);
    flags.sampling.store(false, Ordering::SeqCst);
    if let Some(t) = &shared.lock().unwrap().trace {
        t.lock().unwrap().flush();
    }
}

const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

fn run_loop(core: &mut Core, rates: Rates, flags: &Flags, shared: &Mutex<Snapshot>) {
    let begin = Instant::now();
    let (mut next_dev, mut next_proc, mut next_snap) = (begin, begin, begin);
    let mut last_change = begin;
    loop {
        let now = Instant::now();
        if now >= next_dev {
            if core.sample_devices() {
                last_change = now;
                // A process's memory can't change without the device's: when the device moves, look at
                // the processes now, so a process that lives only a few milliseconds is still seen.
                next_proc = now;
            }
            let flat = now.duration_since(last_change) >= IDLE_AFTER;
            let step = if flat {
                rates.device_idle.max(rates.device)
            } else {
                rates.device
            };
            next_dev = advance(next_dev, step, now);
        }
        let look = flags.look.swap(false, Ordering::SeqCst);
        if now >= next_proc || look {
            if core.sample_processes() {
                last_change = now;
                next_dev = next_dev.min(now + rates.device);
            }
            if look {
                flags.looks_done.fetch_add(1, Ordering::SeqCst);
            }
            let flat = now.duration_since(last_change) >= IDLE_AFTER;
            let step = if flat {
                rates.process * PROCESS_IDLE_FACTOR
            } else {
                rates.process
            };
            next_proc = advance(now, step.max(rates.device), now);
        }
        if now >= next_snap {
            *shared.lock().unwrap() = core.snapshot();
            core.flush_trace_if_due();
            next_snap = advance(next_snap, SNAPSHOT_EVERY, now);
        }
        if flags.stop.load(Ordering::SeqCst) {
            // One last look at everything, so the end state is recorded.
            core.sample_devices();
            core.sample_processes();
            return;
        }
        // Parked rather than slept, so a request to look or stop wakes the loop at once.
        let wake = next_dev.min(next_proc).min(next_snap);
        std::thread::park_timeout(wake.saturating_duration_since(Instant::now()));
    }
}

/// The next deadline after `prev`; when the loop fell behind, it skips ahead instead of bursting.
fn advance(prev: Instant, step: Duration, now: Instant) -> Instant {
    let next = prev + step;
    if next <= now { now + step } else { next }
}
