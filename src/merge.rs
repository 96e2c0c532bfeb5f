//! One job across nodes: the reports each node's `gpudoc run` wrote, merged into one report (the same
//! schema, each GPU, process, PyTorch process, OOM and leftover marked with its host, times on one clock
//! from the earliest start) so the rules, the gate, the HTML report and `compare` see the whole job; and
//! whether reports are parts of one job at all ([`one_job`]). Pure.

use crate::oom::Ending;
use crate::report::{HostRun, Report};
use crate::units::fmt_secs;

/// How far apart the runs of one launch may be with no moment when all of them ran: a node whose command
/// failed at once may have ended a little before a slower node started.
pub const LAUNCH_SLACK_S: f64 = 5.0;

/// Why two of the reports given are not parts of one job.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{other} is not part of the job of {first}: {what}. Only the reports of one job's nodes merge (what \
     says they are one job: the same Slurm job and step, the same --name or launcher's id, or ranks of one \
     world; and runs that overlap in time); give unrelated runs to `gpudoc report` one at a time, or set \
     them side by side with `gpudoc compare`"
)]
pub struct NotOneJob {
    pub first: String,
    pub other: String,
    /// What differs, in words.
    pub what: String,
}

/// Checks that `parts` (each report with the file it came from) are parts of one job: the same Slurm job
/// and step, `--name` and launcher's id as the first; something that says they are one job (one of those
/// given, or ranks no two of them share: [`one_world`]), as runs that merely started together are not;
/// and run at the same time (one launch: there was a moment, give or take [`LAUNCH_SLACK_S`], when all of
/// them ran), unless one Slurm step says they are one launch.
pub fn one_job(parts: &[(&str, &Report)]) -> Result<(), NotOneJob> {
    let Some(&(first, a)) = parts.first() else {
        return Ok(());
    };
    let differs = |other: &str, what: String| NotOneJob {
        first: first.into(),
        other: other.into(),
        what,
    };
    for &(other, b) in &parts[1..] {
        let (x, y) = (&a.origin, &b.origin);
        for (what, p, q) in [
            ("Slurm job", &x.slurm.job_id, &y.slurm.job_id),
            ("Slurm step", &x.slurm.step_id, &y.slurm.step_id),
            ("--name", &x.name, &y.name),
            ("launcher's id", &x.launch, &y.launch),
        ] {
            if p != q {
                let say =
                    |v: &Option<String>| v.as_deref().map_or("none".into(), |v| format!("`{v}`"));
                return Err(differs(other, format!("{what} {} and {}", say(p), say(q))));
            }
        }
    }
    twice_a_rank(parts)?;
    let one_step = a.origin.slurm.job_id.is_some() && a.origin.slurm.step_id.is_some();
    if one_step {
        return Ok(());
    }
    let said = a.origin.slurm.job_id.is_some()
        || a.origin.name.is_some()
        || a.origin.launch.is_some()
        || one_world(parts.iter().map(|p| p.1));
    if !said && parts.len() > 1 {
        return Err(differs(
            parts[1].0,
            "nothing says they are one job: neither has a --name, a Slurm job or a launcher's id, and \
             their PyTorch processes did not report ranks of one world"
                .into(),
        ));
    }
    overlap(parts)
}

/// No two runs of one rank of the launch: a second is another attempt of it (a restart, an earlier
/// submission writing to the same `--report-dir`).
fn twice_a_rank(parts: &[(&str, &Report)]) -> Result<(), NotOneJob> {
    let mut seen: std::collections::BTreeMap<u64, &str> = Default::default();
    for &(file, r) in parts {
        let Some(rank) = r.origin.rank else { continue };
        if let Some(first) = seen.insert(rank, file) {
            return Err(NotOneJob {
                first: first.into(),
                other: file.into(),
                what: format!(
                    "both are rank {rank} of the launch, so one of them is another attempt of it (a restart, \
                     an earlier run writing to the same folder)"
                ),
            });
        }
    }
    Ok(())
}

