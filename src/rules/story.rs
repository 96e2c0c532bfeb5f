//! One story, one teller. A rule may say which story its diagnosis tells (`story = "oom"`: why the job
//! ran out, told by each `oom-*` rule) and which story its diagnosis is only a part of (`part_of = "oom"`:
//! `near-capacity`, whose full GPU the OOM is the end of; `transient-spike`, whose peak is the climb that
//! ended in it). A part is folded into a teller's diagnosis when both are about the same GPU and the same
//! moment: the job's memory on that GPU never came down by half of the part's level between the part's
//! moment and the teller's. Folded, it is not said on its own but kept in the teller's `parts`, with when
//! it was told during the run, so a verdict told live is never taken back: the summary says it under the
//! diagnosis that explains it. Which rules tell and which are parts is data, in the rule files.

use super::RuleSet;
use crate::report::Report;
use crate::verdict::{Diagnosis, Part};

/// `found` with each part folded into the first diagnosis (most severe first) that tells its story on
/// its GPU at its moment.
pub fn fold(found: Vec<Diagnosis>, rules: &RuleSet, r: &Report) -> Vec<Diagnosis> {
    let role = |d: &Diagnosis, f: fn(&super::Rule) -> &Option<String>| {
        rules
            .rules
            .iter()
            .find(|x| x.id == d.rule)
            .and_then(|x| f(x).clone())
    };
    let stories: Vec<Option<String>> = found.iter().map(|d| role(d, |x| &x.story)).collect();
    let mut kept: Vec<Diagnosis> = Vec::with_capacity(found.len());
    let mut folded: Vec<(usize, Part)> = Vec::new();
    for d in found.iter() {
        let teller = role(d, |x| &x.part_of).and_then(|story| {
            found
                .iter()
                .zip(&stories)
                .position(|(t, s)| s.as_deref() == Some(story.as_str()) && one_moment(r, d, t))
        });
        match teller {
            Some(t) => folded.push((t, Part::of(d.clone()))),
            None => kept.push(d.clone()),
        }
    }
    for (t, part) in folded {
        let teller = &found[t];
        if let Some(k) = kept
            .iter_mut()
            .find(|k| k.rule == teller.rule && k.subject == teller.subject)
        {
            k.parts.push(part);
        }
    }
    kept
}

/// Whether `part` and `teller` are about one GPU at one moment: the same GPU, and the memory in use on it
/// stayed at half of its level at the part's moment or more from one moment to the other. The memory in
/// use is the job's (its timeline's slices, each the highest it held in that slice) and what processes
/// outside the job held at the OOM on that GPU (another user's 139 GiB fill it whatever the job does). A
/// diagnosis without a moment is about the whole run.
fn one_moment(r: &Report, part: &Diagnosis, teller: &Diagnosis) -> bool {
    let (Some(gpu), Some(other)) = (&part.gpu, &teller.gpu) else {
        return false;
    };
    if gpu != other {
        return false;
    }
    let (Some(a), Some(b)) = (part.at_s, teller.at_s) else {
        return true;
    };
    let Some(g) = r.gpus.iter().find(|g| g.gpu() == *gpu) else {
        return true;
    };
    let outside = r
        .oom
        .as_ref()
        .filter(|o| o.gpu == Some(g.index) && o.host == g.host)
        .map_or(0, |o| o.others_bytes);
    let levels: Vec<u64> = g.job_timeline.iter().map(|&(_, v)| v + outside).collect();
    let slice = |t: f64| {
        g.job_timeline
            .iter()
            .rposition(|&(s, _)| s <= t)
            .unwrap_or(0)
    };
    let Some(&level) = levels.get(slice(a)) else {
        return true;
    };
    let (from, to) = (slice(a.min(b)), slice(a.max(b)));
    levels[from..=to]
        .iter()
        .all(|&v| v.saturating_mul(2) >= level)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::GpuRef;
    use crate::verdict::Severity;

    const GIB: u64 = 1 << 30;

    /// A real run's report with GPU 0's job memory set to `levels`, one slice a second.
    fn report(levels: &[u64]) -> Report {
        let mut r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/healthy.report.json"
        )))
        .unwrap();
        r.gpus[0].job_timeline = levels
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as f64, v))
            .collect();
        r
    }

    fn said(rule: &str, severity: Severity, subject: &str, at_s: f64) -> Diagnosis {
        Diagnosis {
            rule: rule.into(),
            severity,
            title: rule.into(),
            subject: subject.into(),
            message: format!("{rule} says"),
            details: Vec::new(),
            advice: Vec::new(),
            docs: None,
            gpu: Some(GpuRef::new(None, 0)),
            pid: None,
            at_s: Some(at_s),
            facts: Default::default(),
            known_at_s: None,
            parts: Vec::new(),
        }
    }

    fn rules() -> RuleSet {
        RuleSet::load(None, &[]).unwrap()
    }

    #[test]
    fn the_full_gpu_an_oom_explains_is_kept_in_the_ooms_diagnosis_with_when_it_was_told() {
        let r = report(&[2 * GIB, 60 * GIB, 120 * GIB, 139 * GIB, 139 * GIB, 0]);
        let mut near = said("near-capacity", Severity::Warn, "GPU 0", 3.5);
        near.known_at_s = Some(3.6);
        let found = vec![said("oom-self-growth", Severity::Error, "run", 4.2), near];
        let kept = fold(found, &rules(), &r);
        assert_eq!(kept.len(), 1, "{kept:#?}");
        assert_eq!(kept[0].rule, "oom-self-growth");
        assert_eq!(kept[0].parts.len(), 1);
        assert_eq!(kept[0].parts[0].rule, "near-capacity");
        assert_eq!(kept[0].parts[0].known_at_s, Some(3.6));
    }

    #[test]
    fn a_spike_that_came_down_before_the_oom_and_an_oom_on_another_gpu_explain_nothing() {
        // The spike at 1 s came back to 2 GiB before the OOM (too big) at 5 s: two stories.
        let r = report(&[2 * GIB, 130 * GIB, 2 * GIB, 2 * GIB, 2 * GIB, 3 * GIB]);
        let found = vec![
            said("oom-too-big", Severity::Error, "run", 5.0),
            said("transient-spike", Severity::Info, "GPU 0", 1.0),
            said("near-capacity", Severity::Warn, "GPU 0", 1.0),
        ];
        let kept = fold(found.clone(), &rules(), &r);
        assert_eq!(kept.len(), 3, "{kept:#?}");
        // The same near-capacity beside an OOM of GPU 1.
        let mut other = found;
        other[0].gpu = Some(GpuRef::new(None, 1));
        other[0].at_s = Some(1.0);
        assert_eq!(fold(other, &rules(), &r).len(), 3);
    }

    #[test]
    fn with_no_story_teller_a_part_speaks_for_itself() {
        let r = report(&[139 * GIB, 139 * GIB]);
        let found = vec![
            said("step-leak", Severity::Warn, "pid 1", 1.0),
            said("near-capacity", Severity::Warn, "GPU 0", 1.0),
        ];
        assert_eq!(fold(found, &rules(), &r).len(), 2);
    }
}
