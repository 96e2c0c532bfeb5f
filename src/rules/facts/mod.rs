//! The facts rules read, computed from a report (so a saved report can be diagnosed again). Every fact is
//! documented once, by the doc comment on its field, which [`documented`] gives to `gpudoc rules facts`
//! and docs/rules.md (a test checks that the example facts, every rule and the documentation agree).

//!
//! One file a subject: the run (`run`), each GPU (`gpu`), each process holding GPU memory (`process`),
//! each PyTorch process (`torch`, with its notebook cells in `cell`), the OOM (`oom`).

/// A fact as documented: its name in its group, its type as a rule sees it, and what it means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fact {
    pub name: &'static str,
    pub ty: &'static str,
    /// The field's doc comment, its lines joined.
    pub doc: &'static str,
}

/// The type of a fact as a rule sees it: CEL's name for it.
pub trait FactType {
    const NAME: &'static str;
}

macro_rules! fact_types {
    ($($t:ty => $name:literal),* $(,)?) => {
        $(impl FactType for $t {
            const NAME: &'static str = $name;
        })*
    };
}

fact_types! {
    i64 => "int",
    f64 => "double",
    bool => "bool",
    String => "string",
    Vec<i64> => "list(int)",
    Option<i64> => "int or null",
    Option<f64> => "double or null",
    Option<String> => "string or null",
    Option<bool> => "bool or null",
    Vec<String> => "list(string)",
    Vec<Holder> => "list(holder)",
    Vec<OnGpu> => "list(on_gpu)",
    Option<crate::orphans::Why> => "why or null",
    Option<HuntRecord> => "hunt or null",
    Vec<SiteRecord> => "list(site)",
    Vec<HolderRecord> => "list(hunt_holder)",
    Option<InsideRecord> => "inside or null",
    Vec<PartRecord> => "list(part)",
    Vec<SavedRecord> => "list(saver)",
}

/// A process holding GPU memory, as a list fact gives it (`gpu.others_list`, `oom.others`,
/// `run.orphan_list`): a record whose words the rule's template writes (`p.pid`, `p.who`, ...:
/// docs/rules.md, "List facts").
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Holder {
    /// its PID
    pub pid: i64,
    /// its host, in a report merged from several (null otherwise)
    pub host: Option<String>,
    /// who it is in words, as its list says: its command line, or in a look its owner; null where unknown
    pub who: Option<String>,
    /// the memory it held
    pub bytes: i64,
}

/// What a process held on one GPU, as `process.per_gpu` gives it: a record the rules read (`h.index`,
/// `h.bytes`: docs/rules.md, "List facts").
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct OnGpu {
    /// NVML's index of the GPU
    pub index: i64,
    /// the GPU as messages name it (`GPU 0`, `GPU 0 on node-a`)
    pub label: String,
    /// what the process held there
    pub bytes: i64,
}

/// Declares a group of facts: the struct, and its documentation (`FIELDS`) from its fields' doc comments,
/// so a fact's name, type and meaning are written once, where it is.
macro_rules! facts {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[doc = $doc:literal])+ pub $field:ident: $ty:ty,)*
        }
    ) => {
        $(#[$meta])*
        pub struct $name {
            $($(#[doc = $doc])+ pub $field: $ty,)*
        }

        impl $name {
            /// Its facts, each with its type and its doc comment.
            pub const FIELDS: &'static [$crate::rules::facts::Fact] = &[$($crate::rules::facts::Fact {
                name: stringify!($field),
                ty: <$ty as $crate::rules::facts::FactType>::NAME,
                doc: concat!($($doc),+),
            }),*];
        }
    };
}

mod cell;
mod gpu;
pub mod hunt;
pub mod inside;
mod oom;
mod process;
mod run;
mod torch;

pub use gpu::GpuFacts;
use hunt::{HolderRecord, HuntRecord, SiteRecord};
use inside::{InsideRecord, PartRecord, SavedRecord};
pub use oom::OomFacts;
pub use process::ProcFacts;
pub use run::{RunFacts, cuda_of_torch};
pub use torch::TorchFacts;

