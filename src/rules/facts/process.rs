//! Each process's facts (`process.*`): one entry per PID holding GPU memory, its rank, its own GPU and
//! stray contexts, whether it is a helper, and what it held beside the job.

use super::gpu_label;
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
    /// other GPUs it held memory on (for a process without a rank: only where it held no more than a CUDA
    /// context's worth, 2 GiB or a tenth of its main GPU's)
    pub stray_gpus: Vec<i64>,
    /// what it held on them
    pub stray_bytes: i64,
    /// its parent, null if unknown
    pub parent_pid: Option<i64>,
    /// a process that holds a CUDA context it should not: in the job, a child of a process of the job that
    /// itself holds GPU memory, not a rank of its own (no RANK from the shim, or its parent's) and holding no
    /// more than 1 GiB on any GPU (a context is ~500 MiB on an H200): a DataLoader worker or another helper
    /// that touched CUDA
    pub helper: bool,
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
    /// came and went in a blip; 0 if unknown
    pub job_gpu_high_s: f64,
    /// its owner's name, in a look (null in a run, and where /proc can't tell)
    pub user: Option<String>,
    /// in a look, what `gpudoc orphans` makes of it: orphan, detached, zombie, ghost, service, live (null in
    /// a run)
    pub verdict: Option<String>,
    /// in a look, why, in one line (`its parent died`; null in a run)
    pub reason: Option<String>,
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
            f.helper = helper(who, rows, ranks, &holders);
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
                ..Default::default()
            });
            ps.len() - 1
        });
        let f = &mut ps[i];
        f.user = h.user.clone();
        f.verdict = Some(super::name_of(h.verdict));
        f.reason = Some(h.reason.clone());
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
        f.job_gpu_high_s = len;
    }
}

/// Most a helper holds on a GPU (the table of parameters says why).
const HELPER_MAX: u64 = crate::params::HELPER_MAX.uint();

/// Whether `who` is a helper holding a CUDA context it should not: a child of a process of the job that
/// holds GPU memory itself (a torchrun rank's parent, the launcher, holds none), not a rank of its own
/// (DataLoader workers inherit their rank's RANK), holding no more than a context's worth on any GPU.
fn helper(who: &Who, rows: &[&ProcessReport], ranks: &Ranks, holders: &HashSet<Who>) -> bool {
    let Some(parent) = rows
        .iter()
        .find_map(|p| p.ppid)
        .map(|pp| ProcRef::new(who.host.as_deref(), pp))
    else {
        return false;
    };
    let rank = ranks.of_pid(who).0;
    holders.contains(&parent)
        && (rank.is_none() || rank == ranks.of_pid(&parent).0)
        && rows.iter().all(|p| p.in_job && p.peak_bytes <= HELPER_MAX)
}

/// The most a process without a rank may hold on a GPU not its own for it to count as a stray context (the
/// table of parameters says why).
const CONTEXT_MAX: u64 = crate::params::STRAY_CONTEXT_MAX.uint();
/// Or that share of its own GPU's, percent.
const CONTEXT_MAX_PCT: u64 = crate::params::STRAY_CONTEXT_MAX_PCT.uint();

/// The facts of where a process holds memory (`held`: per GPU, its peak in a run, now in a look): its
/// GPUs, its own GPU and the stray ones; the index of its own GPU's entry, if any. One definition of a
/// stray context, for a run's processes and a look's (`gpudoc watch`). A rank's own GPU is `own`, its
/// LOCAL_RANK's device (as PyTorch numbers it, matched to NVML's index by UUID), where it holds memory;
/// anything it holds elsewhere is stray, whatever its size. Without one, the GPU where it holds the most
/// is its own, and only context-sized footprints elsewhere (`stray_context_max_bytes`, or
/// `stray_context_max_pct` of its own GPU's) count as
/// stray. `None` when it holds nothing anywhere.
pub(in crate::rules) fn place(
    held: &[(u32, u64)],
    own: Option<u32>,
    f: &mut ProcFacts,
) -> Option<usize> {
    f.gpus = held.iter().filter(|h| h.1 > 0).count() as i64;
    f.peak_bytes = held.iter().map(|h| h.1 as i64).sum();
    f.main_gpu = None;
    let own = own.and_then(|g| held.iter().position(|&(gpu, b)| gpu == g && b > 0));
    let main = own.or_else(|| (0..held.len()).max_by_key(|&i| held[i].1))?;
    let limit = match own {
        Some(_) => u64::MAX,
        None => CONTEXT_MAX.max((held[main].1 as u128 * CONTEXT_MAX_PCT as u128 / 100) as u64),
    };
    let stray = held
        .iter()
        .filter(|&&(gpu, b)| gpu != held[main].0 && b > 0 && b <= limit);
    f.main_gpu = Some(i64::from(held[main].0));
    f.main_bytes = held[main].1 as i64;
    f.stray_gpus = stray.clone().map(|&(gpu, _)| gpu as i64).collect();
    f.stray_bytes = stray.map(|&(_, b)| b as i64).sum();
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
        host: who.host,
        rank,
        local_rank,
        parent_pid: rows.iter().find_map(|p| p.ppid).map(i64::from),
        ..Default::default()
    };
    // A process's rows are never empty: it is listed because NVML saw it on a GPU.
    let main = rows[place(&held, own, &mut f).unwrap_or(0)];
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
        assert!(f.visible && f.job_gpu_high_s >= 15.0 && f.job_gpu_high_from_s >= Some(1.9));
        // On a GPU the job did not use, it is none of the job's business.
        for p in r.processes.iter_mut().filter(|p| !p.in_job) {
            p.gpu = 1;
        }
        let f = other(&Facts::of(&r));
        assert_eq!(
            (f.job_gpu, f.job_gpu_start_bytes, f.job_gpu_high_s),
            (None, None, 0.0)
        );
        // A report from before the start was recorded: unknown, never a zero.
        for p in &mut r.processes {
            (p.gpu, p.start_bytes, p.high_from_s, p.high_s) = (0, None, None, None);
        }
        let f = other(&Facts::of(&r));
        assert_eq!((f.job_gpu, f.job_gpu_start_bytes), (Some(0), None));
    }
}
