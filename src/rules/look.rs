//! The facts of one look at the machine (`gpudoc watch`), for the rules with `look = true`: no job ran, so
//! "the job" is the watcher's own processes (its uid) and "others" are other users'; what is held now
//! stands where a run has its peaks. A holder's own GPU and stray contexts are placed by the same code as a
//! run's processes.

use super::facts::{
    Facts, GpuFacts, OomFacts, Other, ProcFacts, RunFacts, gpu_label, job_facts, name_of,
    others_facts, pct, place, server_among,
};
use crate::orphans::Holder;
use std::collections::HashMap;

/// A GPU as one look sees it.
#[derive(Debug, Clone, Copy)]
pub struct GpuNow<'a> {
    pub index: u32,
    pub name: &'a str,
    /// Device memory in use (NVML `used`).
    pub used_bytes: u64,
    pub total_bytes: u64,
}

impl Facts {
    /// The facts of a look: its GPUs, and the processes holding memory or a device as `gpudoc orphans`
    /// judges them; `me` is the watcher's uid.
    pub fn of_look(gpus: &[GpuNow], holders: &[Holder], me: u32) -> Facts {
        let processes: Vec<ProcFacts> = holders.iter().map(|h| holder(h, me)).collect();
        let mut on_gpu: HashMap<u32, OnGpu> = HashMap::new();
        for (h, p) in holders.iter().zip(&processes) {
            for &(gpu, bytes) in h.gpu_bytes.iter().filter(|g| g.1 > 0) {
                let OnGpu {
                    job,
                    others,
                    cmdlines,
                } = on_gpu.entry(gpu).or_default();
                cmdlines.push(&h.cmdline);
                if p.in_job {
                    *job += bytes as i64;
                } else if let Some(uid) = h.uid {
                    let who = h.user.clone().unwrap_or_else(|| format!("uid {uid}"));
                    others.push((h.pid, who, bytes));
                }
            }
        }
        let mut gpus: Vec<GpuFacts> = gpus
            .iter()
            .map(|g| gpu(g, on_gpu.remove(&g.index).unwrap_or_default()))
            .collect();
        let max_job = gpus.iter().map(|g| g.job_peak_bytes).max().unwrap_or(0);
        for g in gpus.iter_mut().filter(|_| max_job > 0) {
            g.job_share = g.job_peak_bytes as f64 / max_job as f64;
        }
        let mut run = RunFacts {
            look: true,
            classification: "unknown".into(),
            hosts: 1,
            ..Default::default()
        };
        job_facts(&gpus, &mut run);
        Facts {
            run,
            oom: OomFacts::absent(),
            gpus,
            processes,
            torch_processes: Vec::new(),
        }
    }
}

/// What holds memory on a GPU now: the watcher's processes' bytes, other users' processes, and the
/// command lines of all.
#[derive(Default)]
struct OnGpu<'a> {
    job: i64,
    others: Vec<Other>,
    cmdlines: Vec<&'a str>,
}

/// A GPU now: in use, the watcher's processes' memory and other users', the server among them.
fn gpu(g: &GpuNow, on: OnGpu) -> GpuFacts {
    let pct = |b: i64| pct(b, g.total_bytes as i64);
    let (others_peak_bytes, others_list) = others_facts(on.others);
    let job = on.job;
    GpuFacts {
        server: server_among(on.cmdlines),
        label: gpu_label("", g.index as i64),
        index: g.index as i64,
        name: g.name.to_string(),
        total_bytes: g.total_bytes as i64,
        peak_used_bytes: g.used_bytes as i64,
        peak_used_pct: pct(g.used_bytes as i64),
        others_peak_bytes,
        others_list,
        job_peak_bytes: job,
        job_peak_pct: pct(job),
        job_final_bytes: job,
        last_held_bytes: job,
        peak_since_last_step_s: -1.0,
        growth_from_s: -1.0,
        growth_after_step: -1,
        growth_live_bytes: -1,
        time_to_full_s: -1.0,
        ..Default::default()
    }
}

/// A holder as a process of the look: whose, where it works and strays, and its verdict.
fn holder(h: &Holder, me: u32) -> ProcFacts {
    let mut f = ProcFacts {
        pid: h.pid as i64,
        cmdline: h.cmdline.clone(),
        in_job: h.uid == Some(me),
        parent_pid: h.ppid.map(i64::from),
        // Its owner is read from /proc: a ghost, which /proc does not have, has none.
        visible: h.uid.is_some(),
        user: h.user.clone().unwrap_or_default(),
        verdict: name_of(h.verdict),
        reason: h.reason.clone(),
        leftover: h.is_leftover(),
        ..Default::default()
    };
    place(&h.gpu_bytes, None, &mut f);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::orphans::Verdict;

    const GIB: u64 = 1 << 30;

    fn holder(pid: u32, uid: Option<u32>, gpu_bytes: Vec<(u32, u64)>) -> Holder {
        Holder {
            pid,
            verdict: if uid.is_some() {
                Verdict::Live
            } else {
                Verdict::Ghost
            },
            reason: String::new(),
            gpu_bytes,
            devices: vec![],
            ppid: None,
            parent_cmd: None,
            pgid: None,
            sid: None,
            tty: None,
            uid,
            user: uid.filter(|&u| u != 3000).map(|u| format!("u{u}")),
            state: None,
            start_ticks: None,
            age_s: None,
            cmdline: format!("job{pid}"),
            left_by: None,
        }
    }

    #[test]
    fn the_job_is_the_watchers_the_others_other_users_and_a_ghost_neither() {
        let gpus = [0, 1].map(|index| GpuNow {
            index,
            name: "NVIDIA H200",
            used_bytes: 30 * GIB,
            total_bytes: 100 * GIB,
        });
        let holders = [
            holder(1, Some(1000), vec![(0, 10 * GIB), (1, 5 * GIB)]),
            holder(2, Some(2000), vec![(0, GIB)]),
            holder(3, Some(3000), vec![(0, 4 * GIB)]),
            holder(4, None, vec![(0, 8 * GIB)]),
        ];
        let f = Facts::of_look(&gpus, &holders, 1000);
        assert!(f.run.look && !f.run.live);
        let g = &f.gpus[0];
        assert_eq!(
            (g.peak_used_bytes, g.peak_used_pct),
            (30 * GIB as i64, 30.0)
        );
        assert_eq!(g.job_peak_bytes, 10 * GIB as i64);
        // Other users' memory, the most first; a user without a name by uid; the ghost's is nobody's.
        assert_eq!(g.others_peak_bytes, 5 * GIB as i64);
        assert_eq!(
            g.others_list,
            "pid 3 (uid 3000) 4.00 GiB; pid 2 (u2000) 1.00 GiB"
        );
        assert_eq!((f.gpus[1].job_share, f.run.job_gpus), (0.5, 2));
        let p = &f.processes[0];
        assert!(p.in_job && p.visible && !p.leftover);
        assert_eq!((p.main_gpu, p.stray_gpus.as_slice()), (Some(0), &[][..]));
        assert_eq!((p.verdict.as_str(), p.user.as_str()), ("live", "u1000"));
        assert!(!f.processes[3].visible && !f.processes[3].in_job);
    }
}
