//! The cost of judging one look of `gpudoc watch` (docs/watch.md): the facts of the look and the rules
//! with `look = true`, on 8 GPUs and 200 processes holding memory (each on one GPU, every tenth with a
//! context on a second, every twentieth a leftover, half of them another user's). Prints the median of 50
//! looks, and the share of a core at `--interval` 1 s and 100 ms.
//!   cargo bench --bench watch_look

use gpudoc::gpu::GpuInfo;
use gpudoc::orphans::{Holder, Listing, Verdict, Why, WhyKind};
use gpudoc::rules::RuleSet;
use gpudoc::watch::Frame;
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

fn holder(pid: u32) -> Holder {
    let gpu = pid % 8;
    let mut gpu_bytes = vec![(gpu, GIB + pid as u64 * (1 << 20))];
    if pid.is_multiple_of(10) {
        gpu_bytes.push(((gpu + 1) % 8, 500 << 20));
    }
    Holder {
        pid: 10_000 + pid,
        verdict: if pid.is_multiple_of(20) {
            Verdict::Orphan
        } else {
            Verdict::Live
        },
        reason: String::new(),
        // Worded at each look, as `gpudoc watch` words a listing's.
        why: Some(Why {
            kind: if pid.is_multiple_of(20) {
                WhyKind::GroupGone
            } else {
                WhyKind::InJob
            },
            ppid: Some(1),
            parent: Some("bash".into()),
            pgid: Some(9),
            ..Why::default()
        }),
        gpu_bytes,
        devices: vec!["/dev/nvidia0".into()],
        ppid: Some(1),
        parent_cmd: None,
        pgid: None,
        sid: None,
        tty: None,
        uid: Some(1000 + pid % 2),
        user: Some(format!("user{}", pid % 2)),
        state: None,
        start_ticks: None,
        age_s: None,
        cmdline: format!("python3 train.py --rank {pid} --config configs/large.yaml"),
        left_by: None,
    }
}

fn main() {
    let rules = RuleSet::load(None, &[]).unwrap().looks();
    let gpus: Vec<GpuInfo> = (0..8)
        .map(|index| GpuInfo {
            index,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-{index}"),
            total_bytes: 150_754_820_096,
        })
        .collect();
    let listing = Listing {
        holders: (0..200).map(holder).collect(),
        gpu_used: (0..8).map(|i| (i, 143 * GIB)).collect(),
        ..Default::default()
    };
    let mut took: Vec<Duration> = (0..50)
        .map(|_| {
            let l = listing.clone();
            let t = Instant::now();
            let f = Frame::of(l, &gpus, 1000, &rules, &[], 0.0);
            let elapsed = t.elapsed();
            assert!(f.rule_errors.is_empty(), "{:?}", f.rule_errors);
            assert!(f.diagnoses.len() >= 8 + 10 + 20, "{}", f.diagnoses.len());
            elapsed
        })
        .collect();
    took.sort();
    let t = took[took.len() / 2];
    println!(
        "| look (8 GPUs, 200 processes, {} look rules) | one look | share of a core at 1 s | at 100 ms |",
        rules.rules.len()
    );
    println!("|---|---:|---:|---:|");
    println!(
        "| facts + rules | {:.2} ms | {:.2}% | {:.2}% |",
        t.as_secs_f64() * 1e3,
        100.0 * t.as_secs_f64() / 1.0,
        100.0 * t.as_secs_f64() / 0.1
    );
}
