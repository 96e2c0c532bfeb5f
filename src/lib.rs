//! gpudoc: a doctor for NVIDIA GPU memory. The flow (DESIGN.md): `cli` → `run` → `supervise` (the
//! command) with `sample` (NVML, on its own thread) → `timeline` → `report` → `summary` / JSON / trace.
//! Every stage after the spawn takes data and returns data.

pub mod cli;
pub mod compare;
pub mod exit;
pub mod gate;
pub mod gpu;
pub mod live;
pub mod oom;
pub mod orphans;
pub mod procs;
pub mod replay;
pub mod report;
pub mod rules;
pub mod run;
pub mod sample;
pub mod summary;
pub mod supervise;
pub mod timeline;
pub mod torch;
pub mod trace;
pub mod units;