use crate::ident::{GpuRef, ProcRef};
use crate::report::Report;
use process::Ranks;
use serde::Serialize;

/// Facts of one run, as the rules see them. Integers are bytes or counts, `_s` seconds, `_pct` percent.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Facts {
    pub run: RunFacts,
    pub oom: OomFacts,
    pub gpus: Vec<GpuFacts>,
    pub processes: Vec<ProcFacts>,
    pub torch_processes: Vec<TorchFacts>,
}

/// Every fact, by the name a rule reads it (`run.exit_code`, `gpu.total_bytes`), with its type and what it
/// means: the reference for rule authors (`gpudoc rules facts`, `gpudoc rules explain`, docs/rules.md).
pub fn documented() -> Vec<(String, &'static str, &'static str)> {
    let groups = [
        ("run", RunFacts::FIELDS),
        ("oom", OomFacts::FIELDS),
        ("gpu", GpuFacts::FIELDS),
        ("process", ProcFacts::FIELDS),
        ("torch", TorchFacts::FIELDS),
    ];
    named(groups)
}

/// Each field of each group by its group's name (`oom.cause`, `site.file`), with its type and doc.
fn named<const N: usize>(
    groups: [(&'static str, &'static [Fact]); N],
) -> Vec<(String, &'static str, &'static str)> {
    groups
        .into_iter()
        .flat_map(|(group, fields)| {
            fields
                .iter()
                .map(move |f| (format!("{group}.{}", f.name), f.ty, f.doc.trim()))
        })
        .collect()
}

/// The fields of the records a list fact or a record fact holds (`site`, `hunt_holder`, `hunt`), by the
/// name docs/rules.md gives them (`site.file`), with their types and what they mean.
pub fn records() -> Vec<(String, &'static str, &'static str)> {
    let groups = [
        ("hunt", HuntRecord::FIELDS),
        ("site", SiteRecord::FIELDS),
        ("hunt_holder", HolderRecord::FIELDS),
        ("inside", InsideRecord::FIELDS),
        ("part", PartRecord::FIELDS),
        ("saver", SavedRecord::FIELDS),
    ];
    named(groups)
}

const GIB: i64 = 1 << 30;

pub(in crate::rules) fn pct(part: i64, whole: i64) -> f64 {
    if whole > 0 {
        part as f64 * 100.0 / whole as f64
    } else {
        0.0
    }
}

/// The steady level of a series of readings: the level it held most of the time, spikes and phases
/// aside, the median (the upper one of an even number), 0 for none. The one definition of "steady" the
/// facts use; each says which readings it is of: `gpu.steady_bytes` the job's timeline where it held
/// memory, `torch.steady_reserved_bytes` and `torch.steady_peak_allocated_bytes` the step records after
/// warm-up, `torch.steady_peak_reserved_bytes` the step peaks at or under the phase bar.
pub fn steady_level(readings: impl IntoIterator<Item = i64>) -> i64 {
    median(readings.into_iter().collect())
}

/// The middle value (the upper one of an even number), 0 for none.
pub(super) fn median(mut v: Vec<i64>) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

impl Facts {
    /// Computes the facts of a report, in time linear in its size.
    pub fn of(r: &Report) -> Facts {
        let ranks = Ranks::of(r);
        let steps = super::when::Steps::of(r);
        let gpus = gpu::gpu_facts(r, &steps);
        let processes = process::process_facts(r, &ranks);
        let mut gpus = gpus;
        let torch_processes: Vec<TorchFacts> = r
            .torch
            .processes
            .iter()
            .map(|t| torch::torch_facts(t, &ranks, &gpus))
            .collect();
        for g in &mut gpus {
            g.torch_phases = torch_processes
                .iter()
                .filter(|t| t.gpu == Some(g.index) && t.host == g.host)
                .map(|t| t.phase_count)
                .sum();
        }
        let mut oom = oom::oom_facts(r, &gpus, &steps);
        oom::oom_leak(&mut oom, &torch_processes);
        Facts {
            run: run::run_facts(r, &gpus),
            oom,
            gpus,
            processes,
            torch_processes,
        }
    }

