//! The rules' cost against the size of a report: a real H200 report (fixtures/runs/healthy.report.json)
//! with its process list grown to N entries, diagnosed with the bundled rules. Prints a table.
//!   cargo bench --bench diagnose

use gpudoc::report::{ProcessReport, Report};
use gpudoc::rules::{self, RuleSet};
use std::time::Instant;

fn main() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/runs/healthy.report.json"
    ))
    .unwrap();
    let base: Report = serde_json::from_str(&text).unwrap();
    let set = RuleSet::load(None, &[]).unwrap();
    println!("| process entries | facts + rules | per entry |");
    println!("|---:|---:|---:|");
    for n in [1_000u32, 10_000, 100_000] {
        let mut r = base.clone();
        let template = r.processes[0].clone();
        r.processes = (0..n)
            .map(|i| ProcessReport {
                pid: 10_000 + i,
                gpu: i % 8,
                ..template.clone()
            })
            .collect();
        let t = Instant::now();
        rules::diagnose(&mut r, &set);
        let s = t.elapsed().as_secs_f64();
        println!("| {n} | {s:.3} s | {:.1} µs |", s * 1e6 / n as f64);
    }
}
