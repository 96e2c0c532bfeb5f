//! When a GPU will be full, forecast from a diagnosis of the run so far: from a leak of every step (its
//! size per step, the rule's own fit, and the steps per second of the latest records) or from growth with
//! no step to explain it (its rate), against the room still free on the GPU. Which diagnoses give one is
//! decided by the facts their rule read (`torch.leak_bytes_per_step`, `gpu.growth_rate_bytes_per_s`), so a
//! rule of the user's reading them forecasts too. Pure: the live verdicts ask it.

use crate::report::Report;
use crate::rules::hunt_words::HuntWords;
use crate::torch::Step;
use crate::verdict::{Diagnosis, Estimate};

/// What a diagnosis says of a GPU's future: which GPU fills, when, and what holds the memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Outlook {
    pub gpu: u32,
    pub estimate: Estimate,
    pub held_by: Option<String>,
}

/// The forecast `d` gives on the run so far (`r`, made at `now_s` seconds into the run); `None` when its
/// rule reads no rate, or the rate, the pace or the GPU cannot be told.
pub fn outlook(r: &Report, d: &Diagnosis, now_s: f64) -> Option<Outlook> {
    if let Some(per_step) = number(d, "torch.leak_bytes_per_step").filter(|b| *b > 0.0) {
        return by_steps(r, d, per_step, now_s);
    }
    let rate = number(d, "gpu.growth_rate_bytes_per_s").filter(|b| *b > 0.0)?;
    let gpu = r.gpus.iter().find(|g| d.gpu.as_ref() == Some(&g.gpu()))?;
    let room = room(r, gpu.index)?;
    Some(Outlook {
        gpu: gpu.index,
        estimate: Estimate {
            at_s: now_s,
            full_at_s: now_s + room as f64 / rate,
            room_bytes: room,
            rate_bytes_per_s: rate,
            bytes_per_step: None,
            full_at_step: None,
        },
        held_by: None,
    })
}

/// A leak of `per_step` bytes every step in the diagnosis' process: the GPU is full after as many more
/// steps as the room holds, at the pace of the latest steps.
fn by_steps(r: &Report, d: &Diagnosis, per_step: f64, now_s: f64) -> Option<Outlook> {
    let t = r
        .torch
        .processes
        .iter()
        .find(|t| Some(t.pid) == d.pid && t.host.is_none())?;
    let gpu = t.gpu?;
    let (step, per_s) = pace(&t.steps)?;
    let room = room(r, gpu)?;
    let steps_left = room as f64 / per_step;
    Some(Outlook {
        gpu,
        estimate: Estimate {
            at_s: now_s,
            full_at_s: now_s + steps_left / per_s,
            room_bytes: room,
            rate_bytes_per_s: per_step * per_s,
            bytes_per_step: Some(per_step),
            full_at_step: Some(step + steps_left.ceil() as u64),
        },
        held_by: held_by(d),
    })
}

/// The last step recorded and the steps per second over the records past warm-up
/// ([`crate::torch::warmup`]: its compiling and autotuning are no pace of the steps to come); `None`
/// with fewer than 2 of them or no time between.
fn pace(steps: &[Step]) -> Option<(u64, f64)> {
    let after = crate::torch::warmup::after(steps);
    let (first, last) = (after.first()?, after.last()?);
    let secs = last.at_s - first.at_s;
    let n = last.step.checked_sub(first.step)?;
    (secs > 0.0 && n > 0).then(|| (last.step, n as f64 / secs))
}

/// Memory the job can still take on GPU `gpu`: its total less the driver's reserve and what is in use
/// now (the job's own cache included: PyTorch keeps what it reserved, so NVML's figure follows the peak
/// within a step, and the room is what the steps still to come can take).
fn room(r: &Report, gpu: u32) -> Option<u64> {
    let g = r.gpus.iter().find(|g| g.index == gpu && g.host.is_none())?;
    if g.lost.is_some() || g.total_bytes == 0 {
        return None;
    }
    Some(
        g.total_bytes
            .saturating_sub(g.driver_reserved_bytes)
            .saturating_sub(g.final_used_bytes),
    )
}

fn number(d: &Diagnosis, fact: &str) -> Option<f64> {
    d.facts.get(fact)?.as_f64()
}

/// What holds the leak, in the words of a hunt (rules/words/hunt.toml): the first holder its hunt found,
/// else where its memory was allocated; `None` where the hunt found neither, or its rule read no hunt.
fn held_by(d: &Diagnosis) -> Option<String> {
    let hunt = d.facts.get("torch.leak_hunt")?;
    let first = |fact: &str| d.facts.get(fact)?.as_array()?.first();
    let words = HuntWords::bundled();
    match first("torch.leak_holders") {
        Some(h) => words.holder(hunt, h).ok(),
        None => words.site(hunt, first("torch.leak_sites")?).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(n: u64, every_s: f64) -> Vec<Step> {
        (1..=n)
            .map(|i| Step {
                step: i,
                steps: 1,
                at_s: i as f64 * every_s,
                ..Step::default()
            })
            .collect()
    }

    #[test]
    fn what_holds_a_leak_is_said_from_the_records_its_rule_read() {
        let r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/leak.report.json"
        )))
        .unwrap();
        let mut d = r
            .diagnoses
            .into_iter()
            .find(|d| d.rule == "step-leak")
            .unwrap();
        assert_eq!(
            held_by(&d).as_deref(),
            Some(
                "list `kept` (torch_steps.py, module globals), 30 items — at step 31: 20 of its tensors, allocated in steps 11-31, hold 1.25 GiB"
            )
        );
        // No holder found: where its memory was allocated.
        d.facts
            .insert("torch.leak_holders".into(), serde_json::json!([]));
        assert!(
            held_by(&d)
                .unwrap()
                .starts_with("allocated at gpu/torch_steps.py:26 in <module>"),
            "{:?}",
            held_by(&d)
        );
        // A hunt that could not run, or none: nothing holds it that is known.
        d.facts
            .insert("torch.leak_sites".into(), serde_json::json!([]));
        assert_eq!(held_by(&d), None);
        d.facts.remove("torch.leak_hunt");
        assert_eq!(held_by(&d), None);
    }

    #[test]
    fn the_pace_is_of_the_steps_past_warm_up() {
        // Slow steps of warm-up (compiling), then 10 steps a second.
        let warm = crate::torch::warmup::STEPS;
        let mut s = steps(warm, 1.0);
        s.extend(steps(30, 0.1).into_iter().map(|mut x| {
            x.step += warm;
            x.at_s += warm as f64;
            x
        }));
        let (last, per_s) = pace(&s).unwrap();
        assert_eq!(last, warm + 30);
        assert!((per_s - 10.0).abs() < 1e-9, "{per_s}");
        // One step past warm-up is no pace yet.
        assert_eq!(pace(&steps(warm + 1, 1.0)), None);
        assert!(pace(&steps(warm + 2, 1.0)).is_some());
    }
}
