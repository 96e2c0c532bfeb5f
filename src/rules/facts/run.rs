//! The run's facts (`run.*`): how it ended, the machine, the job's GPUs, orphans, the inference server
//! it runs.

use super::{GpuFacts, Holder, gpu_label, name_of};
use crate::report::Report;
use serde::Serialize;

facts! {
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFacts {
    /// length of the run
    pub duration_s: f64,
    /// what gpudoc run exits with (128+N for signal N), null if not recorded
    pub exit_code: Option<i64>,
    /// the signal that ended the command, 0 if none
    pub signal: i64,
    /// success, gpu_oom, host_oom_kill, signal, failure; unknown when not recorded
    pub classification: String,
    /// NVIDIA driver version, null if NVML did not give it
    pub driver: Option<String>,
    /// highest CUDA version the driver supports (13.0), null if NVML did not give it
    pub cuda_driver_version: Option<f64>,
    /// CUDA version the job's PyTorch was built for (from +cu130), null if no PyTorch process gave a CUDA
    /// build's version
    pub cuda_runtime_version: Option<f64>,
    /// GPUs on the machine
    pub gpus: i64,
    /// GPUs on which the job held memory
    pub job_gpus: i64,
    /// largest per-GPU job peak
    pub job_peak_max_bytes: i64,
    /// smallest per-GPU job peak among the GPUs the job used
    pub job_peak_min_bytes: i64,
    /// the GPU with the largest job peak, null if the job used none
    pub job_peak_max_gpu: Option<i64>,
    /// the GPU with the smallest job peak (among those used), null if the job used none
    pub job_peak_min_gpu: Option<i64>,
    /// the GPU with the largest job peak, as messages name it
    pub job_peak_max_label: String,
    /// the GPU with the smallest job peak, as messages name it
    pub job_peak_min_label: String,
    /// when that GPU's job peak was, null if the job used none
    pub job_peak_max_at_s: Option<f64>,
    /// hosts the run spans (more than 1 in a report merged from several nodes)
    pub hosts: i64,
    /// largest / smallest per-GPU job peak (1.0 with one GPU)
    pub imbalance_ratio: f64,
    /// job descendants still running after the command exited
    pub orphans: i64,
    /// GPU memory they held
    pub orphans_gpu_bytes: i64,
    /// them: each a holder (pid, host in a merged report, who: its command line; bytes: the GPU memory it
    /// held)
    pub orphan_list: Vec<Holder>,
    /// the kernel's OOM killer ended a job process
    pub host_oom: bool,
    /// the PyTorch shim reported from at least one process
    pub has_torch: bool,
    /// an inference server that preallocates its share of the GPU on purpose, recognised from the command
    /// lines of the job and its processes: vllm, sglang, tensorrt_llm, tgi; null if none
    pub server: Option<String>,
    /// that server as messages name it (`vLLM`), null if none
    pub server_label: Option<String>,
    /// the flag that sets its share (`--gpu-memory-utilization`), null if no server
    pub server_flag: Option<String>,
    /// that flag and its value as a command line gives it (`--gpu-memory-utilization 0.8`); null when none
    /// does
    pub server_setting: Option<String>,
    /// the share it takes: the value given, else its default; null where the default depends on the GPU
    /// (SGLang) or no server runs
    pub server_fraction: Option<f64>,
    /// the run is still going: the rule is judged live, on the run so far (`live = true`); false at its end
    pub live: bool,
    /// the facts are of one look at the machine by `gpudoc watch` (`look = true`), not of a run: the job is
    /// the watcher's own processes (its uid), the others other users'; gpu.peak_used_*, the job's and the
    /// others' bytes are what is held now (gpu.peak_used_at_s 0); what only a run has (a timeline, steps, an
    /// OOM, an exit, its server: run.server) is empty; the facts are the run's, of a report of that one moment
    pub look: bool,
}
}

/// `2.11.0+cu130` → 13.0; `None` when there is no CUDA tag.
pub fn cuda_of_torch(version: &str) -> Option<f64> {
    let tag = version.split("+cu").nth(1)?;
    let digits: String = tag.chars().take_while(|c| c.is_ascii_digit()).collect();
    let major = match digits.len() {
        3 => 2,
        2 => 1,
        _ => return None,
    };
    let (a, b) = digits.split_at(major);
    Some(a.parse::<f64>().ok()? + b.parse::<f64>().ok()? / 10.0)
}

