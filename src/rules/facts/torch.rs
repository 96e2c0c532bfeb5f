//! Each PyTorch process's facts (`torch.*`): its allocator, its steps' leak and churn, its phases, the
//! leak hunt's sites and holders.

use super::cell::cell_facts;
use super::hunt::{HolderRecord, HuntRecord, SiteRecord};
use super::process::Ranks;
use super::{GpuFacts, gpu_label, median, steady_level};
use crate::ident::ProcRef;
use crate::rules::growth::fit;
use serde::Serialize;

facts! {
#[derive(Debug, Clone, Default, Serialize)]
pub struct TorchFacts {
    /// its host, in a report merged from several (null otherwise)
    pub host: Option<String>,
    /// its GPU as messages name it (`GPU 0`, `GPU 0 on node-a`)
    pub label: String,
    /// PID
    pub pid: i64,
    /// RANK, null if it has none
    pub rank: Option<i64>,
    /// NVML's index of its device, null if unmatched
    pub gpu: Option<i64>,
    /// PyTorch's version, null if the shim did not give it
    pub torch_version: Option<String>,
    /// whose allocator the numbers are: PyTorch, JAX (XLA's: allocated is bytes in use, reserved its pool),
    /// CuPy (its default memory pool: used and total bytes)
    pub framework: String,
    /// what that framework's live memory is made of, as messages name it: tensors (PyTorch, TensorFlow),
    /// arrays (JAX, CuPy), allocations (RMM)
    pub noun: String,
    /// its records are at its steps; false for CuPy and RMM, whose records are readings ten times a second
    /// that stand for steps (the report counts no steps for them)
    pub counts_steps: bool,
    /// the allocator took its pool whole at its start (JAX's default preallocation): reserved says nothing of
    /// what the program needs
    pub preallocated: bool,
    /// the allocator's peak reserved (cache) memory, null where the framework does not say (TensorFlow)
    pub reserved_peak_bytes: Option<i64>,
    /// the allocator's peak live tensors
    pub allocated_peak_bytes: i64,
    /// reserved at the end, null where not said
    pub final_reserved_bytes: Option<i64>,
    /// allocated at the end
    pub final_allocated_bytes: i64,
    /// the steady level of reserved memory over the steps after warm-up (final reserved with fewer than 3),
    /// null where not said
    pub steady_reserved_bytes: Option<i64>,
    /// the steady level of the per-step peaks of live tensors after warm-up (peak allocated with fewer than 3)
    pub steady_peak_allocated_bytes: i64,
    /// peak memory in split blocks not in use (fragmentation)
    pub inactive_split_peak_bytes: i64,
    /// NVML − reserved at NVML's peak (context, libraries), null where either is unknown
    pub non_pytorch_bytes: Option<i64>,
    /// times the allocator freed its cache and retried (cudaMalloc failed)
    pub alloc_retries: i64,
    /// OOMs the allocator raised
    pub ooms: i64,
    /// cudaMalloc calls
    pub device_allocs: i64,
    /// cudaFree calls
    pub device_frees: i64,
    /// optimizer steps seen
    pub steps: i64,
    /// steps of warm-up: the first steps (forward calls without steps), left out of the slopes, steady levels
    /// and phase steps, and before which the shim starts no leak hunt or measured step (torch::warmup)
    pub warmup_steps: i64,
    /// slope of allocated memory per step after warm-up (least squares)
    pub leak_bytes_per_step: f64,
    /// how well a straight line fits it (R², 0..1)
    pub leak_r2: f64,
    /// the slope times the steps it was fitted over
    pub leak_total_bytes: i64,
    /// slope of cudaMalloc calls per step after warm-up
    pub device_allocs_per_step: f64,
    /// slope of cudaFree calls per step after warm-up
    pub device_frees_per_step: f64,
    /// allocation retries by the last step (not those of an OOM after it)
    pub step_alloc_retries: i64,
    /// slope of allocation retries per step after warm-up
    pub alloc_retries_per_step: f64,
    /// capacity of its GPU, null if its device was not matched to a GPU NVML sees
    pub gpu_total_bytes: Option<i64>,
    /// the steady level of the per-step peaks of reserved memory over the steps that are not phases, null
    /// where the framework does not say what it reserves
    pub steady_peak_reserved_bytes: Option<i64>,
    /// the highest per-step peak of reserved memory among the phase steps (0 without any; null where not
    /// said)
    pub phase_peak_reserved_bytes: Option<i64>,
    /// phase steps: a step record whose peak reserved memory is above the lower quartile of the peaks by 2
    /// GiB and half of it, in a run that comes back down after one (growth that never does is no phase)
    pub phase_count: i64,
    /// their step numbers (the first 8; a record covering several steps gives its last)
    pub phase_steps: Vec<i64>,
    /// steps between phase steps when they come at a regular interval (3 or more), else 0
    pub phase_period_steps: i64,
    /// the most steps one phase record covers (1: each is placed at its step; more: the shim recorded every
    /// Nth step)
    pub phase_span_steps: i64,
    /// its evaluation ran under grad: the first call of the model after an eval() that followed optimizer
    /// steps (the call the shim measured) saved tensors for a backward; false where it saved none (under
    /// torch.no_grad() or torch.inference_mode()); null where no evaluation call was measured
    pub eval_grad: Option<bool>,
    /// a leak hunt recorded this process's memory history
    pub hunted: bool,
    /// its last leak hunt that ran or failed (a window of steps, or of forward calls in a program without
    /// steps): whether it ran, its window (a record: docs/rules.md, "The words of a hunt"); null without
    /// one
    pub leak_hunt: Option<HuntRecord>,
    /// where the memory that stayed alive in the hunt's window was allocated, most first: sites (file,
    /// line, function, code, bytes, per_step_bytes, blocks)
    pub leak_sites: Vec<SiteRecord>,
    /// what keeps it alive, as the hunt found them: holders (name, kind, tensors, bytes, items, graphs, of)
    pub leak_holders: Vec<HolderRecord>,
    /// notebook cells run in this process (a Jupyter kernel), 0 elsewhere
    pub cells: i64,
    /// the cell whose last runs each left more allocated, the most in all: `its first line` (cell 12 when it
    /// has none); null if none did
    pub cell: Option<String>,
    /// its last runs that each left at least 1 MiB more allocated than they found, in a row
    pub cell_runs: i64,
    /// their execution counts (the In [3] of each), in order
    pub cell_numbers: Vec<i64>,
    /// allocated memory those runs left behind, on average
    pub cell_growth_bytes_per_run: f64,
    /// allocated memory those runs left behind, in all
    pub cell_growth_bytes: i64,
}
}