/// Whether the reports' PyTorch processes reported ranks of one world: each report some, no rank in two.
fn one_world<'a>(reports: impl Iterator<Item = &'a Report>) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    for r in reports {
        let ranks = ranks(r);
        if ranks.is_empty() || !ranks.iter().all(|k| seen.insert(*k)) {
            return false;
        }
    }
    true
}

/// The runs had a moment, give or take [`LAUNCH_SLACK_S`], when all of them ran.
fn overlap(parts: &[(&str, &Report)]) -> Result<(), NotOneJob> {
    let end = |r: &Report| r.started_unix_s + r.duration_s;
    let late = parts
        .iter()
        .max_by(|p, q| p.1.started_unix_s.total_cmp(&q.1.started_unix_s));
    let early = parts.iter().min_by(|p, q| end(p.1).total_cmp(&end(q.1)));
    match (late, early) {
        (Some(&(l, lr)), Some(&(e, er))) if lr.started_unix_s > end(er) + LAUNCH_SLACK_S => {
            Err(NotOneJob {
                first: e.into(),
                other: l.into(),
                what: format!(
                    "they did not run at the same time: {l} started at {}, {} after {e} had ended (at {})",
                    at(lr.started_unix_s),
                    fmt_secs(lr.started_unix_s - end(er)),
                    at(end(er))
                ),
            })
        }
        _ => Ok(()),
    }
}

/// A time for people: RFC 3339, UTC, to the second.
fn at(unix_s: f64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix_s.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

/// The merged report of `reports` (the report itself when there is one).
pub fn merge(mut reports: Vec<Report>) -> Result<Report, String> {
    match reports.len() {
        0 => return Err("no report to merge".into()),
        1 => return Ok(reports.pop().expect("one report")),
        _ => {}
    }
    reports.sort_by(|a, b| a.started_unix_s.total_cmp(&b.started_unix_s));
    let hosts = host_names(&reports);
    let start = reports[0].started_unix_s;
    let end = reports
        .iter()
        .map(|r| r.started_unix_s + r.duration_s)
        .fold(start, f64::max);
    let mut out = reports[0].clone();
    out.started_unix_s = start;
    out.duration_s = end - start;
    out.gpus.clear();
    out.processes.clear();
    out.orphans.clear();
    out.torch = Default::default();
    out.oom = None;
    out.diagnoses.clear();
    out.rule_errors.clear();
    out.gate = None;
    out.notes = vec![format!(
        "merged from the reports of {} hosts: {}",
        reports.len(),
        hosts.join(", ")
    )];
    out.origin = common_origin(&reports);
    out.notes
        .extend(missing_ranks(&reports, out.origin.world_size));
    let mut first_oom: Option<(f64, crate::oom::OomReport)> = None;
    for (r, host) in reports.iter().zip(&hosts) {
        let shift = r.started_unix_s - start;
        add_host(&mut out, r, host, shift);
        if let Some(o) = &r.oom {
            let at = o.event.at_s + shift;
            if first_oom.as_ref().is_none_or(|(t, _)| at < *t) {
                let mut o = o.clone();
                o.host = Some(host.clone());
                o.event.at_s = at;
                first_oom = Some((at, o));
            }
        }
        out.hosts.push(host_run(r, host));
    }
    out.oom = first_oom.map(|(_, o)| o);
    out.exit = merged_exit(
        &reports,
        out.oom.as_ref().and_then(|o| o.host.as_deref()),
        &hosts,
    );
    let (device, process) = reports.iter().fold((0, 0), |(d, p), r| {
        (
            d + r.sampling.device_samples,
            p + r.sampling.process_samples,
        )
    });
    out.sampling.device_samples = device;
    out.sampling.process_samples = process;
    out.sampling.self_cpu_s = reports.iter().map(|r| r.sampling.self_cpu_s).sum();
    out.sampling.self_max_rss_bytes = reports
        .iter()
        .map(|r| r.sampling.self_max_rss_bytes)
        .max()
        .unwrap_or(0);
    Ok(out)
}

/// Each report's host name; one left empty, or given twice, is told apart by its place (`host2`).
fn host_names(reports: &[Report]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (i, r) in reports.iter().enumerate() {
        let mut n = r.origin.host.clone();
        if n.is_empty() || names.contains(&n) {
            n = format!("{}#{}", if n.is_empty() { "host" } else { &n }, i + 1);
        }
        names.push(n);
    }
    names
}

/// What all the reports share: the job's name and Slurm job id when they agree.
fn common_origin(reports: &[Report]) -> crate::origin::Origin {
    let first = &reports[0].origin;
    let all = |f: &dyn Fn(&crate::origin::Origin) -> Option<String>| {
        let v = f(first);
        reports
            .iter()
            .all(|r| f(&r.origin) == v)
            .then_some(v)
            .flatten()
    };
    crate::origin::Origin {
        host: String::new(),
        name: all(&|o| o.name.clone()),
        slurm: crate::origin::Slurm {
            job_id: all(&|o| o.slurm.job_id.clone()),
            step_id: all(&|o| o.slurm.step_id.clone()),
            node_id: None,
        },
        cuda_visible_devices: None,
        launch: all(&|o| o.launch.clone()),
        rank: None,
        world_size: first
            .world_size
            .filter(|&n| reports.iter().all(|r| r.origin.world_size == Some(n))),
    }
}

/// The ranks of a launch of `world_size` tasks that no report is of, in words: a node that wrote none (it
/// was lost, or its report went elsewhere).
fn missing_ranks(reports: &[Report], world_size: Option<u64>) -> Option<String> {
    let n = world_size?;
    let have: std::collections::BTreeSet<u64> =
        reports.iter().filter_map(|r| r.origin.rank).collect();
    if have.is_empty() {
        return None;
    }
    let missing: Vec<String> = (0..n)
        .filter(|k| !have.contains(k))
        .map(|k| k.to_string())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "the reports of {} of the launch's {n} ranks: none of rank {}",
            have.len(),
            missing.join(", ")
        )
    })
}