/// The inference server the job runs, if a command line shows one (`serving`).
fn server_facts(r: &Report, f: &mut RunFacts) {
    let command = r.command.join(" ");
    let lines = std::iter::once(command.as_str()).chain(
        r.processes
            .iter()
            .filter(|p| p.in_job)
            .map(|p| p.cmdline.as_str()),
    );
    // A look ran no job: its server is known by the processes holding a GPU only (gpu.server).
    let Some(s) = crate::rules::serving::recognise(lines).filter(|_| r.moment.is_none()) else {
        return;
    };
    f.server = Some(s.id.into());
    f.server_label = Some(s.label.into());
    f.server_flag = Some(s.flag.into());
    f.server_setting = s.setting;
    f.server_fraction = s.fraction;
}

pub(super) fn run_facts(r: &Report, gpus: &[GpuFacts]) -> RunFacts {
    let mut f = run_basics(r, gpus);
    f.live = r.live;
    f.look = r.moment.is_some();
    server_facts(r, &mut f);
    f
}

/// The job's GPUs: how many, the largest and smallest of its per-GPU peaks, and their ratio.
pub(in crate::rules) fn job_facts(gpus: &[GpuFacts], f: &mut RunFacts) {
    let used: Vec<&GpuFacts> = gpus.iter().filter(|g| g.job_peak_bytes > 0).collect();
    let max_g = used.iter().max_by_key(|g| g.job_peak_bytes);
    let min_g = used.iter().min_by_key(|g| g.job_peak_bytes);
    f.gpus = gpus.len() as i64;
    f.job_gpus = used.len() as i64;
    f.job_peak_max_bytes = max_g.map_or(0, |g| g.job_peak_bytes);
    f.job_peak_min_bytes = min_g.map_or(0, |g| g.job_peak_bytes);
    f.job_peak_max_gpu = max_g.map(|g| g.index);
    f.job_peak_min_gpu = min_g.map(|g| g.index);
    f.job_peak_max_label = max_g.map_or_else(|| gpu_label(None, -1), |g| g.label.clone());
    f.job_peak_min_label = min_g.map_or_else(|| gpu_label(None, -1), |g| g.label.clone());
    f.job_peak_max_at_s = max_g.map(|g| g.spike_at_s);
    f.imbalance_ratio = match (max_g, min_g) {
        (Some(a), Some(b)) if b.job_peak_bytes > 0 => {
            a.job_peak_bytes as f64 / b.job_peak_bytes as f64
        }
        _ => 1.0,
    };
}

fn run_basics(r: &Report, gpus: &[GpuFacts]) -> RunFacts {
    let cuda_runtime = r
        .torch
        .processes
        .iter()
        .filter_map(|t| t.torch_version.as_deref())
        .filter_map(cuda_of_torch)
        .reduce(f64::max);
    let orphan_bytes =
        |o: &crate::report::Orphan| -> u64 { o.gpu_bytes.iter().map(|&(_, b)| b).sum() };
    let mut f = RunFacts {
        duration_s: r.duration_s,
        exit_code: r.exit.code.map(i64::from),
        signal: r.exit.signal.unwrap_or(0) as i64,
        classification: name_of(r.exit.classification),
        driver: r.nvml.driver.clone(),
        cuda_driver_version: r.nvml.cuda_driver.as_deref().and_then(|v| v.parse().ok()),
        cuda_runtime_version: cuda_runtime,
        hosts: r.hosts.len().max(1) as i64,
        orphans: r.orphans.len() as i64,
        orphans_gpu_bytes: r.orphans.iter().map(|o| orphan_bytes(o) as i64).sum(),
        orphan_list: r
            .orphans
            .iter()
            .map(|o| Holder {
                pid: i64::from(o.pid),
                host: o.host.clone(),
                who: Some(o.cmdline.clone()),
                bytes: orphan_bytes(o) as i64,
            })
            .collect(),
        host_oom: r.exit.classification == crate::oom::Ending::HostOomKill,
        has_torch: !r.torch.processes.is_empty(),
        ..Default::default()
    };
    job_facts(gpus, &mut f);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_version_from_torch_tag() {
        assert_eq!(cuda_of_torch("2.11.0+cu130"), Some(13.0));
        assert_eq!(cuda_of_torch("2.4.1+cu121"), Some(12.1));
        assert_eq!(cuda_of_torch("1.13.1+cu117"), Some(11.7));
        // A CPU or ROCm build says no CUDA: unknown, never CUDA 0.
        assert_eq!(cuda_of_torch("2.11.0"), None);
        assert_eq!(cuda_of_torch("2.11.0+cpu"), None);
    }
}