    /// Facts with one of everything, every field set (none null, so that a rule is checked against a
    /// value of each fact's type): what rules are checked against at load.
    pub fn example() -> Facts {
        let run = RunFacts {
            classification: "success".into(),
            driver: Some("580.159.04".into()),
            server: Some("vllm".into()),
            server_label: Some("vLLM".into()),
            server_flag: Some("--gpu-memory-utilization".into()),
            server_setting: Some("--gpu-memory-utilization 0.8".into()),
            exit_code: Some(0),
            job_peak_max_gpu: Some(0),
            job_peak_min_gpu: Some(0),
            job_peak_max_at_s: Some(0.0),
            server_fraction: Some(0.9),
            cuda_driver_version: Some(13.0),
            cuda_runtime_version: Some(13.0),
            orphan_list: vec![Holder::example()],
            ..Default::default()
        };
        Facts {
            run,
            oom: OomFacts {
                cause: Some("unknown".into()),
                explanation: Some("the job asked for more than was free".into()),
                source: Some("pytorch".into()),
                engine: Some("vllm".into()),
                vendor: Some("nvidia".into()),
                exception: Some("torch.OutOfMemoryError".into()),
                pass: Some("forward".into()),
                module: Some("model.layers.2.mlp".into()),
                largest_part: Some("activations".into()),
                largest_part_pct: Some(50.0),
                host: Some("node-a".into()),
                at_s: Some(0.0),
                phase: Some("training_step".into()),
                steps: Some(0),
                since_last_step_s: Some(0.0),
                growth_bytes: Some(0),
                growth_rate_bytes_per_s: Some(0.0),
                growth_s: Some(0.0),
                graph_holder: Some("list `outs`".into()),
                graph_bytes: Some(0),
                job_peak_pct: Some(0.0),
                leak_total_bytes: Some(0),
                leak_bytes_per_step: Some(0.0),
                leak_r2: Some(0.0),
                waiting_forwards: Some(0),
                grad: Some(true),
                optimizer_made: Some(true),
                gpu: Some(0),
                rank: Some(0),
                requested_bytes: Some(0),
                free_bytes: Some(0),
                total_bytes: Some(0),
                allocated_bytes: Some(0),
                reserved_bytes: Some(0),
                reserved_unallocated_bytes: Some(0),
                allowed_bytes: Some(0),
                inside: Some(InsideRecord::example()),
                hunt: Some(HuntRecord {
                    why: "oom".into(),
                    ..HuntRecord::example()
                }),
                sites: vec![SiteRecord::example()],
                holders: vec![HolderRecord::example()],
                others: vec![Holder::example()],
                ..Default::default()
            },
            gpus: vec![GpuFacts {
                name: "NVIDIA H200".into(),
                others_list: vec![Holder::example()],
                forecast: vec!["GPU 0 will be full in ~5 min".into()],
                host: Some("node-a".into()),
                server: Some("vllm".into()),
                framework: Some("JAX".into()),
                framework_noun: Some("arrays".into()),
                peak_stretch: Some("steps".into()),
                peak_since_last_step_s: Some(0.0),
                growth_bytes: Some(0),
                growth_rate_bytes_per_s: Some(0.0),
                growth_r2: Some(1.0),
                growth_s: Some(0.0),
                growth_from_s: Some(0.0),
                growth_after_step: Some(0),
                growth_live_bytes: Some(0),
                growth_live_framework: Some("PyTorch".into()),
                time_to_full_s: Some(0.0),
                growth_graph_holder: Some("list `outs`".into()),
                growth_hunt: Some(HuntRecord::example()),
                growth_sites: vec![SiteRecord::example()],
                growth_holders: vec![HolderRecord::example()],
                ..Default::default()
            }],
            processes: vec![ProcFacts {
                host: Some("node-a".into()),
                job_gpu_label: Some("GPU 0".into()),
                user: Some("alice".into()),
                verdict: Some("orphan".into()),
                reason: Some("its parent died".into()),
                why: crate::orphans::Why::examples().pop(),
                per_gpu: vec![
                    OnGpu {
                        index: 0,
                        label: "GPU 0".into(),
                        bytes: GIB,
                    },
                    OnGpu {
                        index: 1,
                        label: "GPU 1".into(),
                        bytes: GIB,
                    },
                ],
                main_label: "GPU 0".into(),
                parent_rank: Some(0),
                main_gpu: Some(0),
                job_gpu: Some(0),
                job_gpu_start_bytes: Some(0),
                job_gpu_high_from_s: Some(0.0),
                job_gpu_high_s: Some(0.0),
                rank: Some(0),
                local_rank: Some(0),
                parent_pid: Some(1),
                ..Default::default()
            }],
            torch_processes: vec![TorchFacts {
                host: Some("node-a".into()),
                torch_version: Some("2.11.0+cu130".into()),
                gpu_total_bytes: Some(GIB),
                cell: Some("x = model(batch)".into()),
                rank: Some(0),
                gpu: Some(0),
                cell_numbers: vec![3, 5],
                reserved_peak_bytes: Some(0),
                final_reserved_bytes: Some(0),
                steady_reserved_bytes: Some(0),
                steady_peak_reserved_bytes: Some(0),
                phase_peak_reserved_bytes: Some(0),
                eval_grad: Some(false),
                non_pytorch_bytes: Some(0),
                phase_steps: vec![25, 50],
                leak_hunt: Some(HuntRecord::example()),
                leak_sites: vec![SiteRecord::example(), SiteRecord::example()],
                leak_holders: vec![HolderRecord::example(), HolderRecord::example()],
                ..Default::default()
            }],
        }
    }
}

