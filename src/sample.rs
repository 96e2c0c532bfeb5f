//! The sampler: a thread of its own that reads device memory for every GPU (1 kHz by default) and the
//! per-process lists (100 Hz by default), and keeps both as a [`Timeline`]. A query that fails as
//! unsupported is not asked again; a GPU that fails otherwise is marked lost from that moment and no
//! longer sampled. Nothing here can stop or slow the wrapped command.

use crate::gpu::{self, Failure, GpuInfo};
use crate::procs::JobCache;
use crate::timeline::{GpuTimeline, Lost, Micros, ProcTimeline, Series, Timeline};
use crate::trace::TraceWriter;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
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

struct Probe<'n> {
    device: Device<'n>,
    memory: bool,
    compute: bool,
    graphics: bool,
}

/// The sampling state, usable without the thread (benchmarks drive it directly).
pub struct Core<'n> {
    probes: Vec<Probe<'n>>,
    pub timeline: Timeline,
    cache: JobCache,
    trace: Option<TraceWriter>,
    start: Instant,
}

impl<'n> Core<'n> {
    /// `job_root`: the PID whose descendants are the job (gpudoc itself, a subreaper).
    pub fn new(
        nvml: &'n Nvml,
        gpus: &[GpuInfo],
        job_root: u32,
        trace: Option<TraceWriter>,
        start: Instant,
    ) -> Core<'n> {
        let mut probes = Vec::new();
        let mut timeline = Timeline::default();
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
            timeline.gpus.push(GpuTimeline::new(info.clone()));
        }
        Core {
            probes,
            timeline,
            cache: JobCache::new(job_root),
            trace,
            start,
        }
    }

    fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    fn mark(&mut self, i: usize, what: &str, e: &nvml_wrapper::error::NvmlError, at: Micros) {
        let g = &mut self.timeline.gpus[i];
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
                    if let Some(t) = &mut self.trace {
                        t.lost(at, g.info.index, &text);
                    }
                    g.lost = Some(Lost { at, error: text });
                }
            }
        }
    }

    /// Reads device memory on every GPU still sampled; whether any changed.
    pub fn sample_devices(&mut self) -> bool {
        let at = self.now();
        let mut changed = false;
        for i in 0..self.probes.len() {
            if !self.probes[i].memory || self.timeline.gpus[i].lost.is_some() {
                continue;
            }
            match self.probes[i].device.memory_info() {
                Ok(m) => {
                    let g = &mut self.timeline.gpus[i];
                    g.driver_reserved = m.reserved;
                    if g.used.push(at, m.used) {
                        changed = true;
                        g.used.thin_to(MAX_POINTS);
                        if let Some(t) = &mut self.trace {
                            t.device(at, g.info.index, m.used, m.total);
                        }
                    }
                }
                Err(e) => self.mark(i, "memory", &e, at),
            }
        }
        self.timeline.device_samples += 1;
        changed
    }

    /// Reads the compute and graphics process lists on every GPU still sampled, attributes each PID to
    /// the job or not, and sums the job's memory per GPU; whether the job's memory changed.
    pub fn sample_processes(&mut self) -> bool {
        let at = self.now();
        let mut changed = false;
        let mut present = Vec::new();
        for i in 0..self.probes.len() {
            if self.timeline.gpus[i].lost.is_some() {
                continue;
            }
            // pid → bytes; a process listed as compute and graphics counts once, at its larger figure.
            let mut seen: BTreeMap<u32, u64> = BTreeMap::new();
            for graphics in [false, true] {
                let p = &self.probes[i];
                if (graphics && !p.graphics) || (!graphics && !p.compute) {
                    continue;
                }
                let listed = if graphics {
                    p.device.running_graphics_processes()
                } else {
                    p.device.running_compute_processes()
                };
                match listed {
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
                    Err(e) => {
                        let what = if graphics {
                            "graphics processes"
                        } else {
                            "compute processes"
                        };
                        self.mark(i, what, &e, at);
                    }
                }
            }
            if self.timeline.gpus[i].lost.is_some() {
                continue;
            }
            let gpu = self.timeline.gpus[i].info.index;
            let mut job = 0;
            for (&pid, &bytes) in &seen {
                present.push(pid);
                let known = self.cache.get(pid).clone();
                if known.in_job {
                    job += bytes;
                }
                let entry = self
                    .timeline
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
                        used: Series::default(),
                    });
                let first = entry.used.is_empty();
                entry.used.thin_to(MAX_POINTS);
                if entry.used.push(at, bytes)
                    && let Some(t) = &mut self.trace
                {
                    let cmdline = first.then_some(entry.cmdline.as_str());
                    t.process(at, gpu, pid, bytes, known.in_job, cmdline);
                }
            }
            // Processes that left this GPU drop to zero.
            for p in self.timeline.procs.values_mut().filter(|p| p.gpu == gpu) {
                if !seen.contains_key(&p.pid)
                    && p.used.last() != Some(0)
                    && p.used.push(at, 0)
                    && let Some(t) = &mut self.trace
                {
                    t.process(at, gpu, p.pid, 0, p.in_job, None);
                }
            }
            changed |= self.timeline.gpus[i].job.push(at, job);
            self.timeline.gpus[i].job.thin_to(MAX_POINTS);
        }
        self.cache.retain(&present);
        self.timeline.process_samples += 1;
        changed
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            gpus: self
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

    /// Ends sampling: flushes the trace and returns the timeline and any trace error.
    pub fn finish(mut self) -> (Timeline, Option<String>) {
        let mut heap = 0;
        for g in &self.timeline.gpus {
            heap += g.used.heap_bytes() + g.job.heap_bytes();
        }
        for p in self.timeline.procs.values() {
            heap += p.used.heap_bytes();
        }
        self.timeline.heap_bytes = heap;
        let err = self.trace.as_mut().and_then(|t| {
            t.flush();
            t.error().map(String::from)
        });
        (self.timeline, err)
    }
}