pub(super) fn torch_facts(
    t: &crate::torch::view::TorchProcReport,
    ranks: &Ranks,
    gpus: &[GpuFacts],
) -> TorchFacts {
    let after = crate::torch::warmup::after(&t.steps);
    let slope = |f: fn(&crate::torch::Step) -> Option<u64>| {
        fit(&after
            .iter()
            .map(|s| (s.step as f64, f(s).unwrap_or(0) as f64))
            .collect::<Vec<_>>())
    };
    let (leak, r2) = slope(|s| Some(s.allocated_bytes));
    let span = after
        .last()
        .zip(after.first())
        .map_or(0, |(l, f)| l.step.saturating_sub(f.step));
    let phases = phases(after);
    let hunt = t
        .hunts
        .iter()
        .rev()
        .find(|h| h.why != "oom" && (h.error.is_some() || h.steps > 0));
    let said = |v: Option<u64>| v.map(|v| v as i64);
    // A record that does not say what is reserved (TensorFlow's) leaves the level unknown, never 0.
    let (steady_reserved, steady_peak) = if after.len() >= 3 {
        (
            after
                .iter()
                .map(|s| said(s.reserved_bytes))
                .collect::<Option<Vec<i64>>>()
                .map(steady_level),
            steady_level(after.iter().map(|s| s.peak_allocated_bytes as i64)),
        )
    } else {
        (said(t.final_reserved_bytes), t.peak_allocated_bytes as i64)
    };
    let host = t.host.clone();
    let (leak_hunt, leak_sites, leak_holders) = super::hunt::of(hunt);
    TorchFacts {
        label: gpu_label(host.as_deref(), t.gpu.map_or(-1, |g| g as i64)),
        rank: ranks.of_pid(&ProcRef::new(t.host.as_deref(), t.pid)).0,
        host,
        pid: t.pid as i64,
        gpu: t.gpu.map(i64::from),
        torch_version: t.torch_version.clone(),
        framework: crate::rules::framework::name(t),
        noun: crate::rules::framework::noun(t),
        counts_steps: t.framework.counts_steps(),
        preallocated: t.preallocated,
        reserved_peak_bytes: said(t.peak_reserved_bytes),
        allocated_peak_bytes: t.peak_allocated_bytes as i64,
        final_reserved_bytes: said(t.final_reserved_bytes),
        final_allocated_bytes: t.final_allocated_bytes as i64,
        steady_reserved_bytes: steady_reserved,
        steady_peak_allocated_bytes: steady_peak,
        inactive_split_peak_bytes: t.peak_inactive_split_bytes.unwrap_or(0) as i64,
        non_pytorch_bytes: said(t.non_pytorch_bytes),
        alloc_retries: t.alloc_retries.unwrap_or(0) as i64,
        ooms: t.ooms.unwrap_or(0) as i64,
        device_allocs: t.device_allocs.unwrap_or(0) as i64,
        device_frees: t.device_frees.unwrap_or(0) as i64,
        steps: t.steps_total as i64,
        warmup_steps: crate::torch::warmup::STEPS as i64,
        leak_bytes_per_step: leak,
        leak_r2: r2,
        leak_total_bytes: (leak * span as f64) as i64,
        device_allocs_per_step: slope(|s| s.device_allocs).0,
        device_frees_per_step: slope(|s| s.device_frees).0,
        step_alloc_retries: t
            .steps
            .last()
            .and_then(|s| s.alloc_retries)
            .map_or(0, |n| n as i64),
        alloc_retries_per_step: slope(|s| s.alloc_retries).0,
        gpu_total_bytes: t
            .gpu
            .and_then(|i| {
                gpus.iter()
                    .find(|g| g.index == i as i64 && g.host == t.host)
            })
            .map(|g| g.total_bytes),
        steady_peak_reserved_bytes: phases.as_ref().map(|p| p.steady),
        phase_peak_reserved_bytes: phases.as_ref().map(|p| p.peak),
        phase_count: phases.as_ref().map_or(0, |p| p.steps.len() as i64),
        phase_steps: phases
            .as_ref()
            .map(|p| p.steps.iter().take(8).copied().collect())
            .unwrap_or_default(),
        phase_period_steps: phases.as_ref().map_or(0, |p| p.period),
        phase_span_steps: phases.as_ref().map_or(0, |p| p.span),
        eval_grad: t
            .inside
            .iter()
            .find(|w| w.phase.as_deref() == Some("evaluation") && w.error.is_none())
            .map(|w| w.parts.activations > 0 || w.saved_hooked > 0),
        hunted: hunt.is_some(),
        leak_hunt,
        leak_sites,
        leak_holders,
        cells: t.cells.len() as i64,
        ..cell_facts(&t.cells)
    }
}

