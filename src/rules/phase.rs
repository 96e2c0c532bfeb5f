//! Two readings of a moment, kept apart: its `Phase`, what the program was doing (loading, a training
//! step, an evaluation, inference), read from the shim's evidence and never from the time; and its
//! `Stretch`, where it falls among the optimizer steps' records (before the first, among them, after the
//! last), which places a peak or a growth in time and says nothing of what ran then.

use crate::torch::activity::Activity;
use crate::torch::view::TorchProcReport;

/// What a program was doing at a moment, from the shim's evidence (see `Phase::at_oom`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before its first forward call, backward or optimizer step: building or loading the model.
    Loading,
    /// A training step: its backward, its optimizer's step, or a forward under grad in train() mode with
    /// no earlier forward call still waiting for a backward (the step's own forward, or the first one), or
    /// before the first backward in a program that made an optimizer (micro-batches waiting for one).
    TrainingStep,
    /// Forward calls that are no training step's, in a program that has trained: under no_grad or
    /// inference_mode, after eval(), or under grad with no backward following (a validation inside
    /// training, an evaluation after it).
    Evaluation,
    /// The same in a program that has run no backward and no optimizer step: inference.
    Inference,
}

impl Phase {
    /// The fact's value: `loading`, `training_step`, `evaluation`, `inference`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Loading => "loading",
            Phase::TrainingStep => "training_step",
            Phase::Evaluation => "evaluation",
            Phase::Inference => "inference",
        }
    }

    /// The phase of an OOM from what the shim saw then (`act`) and the pass its look placed it in
    /// (`forward`, `backward`, `optimizer`, `other`); `None` where the evidence does not decide: a forward
    /// under grad during training with no call beyond a step's count since the last backward may be the
    /// next step's or a validation's first.
    pub fn at_oom(act: Option<&Activity>, pass: Option<&str>) -> Option<Phase> {
        // Backward and the optimizer's step are a training step's, whatever else is known.
        if pass == Some("backward") || pass == Some("optimizer") {
            return Some(Phase::TrainingStep);
        }
        let a = act?;
        if a.in_backward == Some(true) || a.in_optimizer_step == Some(true) {
            return Some(Phase::TrainingStep);
        }
        let trained = a.steps.unwrap_or(0) > 0 || a.backwards.unwrap_or(0) > 0;
        let in_forward = pass == Some("forward");
        if !trained && !in_forward && a.forwards == Some(0) && a.backwards == Some(0) {
            return Some(Phase::Loading);
        }
        let no_graph = a.grad == Some(false) || a.inference_mode == Some(true);
        // Before the first backward, forward calls under grad in train() mode in a program that made an
        // optimizer are its first step's, however many wait for one backward (a gradient accumulation
        // that sums its micro-batches' losses): training, not inference.
        let accumulating = !trained
            && a.optimizer == Some(true)
            && a.grad == Some(true)
            && a.inference_mode != Some(true)
            && a.training == Some(true);
        if accumulating && (in_forward || waiting(a)) {
            return Some(Phase::TrainingStep);
        }
        if (in_forward && (no_graph || a.training == Some(false))) || waiting(a) {
            return Some(if trained {
                Phase::Evaluation
            } else {
                Phase::Inference
            });
        }
        let first = !trained && a.forwards_without_backward == Some(0);
        // Grad unknown (inside an autograd.Function's forward: a compiled model's) in a program that made
        // an optimizer: its first training step's forward, as with grad on.
        let for_training = a.grad == Some(true) || (a.grad.is_none() && a.optimizer == Some(true));
        (in_forward && first && for_training).then_some(Phase::TrainingStep)
    }
}

/// Forward calls since the last backward began, with more of them than a step uses (after the first
/// backward: the count most backwards had, or where the shim did not give it the most any had), or than
/// any step would use (before it: [`WAITING_CALLS`]): calls no backward followed. A validation every few
/// steps leaves most backwards with the step's own count: its second call after a step is told.
fn waiting(a: &Activity) -> bool {
    let per = a.forwards_per_step.or(a.forwards_per_backward);
    let (Some(n), Some(per)) = (a.forwards_without_backward, per) else {
        return false;
    };
    match a.backwards {
        Some(0) => n >= WAITING_CALLS,
        _ => n > per,
    }
}

/// Before the first backward, this many forward calls with none are calls no backward will follow (the
/// table of parameters says why).
pub const WAITING_CALLS: u64 = crate::params::WAITING_CALLS.uint();

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

/// Where a moment falls among the optimizer steps' records: a time, not what ran then (see `Phase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stretch {
    /// Before the first optimizer step ended: loading, warm-up, the first step, or a program without an
    /// optimizer (inference).
    BeforeSteps,
    /// Among the optimizer steps: training.
    Steps,
    /// After the last optimizer step: evaluation, saving, inference after training.
    AfterSteps,
}

impl Stretch {
    /// The fact's value: `before_steps`, `steps`, `after_steps`.
    pub fn name(self) -> &'static str {
        match self {
            Stretch::BeforeSteps => "before_steps",
            Stretch::Steps => "steps",
            Stretch::AfterSteps => "after_steps",
        }
    }
}

/// A moment placed among the steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Placed {
    pub stretch: Stretch,
    /// Optimizer steps that had ended by then (as far as the records tell).
    pub steps: u64,
    /// Seconds since the last of them; `None` before the first.
    pub since_last_s: Option<f64>,
}

