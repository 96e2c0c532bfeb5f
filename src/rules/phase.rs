//! Where a moment falls among a program's phases, from the shim's records of its optimizer steps: before
//! the first step (loading the model, warming up, the first step itself), during the steps (training),
//! after the last (evaluation, saving, inference). A program without steps is all "before".

use crate::torch::view::TorchProcReport;

/// When a process's optimizer steps ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Clock {
    /// When the first recorded step ended (the shim records from the first step's end on).
    pub first_s: f64,
    /// When the last step ended: the last record's time, plus the steps after it (the shim records every
    /// Nth step; its exit record counts them all) at the records' pace.
    pub last_s: f64,
    /// Steps seen in all.
    pub steps: u64,
    /// Seconds per step over the records (0 with one record).
    pub period_s: f64,
}

impl Clock {
    /// The steps of `p`; `None` without any.
    pub fn of(p: &TorchProcReport) -> Option<Clock> {
        let (first, last) = (p.steps.first()?, p.steps.last()?);
        let period_s = match last.step.saturating_sub(first.step) {
            0 => 0.0,
            n => (last.at_s - first.at_s) / n as f64,
        };
        let steps = p.steps_total.max(last.step);
        Some(Clock {
            first_s: first.at_s,
            last_s: last.at_s + (steps - last.step) as f64 * period_s,
            steps,
            period_s,
        })
    }

    /// The steps of several processes (the ranks on one GPU, or of a whole run): from the earliest first
    /// step to the latest last one, at the slowest pace.
    pub fn of_all<'a>(ps: impl IntoIterator<Item = &'a TorchProcReport>) -> Option<Clock> {
        ps.into_iter().filter_map(Clock::of).reduce(|a, b| Clock {
            first_s: a.first_s.min(b.first_s),
            last_s: a.last_s.max(b.last_s),
            steps: a.steps.max(b.steps),
            period_s: a.period_s.max(b.period_s),
        })
    }

    /// How long after the last step a moment still counts as during the steps: the next step's own work
    /// (its forward and backward run before its step is recorded) with room for a slow one.
    fn slack(&self) -> f64 {
        (3.0 * self.period_s).max(0.5)
    }
}

/// A program's phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the first optimizer step ended: loading, warm-up, the first step, or a program without an
    /// optimizer (inference).
    BeforeSteps,
    /// Among the optimizer steps: training.
    Steps,
    /// After the last optimizer step: evaluation, saving, inference after training.
    AfterSteps,
}

impl Phase {
    /// The fact's value: `before_steps`, `steps`, `after_steps`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::BeforeSteps => "before_steps",
            Phase::Steps => "steps",
            Phase::AfterSteps => "after_steps",
        }
    }
}

/// A moment placed among the phases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub phase: Phase,
    /// Optimizer steps that had ended by then (as far as the records tell).
    pub steps: u64,
    /// Seconds since the last of them; `None` before the first.
    pub since_last_s: Option<f64>,
}

