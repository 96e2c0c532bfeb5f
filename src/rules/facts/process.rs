//! Each process's facts (`process.*`): one entry per PID holding GPU memory, its rank, its own GPU and
//! GPUs and what it held on each, its parent, and what it held beside the job.

use super::{OnGpu, gpu_label};
use crate::ident::ProcRef;
use crate::report::{ProcessReport, Report};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};

facts! {
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProcFacts {
    /// its host, in a report merged from several (null otherwise)
    pub host: Option<String>,
    /// PID
    pub pid: i64,
    /// command line
    pub cmdline: String,
    /// part of the job (in a look: the watcher's own, by its uid)
    pub in_job: bool,
    /// RANK, null if it has none (or is no PyTorch process)
    pub rank: Option<i64>,
    /// LOCAL_RANK, null if it has none
    pub local_rank: Option<i64>,
    /// GPUs it held memory on
    pub gpus: i64,
    /// its own GPU: its LOCAL_RANK's device when it is a PyTorch rank, else the GPU where it held the most;
    /// null if it held memory nowhere
    pub main_gpu: Option<i64>,
    /// its peak there
    pub main_bytes: i64,
    /// sum of its peaks over GPUs
    pub peak_bytes: i64,
    /// what it held on each GPU (its peak there in a run, what it holds now in a look), its own GPU first:
    /// each {index, label (as messages name the GPU), bytes}
    pub per_gpu: Vec<OnGpu>,
    /// its own GPU is its LOCAL_RANK's device (a PyTorch rank holding memory there), not only the GPU where
    /// it held the most: whatever it holds elsewhere is not its work (stray-context)
    pub main_by_rank: bool,
    /// its own GPU as messages name it (`GPU 0`, `GPU 0 on node-a`; `an unknown GPU` if it held memory
    /// nowhere)
    pub main_label: String,
    /// its parent, null if unknown
    pub parent_pid: Option<i64>,
    /// its parent is a process of the job that holds GPU memory itself (a DataLoader worker's rank; not
    /// torchrun's launcher, which holds none)
    pub parent_holds: bool,
    /// its parent's RANK, null if it has none (a DataLoader worker inherits its rank's)
    pub parent_rank: Option<i64>,
    /// /proc has its PID: false inside a container that doesn't share the host's PID namespace, where NVML's
    /// PIDs can't be placed in or out of the job
    pub visible: bool,
    /// of the GPUs the job held memory on, the one where this process held the most; null if it held none
    /// there
    pub job_gpu: Option<i64>,
    /// that GPU as messages name it, null if none
    pub job_gpu_label: Option<String>,
    /// its peak there
    pub job_gpu_bytes: i64,
    /// what it held there at the run's start: at gpudoc's first look at the GPU's processes, a process first
    /// read within 0.1 s of it counted as there (the one definition, timeline::Timeline::at_first_look, which
    /// the OOM's window reads too); 0: it was not there yet, null if unknown
    pub job_gpu_start_bytes: Option<i64>,
    /// when its longest stretch there above half-way from that start to its peak began, null if unknown
    pub job_gpu_high_from_s: Option<f64>,
    /// how long that stretch lasted, without a break (to now, in a run still going): short for memory that
    /// came and went in a blip; null if unknown
    pub job_gpu_high_s: Option<f64>,
    /// its owner's name, in a look (null in a run, and where /proc can't tell)
    pub user: Option<String>,
    /// in a look, what `gpudoc orphans` makes of it: orphan, detached, zombie, ghost, service, live (null in
    /// a run)
    pub verdict: Option<String>,
    /// in a look, why, in one line: `process.why` in the words of rules/words/process-reason.toml, as
    /// `gpudoc orphans` says it (`its parent died: ...`; null in a run)
    pub reason: Option<String>,
    /// in a look, why, as data: a **why** record (`kind`, `left_by`, `ppid`, `parent`, `pgid`, `sid`,
    /// `comm`, `init`, `ignores_sighup`, `main_thread_exited`, `threads`: docs/orphans.md, "Why, as
    /// data"); null in a run
    pub why: Option<crate::orphans::Why>,
    /// in a look, a leftover `gpudoc orphans --kill` would end: an orphan holding GPU memory, or what a
    /// `gpudoc run` recorded it left running that holds GPU memory or a device file (false in a run, whose
    /// leftovers are run.orphans)
    pub leftover: bool,
}
}

/// RANK and LOCAL_RANK per PID, and each PID's PyTorch processes, from the framework view.
pub(super) struct Ranks<'a> {
    by_pid: HashMap<Who, (Option<i64>, Option<i64>)>,
    torch: HashMap<Who, Vec<&'a crate::torch::view::TorchProcReport>>,
}