/// Steps whose peak stands far above the steady per-step peak: an evaluation, a checkpoint.
#[derive(Debug, Default, PartialEq)]
struct Phases {
    /// The steady level of the per-step peaks of reserved memory ([`steady_level`]).
    steady: i64,
    /// Highest peak among the phase steps.
    peak: i64,
    steps: Vec<i64>,
    /// Regular interval between them (3 or more), else 0.
    period: i64,
    /// The most steps one of their records covers.
    span: i64,
}

/// The phase records of `recs` (the step records but the first two): a peak above the steady level (the
/// lower quartile of the records' peaks) by more than `phase_min_above_bytes` (2 GiB) and
/// `phase_min_above_pct` (half) of it, in a run that comes back down
/// to the steady level after at least one of them. Growth that never comes back (a leak, a job filling the
/// GPU) is no phase. A record covering several steps places its phase only to within those steps. `None`
/// where a record does not say its peak reserved memory (TensorFlow's): nothing is known of phases.
fn phases(recs: &[crate::torch::Step]) -> Option<Phases> {
    if recs.iter().any(|s| s.peak_reserved_bytes.is_none()) {
        return None;
    }
    if recs.len() < 3 {
        return Some(Phases::default());
    }
    let peak = |s: &crate::torch::Step| s.peak_reserved_bytes.unwrap_or(0) as i64;
    let mut sorted: Vec<i64> = recs.iter().map(peak).collect();
    sorted.sort_unstable();
    let quartile = sorted[sorted.len() / 4];
    let above = crate::params::PHASE_MIN_ABOVE.uint() as i64;
    let pct = crate::params::PHASE_MIN_ABOVE_PCT.uint() as i64;
    let bar = quartile + above.max((quartile as i128 * pct as i128 / 100) as i64);
    let high: Vec<usize> = (0..recs.len()).filter(|&i| peak(&recs[i]) > bar).collect();
    let steady = steady_level(recs.iter().map(peak).filter(|&p| p <= bar));
    let comes_back = high
        .iter()
        .any(|&i| recs.get(i + 1).is_some_and(|n| peak(n) <= bar));
    if !comes_back {
        return Some(Phases {
            steady,
            ..Default::default()
        });
    }
    let steps: Vec<i64> = high.iter().map(|&i| recs[i].step as i64).collect();
    let gaps: Vec<i64> = steps.windows(2).map(|w| w[1] - w[0]).collect();
    let span = high
        .iter()
        .map(|&i| recs[i].steps as i64)
        .max()
        .unwrap_or(1);
    // A period is said only when the records place each phase well within it.
    let period = match gaps.first() {
        Some(&g)
            if steps.len() >= 3
                && span * 4 <= g
                && gaps.iter().all(|&x| (x - g).abs() <= span.max(g / 10)) =>
        {
            median(gaps.clone())
        }
        _ => 0,
    };
    Some(Phases {
        steady,
        peak: high.iter().map(|&i| peak(&recs[i])).max().unwrap_or(0),
        steps,
        period,
        span,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::facts::GIB;

    fn step(step: u64, peak_gib: f64) -> crate::torch::Step {
        crate::torch::Step {
            step,
            steps: 1,
            at_s: step as f64,
            peak_reserved_bytes: Some((peak_gib * GIB as f64) as u64),
            ..crate::torch::Step::default()
        }
    }

    #[test]
    fn the_steps_of_warm_up_are_left_out_of_the_slopes_the_steady_levels_and_the_phases() {
        use crate::report::Report;
        use crate::rules::facts::Facts;
        use crate::torch::warmup;
        let mut r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/healthy.report.json"
        )))
        .unwrap();
        // Warm-up fills the cache a GiB a step and peaks high; past it, flat at 4 GiB reserved.
        let gib = GIB as u64;
        let n = warmup::STEPS + 20;
        r.torch.processes[0].steps = (1..=n)
            .map(|i| {
                let (reserved, peak) = if warmup::past(i) {
                    (4 * gib, 5 * gib)
                } else {
                    (i * gib, 60 * gib)
                };
                crate::torch::Step {
                    reserved_bytes: Some(reserved),
                    allocated_bytes: reserved / 2,
                    peak_allocated_bytes: reserved / 2,
                    ..step(i, (peak / gib) as f64)
                }
            })
            .collect();
        let f = Facts::of(&r);
        let t = &f.torch_processes[0];
        assert_eq!(t.warmup_steps, warmup::STEPS as i64);
        assert_eq!(t.leak_bytes_per_step, 0.0);
        assert_eq!(t.steady_reserved_bytes, Some(4 * GIB));
        assert_eq!(t.steady_peak_allocated_bytes, 2 * GIB);
        assert_eq!(t.steady_peak_reserved_bytes, Some(5 * GIB));
        assert_eq!(t.phase_count, 0, "warm-up's peaks are no phase");
    }

    #[test]
    fn an_evaluation_every_25_steps_is_a_periodic_phase() {
        let steps: Vec<_> = (1..=100)
            .map(|i| step(i, if i % 25 == 0 { 66.0 } else { 5.5 }))
            .collect();
        let p = phases(&steps).unwrap();
        assert_eq!(p.steps, vec![25, 50, 75, 100]);
        assert_eq!(p.period, 25);
        assert_eq!(p.peak, 66 * GIB);
        assert_eq!(p.steady, (5.5 * GIB as f64) as i64);
    }

    #[test]
    fn phases_need_a_clear_margin_and_must_come_back_down() {
        // 1.5 GiB above the steady 5.5 GiB: below the 2 GiB margin.
        let small: Vec<_> = (1..=50)
            .map(|i| step(i, if i % 10 == 0 { 7.0 } else { 5.5 }))
            .collect();
        assert!(phases(&small).unwrap().steps.is_empty());
        // Growth that never comes back (a leak, a job filling the GPU) is no phase.
        let growth: Vec<_> = (1..=50).map(|i| step(i, i as f64)).collect();
        assert!(phases(&growth).unwrap().steps.is_empty());
        // One phase: no period.
        let once: Vec<_> = (1..=50)
            .map(|i| step(i, if i == 30 { 55.0 } else { 5.0 }))
            .collect();
        let p = phases(&once).unwrap();
        assert_eq!((p.steps, p.period, p.span), (vec![30], 0, 1));
        // Irregular: listed, no period.
        let odd: Vec<_> = (1..=60)
            .map(|i| step(i, if [10, 17, 41].contains(&i) { 30.0 } else { 5.0 }))
            .collect();
        let p = phases(&odd).unwrap();
        assert_eq!((p.steps, p.period), (vec![10, 17, 41], 0));
    }

    #[test]
    fn phases_are_found_in_records_that_cover_many_steps() {
        // The H200's periodic evaluation (fixtures/runs/periodic_eval): the shim recorded every ~40 steps,
        // so half the records hold an evaluation.
        let recs = [
            (31, 29, 60.7),
            (40, 9, 0.7),
            (87, 47, 60.7),
            (94, 7, 0.7),
            (144, 50, 60.7),
            (151, 7, 60.7),
            (154, 3, 0.7),
            (194, 40, 60.7),
        ];
        let steps: Vec<_> = recs
            .iter()
            .map(|&(n, covered, gib)| crate::torch::Step {
                steps: covered,
                ..step(n, gib)
            })
            .collect();
        let p = phases(&steps).unwrap();
        assert_eq!(p.steps, vec![31, 87, 144, 151, 194]);
        assert_eq!((p.period, p.span), (0, 50));
        assert_eq!(p.steady, (0.7 * GIB as f64) as i64);
    }
}