/// Places the moment `at` (seconds into the run) among the steps of `clock` (`None`: no step at all).
pub fn place(clock: Option<&Clock>, steps: &[&TorchProcReport], at: f64) -> Placed {
    let before = Placed {
        stretch: Stretch::BeforeSteps,
        steps: 0,
        since_last_s: None,
    };
    let Some(c) = clock else { return before };
    if at < c.first_s {
        return before;
    }
    if at > c.last_s + c.slack() {
        return Placed {
            stretch: Stretch::AfterSteps,
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
        stretch: Stretch::Steps,
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
            x.stretch.name(),
            x.steps,
            x.since_last_s.map(|s| (s * 100.0).round() / 100.0),
        )
    }

    /// An Activity from the shim's message fields.
    fn act(v: serde_json::Value) -> Activity {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_phase_of_an_oom_is_what_the_program_was_doing() {
        use serde_json::json;
        let at = |v, pass| Phase::at_oom(Some(&act(v)), pass);
        // Backward after a slow step, whatever the time since the last step: a training step's.
        let bw = json!({"bw": true, "bws": 32, "steps": 31, "grad": false, "fg": null});
        assert_eq!(at(bw, Some("backward")), Some(Phase::TrainingStep));
        // The first training forward: no call waiting for its backward.
        let first =
            json!({"bw": false, "bws": 0, "steps": 0, "grad": true, "fwd": 0, "fg": 0, "fpb": 0});
        assert_eq!(
            at(first.clone(), Some("forward")),
            Some(Phase::TrainingStep)
        );
        // Nothing called yet, outside any forward: loading.
        assert_eq!(at(first, Some("other")), Some(Phase::Loading));
        // After eval(), 34 calls since the last backward: an evaluation.
        let eval = json!({"bws": 50, "steps": 50, "grad": true, "fwd": 35, "fg": 34, "fpb": 1, "train": false});
        assert_eq!(at(eval, Some("forward")), Some(Phase::Evaluation));
        // Calls under grad that no backward followed, in a program that never trained: inference.
        let kept = json!({"bws": 0, "steps": 0, "grad": true, "fwd": 150, "fg": 150, "fpb": 0});
        assert_eq!(at(kept.clone(), Some("other")), Some(Phase::Inference));
        // The same in train() mode in a program that made an optimizer: a gradient accumulation whose
        // micro-batches wait for one backward, in its first step.
        let mut accumulating = kept;
        accumulating["train"] = json!(true);
        accumulating["optim"] = json!(true);
        assert_eq!(
            at(accumulating.clone(), Some("other")),
            Some(Phase::TrainingStep)
        );
        accumulating["fg"] = json!(3);
        assert_eq!(
            at(accumulating.clone(), Some("forward")),
            Some(Phase::TrainingStep)
        );
        // A compiled model's first forward: grad not known inside its autograd.Function, an optimizer made.
        let compiled = json!({"bws": 0, "steps": 0, "grad": null, "fwd": 0, "fg": 0, "fpb": 0,
            "train": null, "optim": true});
        assert_eq!(
            at(compiled.clone(), Some("forward")),
            Some(Phase::TrainingStep)
        );
        let mut no_optimizer = compiled;
        no_optimizer["optim"] = json!(false);
        assert_eq!(at(no_optimizer, Some("forward")), None);
        // Under no_grad, or after eval(), they are no step's, optimizer or not.
        accumulating["grad"] = json!(false);
        assert_eq!(
            at(accumulating.clone(), Some("forward")),
            Some(Phase::Inference)
        );
        accumulating["grad"] = json!(true);
        accumulating["train"] = json!(false);
        accumulating["fg"] = json!(150);
        assert_eq!(at(accumulating, Some("other")), Some(Phase::Inference));
        // Two calls in a step that calls its model twice (fpb 2): still the step's.
        let two = json!({"bws": 9, "steps": 9, "grad": true, "fwd": 20, "fg": 2, "fpb": 2, "train": true});
        assert_eq!(at(two, Some("forward")), None);
        // A validation every 5 steps (4 calls, no backward): most backwards had one call before them, the
        // most had 5; two calls returned since the last backward are no step's.
        let val = json!({"bws": 50, "steps": 50, "grad": true, "fwd": 88, "fg": 2, "fpb": 5, "fps": 1,
            "train": true});
        assert_eq!(at(val.clone(), Some("other")), Some(Phase::Evaluation));
        assert_eq!(at(val.clone(), Some("forward")), Some(Phase::Evaluation));
        // Without the count most had (an older shim), the most any had decides: not known.
        let mut old = val;
        old["fps"] = serde_json::Value::Null;
        assert_eq!(at(old, Some("other")), None);
        // A step that calls its model twice, then once, in turn: counted at its most.
        let gan = json!({"bws": 9, "steps": 9, "grad": true, "fwd": 14, "fg": 2, "fpb": 2, "fps": 2,
            "train": true});
        assert_eq!(at(gan, Some("other")), None);
        // A forward under grad during training, its calls not counted: not known.
        let unknown =
            json!({"bws": 50, "steps": 50, "grad": true, "fwd": null, "fg": null, "train": true});
        assert_eq!(at(unknown.clone(), Some("forward")), None);
        assert_eq!(at(unknown, Some("other")), None);
        // Without the shim's reading, only the pass speaks.
        assert_eq!(
            Phase::at_oom(None, Some("optimizer")),
            Some(Phase::TrainingStep)
        );
        assert_eq!(Phase::at_oom(None, Some("forward")), None);
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
        assert_eq!((x.stretch, x.steps), (Stretch::Steps, 20));
    }
}
