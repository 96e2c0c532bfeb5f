//! How a look at the run so far (live verdicts, each `--metrics` scrape) costs as a run grows: the run of
//! bench/long_trace.py (one GPU whose memory and the job's one process change at every sample, 100 samples
//! a second) kept as the sampler keeps it (changes only, each series thinned to `MAX_POINTS`), looked at
//! after 1 min, 1 h, 1 day and 3 days, 2 s after the previous look. A look copied the whole timeline; it
//! now brings its own copy up to date with the samples since the last look (`Timeline::catch_up`), and
//! still analyzes the run from its start. gpudoc rests 50 times a look's time after it (2 s at least), so
//! a slower look is a later verdict.
//!   cargo bench --bench live_long

use gpudoc::analysis::{self, Evidence};
use gpudoc::gpu::GpuInfo;
use gpudoc::rules::RuleSet;
use gpudoc::sample::{MAX_POINTS, Rates};
use gpudoc::timeline::{GpuTimeline, ProcTimeline, Series, Timeline};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Samples a second, as bench/long_trace.py writes them.
const RATE: u64 = 100;

/// A run's timeline, one GPU and the job's one process, with nothing sampled yet.
fn empty() -> Timeline {
    let mut t = Timeline::default();
    t.gpus.push(GpuTimeline::new(GpuInfo {
        index: 0,
        name: "NVIDIA H200".into(),
        uuid: "GPU-0".into(),
        total_bytes: 150_754_820_096,
    }));
    t.procs.insert(
        (0, 100),
        ProcTimeline {
            pid: 100,
            gpu: 0,
            in_job: true,
            visible: true,
            cmdline: "python3 train.py".into(),
            uid: Some(0),
            ppid: None,
            used: Series::default(),
        },
    );
    t
}

/// Samples `from..to` of the run, pushed as the sampler pushes them.
fn grow(t: &mut Timeline, from: u64, to: u64) {
    for i in from..to {
        let at = 20_000 + i * 1_000_000 / RATE;
        let used = (10 << 30) + (i % 50) * MIB;
        let g = &mut t.gpus[0];
        g.used.push(at, used);
        g.used.thin_to(MAX_POINTS);
        g.job.push(at, used - 500 * MIB);
        g.job.thin_to(MAX_POINTS);
        let p = &mut t.procs.get_mut(&(0, 100)).unwrap().used;
        p.thin_to(MAX_POINTS);
        p.push(at, used - 500 * MIB);
    }
    t.device_samples = to;
    t.process_samples = to;
}

fn evidence(timeline: Timeline) -> Evidence {
    Evidence {
        command: vec!["python3".into(), "train.py".into()],
        rates: Rates {
            device: Duration::from_millis(1),
            device_idle: Duration::from_millis(5),
            process: Duration::from_millis(10),
        },
        timeline,
        ..Evidence::default()
    }
}

/// The median of 5 looks at `now`, 2 s after a look at `before`: the copy of the timeline (the whole
/// of it, as before; or the looks' own copy, last brought up to date with `before`, taking only what is
/// new since: `Timeline::catch_up`), and the copy with the analysis and the rules. The looks' copy is
/// kept as a run keeps it: caught up look after look (here from a look 2 s before `before`), so its
/// series have room to grow at their ends.
fn look(
    (earlier, before, now): (&Timeline, &Timeline, &Timeline),
    whole: bool,
    rules: &RuleSet,
) -> (Duration, Duration) {
    let mut took: Vec<(Duration, Duration)> = (0..5)
        .map(|_| {
            let mut copy = earlier.clone();
            copy.catch_up(before);
            let start = Instant::now();
            if whole {
                copy = now.clone();
            } else {
                copy.catch_up(now);
            }
            let copied = start.elapsed();
            let r = analysis::analyze_so_far(&evidence(copy), rules);
            assert!(r.rule_errors.is_empty(), "{:?}", r.rule_errors);
            (copied, start.elapsed())
        })
        .collect();
    took.sort_by_key(|t| t.1);
    took[2]
}

fn main() {
    let rules = RuleSet::load(None, &[]).unwrap();
    println!(
        "| run so far | points a series | copy of the timeline: whole / since the last look | one look: whole / since the last look | rest after it (the next verdict's delay): whole / since |"
    );
    println!("|---|---:|---:|---:|---:|");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let rest = |d: Duration| Duration::from_secs(2).max(d * 50).as_secs_f64();
    let mut t = empty();
    let mut at = 0;
    for (name, secs) in [
        ("1 min", 60),
        ("1 h", 3600),
        ("1 day", 86_400),
        ("3 days", 3 * 86_400),
    ] {
        // The two looks before this one, 2 s apart.
        grow(&mut t, at, (secs - 4) * RATE);
        let earlier = t.clone();
        grow(&mut t, (secs - 4) * RATE, (secs - 2) * RATE);
        let before = t.clone();
        grow(&mut t, (secs - 2) * RATE, secs * RATE);
        at = secs * RATE;
        let (copy, all) = look((&earlier, &before, &t), true, &rules);
        let (copy_new, all_new) = look((&earlier, &before, &t), false, &rules);
        println!(
            "| {name} | {} | {:.2} / {:.3} ms | {:.2} / {:.2} ms | {:.1} / {:.1} s |",
            t.gpus[0].job.points().len(),
            ms(copy),
            ms(copy_new),
            ms(all),
            ms(all_new),
            rest(all),
            rest(all_new)
        );
    }
}
