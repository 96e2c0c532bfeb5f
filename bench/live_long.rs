//! How a look at the run so far (live verdicts, each `--metrics` scrape) costs as a run grows: the run of
//! bench/long_trace.py (one GPU whose memory and the job's one process change at every sample, 100 samples
//! a second), with PyTorch's view of that process (its allocated and reserved memory read at every
//! sample, a step recorded at each), kept as the sampler and the shim's reader keep them (changes only,
//! each series thinned to `MAX_POINTS`, the step log to `MAX_STEPS`), looked at after 1 min, 1 h, 1 day
//! and 3 days by `gpudoc run`'s own look (`live::so_far::Sources::report`: the copies brought up to date,
//! the analysis and the rules), two ways, side by side:
//! - whole: a look that keeps nothing from the looks before (its copies made whole, the analysis reading
//!   the run from its start), as a look did before issue 44's step 5;
//! - since the last look: a look 2 s after two others, 2 s apart, whose copies and analysis take only
//!   what is new since (`Timeline::catch_up`, `TorchTimeline::catch_up`, `timeline::running::Running`).
//!
//! gpudoc rests 50 times a look's time after it (2 s at least), so a slower look is a later verdict.
//!   cargo bench --bench live_long

use gpudoc::gpu::GpuInfo;
use gpudoc::live::so_far::{Looks, Sources};
use gpudoc::rules::RunRules;
use gpudoc::sample::{MAX_POINTS, Rates};
use gpudoc::timeline::{GpuTimeline, ProcTimeline, Series, Timeline};
use gpudoc::torch::{Step, TorchProc, TorchTimeline};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Samples a second, as bench/long_trace.py writes them.
const RATE: u64 = 100;
const PID: u32 = 100;

/// A run's timelines, one GPU and the job's one process, with nothing sampled yet.
fn empty() -> (Timeline, TorchTimeline) {
    let mut t = Timeline::default();
    t.gpus.push(GpuTimeline::new(GpuInfo {
        index: 0,
        name: "NVIDIA H200".into(),
        uuid: "GPU-0".into(),
        total_bytes: 150_754_820_096,
    }));
    t.procs.insert(
        (0, PID),
        ProcTimeline {
            pid: PID,
            gpu: 0,
            in_job: true,
            visible: true,
            cmdline: "python3 train.py".into(),
            uid: Some(0),
            ppid: None,
            used: Series::default(),
        },
    );
    let mut torch = TorchTimeline::default();
    let p = TorchProc {
        pid: PID,
        uuid: Some("GPU-0".into()),
        ..TorchProc::default()
    };
    torch.procs.insert((PID, 0, p.framework), p);
    torch.messages = 1;
    (t, torch)
}

/// Samples `from..to` of the run, pushed as the sampler and the shim's reader push them; `rise` more
/// bytes from `from` on.
fn grow((t, torch): &mut (Timeline, TorchTimeline), from: u64, to: u64, rise: u64) {
    for i in from..to {
        let at = 20_000 + i * 1_000_000 / RATE;
        let used = (10 << 30) + (i % 50) * MIB + rise;
        let g = &mut t.gpus[0];
        g.used.push(at, used);
        g.used.thin_to(MAX_POINTS);
        g.job.push(at, used - 500 * MIB);
        g.job.thin_to(MAX_POINTS);
        let p = &mut t.procs.get_mut(&(0, PID)).unwrap().used;
        p.thin_to(MAX_POINTS);
        p.push(at, used - 500 * MIB);
        let p = torch.procs.values_mut().next().unwrap();
        let (allocated, reserved) = (used - 2048 * MIB, used - 1024 * MIB);
        for (s, v) in [(&mut p.allocated, allocated), (&mut p.reserved, reserved)] {
            s.push(at, v);
            s.thin_to(MAX_POINTS);
        }
        p.peak_allocated = p.allocated.peak();
        p.last_step = i + 1;
        p.steps.push(Step {
            step: i + 1,
            steps: 1,
            at_s: at as f64 / 1e6,
            allocated_bytes: allocated,
            peak_allocated_bytes: allocated,
            ..Step::default()
        });
    }
    t.device_samples = to;
    t.process_samples = to;
}

/// `gpudoc run`'s looks at a run whose samplers' timelines are swapped in before each look.
struct Live {
    nvml: Arc<Mutex<Timeline>>,
    torch: Arc<Mutex<TorchTimeline>>,
    sources: Sources,
}