/// The GPU a fact's host (none but in merged reports) and index (-1: unknown) name.
pub(super) fn gpu_of(host: Option<&str>, index: i64) -> Option<GpuRef> {
    let index = u32::try_from(index).ok()?;
    Some(GpuRef::new(host, index))
}

/// How messages name the GPU a fact's host and index name: `GPU 0`, `GPU 0 on node-a`, `an unknown GPU`.
pub(super) fn gpu_label(host: Option<&str>, index: i64) -> String {
    GpuRef::label(gpu_of(host, index).as_ref())
}

/// The process a fact's host (none but in merged reports) and PID name.
fn proc_of(host: Option<&str>, pid: i64) -> ProcRef {
    ProcRef::new(host, pid as u32)
}

impl Holder {
    /// A holder with every field set, for the example facts.
    fn example() -> Holder {
        Holder {
            pid: 42,
            host: Some("node-a".into()),
            who: Some("python train.py".into()),
            bytes: GIB,
        }
    }
}

impl GpuFacts {
    /// Which GPU this is.
    pub fn gpu(&self) -> GpuRef {
        gpu_of(self.host.as_deref(), self.index).expect("a GPU's facts have its index")
    }
}

impl ProcFacts {
    /// Which process this is.
    pub fn who(&self) -> ProcRef {
        proc_of(self.host.as_deref(), self.pid)
    }

    /// The GPU it works on, if it holds memory anywhere.
    pub fn main_gpu(&self) -> Option<GpuRef> {
        gpu_of(self.host.as_deref(), self.main_gpu?)
    }
}

impl TorchFacts {
    /// Which process this is.
    pub fn who(&self) -> ProcRef {
        proc_of(self.host.as_deref(), self.pid)
    }

    /// Its GPU, where PyTorch's device was matched to one NVML sees.
    pub fn on_gpu(&self) -> Option<GpuRef> {
        gpu_of(self.host.as_deref(), self.gpu?)
    }
}

