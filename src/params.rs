//! The thresholds verdicts depend on: one table, read by the Rust that decides (the OOM's cause, growth,
//! the phase at an OOM) and by the rules as `param.NAME`. docs/rules.md lists it (generated from [`ALL`]; `GPUDOC_BLESS=1 cargo test --test docs`). A leaf: it imports nothing.

/// What a parameter's number counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    Count,
    Seconds,
    Percent,
    /// A fraction or a fit's R² (0-1).
    Ratio,
}

impl Unit {
    /// Its name in the documentation.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Count => "count",
            Unit::Seconds => "seconds",
            Unit::Percent => "percent",
            Unit::Ratio => "ratio",
        }
    }
}

/// A parameter's number: an integer (bytes, counts, whole percents) or not.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    Int(i64),
    Float(f64),
}

impl std::fmt::Display for Number {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Number::Int(i) => write!(f, "{i}"),
            Number::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// A named threshold: its value, its unit and what it decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Param {
    pub name: &'static str,
    pub value: Number,
    pub unit: Unit,
    pub decides: &'static str,
}

impl Param {
    /// Its value as an unsigned integer (bytes, counts, percents).
    pub const fn uint(&self) -> u64 {
        match self.value {
            Number::Int(i) => i as u64,
            Number::Float(f) => f as u64,
        }
    }

    /// Its value as a float.
    pub const fn float(&self) -> f64 {
        match self.value {
            Number::Int(i) => i as f64,
            Number::Float(f) => f,
        }
    }
}

const MIB: i64 = 1 << 20;
const GIB: i64 = 1 << 30;

const fn int(name: &'static str, v: i64, unit: Unit, decides: &'static str) -> Param {
    Param {
        name,
        value: Number::Int(v),
        unit,
        decides,
    }
}

const fn float(name: &'static str, v: f64, unit: Unit, decides: &'static str) -> Param {
    Param {
        name,
        value: Number::Float(v),
        unit,
        decides,
    }
}

/// The share of its cache PyTorch must hold unallocated for fragmentation to be an OOM's cause: below it,
/// the GPU is full of live tensors and reclaiming the pieces would buy an allocation or two (the real
/// texts with a few MiB free in the cache of a full GPU hold 0.15-0.8% of it, the fragmented ones 5.6-85%).
pub const OOM_FRAGMENTED_SHARE: Param = int(
    "oom_fragmented_share_pct",
    2,
    Unit::Percent,
    "an OOM is fragmentation (`oom.cause` `fragmentation`) only where PyTorch held at least this share of its cache reserved but unallocated, and more than the request",
);

/// A request counts as fitting in what was free only with room to spare: CUDA maps memory in pages and
/// needs it in one piece.
pub const OOM_FITS_MARGIN: Param = int(
    "oom_fits_margin_pct",
    5,
    Unit::Percent,
    "a request fits in the free memory an OOM text gives only with this much of it to spare, plus `oom_fits_slack_bytes`: then the numbers do not explain the OOM (`unknown`), and a cap that left the GPU with less is not the cause",
);

pub const OOM_FITS_SLACK: Param = int(
    "oom_fits_slack_bytes",
    64 * MIB,
    Unit::Bytes,
    "the room to spare, beyond `oom_fits_margin_pct`, for a request to fit in the free memory",
);

pub const OOM_OTHERS_SHARE: Param = int(
    "oom_others_share_pct",
    50,
    Unit::Percent,
    "without the allocator's numbers, an OOM is other processes' (`others`) where NVML saw them hold more than this share of the GPU",
);

pub const OOM_FULL: Param = int(
    "oom_full_pct",
    90,
    Unit::Percent,
    "without the allocator's numbers, an OOM is the job's own growth (`self_growth`) where NVML saw the GPU more than this full, mostly by the job",
);

/// The first steps compile and autotune, fill the allocator's cache and make the optimizer's state: what
/// they hold says nothing of the steps to come (`torch::warmup`, the one definition; the shim is told it).
pub const WARMUP_STEPS: Param = int(
    "warmup_steps",
    10,
    Unit::Count,
    "a process's first steps (forward calls without steps) are warm-up, left out of the slopes per step (`step-leak`, `allocator-thrash`), the steady levels (`cache-bloat`), the phase steps (`phase-peak`), the forecasts' pace, and before which the shim starts no leak hunt or measured step (`torch.warmup_steps`)",
);

/// Before the first backward, this many forward calls with none are calls no backward will follow: a step
/// calls its model once, or twice or three times (two views, a GAN's discriminator), never this often.
pub const WAITING_CALLS: Param = int(
    "waiting_calls",
    8,
    Unit::Count,
    "forward calls with no backward, before the program's first backward, that make an OOM's phase an evaluation or inference rather than a training step (`oom.phase`)",
);

/// An evaluation every N steps stands well above the training steps; a step's own noise does not.
pub const PHASE_MIN_ABOVE: Param = int(
    "phase_min_above_bytes",
    2 * GIB,
    Unit::Bytes,
    "a step record is a phase step (`torch.phase_count`, `gpu.torch_phases`: `phase-peak`, and no `transient-spike` where there are any) when its peak reserved memory stands above the lower quartile of the records' peaks by more than this and `phase_min_above_pct` of that quartile",
);

pub const PHASE_MIN_ABOVE_PCT: Param = int(
    "phase_min_above_pct",
    50,
    Unit::Percent,
    "with `phase_min_above_bytes`: a phase step's peak is above the lower quartile by at least this share of it too",
);