/// A process: its host (in merged reports) and PID.
pub(super) type Who = ProcRef;

impl<'a> Ranks<'a> {
    pub(super) fn of(r: &'a Report) -> Ranks<'a> {
        let n = |v: &Option<serde_json::Value>| {
            v.as_ref()
                .and_then(|x| x.as_i64().or_else(|| x.as_str()?.parse().ok()))
        };
        let mut by_pid = HashMap::new();
        let mut torch: HashMap<Who, Vec<_>> = HashMap::new();
        for t in &r.torch.processes {
            let who = ProcRef::new(t.host.as_deref(), t.pid);
            by_pid
                .entry(who.clone())
                .or_insert((n(&t.rank), n(&t.local_rank)));
            torch.entry(who).or_default().push(t);
        }
        Ranks { by_pid, torch }
    }

    /// RANK and LOCAL_RANK of a process, where it has them.
    pub(super) fn of_pid(&self, who: &Who) -> (Option<i64>, Option<i64>) {
        self.by_pid.get(who).copied().unwrap_or_default()
    }
}

/// Processes, merged over GPUs: one entry per PID.
pub(super) fn process_facts(r: &Report, ranks: &Ranks) -> Vec<ProcFacts> {
    let mut by_pid: BTreeMap<Who, Vec<&ProcessReport>> = BTreeMap::new();
    for p in &r.processes {
        by_pid
            .entry(ProcRef::new(p.host.as_deref(), p.pid))
            .or_default()
            .push(p);
    }
    let holders: HashSet<Who> = by_pid
        .iter()
        .filter(|(_, rows)| rows.iter().any(|p| p.in_job && p.peak_bytes > 0))
        .map(|(who, _)| who.clone())
        .collect();
    let mut ps: Vec<ProcFacts> = by_pid
        .iter()
        .map(|(who, rows)| {
            let mut f = one_process(who.clone(), rows, ranks);
            parent(who, rows, ranks, &holders, &mut f);
            beside_job(r, rows, &mut f);
            f
        })
        .collect();
    if let Some(m) = &r.moment {
        judged(m, &mut ps);
    }
    ps
}

/// In a look, what `gpudoc orphans` makes of each process (`process.user`, `.verdict`, `.reason`,
/// `.leftover`). One that holds a device file and no memory has no row in the report: it is a process of
/// the look too, holding nothing.
fn judged(m: &crate::report::Moment, ps: &mut Vec<ProcFacts>) {
    let mut at: HashMap<i64, usize> = ps.iter().enumerate().map(|(i, p)| (p.pid, i)).collect();
    for h in &m.holders {
        let i = *at.entry(h.pid as i64).or_insert_with(|| {
            ps.push(ProcFacts {
                pid: h.pid as i64,
                cmdline: h.cmdline.clone(),
                in_job: h.uid == Some(m.me),
                parent_pid: h.ppid.map(i64::from),
                visible: h.uid.is_some(),
                main_label: gpu_label(None, -1),
                ..Default::default()
            });
            ps.len() - 1
        });
        let f = &mut ps[i];
        f.user = h.user.clone();
        f.verdict = Some(super::name_of(h.verdict));
        f.reason = Some(h.reason.clone());
        f.why = h.why.clone();
        f.leftover = h.is_leftover();
    }
}

/// What a process held on the GPUs the job used: the one where it held the most, what it held there at
/// the start, and its longest stretch near its peak there.
fn beside_job(r: &Report, rows: &[&ProcessReport], f: &mut ProcFacts) {
    let job_gpu = |p: &ProcessReport| {
        r.gpus
            .iter()
            .any(|g| g.index == p.gpu && g.host == p.host && g.job_peak_bytes > 0)
    };
    let best = rows
        .iter()
        .filter(|p| p.peak_bytes > 0 && job_gpu(p))
        .max_by_key(|p| p.peak_bytes);
    f.visible = rows.iter().all(|p| p.visible);
    let Some(p) = best else { return };
    f.job_gpu = Some(i64::from(p.gpu));
    f.job_gpu_label = Some(gpu_label(p.host.as_deref(), p.gpu as i64));
    f.job_gpu_bytes = p.peak_bytes as i64;
    if let (Some(start), Some(from), Some(len)) = (p.start_bytes, p.high_from_s, p.high_s) {
        f.job_gpu_start_bytes = Some(start as i64);
        f.job_gpu_high_from_s = Some(from);
        f.job_gpu_high_s = Some(len);
    }
}

/// Its parent, as the process of the job it was started by, and whether that parent holds GPU memory
/// itself and its RANK (`process.parent_holds`, `process.parent_rank`): what `worker-contexts` tells a
/// DataLoader worker that touched CUDA by (a torchrun rank's parent, the launcher, holds none).
fn parent(
    who: &Who,
    rows: &[&ProcessReport],
    ranks: &Ranks,
    holders: &HashSet<Who>,
    f: &mut ProcFacts,
) {
    let Some(parent) = rows
        .iter()
        .find_map(|p| p.ppid)
        .map(|pp| ProcRef::new(who.host.as_deref(), pp))
    else {
        return;
    };
    f.parent_holds = holders.contains(&parent);
    f.parent_rank = ranks.of_pid(&parent).0;
}

/// The facts of where a process holds memory (`held`: per GPU, its peak in a run, now in a look): its
/// GPUs, each with what it held there, and its own GPU; the index of its own GPU's entry, if any. A
/// rank's own GPU is `own`, its LOCAL_RANK's device (as PyTorch numbers it, matched to NVML's index by
/// UUID), where it holds memory; without one, the GPU where it holds the most. What counts as a stray
/// context elsewhere is `stray-context`'s to decide. `None` when it holds nothing anywhere.
pub(in crate::rules) fn place(
    held: &[(u32, u64)],
    own: Option<u32>,
    host: Option<&str>,
    f: &mut ProcFacts,
) -> Option<usize> {
    f.gpus = held.iter().filter(|h| h.1 > 0).count() as i64;
    f.peak_bytes = held.iter().map(|h| h.1 as i64).sum();
    f.main_gpu = None;
    f.main_label = gpu_label(host, -1);
    let own = own.and_then(|g| held.iter().position(|&(gpu, b)| gpu == g && b > 0));
    let main = own.or_else(|| (0..held.len()).max_by_key(|&i| held[i].1))?;
    f.main_by_rank = own.is_some();
    f.main_gpu = Some(i64::from(held[main].0));
    f.main_label = gpu_label(host, i64::from(held[main].0));
    f.main_bytes = held[main].1 as i64;
    let others = (0..held.len()).filter(|&i| i != main);
    f.per_gpu = std::iter::once(main)
        .chain(others)
        .map(|i| OnGpu {
            index: i64::from(held[i].0),
            label: gpu_label(host, i64::from(held[i].0)),
            bytes: held[i].1 as i64,
        })
        .collect();
    Some(main)
}

fn one_process(who: Who, rows: &[&ProcessReport], ranks: &Ranks) -> ProcFacts {
    let (rank, local_rank) = ranks.of_pid(&who);
    let own = ranks
        .torch
        .get(&who)
        .into_iter()
        .flatten()
        .find(|t| local_rank == Some(i64::from(t.device)))
        .and_then(|t| t.gpu);
    let held: Vec<(u32, u64)> = rows.iter().map(|p| (p.gpu, p.peak_bytes)).collect();
    let mut f = ProcFacts {
        pid: who.pid as i64,
        host: who.host.clone(),
        rank,
        local_rank,
        parent_pid: rows.iter().find_map(|p| p.ppid).map(i64::from),
        ..Default::default()
    };
    // A process's rows are never empty: it is listed because NVML saw it on a GPU.
    let main = rows[place(&held, own, who.host.as_deref(), &mut f).unwrap_or(0)];
    f.cmdline = main.cmdline.clone();
    f.in_job = main.in_job;
    f
}

#[cfg(test)]
mod tests {
    use crate::report::Report;
    use crate::rules::facts::{Facts, GIB};