/// A running sampler thread.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(Timeline, Option<String>)>,
    pub snapshot: Arc<Mutex<Snapshot>>,
}

impl Sampler {
    /// Starts sampling on its own thread; the thread owns NVML for the run.
    pub fn start(
        nvml: Nvml,
        gpus: Vec<GpuInfo>,
        job_root: u32,
        rates: Rates,
        trace: Option<TraceWriter>,
        start: Instant,
    ) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        let shared = snapshot.clone();
        let handle = std::thread::Builder::new()
            .name("gpudoc-sampler".into())
            .spawn(move || {
                let mut core = Core::new(&nvml, &gpus, job_root, trace, start);
                run_loop(&mut core, rates, &stop_flag, &shared);
                let out = core.finish();
                drop(nvml);
                out
            })
            .expect("spawn the sampler thread");
        Sampler {
            stop,
            handle,
            snapshot,
        }
    }

    /// Takes a last sample, stops, and returns the timeline (and a trace write error, if any).
    pub fn stop(self) -> (Timeline, Option<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

fn run_loop(core: &mut Core, rates: Rates, stop: &AtomicBool, shared: &Mutex<Snapshot>) {
    let begin = Instant::now();
    let (mut next_dev, mut next_proc, mut next_snap) = (begin, begin, begin);
    let mut last_change = begin;
    let mut last_proc: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if now >= next_dev {
            if core.sample_devices() {
                last_change = now;
                // A process's memory can't change without the device's: when the device moves, look at
                // the processes now (at most every process interval), so the job's figure follows the
                // device's without reading the process lists fast while nothing moves.
                let soonest = last_proc.map_or(now, |t| t + rates.process);
                next_proc = next_proc.min(soonest.max(now));
            }
            let flat = now.duration_since(last_change) >= IDLE_AFTER;
            let step = if flat {
                rates.device_idle.max(rates.device)
            } else {
                rates.device
            };
            next_dev = advance(next_dev, step, now);
        }
        if now >= next_proc {
            if core.sample_processes() {
                last_change = now;
                next_dev = next_dev.min(now + rates.device);
            }
            last_proc = Some(now);
            let flat = now.duration_since(last_change) >= IDLE_AFTER;
            let step = if flat {
                rates.process * PROCESS_IDLE_FACTOR
            } else {
                rates.process
            };
            next_proc = advance(next_proc, step, now);
        }
        if now >= next_snap {
            *shared.lock().unwrap() = core.snapshot();
            if let Some(t) = &mut core.trace {
                t.flush_if_due();
            }
            next_snap = advance(next_snap, SNAPSHOT_EVERY, now);
        }
        if stop.load(Ordering::Relaxed) {
            // One last look at everything, so the end state is recorded.
            core.sample_devices();
            core.sample_processes();
            return;
        }
        // A plain sleep: cheaper per wake-up than a timed wait on a channel or condition variable, and
        // stopping waits at most one device interval.
        let wake = next_dev.min(next_proc).min(next_snap);
        std::thread::sleep(wake.saturating_duration_since(Instant::now()));
    }
}

/// The next deadline after `prev`; when the loop fell behind, it skips ahead instead of bursting.
fn advance(prev: Instant, step: Duration, now: Instant) -> Instant {
    let next = prev + step;
    if next <= now { now + step } else { next }
}
