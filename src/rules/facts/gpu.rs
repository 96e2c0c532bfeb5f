//! Each GPU's facts (`gpu.*`): its memory, the job's peak and steady level, spikes, growth, the others on
//! it.

use super::hunt::{HolderRecord, HuntRecord, SiteRecord};
use super::{Holder, gpu_label, pct, steady_level};
use crate::ident::GpuRef;
use crate::report::Report;
use serde::Serialize;
use std::collections::HashMap;

facts! {
#[derive(Debug, Clone, Default, Serialize)]
pub struct GpuFacts {
    /// its host, in a report merged from several (null otherwise)
    pub host: Option<String>,
    /// how messages name it: `GPU 0`, or `GPU 0 on node-a` in a merged report
    pub label: String,
    /// NVML's index
    pub index: i64,
    /// the GPU's name
    pub name: String,
    /// capacity
    pub total_bytes: i64,
    /// peak device memory in use (what nvidia-smi shows)
    pub peak_used_bytes: i64,
    /// that, % of capacity
    pub peak_used_pct: f64,
    /// memory in use before the job started (held by others)
    pub start_used_bytes: i64,
    /// sum of the peaks of processes outside the job (in a look: what other users' processes hold now; one
    /// whose owner can't be read, a ghost, is neither the job's nor others')
    pub others_peak_bytes: i64,
    /// those processes, the most first: each a holder (pid, who: its command line cut to 60 characters, in a
    /// look its owner; bytes: its peak)
    pub others_list: Vec<Holder>,
    /// an inference server (as run.server: vllm, sglang, tensorrt_llm, tgi) whose processes are all that hold
    /// memory on this GPU, the job's or others'; null if none, or if any other process holds memory there
    /// (it has only what the server left; in a look, the only way a server is known)
    pub server: Option<String>,
    /// peak of the job's processes' memory
    pub job_peak_bytes: i64,
    /// that, % of capacity
    pub job_peak_pct: f64,
    /// the job's memory at the end
    pub job_final_bytes: i64,
    /// this GPU's job peak / the largest job peak over GPUs
    pub job_share: f64,
    /// the job's steady level (the median) over its timeline while it held memory
    pub steady_bytes: i64,
    /// that, % of capacity
    pub steady_pct: f64,
    /// time from the job's first memory on this GPU to 90% of its peak (to the timeline's resolution)
    pub rise_s: f64,
    /// the job's memory in the last part of the run while it still held some (before its processes exited)
    pub last_held_bytes: i64,
    /// job peak − steady level
    pub spike_bytes: i64,
    /// job peak / steady level
    pub spike_ratio: f64,
    /// how long the job stayed above halfway between steady level and peak
    pub spike_duration_s: f64,
    /// when the job peaked
    pub spike_at_s: f64,
    /// when the device's memory in use peaked
    pub peak_used_at_s: f64,
    /// the GPU stopped answering during the run
    pub lost: bool,
    /// the framework view (PyTorch's, JAX's, CuPy's allocator) reported a process from this GPU
    pub torch: bool,
    /// steps whose peak the framework view saw far above the others, on this GPU (see torch.phase_count)
    pub torch_phases: i64,
    /// the framework whose allocator took its pool whole at its start on this GPU (JAX, TensorFlow), null
    /// if none
    pub framework: Option<String>,
    /// what that framework's live memory is made of, as messages name it (arrays, tensors), null if none
    pub framework_noun: Option<String>,
    /// what that framework's allocator held there at its peak (its preallocated pool; TensorFlow's, which
    /// does not say, is what NVML saw the process hold), 0 if none
    pub framework_reserved_bytes: i64,
    /// the peak of what its live arrays really used of that pool, 0 if none
    pub framework_used_peak_bytes: i64,
    /// the XLA_PYTHON_CLIENT_MEM_FRACTION that holds that peak with the headroom of
    /// param.framework_headroom_pct (rounded up to 0.05), 0 if none
    pub framework_fraction: f64,
    /// the memory limit, in MiB, that holds that peak with the same headroom (rounded up to a GiB): TensorFlow's
    /// `memory_limit`; 0 if none
    pub framework_limit_mib: i64,
    /// when the job's peak on it fell among the optimizer steps' records: before_steps, steps, after_steps (a
    /// time, not what ran then: see oom.phase); null without the framework view
    pub peak_stretch: Option<String>,
    /// seconds after the last optimizer step it came, null before the first or if unknown
    pub peak_since_last_step_s: Option<f64>,
    /// steady growth of the job's memory with no optimizer step to explain it (a run without steps, or after
    /// the last one), null if none was found: a straight rise to the program's end that never came back
    /// (docs/rules.md, Beyond the training step)
    pub growth_bytes: Option<i64>,
    /// its rate (least squares), bytes per second; null if none
    pub growth_rate_bytes_per_s: Option<f64>,
    /// how well a straight line fits it (R², 0..1); null if none
    pub growth_r2: Option<f64>,
    /// how long it lasted, to the last moment the job held memory; null if none
    pub growth_s: Option<f64>,
    /// when it started, null if none
    pub growth_from_s: Option<f64>,
    /// the last optimizer step before the stretch growth is looked for in, null in a run without steps (or
    /// without the framework view)
    pub growth_after_step: Option<i64>,
    /// the job's PyTorch processes on this GPU have not yet called their model nor stepped (the shim recorded
    /// neither): what its memory does is loading; false where they have, or without the shim
    pub loading: bool,
    /// PyTorch's live tensors on this GPU at its last reading (the exit record), summed over processes; null
    /// without one (another framework's: what its allocator had in use)
    pub growth_live_bytes: Option<i64>,
    /// whose those are: the framework's name (PyTorch, JAX, CuPy, TensorFlow, RMM), null without one
    pub growth_live_framework: Option<String>,
    /// at that rate, seconds until the GPU is full (its capacity less the driver's reserve, other processes'
    /// peaks and the level reached), null if not growing
    pub time_to_full_s: Option<f64>,
    /// the last leak hunt of a PyTorch process on this GPU that ran or failed (counted in forward calls of
    /// the outermost module in a program without steps), as torch.leak_hunt; null without one
    pub growth_hunt: Option<HuntRecord>,
    /// where the memory that stayed alive was allocated, from that hunt: sites, as torch.leak_sites
    pub growth_sites: Vec<SiteRecord>,
    /// what kept it alive, from the same hunt: holders, as torch.leak_holders
    pub growth_holders: Vec<HolderRecord>,
    /// of what that hunt found kept, the bytes behind held tensors' autograd graphs (see oom.graph_bytes), 0
    /// if none
    pub growth_graph_bytes: i64,
    /// what holds those tensors, null if none
    pub growth_graph_holder: Option<String>,
    /// in a look, what the runs in progress (`gpudoc run`) forecast of this GPU, one item a run, in the words
    /// a run says its forecasts, each with its run (`GPU 0 will be full in ~5 min at +64.00 MiB/step (gpudoc
    /// run, pid 4242, step-leak: python3 train.py)`), the soonest first; empty in a run and when none does
    pub forecast: Vec<String>,
}
}

