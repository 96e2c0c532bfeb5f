//! gpudoc's cost of one device sample (every GPU's memory read into the timeline), through the same code
//! the sampler thread runs. Needs NVML (a GPU, or GPUDOC_NVML_LIB pointing at the fake).
//!   cargo bench --bench sample_cost -- 200000

use gpudoc::{gpu, sample::Core};
use std::time::Instant;

fn main() {
    let n: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let lib = gpudoc::settings::Env::read().nvml_lib;
    let (nvml, status, gpus) = gpu::open(&lib);
    let Some(nvml) = nvml else {
        eprintln!("sample_cost: no NVML: {:?}", status.error);
        return;
    };
    let shared = std::sync::Arc::new(std::sync::Mutex::new(gpudoc::sample::Shared::default()));
    let mut core = Core::new(
        &nvml,
        &gpus[..1],
        std::process::id(),
        shared,
        Instant::now(),
    );
    for _ in 0..1000 {
        core.sample_devices();
    }
    let t = Instant::now();
    for _ in 0..n {
        core.sample_devices();
    }
    let dev_ns = t.elapsed().as_nanos() as f64 / n as f64;
    let m = (n / 100).max(100);
    let t = Instant::now();
    for _ in 0..m {
        core.sample_processes();
    }
    let proc_ns = t.elapsed().as_nanos() as f64 / m as f64;
    println!("gpudoc_device_sample_ns {dev_ns:.0}");
    println!("gpudoc_process_sample_ns {proc_ns:.0}");
}