/// Places the moment `at` (seconds into the run) among the phases of `clock` (`None`: no step at all).
pub fn place(clock: Option<&Clock>, steps: &[&TorchProcReport], at: f64) -> Placed {
    let before = Placed {
        phase: Phase::BeforeSteps,
        steps: 0,
        since_last_s: None,
    };
    let Some(c) = clock else { return before };
    if at < c.first_s {
        return before;
    }
    if at > c.last_s + c.slack() {
        return Placed {
            phase: Phase::AfterSteps,
            steps: c.steps,
            since_last_s: Some(at - c.last_s),
        };
    }
    // The last record at or before it, over the processes.
    let (step, t) = steps
        .iter()
        .flat_map(|p| &p.steps)
        .filter(|s| s.at_s <= at)
        .map(|s| (s.step, s.at_s))
        .fold((0, c.first_s), |a, b| if b.1 >= a.1 { b } else { a });
    let (step, t) = if at >= c.last_s {
        (c.steps, c.last_s)
    } else {
        (step, t)
    };
    Placed {
        phase: Phase::Steps,
        steps: step,
        since_last_s: Some(at - t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::torch::Step;

    /// A process that recorded `(step, steps covered, at_s)` and saw `total` steps.
    fn proc(records: &[(u64, u64, f64)], total: u64) -> TorchProcReport {
        let steps: Vec<Step> = records
            .iter()
            .map(|&(step, steps, at_s)| Step {
                step,
                steps,
                at_s,
                ..Step::default()
            })
            .collect();
        let mut p: TorchProcReport = serde_json::from_value(serde_json::json!({
            "pid": 1, "rank": null, "local_rank": null, "torch_version": null, "device": 0,
            "gpu": 0, "peak_allocated_bytes": 0, "peak_reserved_bytes": 0,
            "final_allocated_bytes": 0, "final_reserved_bytes": 0, "peak_inactive_split_bytes": 0,
            "nvml_peak_bytes": null, "non_pytorch_bytes": null, "alloc_retries": 0, "ooms": 0,
            "device_allocs": 0, "device_frees": 0, "steps_total": 0, "step_stride": 1, "steps": []
        }))
        .unwrap();
        p.steps = steps;
        p.steps_total = total;
        p
    }

    fn placed(p: &TorchProcReport, at: f64) -> (&'static str, u64, Option<f64>) {
        let x = place(Clock::of(p).as_ref(), &[p], at);
        (
            x.phase.name(),
            x.steps,
            x.since_last_s.map(|s| (s * 100.0).round() / 100.0),
        )
    }

    #[test]
    fn an_evaluation_after_fifty_steps_comes_after_the_last() {
        // Fifty steps of 0.1 s from 5 s on, every one recorded; an OOM 8 s after the last.
        let recs: Vec<_> = (1..=50).map(|i| (i, 1, 5.0 + 0.1 * i as f64)).collect();
        let p = proc(&recs, 50);
        assert_eq!(placed(&p, 18.0), ("after_steps", 50, Some(8.0)));
        // During the steps: the last step before it, and how long since.
        assert_eq!(placed(&p, 7.53), ("steps", 25, Some(0.03)));
        // The next step's forward, before its record: still training.
        assert_eq!(placed(&p, 10.2), ("steps", 50, Some(0.2)));
        // Loading, before the first step ended.
        assert_eq!(placed(&p, 2.0), ("before_steps", 0, None));
    }

    #[test]
    fn steps_recorded_every_nth_are_counted_to_the_last() {
        // Records every 4th step (0.05 s a step), the exit record saying 70 steps: the last step is
        // placed 2 steps after the last record.
        let mut recs = vec![(1, 1, 7.0)];
        recs.extend((1..=17).map(|k| (4 * k, 4, 7.0 + 0.05 * (4 * k - 1) as f64)));
        let p = proc(&recs, 70);
        let c = Clock::of(&p).unwrap();
        assert!((c.last_s - (7.0 + 0.05 * 69.0)).abs() < 1e-9, "{c:?}");
        assert_eq!(placed(&p, 10.5).0, "steps");
        assert_eq!(placed(&p, 13.0), ("after_steps", 70, Some(2.55)));
    }

    #[test]
    fn a_program_without_steps_is_all_before_them() {
        let p = proc(&[], 0);
        assert_eq!(Clock::of(&p), None);
        assert_eq!(placed(&p, 30.0), ("before_steps", 0, None));
    }

    #[test]
    fn ranks_share_one_clock() {
        let a = proc(&[(1, 1, 10.0), (20, 1, 12.0)], 20);
        let b = proc(&[(1, 1, 10.2), (21, 1, 12.5)], 21);
        let c = Clock::of_all([&a, &b]).unwrap();
        assert_eq!((c.first_s, c.last_s, c.steps), (10.0, 12.5, 21));
        let x = place(Some(&c), &[&a, &b], 12.1);
        assert_eq!((x.phase, x.steps), (Phase::Steps, 20));
    }
}
