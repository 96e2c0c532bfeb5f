//! One job across nodes: the reports each node's `gpudoc run` wrote, merged into one report (the same
//! schema, each GPU, process, PyTorch process, OOM and leftover marked with its host, times on one clock
//! from the earliest start) so the rules, the gate, the HTML report and `compare` see the whole job. Pure.

use crate::oom::Ending;
use crate::report::{HostRun, Report};

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
    }
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

fn host_run(r: &Report, host: &str) -> HostRun {
    let mut ranks: Vec<i64> = r
        .torch
        .processes
        .iter()
        .filter_map(|t| t.rank.as_ref())
        .filter_map(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()))
        .collect();
    ranks.sort_unstable();
    ranks.dedup();
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
        ranks,
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
    fn the_same_host_twice_is_told_apart() {
        let m = merge(vec![report("n", 1.0), report("n", 2.0)]).unwrap();
        let names: Vec<_> = m.hosts.iter().map(|h| h.origin.host.clone()).collect();
        assert_eq!(names, ["n", "n#2"]);
    }
}