pub(super) fn gpu_facts(r: &Report, steps: &crate::rules::when::Steps) -> Vec<GpuFacts> {
    // Per GPU: the command lines of every process holding memory there, and those outside the job.
    let mut holding: HashMap<GpuRef, Vec<&str>> = HashMap::new();
    let mut others: HashMap<GpuRef, Vec<Other>> = HashMap::new();
    let owners = r.moment.as_ref().map(owners);
    for p in r.processes.iter().filter(|p| p.peak_bytes > 0) {
        let on = GpuRef::new(p.host.as_deref(), p.gpu);
        // In a look, another user's process is named by its owner; a ghost, whose owner can't be read,
        // is nobody's.
        let who = match &owners {
            None => Some(crate::units::shorten(&p.cmdline, 60)),
            Some(o) => o.get(&p.pid).cloned().flatten(),
        };
        if let Some(who) = who.filter(|_| !p.in_job) {
            others
                .entry(on.clone())
                .or_default()
                .push((p.pid, who, p.peak_bytes));
        }
        holding.entry(on).or_default().push(&p.cmdline);
    }
    let mut gpus: Vec<GpuFacts> = r
        .gpus
        .iter()
        .map(|g| {
            let held = others.remove(&g.gpu());
            let mut f = one_gpu(r, g);
            let pre = crate::rules::framework::on_gpu(r, g);
            (f.framework, f.framework_reserved_bytes) = (pre.name, pre.reserved_bytes);
            f.framework_noun = pre.noun;
            (f.framework_used_peak_bytes, f.framework_fraction) =
                (pre.used_peak_bytes, pre.fraction);
            f.framework_limit_mib = pre.limit_mib;
            (f.others_peak_bytes, f.others_list) = others_facts(held.unwrap_or_default());
            let on = holding.remove(&g.gpu()).unwrap_or_default();
            f.server = server_among(on);
            f.forecast = forecast(r, g.index);
            when_facts(r, g, steps, &mut f);
            f
        })
        .collect();
    let max_job = gpus.iter().map(|g| g.job_peak_bytes).max().unwrap_or(0);
    for g in &mut gpus {
        g.job_share = if max_job > 0 {
            g.job_peak_bytes as f64 / max_job as f64
        } else {
            0.0
        };
    }
    gpus
}