fn shifted(t: f64, shift: f64) -> f64 {
    ((t + shift) * 1e6).round() / 1e6
}

/// One host's GPUs, processes, framework view and leftovers, on the merged clock.
fn add_host(out: &mut Report, r: &Report, host: &str, shift: f64) {
    for g in &r.gpus {
        let mut g = g.clone();
        g.host = Some(host.into());
        g.peak_used_at_s = shifted(g.peak_used_at_s, shift);
        g.job_peak_at_s = shifted(g.job_peak_at_s, shift);
        for p in &mut g.job_timeline {
            p.0 = shifted(p.0, shift);
        }
        if let Some(l) = &mut g.lost {
            l.at_s = shifted(l.at_s, shift);
        }
        out.gpus.push(g);
    }
    for p in &r.processes {
        let mut p = p.clone();
        p.host = Some(host.into());
        p.peak_at_s = shifted(p.peak_at_s, shift);
        p.first_seen_s = shifted(p.first_seen_s, shift);
        p.high_from_s = p.high_from_s.map(|t| shifted(t, shift));
        out.processes.push(p);
    }
    for o in &r.orphans {
        let mut o = o.clone();
        o.host = Some(host.into());
        out.orphans.push(o);
    }
    out.torch.enabled |= r.torch.enabled;
    for t in &r.torch.processes {
        let mut t = t.clone();
        t.host = Some(host.into());
        for s in &mut t.steps {
            s.at_s = shifted(s.at_s, shift);
        }
        for h in &mut t.hunts {
            h.at_s = shifted(h.at_s, shift);
        }
        for w in &mut t.inside {
            w.at_s = shifted(w.at_s, shift);
        }
        out.torch.processes.push(t);
    }
    for o in &r.torch.ooms {
        let mut o = o.clone();
        o.at_s = shifted(o.at_s, shift);
        out.torch.ooms.push(o);
    }
    out.torch
        .errors
        .extend(r.torch.errors.iter().map(|e| format!("{host}: {e}")));
    out.notes
        .extend(r.notes.iter().map(|n| format!("{host}: {n}")));
}

