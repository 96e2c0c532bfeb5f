//! The OOM scanner's throughput over the kinds of output a job writes, fed in the 64 KiB chunks the
//! output path reads (issue 11: the scanner must keep up with the stream).
//!   cargo bench --bench scan

use gpudoc::oom::scan::Scanner;
use gpudoc::supervise::Stream;
use std::time::Instant;

fn main() {
    const TOTAL: usize = 1 << 30;
    let mut random = vec![0u8; 64 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in random.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let cases: [(&str, Vec<u8>); 4] = [
        (
            "80-character lines",
            [&b"x".repeat(79)[..], b"\n"].concat().repeat(1 << 16),
        ),
        ("yes (2-byte lines)", b"y\n".repeat(1 << 21)),
        ("random bytes", random),
        (
            "training log lines",
            b"step 1200 | loss 2.3141 | lr 3.0e-4 | tokens/s 181233 | mem 61.2 GiB\n"
                .repeat(1 << 15),
        ),
    ];
    println!("| output | scanned | seconds | GB/s |");
    println!("|---|---|---|---|");
    for (name, block) in cases {
        let mut s = Scanner::new();
        let t = Instant::now();
        let mut done = 0;
        while done < TOTAL {
            for chunk in block.chunks(64 << 10) {
                s.feed(Stream::Stderr, chunk, 0);
                done += chunk.len();
            }
        }
        s.finish(0);
        let secs = t.elapsed().as_secs_f64();
        assert!(s.first().is_none(), "{name}: no OOM text in this output");
        println!(
            "| {name} | {} MiB | {secs:.3} | {:.2} |",
            done >> 20,
            done as f64 / secs / 1e9
        );
    }
}
