//! The live verdicts' cost (`gpudoc run`, docs/run.md): one look at the run so far is a copy of the
//! timeline, the analysis and the rules, and the verdicts' bookkeeping, on gpudoc's own thread. Against
//! timelines from a real H200 leak to the most the sampler keeps (500,000 points a series, 8 GPUs). Prints
//! the cost of one look, how long gpudoc then rests (2 s, or 50 times the look), and the share of a core.
//!   cargo bench --bench live_verdicts

use gpudoc::analysis::{self, Evidence};
use gpudoc::gpu::GpuInfo;
use gpudoc::live::verdicts::Verdicts;
use gpudoc::rules::RuleSet;
use gpudoc::sample::MAX_POINTS;
use gpudoc::sample::Rates;
use gpudoc::timeline::running::Running;
use gpudoc::timeline::{GpuTimeline, Timeline};
use gpudoc::torch::TorchTimeline;
use std::time::{Duration, Instant};

fn evidence(timeline: Timeline, torch: TorchTimeline) -> Evidence {
    Evidence {
        origin: Default::default(),
        command: vec!["python3".into(), "train.py".into()],
        started_unix_s: 0.0,
        outcome: None,
        nvml: Default::default(),
        rates: Rates {
            device: Duration::from_millis(1),
            device_idle: Duration::from_millis(5),
            process: Duration::from_millis(10),
        },
        timeline,
        torch: Some(torch),
        scanner: gpudoc::oom::scan::Scanner::new(),
        host: Default::default(),
        leftovers: Vec::new(),
        ended: Vec::new(),
        notes: Vec::new(),
        self_usage: (0.0, 0),
    }
}

/// `gpus` GPUs whose device and job memory change at every one of MAX_POINTS samples 10 ms apart.
fn full(gpus: u32) -> Timeline {
    let mut t = Timeline::default();
    for i in 0..gpus {
        let mut g = GpuTimeline::new(GpuInfo {
            index: i,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-{i}"),
            total_bytes: 150_754_820_096,
        });
        for k in 0..MAX_POINTS as u64 {
            let v = (40 << 30) + (k % 97) * (1 << 20);
            g.used.push(k * 10_000, v);
            g.job.push(k * 10_000, v - (1 << 30));
        }
        t.gpus.push(g);
    }
    t.device_samples = MAX_POINTS as u64 * gpus as u64;
    t
}

/// The median of 5 looks at `base`: copy, analysis, verdicts.
fn look(base: &(Timeline, TorchTimeline), rules: &RuleSet) -> Duration {
    let mut v = Verdicts::new(["step-leak".to_string()]);
    let mut took: Vec<Duration> = (0..5)
        .map(|i| {
            let t = Instant::now();
            let r = analysis::analyze_so_far(
                &evidence(base.0.clone(), base.1.clone()),
                &mut Running::default(),
                rules,
            );
            v.observe(&r, i as f64);
            t.elapsed()
        })
        .collect();
    took.sort();
    took[2]
}

fn main() {
    let rules = RuleSet::load(None, &[]).unwrap();
    let leak = gpudoc::replay::load_trace(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/leaks/list.trace.jsonl"
    )))
    .unwrap();
    let cases = [
        (
            "H200 leak (fixtures/leaks/list)",
            (leak.timeline, leak.torch),
        ),
        (
            "1 GPU, 500k points a series",
            (full(1), TorchTimeline::default()),
        ),
        (
            "8 GPUs, 500k points a series",
            (full(8), TorchTimeline::default()),
        ),
    ];
    println!("| timeline | one look | rest after it | share of one core |");
    println!("|---|---:|---:|---:|");
    for (name, base) in cases {
        let t = look(&base, &rules);
        let rest = Duration::from_secs(2).max(t * 50);
        println!(
            "| {name} | {:.1} ms | {:.1} s | {:.2}% |",
            t.as_secs_f64() * 1e3,
            rest.as_secs_f64(),
            100.0 * t.as_secs_f64() / (t + rest).as_secs_f64()
        );
    }
}