/// The ranks a report's PyTorch processes reported (their `RANK`), sorted, each once.
fn ranks(r: &Report) -> Vec<i64> {
    let mut ranks: Vec<i64> = r
        .torch
        .processes
        .iter()
        .filter_map(|t| t.rank.as_ref())
        .filter_map(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
    ranks
}

fn host_run(r: &Report, host: &str) -> HostRun {
    HostRun {
        origin: crate::origin::Origin {
            host: host.into(),
            ..r.origin.clone()
        },
        started_unix_s: r.started_unix_s,
        duration_s: r.duration_s,
        exit_code: r.exit.code,
        classification: r.exit.classification,
        gpus: r.gpus.iter().map(|g| g.index).collect(),
        ranks: ranks(r),
    }
}

/// The job's end: the host whose OOM came first, else the first host that failed, else a success.
fn merged_exit(
    reports: &[Report],
    oom_host: Option<&str>,
    hosts: &[String],
) -> crate::report::Exit {
    let failing =
        |r: &&Report| !matches!(r.exit.classification, Ending::Success) && r.exit.code != Some(0);
    let pick = oom_host
        .and_then(|h| hosts.iter().position(|x| x == h))
        .map(|i| &reports[i])
        .or_else(|| reports.iter().find(failing))
        .unwrap_or(&reports[0]);
    pick.exit.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(host: &str, start: f64) -> Report {
        let text = include_str!("../fixtures/runs/healthy.report.json");
        let mut r: Report = serde_json::from_str(text).unwrap();
        r.origin.host = host.into();
        r.started_unix_s = start;
        r
    }

    #[test]
    fn hosts_keep_their_gpus_on_one_clock() {
        let (a, b) = (report("node-a", 100.0), report("node-b", 102.5));
        let (ga, gb) = (a.gpus.len(), b.gpus.len());
        let peak_b = b.gpus[0].job_peak_at_s;
        let m = merge(vec![b, a]).unwrap();
        assert_eq!(m.gpus.len(), ga + gb);
        assert_eq!(m.gpus[0].host.as_deref(), Some("node-a"), "earliest first");
        assert_eq!(m.gpus[ga].host.as_deref(), Some("node-b"));
        assert!((m.gpus[ga].job_peak_at_s - (peak_b + 2.5)).abs() < 1e-6);
        assert_eq!(m.hosts.len(), 2);
        assert_eq!(m.origin.host, "");
        assert!(m.notes[0].contains("node-a, node-b"));
    }

    #[test]
    fn runs_that_merely_started_together_do_not_merge() {
        let (mut a, mut b) = (report("node-a", 100.0), report("node-b", 101.0));
        let e = one_job(&[("a.json", &a), ("b.json", &b)]).unwrap_err();
        assert!(e.what.starts_with("nothing says they are one job"), "{e}");
        // Ranks of one world say so; a rank in both does not.
        let rank = |r: &mut Report, k: i64| r.torch.processes[0].rank = Some(k.into());
        rank(&mut a, 0);
        rank(&mut b, 0);
        assert!(one_job(&[("a.json", &a), ("b.json", &b)]).is_err());
        rank(&mut b, 1);
        assert_eq!(one_job(&[("a.json", &a), ("b.json", &b)]), Ok(()));
        // So does one launcher's id, and not two.
        let (mut a, mut b) = (report("node-a", 100.0), report("node-b", 101.0));
        a.origin.launch = Some("TORCHELASTIC_RUN_ID=5".into());
        let e = one_job(&[("a.json", &a), ("b.json", &b)]).unwrap_err();
        assert_eq!(e.what, "launcher's id `TORCHELASTIC_RUN_ID=5` and none");
        b.origin.launch = a.origin.launch.clone();
        assert_eq!(one_job(&[("a.json", &a), ("b.json", &b)]), Ok(()));
        assert_eq!(
            merge(vec![a, b]).unwrap().origin.launch.as_deref(),
            Some("TORCHELASTIC_RUN_ID=5")
        );
    }

    #[test]
    fn a_rank_twice_is_another_attempt_and_a_rank_missing_is_said() {
        let mut parts: Vec<Report> = (0..3)
            .map(|k| {
                let mut r = report(&format!("node-{k}"), 100.0 + k as f64);
                r.origin.slurm.job_id = Some("77".into());
                r.origin.slurm.step_id = Some("0".into());
                r.origin.rank = Some(k);
                r.origin.world_size = Some(4);
                r
            })
            .collect();
        let files = ["r0.json", "r1.json", "r2.json"];
        fn pairs<'a>(files: &[&'a str], p: &'a [Report]) -> Vec<(&'a str, &'a Report)> {
            files.iter().copied().zip(p).collect()
        }
        assert_eq!(one_job(&pairs(&files, &parts)), Ok(()));
        let m = merge(parts.clone()).unwrap();
        assert_eq!(m.origin.world_size, Some(4));
        assert!(
            m.notes
                .contains(&"the reports of 3 of the launch's 4 ranks: none of rank 3".to_string()),
            "{:?}",
            m.notes
        );
        // Even within one Slurm step, which otherwise says they are one launch.
        parts[2].origin.rank = Some(1);
        let e = one_job(&pairs(&files, &parts)).unwrap_err();
        assert_eq!((e.first.as_str(), e.other.as_str()), ("r1.json", "r2.json"));
        assert!(e.what.starts_with("both are rank 1 of the launch"), "{e}");
    }

    #[test]
    fn only_parts_of_one_job_merge() {
        let mut a = report("node-a", 100.0);
        let duration = a.duration_s;
        let mut b = report("node-b", 101.0);
        for r in [&mut a, &mut b] {
            r.origin.name = Some("llama".into());
        }
        assert_eq!(one_job(&[("a.json", &a), ("b.json", &b)]), Ok(()));
        // A run started long after the other ended: another launch.
        b.started_unix_s = 100.0 + duration + 3600.0;
        let e = one_job(&[("a.json", &a), ("b.json", &b)]).unwrap_err();
        assert_eq!((e.first.as_str(), e.other.as_str()), ("a.json", "b.json"));
        assert!(
            e.what
                .starts_with("they did not run at the same time: b.json started at"),
            "{e}"
        );
        // Unless one Slurm step says it is one launch.
        for r in [&mut a, &mut b] {
            r.origin.slurm.job_id = Some("77".into());
            r.origin.slurm.step_id = Some("0".into());
        }
        assert_eq!(one_job(&[("a.json", &a), ("b.json", &b)]), Ok(()));
        b.origin.slurm.job_id = Some("78".into());
        let e = one_job(&[("a.json", &a), ("b.json", &b)]).unwrap_err();
        assert_eq!(e.what, "Slurm job `77` and `78`");
        b.origin.slurm.job_id = Some("77".into());
        b.origin.name = Some("other".into());
        let e = one_job(&[("a.json", &a), ("b.json", &b)]).unwrap_err();
        assert!(
            e.to_string().starts_with(
                "b.json is not part of the job of a.json: --name `llama` and `other`."
            ),
            "{e}"
        );
    }

    #[test]
    fn the_same_host_twice_is_told_apart() {
        let m = merge(vec![report("n", 1.0), report("n", 2.0)]).unwrap();
        let names: Vec<_> = m.hosts.iter().map(|h| h.origin.host.clone()).collect();
        assert_eq!(names, ["n", "n#2"]);
    }
}
