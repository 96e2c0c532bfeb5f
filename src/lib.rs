//! gpudoc: a doctor for NVIDIA GPU memory. The flow (DESIGN.md): `commands` (with `settings` resolved from
//! `cli` and the environment) → `supervise` (the command) with `sample` (NVML, on its own thread) and
//! `torch` (the shim) → `timeline` → `report` → `rules` → `gate` → `summary` / `output`. Every stage after
//! the spawn takes data and returns data; dependencies point down (a test checks there is no cycle).

pub mod analysis;
pub mod cli;
pub mod commands;
pub mod compare;
pub mod exit;
pub mod fit;
pub mod gate;
pub mod gpu;
pub mod html;
pub mod ident;
pub mod live;
pub mod merge;
pub mod metrics;
pub mod oom;
pub mod origin;
pub mod orphans;
pub mod output;
pub mod paint;
pub mod params;
pub mod private;
pub mod procs;
pub mod program;
pub mod replay;
pub mod report;
pub mod rules;
pub mod runs;
pub mod sample;
pub mod say;
pub mod serve;
pub mod settings;
pub mod stdfds;
pub mod summary;
pub mod supervise;
pub mod tensorboard;
pub mod timeline;
pub mod torch;
pub mod trace;
pub mod units;
pub mod verdict;
pub mod watch;