/// In a look, what the runs in progress forecast of GPU `gpu`, in words, the soonest first (`gpu.forecast`).
fn forecast(r: &Report, gpu: u32) -> Vec<String> {
    let Some(m) = &r.moment else {
        return Vec::new();
    };
    let mut of: Vec<_> = m.forecasts.iter().filter(|f| f.gpu == gpu).collect();
    of.sort_by(|a, b| a.full_in_s.total_cmp(&b.full_in_s));
    of.iter().map(|f| f.words.clone()).collect()
}

/// In a look, each holder's owner in words (its user's name, else `uid N`; `None` for a ghost).
fn owners(m: &crate::report::Moment) -> HashMap<u32, Option<String>> {
    m.holders.iter().map(|h| (h.pid, h.owner())).collect()
}

/// The inference server (its id) holding a GPU, from the command lines of the processes holding memory
/// there: `gpu.server`. Only when the server's processes are all there is: any other process (a training
/// job, a notebook) has only what the server left it, and its next allocation can run out.
pub(in crate::rules) fn server_among<'a>(
    cmdlines: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    // Each line a server's, or none is named; among them, as `recognise` prefers: one that gives its
    // setting, else the first.
    let servers: Option<Vec<_>> = cmdlines
        .into_iter()
        .map(|l| crate::rules::serving::recognise([l]))
        .collect();
    let servers = servers.unwrap_or_default();
    servers
        .iter()
        .find(|s| s.setting.is_some())
        .or(servers.first())
        .map(|s| s.id.to_string())
}

/// A process outside the job on a GPU: its pid, who it is in words, and its memory there.
pub(in crate::rules) type Other = (u32, String, u64);

/// What the processes outside the job hold on a GPU, summed, and each, the most first
/// (`gpu.others_peak_bytes`, `gpu.others_list`).
pub(in crate::rules) fn others_facts(mut others: Vec<Other>) -> (i64, Vec<Holder>) {
    others.sort_by_key(|o| (std::cmp::Reverse(o.2), o.0));
    let list = others
        .iter()
        .map(|(pid, who, b)| Holder {
            pid: i64::from(*pid),
            who: Some(who.clone()),
            bytes: *b as i64,
            ..Holder::default()
        })
        .collect();
    (others.iter().map(|o| o.2 as i64).sum(), list)
}