pub const GROWTH_MIN_SLICES: Param = int(
    "growth_min_slices",
    8,
    Unit::Count,
    "the fewest slices of the job's memory steady growth spans (`gpu.growth_bytes`)",
);

pub const GROWTH_MIN_SHARE: Param = int(
    "growth_min_share",
    4,
    Unit::Count,
    "steady growth spans at least 1 in this many slices of the stretch it is found in",
);

/// A program that rises for a second is loading, not leaking.
pub const GROWTH_MIN_S: Param = float(
    "growth_min_s",
    2.0,
    Unit::Seconds,
    "the shortest steady growth said in a run without optimizer steps",
);

/// After the last step the model is loaded, and a shorter rise counts.
pub const GROWTH_MIN_S_AFTER_STEPS: Param = float(
    "growth_min_s_after_steps",
    0.5,
    Unit::Seconds,
    "the shortest steady growth said after the last optimizer step",
);

pub const GROWTH_MIN_R2: Param = float(
    "growth_min_r2",
    0.9,
    Unit::Ratio,
    "how well a straight line must fit the job's memory for it to be steady growth (R²)",
);

/// PyTorch's segments are 2 and 20 MiB.
pub const GROWTH_NOISE: Param = int(
    "growth_noise_bytes",
    64 * MIB,
    Unit::Bytes,
    "a rise or fall of the job's memory below this is the allocator's noise, not growth, and slices within it of each other are flat",
);

/// Shorter pauses are the program's own pace (a leak in stairs).
pub const GROWTH_PLATEAU_SLICES: Param = int(
    "growth_plateau_slices",
    3,
    Unit::Count,
    "flat this many slices (and a `growth_plateau_share`th of the stretch) ends a ramp: what rose before was a load, and growth is counted after it",
);

pub const GROWTH_PLATEAU_SHARE: Param = int(
    "growth_plateau_share",
    10,
    Unit::Count,
    "a plateau that ends a load is also at least 1 in this many slices of the stretch",
);

pub const LEAK_MIN_R2: Param = float(
    "leak_min_r2",
    0.8,
    Unit::Ratio,
    "how well a straight line must fit the live tensors step by step for them to be a step leak (`step-leak`, and the OOM that a leak filled)",
);

pub const LIVE_CONFIRM: Param = int(
    "live_confirm_looks",
    2,
    Unit::Count,
    "a live rule's diagnosis is told during a run once it held in this many looks in a row",
);

/// About a CUDA context (~520 MiB on an H200): less is a monitoring tool, not a job.
pub const HELD_MIN: Param = int(
    "held_min_bytes",
    500 * MIB,
    Unit::Bytes,
    "memory in use before the job started (`held-before-start`), or other users' on a GPU in a look (`held-by-others`), is said from this much",
);

/// A run's allocator figures move by whole blocks; less is PyTorch's bookkeeping, not what the cell kept.
pub const CELL_GREW: Param = int(
    "cell_grew_bytes",
    MIB,
    Unit::Bytes,
    "a notebook cell's run grew when it left at least this much more allocated than it found (`torch.cell_runs`, `cell-leak`; the notebook extension's `GREW`)",
);

pub const CELL_LEAK_RUNS: Param = int(
    "cell_leak_runs",
    3,
    Unit::Count,
    "a notebook cell leaks (`cell-leak`, and the notebook extension's report of it, its `LEAK_RUNS`) when this many of its last runs in a row each grew",
);

/// XLA's own temporaries and a longer sequence than the run's need room over the peak a run used.
pub const FRAMEWORK_HEADROOM: Param = int(
    "framework_headroom_pct",
    25,
    Unit::Percent,
    "the headroom over a preallocating framework's peak in use that the fraction or memory limit `jax-preallocation` says to set leaves (`gpu.framework_fraction`, `gpu.framework_limit_mib`)",
);

/// Every parameter, in the order docs/rules.md lists them.
pub const ALL: &[Param] = &[
    OOM_FRAGMENTED_SHARE,
    OOM_FITS_MARGIN,
    OOM_FITS_SLACK,
    OOM_OTHERS_SHARE,
    OOM_FULL,
    WARMUP_STEPS,
    WAITING_CALLS,
    PHASE_MIN_ABOVE,
    PHASE_MIN_ABOVE_PCT,
    GROWTH_MIN_SLICES,
    GROWTH_MIN_SHARE,
    GROWTH_MIN_S,
    GROWTH_MIN_S_AFTER_STEPS,
    GROWTH_MIN_R2,
    GROWTH_NOISE,
    GROWTH_PLATEAU_SLICES,
    GROWTH_PLATEAU_SHARE,
    LEAK_MIN_R2,
    LIVE_CONFIRM,
    HELD_MIN,
    CELL_GREW,
    CELL_LEAK_RUNS,
    FRAMEWORK_HEADROOM,
];

/// The parameter named `name`.
pub fn find(name: &str) -> Option<&'static Param> {
    ALL.iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_fit_a_rule() {
        for (i, p) in ALL.iter().enumerate() {
            assert!(
                p.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{}",
                p.name
            );
            assert!(
                ALL[..i].iter().all(|q| q.name != p.name),
                "{} twice",
                p.name
            );
            assert_eq!(find(p.name), Some(p));
        }
    }
}