    #[test]
    fn others_are_measured_on_the_gpus_the_job_used_only() {
        let mut r: Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/others/fake_arrived.report.json"
        )))
        .unwrap();
        let other = |f: &Facts| f.processes.iter().find(|p| !p.in_job).unwrap().clone();
        let f = other(&Facts::of(&r));
        assert_eq!(
            (f.job_gpu, f.job_gpu_label.as_deref()),
            (Some(0), Some("GPU 0"))
        );
        assert_eq!(
            (f.job_gpu_bytes, f.job_gpu_start_bytes),
            (20 * GIB, Some(0))
        );
        assert!(f.visible && f.job_gpu_high_s >= Some(15.0) && f.job_gpu_high_from_s >= Some(1.9));
        // On a GPU the job did not use, it is none of the job's business.
        for p in r.processes.iter_mut().filter(|p| !p.in_job) {
            p.gpu = 1;
        }
        let f = other(&Facts::of(&r));
        assert_eq!(
            (f.job_gpu, f.job_gpu_start_bytes, f.job_gpu_high_s),
            (None, None, None)
        );
        // A report from before the start was recorded: unknown, never a zero.
        for p in &mut r.processes {
            (p.gpu, p.start_bytes, p.high_from_s, p.high_s) = (0, None, None, None);
        }
        let f = other(&Facts::of(&r));
        assert_eq!((f.job_gpu, f.job_gpu_start_bytes), (Some(0), None));
    }
}
