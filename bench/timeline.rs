//! Timeline memory: what storing an hour of 1 kHz samples costs, flat and with realistic change rates.
//!   cargo bench --bench timeline

use gpudoc::timeline::Series;

/// A name and the value at sample i.
type Case = (&'static str, fn(u64) -> u64);

fn main() {
    const N: u64 = 3_600_000; // one hour at 1 kHz
    let cases: [Case; 3] = [
        ("flat (one value)", |_| 40 << 30),
        ("a step change every second", |i| {
            (40 << 30) + (i / 1000 % 2) * (1 << 20)
        }),
        ("changes every 10 ms", |i| {
            (40 << 30) + (i / 10 % 7) * (2 << 20)
        }),
    ];
    println!("| samples | series | points stored | timeline memory | target |");
    println!("|---|---|---|---|---|");
    for (name, f) in cases {
        let mut s = Series::default();
        for i in 0..N {
            s.push(i * 1000, f(i));
        }
        let target = if name.starts_with("flat") {
            "< 1 MB"
        } else {
            "-"
        };
        println!(
            "| {N} | {name} | {} | {} | {target} |",
            s.points().len(),
            gpudoc::units::fmt_bytes(s.heap_bytes() as u64)
        );
    }
}