pub(in crate::rules) fn name_of<T: serde::Serialize>(v: T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(String::from))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_rules_are_checked_against_has_a_value_for_every_fact() {
        fn nulls(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Null => out.push(at.to_string()),
                serde_json::Value::Object(o) => o
                    .iter()
                    .for_each(|(k, x)| nulls(x, &format!("{at}.{k}"), out)),
                serde_json::Value::Array(a) => {
                    a.iter().for_each(|x| nulls(x, &format!("{at}[]"), out))
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        nulls(
            &serde_json::to_value(Facts::example()).unwrap(),
            "",
            &mut found,
        );
        assert!(found.is_empty(), "set these in Facts::example: {found:?}");
    }

    /// Every report among the fixtures, by its path.
    fn fixture_reports() -> Vec<(std::path::PathBuf, Report)> {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.to_string_lossy().ends_with(".report.json") {
                    out.push(p);
                }
            }
        }
        let mut files = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures"),
            &mut files,
        );
        files.sort();
        files
            .into_iter()
            .map(|f| {
                let r = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
                (f, r)
            })
            .collect()
    }

    /// Facts whose 0 no run can have, by their group and name.
    const NEVER_ZERO: [(&str, &str); 6] = [
        ("run", "cuda_driver_version"),
        ("run", "cuda_runtime_version"),
        ("torch_processes", "gpu_total_bytes"),
        ("oom", "leak_total_bytes"),
        ("oom", "leak_r2"),
        ("processes", "job_gpu_high_s"),
    ];

    #[test]
    fn what_a_run_does_not_have_is_null_never_an_empty_string_minus_one_or_zero() {
        fn sentinels(v: &serde_json::Value, at: &str, out: &mut Vec<String>) {
            match v {
                serde_json::Value::String(s) if s.is_empty() => out.push(at.to_string()),
                serde_json::Value::Number(n) if n.as_f64() == Some(-1.0) => {
                    out.push(at.to_string())
                }
                serde_json::Value::Object(o) => o
                    .iter()
                    .for_each(|(k, x)| sentinels(x, &format!("{at}.{k}"), out)),
                serde_json::Value::Array(a) => {
                    a.iter().for_each(|x| sentinels(x, &format!("{at}[]"), out))
                }
                _ => {}
            }
        }
        // Runs with and without an OOM, a server, steps, growth, hosts: every report the fixtures hold.
        let reports = fixture_reports();
        assert!(reports.len() >= 40, "{}", reports.len());
        for (f, r) in reports {
            let mut found = Vec::new();
            sentinels(
                &serde_json::to_value(Facts::of(&r)).unwrap(),
                "",
                &mut found,
            );
            // A command line NVML could not read is no sentinel: it is what /proc gave.
            found.retain(|at| !at.ends_with(".cmdline"));
            // Facts no run can have as 0 (a CUDA version, a GPU's capacity, a fit's R² beside a growth):
            // a 0 there stands for "unknown", which is null.
            let v = serde_json::to_value(Facts::of(&r)).unwrap();
            for (group, name) in NEVER_ZERO {
                let items = match &v[group] {
                    serde_json::Value::Array(a) => a.iter().collect(),
                    one => vec![one],
                };
                for (i, item) in items.into_iter().enumerate() {
                    if item[name].as_f64() == Some(0.0) {
                        found.push(format!("{group}[{i}].{name} = 0"));
                    }
                }
            }
            assert!(found.is_empty(), "{}: {found:?}", f.display());
        }
    }

    #[test]
    fn a_steady_level_is_what_the_readings_held_most_of_the_time() {
        // A spike and a load ramp move it not at all: 4 of 7 readings at 10 GiB.
        let readings = [1, 5, 10, 10, 10, 10, 120].map(|g| g * GIB);
        assert_eq!(steady_level(readings), 10 * GIB);
        // Of an even number, the upper middle; of none, 0.
        assert_eq!(steady_level([2, 4, 6, 8]), 6);
        assert_eq!(steady_level([]), 0);
    }
}