impl Live {
    fn new() -> Live {
        let nvml = Arc::new(Mutex::new(Timeline::default()));
        let torch = Arc::new(Mutex::new(TorchTimeline::default()));
        let shared = nvml.clone();
        let sources = Sources {
            timeline: Box::new(move |copy: &mut Timeline| {
                copy.catch_up(&shared.lock().unwrap());
                None
            }),
            torch: Some(torch.clone()),
            scanner: Default::default(),
            rules: Arc::new(RunRules::load(None, &[]).unwrap()),
            origin: Default::default(),
            command: vec!["python3".into(), "train.py".into()],
            started_unix_s: 0.0,
            rates: Rates {
                device: Duration::from_millis(1),
                device_idle: Duration::from_millis(5),
                process: Duration::from_millis(10),
            },
            seen: Default::default(),
        };
        Live {
            nvml,
            torch,
            sources,
        }
    }

    /// One look at the run as `moment` has it; how long it took.
    fn look(&self, moment: &mut (Timeline, TorchTimeline)) -> Duration {
        let swap = |m: &mut (Timeline, TorchTimeline)| {
            std::mem::swap(&mut *self.nvml.lock().unwrap(), &mut m.0);
            std::mem::swap(&mut *self.torch.lock().unwrap(), &mut m.1);
        };
        swap(moment);
        let start = Instant::now();
        let r = self.sources.report();
        let took = start.elapsed();
        swap(moment);
        assert!(r.rule_errors.is_empty(), "{:?}", r.rule_errors);
        took
    }

    /// The median of 5 looks at the last of `moments` (the run 4 s ago, 2 s ago, now): with nothing kept
    /// (`whole`), or after looks at the two moments before.
    fn median(&self, moments: &mut [(Timeline, TorchTimeline); 3], whole: bool) -> Duration {
        let mut took: Vec<Duration> = (0..5)
            .map(|_| {
                *self.sources.seen.lock().unwrap() = Looks::default();
                if !whole {
                    self.look(&mut moments[0]);
                    self.look(&mut moments[1]);
                }
                self.look(&mut moments[2])
            })
            .collect();
        took.sort();
        took[2]
    }
}

fn main() {
    let live = Live::new();
    println!(
        "| run so far | points a series | one look: whole (before) / since the last look (after) | rest after it (the next verdict's delay): before / after |"
    );
    println!("|---|---:|---:|---:|");
    let mut run = empty();
    let mut at = 0;
    for (name, secs) in [
        ("1 min", 60),
        ("1 h", 3600),
        ("1 day", 86_400),
        ("3 days", 3 * 86_400),
    ] {
        run = row(&live, name, run, (at, secs), 0);
        at = secs * RATE;
    }
    // The run's memory higher at each of the three looks: the process' peak, so the bar of its longest
    // stretch high, moves, and the stretch is read again from the start.
    row(
        &live,
        "3 days, a new peak at each look",
        run,
        (at, at / RATE + 6),
        64 * MIB,
    );
}

/// The run grown from sample `at` to `secs` seconds, looked at 4 s and 2 s before `secs` and at `secs`
/// (its memory `rise` higher at each of the three), and the row of the table that says what the last
/// look took.
fn row(
    live: &Live,
    name: &str,
    mut run: (Timeline, TorchTimeline),
    (at, secs): (u64, u64),
    rise: u64,
) -> (Timeline, TorchTimeline) {
    grow(&mut run, at, (secs - 4) * RATE, rise);
    let earlier = run.clone();
    grow(&mut run, (secs - 4) * RATE, (secs - 2) * RATE, 2 * rise);
    let before = run.clone();
    grow(&mut run, (secs - 2) * RATE, secs * RATE, 3 * rise);
    let mut moments = [earlier, before, run];
    let whole = live.median(&mut moments, true);
    let since = live.median(&mut moments, false);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rest = |d: Duration| Duration::from_secs(2).max(d * 50).as_secs_f64();
    let [_, _, now] = moments;
    println!(
        "| {name} | {} | {:.2} / {:.2} ms | {:.1} / {:.1} s |",
        now.0.gpus[0].job.points().len(),
        ms(whole),
        ms(since),
        rest(whole),
        rest(since)
    );
    now
}
