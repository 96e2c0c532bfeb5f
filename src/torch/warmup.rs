//! Warm-up: a process's first optimizer steps (in a program without steps, the first forward calls of its
//! outermost module), left out of whatever measures its usual steps. They compile and autotune, fill the
//! allocator's cache, and make the optimizer's state at the first step: memory and time there say nothing
//! of the steps to come. The one definition, read by every part that leaves warm-up out: the shim (a leak
//! hunt or a measured step starts after it; told as `GPUDOC_TORCH`'s `warmup=`), the facts (slopes and
//! steady levels, phase steps: `torch.warmup_steps`), and the forecast's pace.

use super::Step;

/// Steps (or calls) of warm-up: the 11th is the first past it (`param.warmup_steps`).
pub const STEPS: u64 = crate::params::WARMUP_STEPS.uint();

/// Whether step (or call) `n`, counted from 1, is past warm-up.
pub fn past(n: u64) -> bool {
    n > STEPS
}

/// The step records past warm-up: from the first that ends at a step past it (its readings are of a
/// moment past warm-up; a record covering several steps, some of them warm-up's, is read as of its last).
/// Records are in step order.
pub fn after(records: &[Step]) -> &[Step] {
    let first = records
        .iter()
        .position(|s| past(s.step))
        .unwrap_or(records.len());
    &records[first..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(step: u64, steps: u64) -> Step {
        Step {
            step,
            steps,
            ..Step::default()
        }
    }

    #[test]
    fn warm_up_is_the_first_steps_and_a_record_is_past_it_when_its_last_step_is() {
        assert!(!past(STEPS) && past(STEPS + 1));
        let every: Vec<Step> = (1..=STEPS + 3).map(|n| record(n, 1)).collect();
        let kept: Vec<u64> = after(&every).iter().map(|s| s.step).collect();
        assert_eq!(kept, [STEPS + 1, STEPS + 2, STEPS + 3]);
        // Records of several steps: the first to end past warm-up is kept, whatever it covers.
        let strided = [
            record(STEPS - 2, STEPS - 2),
            record(STEPS + 2, 4),
            record(STEPS + 6, 4),
        ];
        assert_eq!(after(&strided)[0].step, STEPS + 2);
        assert!(after(&[record(STEPS, 1)]).is_empty());
    }
}