fn one_gpu(r: &Report, g: &crate::report::GpuReport) -> GpuFacts {
    let total = g.total_bytes as i64;
    let held = g.job_timeline.iter().map(|&(_, v)| v as i64);
    let steady = steady_level(held.filter(|&v| v > 0));
    let peak = g.job_peak_bytes as i64;
    let half = steady + (peak - steady) / 2;
    let width = if g.job_timeline.len() > 1 {
        g.job_timeline[1].0 - g.job_timeline[0].0
    } else {
        r.duration_s
    };
    let above = g
        .job_timeline
        .iter()
        .filter(|&&(_, v)| (v as i64) > half && peak > steady)
        .count();
    let first = g
        .job_timeline
        .iter()
        .find(|&&(_, v)| v > 0)
        .map(|&(t, _)| t);
    let high = g
        .job_timeline
        .iter()
        .find(|&&(_, v)| v as f64 >= 0.9 * peak as f64 && v > 0)
        .map(|&(t, _)| t);
    GpuFacts {
        label: gpu_label(g.host.as_deref(), g.index as i64),
        host: g.host.clone(),
        index: g.index as i64,
        name: g.name.clone(),
        total_bytes: total,
        peak_used_bytes: g.peak_used_bytes as i64,
        peak_used_pct: pct(g.peak_used_bytes as i64, total),
        start_used_bytes: g.start_used_bytes as i64,
        job_peak_bytes: peak,
        job_peak_pct: pct(peak, total),
        job_final_bytes: g.job_final_bytes as i64,
        job_share: 0.0,
        steady_bytes: steady,
        steady_pct: pct(steady, total),
        last_held_bytes: g
            .job_timeline
            .iter()
            .rev()
            .map(|&(_, v)| v as i64)
            .find(|&v| v > 0)
            .unwrap_or(0),
        rise_s: first.zip(high).map_or(0.0, |(a, b)| b - a),
        spike_bytes: peak - steady,
        spike_ratio: if steady > 0 {
            peak as f64 / steady as f64
        } else {
            0.0
        },
        spike_duration_s: above as f64 * width,
        spike_at_s: g.job_peak_at_s,
        peak_used_at_s: g.peak_used_at_s,
        lost: g.lost.is_some(),
        torch: r
            .torch
            .processes
            .iter()
            .any(|t| t.gpu == Some(g.index) && t.host == g.host),
        torch_phases: 0,
        ..Default::default()
    }
}

/// Where the GPU's peak fell among the phases, and growth no step explains, with the time it leaves.
fn when_facts(
    r: &Report,
    g: &crate::report::GpuReport,
    steps: &crate::rules::when::Steps,
    f: &mut GpuFacts,
) {
    let w = crate::rules::when::gpu(steps, g, r.oom.as_ref());
    (f.peak_stretch, _, f.peak_since_last_step_s) = w.peak;
    let torch: Vec<_> = r
        .torch
        .processes
        .iter()
        .filter(|t| t.gpu == Some(g.index) && t.host == g.host)
        .collect();
    f.growth_live_bytes = match torch.is_empty() {
        true => None,
        false => Some(torch.iter().map(|t| t.final_allocated_bytes as i64).sum()),
    };
    f.growth_live_framework = torch.first().map(|t| crate::rules::framework::name(t));
    f.growth_after_step = w.growth_after_step;
    f.loading = !torch.is_empty() && torch.iter().all(|t| t.started_work_s().is_none());
    if let Some(h) = torch
        .iter()
        .flat_map(|t| &t.hunts)
        .filter(|h| h.why != "oom" && (h.error.is_some() || h.steps > 0))
        .max_by(|a, b| a.at_s.total_cmp(&b.at_s))
    {
        (f.growth_hunt, f.growth_sites, f.growth_holders) = super::hunt::of(Some(h));
        let (bytes, holder) = h.graphs();
        f.growth_graph_bytes = bytes as i64;
        f.growth_graph_holder = Some(holder.to_string()).filter(|_| bytes > 0);
    }
    let Some(gr) = w.growth else { return };
    let room =
        f.total_bytes - g.driver_reserved_bytes as i64 - f.others_peak_bytes - gr.to_bytes as i64;
    f.growth_bytes = Some(gr.bytes() as i64);
    f.growth_rate_bytes_per_s = Some(gr.rate);
    f.growth_r2 = Some(gr.r2);
    f.growth_s = Some(gr.secs());
    f.growth_from_s = Some(gr.from_s);
    f.time_to_full_s = Some(room.max(0) as f64 / gr.rate);
}
