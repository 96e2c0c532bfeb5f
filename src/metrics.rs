//! What gpudoc exposes to Prometheus: a [`View`] of GPUs, processes, the framework view, OOMs and
//! diagnoses, rendered in the Prometheus text exposition format (0.0.4) or OpenMetrics 1.0, whichever the
//! scraper asks for. Names follow Prometheus conventions (base units, `_bytes`, `_total` for counters);
//! docs/metrics.md gives each metric and its dcgm-exporter counterpart. Pure: `serve` is the server.

use crate::report::Report;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Everything one scrape shows.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub host: String,
    /// `--name`: the job's name, a label on every sample.
    pub job: Option<String>,
    /// The job's id ([`crate::origin::Origin::job_id`]), the same on each of its nodes: a label on every
    /// sample (run only), so a query can take all the ranks of one job together.
    pub job_id: Option<String>,
    pub gpus: Vec<GpuView>,
    pub procs: Vec<ProcView>,
    pub torch: Vec<TorchView>,
    /// OOM reports read from the job's output (run only).
    pub oom_reports: Option<u64>,
    /// Diagnoses that hold now: (rule, severity, subject).
    pub active: Vec<(String, String, String)>,
    /// Diagnoses seen since the start, per (rule, severity).
    pub seen: BTreeMap<(String, String), u64>,
    /// Diagnoses told during the run: (rule, severity, subject) and when, seconds into the run.
    pub known: Vec<(String, String, String, f64)>,
    /// Per GPU, the soonest it will be full, seconds from now (run only).
    pub full_in: BTreeMap<u32, f64>,
    pub device_samples: u64,
    pub process_samples: u64,
    pub gpus_lost: u64,
}

#[derive(Debug, Clone, Default)]
pub struct GpuView {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub used: u64,
    pub total: u64,
    /// The job's memory (run only).
    pub job: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub struct ProcView {
    pub pid: u32,
    pub gpu: u32,
    pub bytes: u64,
    pub in_job: Option<bool>,
    pub rank: Option<i64>,
    pub local_rank: Option<i64>,
    /// `gpudoc watch`: the verdict on it (`live`, `orphan`, `detached`, `zombie`, `ghost`, `service`).
    pub verdict: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct TorchView {
    pub pid: u32,
    /// NVML's index, or torch's device index when unmatched.
    pub gpu: u32,
    pub rank: Option<i64>,
    pub local_rank: Option<i64>,
    /// Whose allocator (`torch`, `jax`, `cupy`, `tensorflow`, `rmm`): the `framework` label.
    pub framework: &'static str,
    pub allocated: u64,
    /// Absent where the framework does not say (TensorFlow).
    pub reserved: Option<u64>,
    /// Peaks over the last recorded step(s).
    pub step_peak_allocated: Option<u64>,
    pub step_peak_reserved: Option<u64>,
    pub steps: u64,
    /// PyTorch's counters (absent for other frameworks: no series is exported for them).
    pub alloc_retries: Option<u64>,
    pub ooms: Option<u64>,
}

/// A metric family gpudoc exports: its name, type and help text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    /// `gauge` or `counter`.
    pub kind: &'static str,
    pub help: &'static str,
}

pub const GPU_MEMORY_USED: Metric = Metric {
    name: "gpudoc_gpu_memory_used_bytes",
    kind: "gauge",
    help: "Device memory in use, as nvidia-smi shows it (NVML v2 used).",
};
pub const GPU_MEMORY_TOTAL: Metric = Metric {
    name: "gpudoc_gpu_memory_total_bytes",
    kind: "gauge",
    help: "Device memory in all.",
};
pub const JOB_MEMORY: Metric = Metric {
    name: "gpudoc_job_memory_bytes",
    kind: "gauge",
    help: "GPU memory of the job's processes, summed per GPU.",
};
pub const PROCESS_MEMORY: Metric = Metric {
    name: "gpudoc_process_memory_bytes",
    kind: "gauge",
    help: "GPU memory a process holds on a GPU (NVML).",
};
pub const TORCH_ALLOCATED: Metric = Metric {
    name: "gpudoc_torch_allocated_bytes",
    kind: "gauge",
    help: "The framework's live tensors or arrays (PyTorch's memory_allocated; JAX, CuPy, TensorFlow, RMM: what their allocator has in use), by its framework label.",
};
pub const TORCH_RESERVED: Metric = Metric {
    name: "gpudoc_torch_reserved_bytes",
    kind: "gauge",
    help: "The framework's allocator in all (PyTorch's memory_reserved; JAX's, CuPy's, RMM's pool; none for TensorFlow, which does not say).",
};
pub const TORCH_STEP_PEAK_ALLOCATED: Metric = Metric {
    name: "gpudoc_torch_step_peak_allocated_bytes",
    kind: "gauge",
    help: "Peak of live tensors over the last recorded step(s) (optimizer steps; JAX's jitted calls, Keras batches; CuPy's and RMM's readings).",
};
pub const TORCH_STEP_PEAK_RESERVED: Metric = Metric {
    name: "gpudoc_torch_step_peak_reserved_bytes",
    kind: "gauge",
    help: "Peak reserved memory over the last recorded optimizer step(s).",
};
pub const TORCH_STEPS: Metric = Metric {
    name: "gpudoc_torch_steps_total",
    kind: "counter",
    help: "Steps seen (optimizer steps; JAX's jitted calls, Keras batches).",
};
pub const TORCH_ALLOC_RETRIES: Metric = Metric {
    name: "gpudoc_torch_alloc_retries_total",
    kind: "counter",
    help: "Times the allocator freed its cache and retried a failed cudaMalloc.",
};
pub const TORCH_OOMS: Metric = Metric {
    name: "gpudoc_torch_ooms_total",
    kind: "counter",
    help: "Out-of-memory errors the allocator raised.",
};
pub const OOM_REPORTS: Metric = Metric {
    name: "gpudoc_oom_reports_total",
    kind: "counter",
    help: "Out-of-memory reports read from the job's output.",
};
pub const DIAGNOSES: Metric = Metric {
    name: "gpudoc_diagnoses_total",
    kind: "counter",
    help: "Diagnoses that began to hold, by rule and severity.",
};
pub const DIAGNOSIS_ACTIVE: Metric = Metric {
    name: "gpudoc_diagnosis_active",
    kind: "gauge",
    help: "A diagnosis that holds now (1), by rule, severity and what it is about.",
};
pub const DIAGNOSIS_KNOWN: Metric = Metric {
    name: "gpudoc_diagnosis_known_seconds",
    kind: "gauge",
    help: "When a diagnosis told during the run was first known, seconds into the run.",
};
pub const FORECAST_FULL: Metric = Metric {
    name: "gpudoc_forecast_full_seconds",
    kind: "gauge",
    help: "Seconds until the GPU is full at the rate a diagnosis told during the run gives (the soonest).",
};
pub const SAMPLES: Metric = Metric {
    name: "gpudoc_samples_total",
    kind: "counter",
    help: "NVML samples taken, by kind (device memory, process lists).",
};
pub const GPUS_LOST: Metric = Metric {
    name: "gpudoc_gpus_lost",
    kind: "gauge",
    help: "GPUs that stopped answering NVML.",
};

/// Every family gpudoc exports, under `run` or `watch` (some only under one, or only when there is
/// something to show): the list docs/metrics.md, the shipped dashboard and the alert rules are checked
/// against.
pub const ALL: [Metric; 18] = [
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    JOB_MEMORY,
    PROCESS_MEMORY,
    TORCH_ALLOCATED,
    TORCH_RESERVED,
    TORCH_STEP_PEAK_ALLOCATED,
    TORCH_STEP_PEAK_RESERVED,
    TORCH_STEPS,
    TORCH_ALLOC_RETRIES,
    TORCH_OOMS,
    OOM_REPORTS,
    DIAGNOSES,
    DIAGNOSIS_ACTIVE,
    DIAGNOSIS_KNOWN,
    FORECAST_FULL,
    SAMPLES,
    GPUS_LOST,
];

/// The exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

impl Format {
    /// The format a scraper's `Accept` header asks for.
    pub fn negotiate(accept: &str) -> Format {
        if accept.contains("application/openmetrics-text") {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

fn rank_of(v: &Option<serde_json::Value>) -> Option<i64> {
    v.as_ref()
        .and_then(|x| x.as_i64().or_else(|| x.as_str()?.parse().ok()))
}

impl View {
    /// The view of a report built from a run so far (or finished): current values are the last sampled.
    pub fn of_report(r: &Report, host: &str, job: Option<&str>) -> View {
        let ranks: BTreeMap<u32, (Option<i64>, Option<i64>)> = r
            .torch
            .processes
            .iter()
            .map(|t| (t.pid, (rank_of(&t.rank), rank_of(&t.local_rank))))
            .collect();
        View {
            host: host.to_string(),
            job: job.map(str::to_string),
            job_id: r.origin.job_id(),
            gpus: r
                .gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    name: g.name.clone(),
                    uuid: g.uuid.clone(),
                    used: g.final_used_bytes,
                    total: g.total_bytes,
                    job: Some(g.job_final_bytes),
                })
                .collect(),
            procs: r
                .processes
                .iter()
                .filter(|p| p.final_bytes > 0)
                .map(|p| {
                    let (rank, local_rank) = ranks.get(&p.pid).copied().unwrap_or_default();
                    ProcView {
                        pid: p.pid,
                        gpu: p.gpu,
                        bytes: p.final_bytes,
                        in_job: Some(p.in_job),
                        rank,
                        local_rank,
                        verdict: None,
                    }
                })
                .collect(),
            torch: r
                .torch
                .processes
                .iter()
                .map(|t| TorchView {
                    pid: t.pid,
                    gpu: t.gpu.unwrap_or(t.device),
                    rank: rank_of(&t.rank),
                    local_rank: rank_of(&t.local_rank),
                    framework: t.framework.id(),
                    allocated: t.final_allocated_bytes,
                    reserved: t.final_reserved_bytes,
                    step_peak_allocated: t.steps.last().map(|s| s.peak_allocated_bytes),
                    step_peak_reserved: t.steps.last().and_then(|s| s.peak_reserved_bytes),
                    steps: t.steps_total,
                    alloc_retries: t.alloc_retries,
                    ooms: t.ooms,
                })
                .collect(),
            oom_reports: Some(r.oom.as_ref().map_or(0, |o| o.reports)),
            active: r
                .diagnoses
                .iter()
                .map(|d| (d.rule.clone(), d.severity.name().into(), d.subject.clone()))
                .collect(),
            seen: BTreeMap::new(),
            // A part told live stays known once another diagnosis tells its story.
            known: r
                .diagnoses
                .iter()
                .flat_map(|d| {
                    let parts = d
                        .parts
                        .iter()
                        .map(|p| (&p.rule, p.severity, &p.subject, p.known_at_s));
                    std::iter::once((&d.rule, d.severity, &d.subject, d.known_at_s)).chain(parts)
                })
                .filter_map(|(rule, severity, subject, at)| {
                    Some((rule.clone(), severity.name().into(), subject.clone(), at?))
                })
                .collect(),
            full_in: full_in(r),
            device_samples: r.sampling.device_samples,
            process_samples: r.sampling.process_samples,
            gpus_lost: r.gpus.iter().filter(|g| g.lost.is_some()).count() as u64,
        }
    }

    /// Counts the diagnoses that began to hold, this scrape's included, into `episodes`; `seen` becomes
    /// their count per (rule, severity).
    pub fn count_new(&mut self, episodes: &mut Episodes) {
        episodes.look(&self.active);
        self.seen = episodes.counts();
    }
}

/// What `gpudoc_diagnoses_total` counts, for `run` and `watch` alike: a diagnosis each time it begins to
/// hold for its subject (it holds at this look or scrape and did not at the last one), so what is kept is
/// only what holds now (a set of every subject ever seen would grow with every new PID of a node agent's
/// days). A run's diagnoses told live stay in its report, so each counts once unless it stops and
/// begins to hold again.
#[derive(Debug, Default)]
pub struct Episodes {
    holding: std::collections::BTreeSet<(String, String)>,
    counts: BTreeMap<(String, String), u64>,
}

impl Episodes {
    /// One look's active diagnoses (rule, severity, subject).
    pub fn look(&mut self, active: &[(String, String, String)]) {
        let mut now = std::collections::BTreeSet::new();
        for (rule, severity, subject) in active {
            let key = (rule.clone(), subject.clone());
            if !self.holding.contains(&key) {
                *self
                    .counts
                    .entry((rule.clone(), severity.clone()))
                    .or_default() += 1;
            }
            now.insert(key);
        }
        self.holding = now;
    }

    /// Per (rule, severity), the diagnoses that began to hold: a [`View`]'s `seen`.
    pub fn counts(&self) -> BTreeMap<(String, String), u64> {
        self.counts.clone()
    }
}

/// Per GPU, the soonest any forecast of `r` has it full, from the report's end (now, for a report of
/// the run so far).
fn full_in(r: &Report) -> BTreeMap<u32, f64> {
    let mut out: BTreeMap<u32, f64> = BTreeMap::new();
    for f in &r.forecasts {
        let left = (f.last.full_at_s - r.duration_s).max(0.0);
        let soonest = out.entry(f.gpu).or_insert(left);
        *soonest = soonest.min(left);
    }
    out
}

/// One metric family being written.
struct Family<'a> {
    out: &'a mut String,
    format: Format,
    common: Vec<(&'static str, String)>,
}

impl Family<'_> {
    fn head(&mut self, m: &Metric) {
        // OpenMetrics names a counter's family without its `_total`.
        let family = match (self.format, m.kind) {
            (Format::OpenMetrics, "counter") => m.name.trim_end_matches("_total"),
            _ => m.name,
        };
        let _ = writeln!(self.out, "# HELP {family} {}", m.help);
        let _ = writeln!(self.out, "# TYPE {family} {}", m.kind);
    }

    fn sample(&mut self, m: &Metric, labels: &[(&str, String)], value: f64) {
        let mut all: Vec<(&str, &str)> =
            self.common.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend(labels.iter().map(|(k, v)| (*k, v.as_str())));
        let body: Vec<String> = all
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        let _ = writeln!(
            self.out,
            "{}{{{}}} {}",
            m.name,
            body.join(","),
            number(value)
        );
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn opt(v: Option<i64>) -> String {
    v.map(|x| x.to_string()).unwrap_or_default()
}

/// The exposition of `v` in `format`.
pub fn render(v: &View, format: Format) -> String {
    let mut out = String::new();
    let mut common = vec![("host", v.host.clone())];
    if let Some(j) = &v.job {
        common.push(("job_name", j.clone()));
    }
    if let Some(id) = &v.job_id {
        common.push(("job_id", id.clone()));
    }
    let mut f = Family {
        out: &mut out,
        format,
        common,
    };
    let gpu = |g: &GpuView| {
        vec![
            ("gpu", g.index.to_string()),
            ("uuid", g.uuid.clone()),
            ("name", g.name.clone()),
        ]
    };
    f.head(&GPU_MEMORY_USED);
    for g in &v.gpus {
        f.sample(&GPU_MEMORY_USED, &gpu(g), g.used as f64);
    }
    f.head(&GPU_MEMORY_TOTAL);
    for g in &v.gpus {
        f.sample(&GPU_MEMORY_TOTAL, &gpu(g), g.total as f64);
    }
    if v.gpus.iter().any(|g| g.job.is_some()) {
        f.head(&JOB_MEMORY);
        for g in &v.gpus {
            if let Some(j) = g.job {
                f.sample(&JOB_MEMORY, &gpu(g), j as f64);
            }
        }
    }
    render_procs(&mut f, v);
    render_torch(&mut f, v);
    render_health(&mut f, v);
    if format == Format::OpenMetrics {
        out.push_str("# EOF\n");
    }
    out
}

fn render_procs(f: &mut Family, v: &View) {
    f.head(&PROCESS_MEMORY);
    for p in &v.procs {
        let mut l = vec![
            ("gpu", p.gpu.to_string()),
            ("pid", p.pid.to_string()),
            ("rank", opt(p.rank)),
            ("local_rank", opt(p.local_rank)),
        ];
        if let Some(j) = p.in_job {
            l.push(("in_job", j.to_string()));
        }
        if let Some(verdict) = &p.verdict {
            l.push(("verdict", verdict.clone()));
        }
        f.sample(&PROCESS_MEMORY, &l, p.bytes as f64);
    }
}

fn render_torch(f: &mut Family, v: &View) {
    let label = |t: &TorchView| {
        vec![
            ("gpu", t.gpu.to_string()),
            ("pid", t.pid.to_string()),
            ("rank", opt(t.rank)),
            ("local_rank", opt(t.local_rank)),
            ("framework", t.framework.to_string()),
        ]
    };
    type Get = fn(&TorchView) -> Option<f64>;
    let families: [(Metric, Get); 7] = [
        (TORCH_ALLOCATED, |t| Some(t.allocated as f64)),
        (TORCH_RESERVED, |t| t.reserved.map(|x| x as f64)),
        (TORCH_STEP_PEAK_ALLOCATED, |t| {
            t.step_peak_allocated.map(|x| x as f64)
        }),
        (TORCH_STEP_PEAK_RESERVED, |t| {
            t.step_peak_reserved.map(|x| x as f64)
        }),
        (TORCH_STEPS, |t| Some(t.steps as f64)),
        (TORCH_ALLOC_RETRIES, |t| t.alloc_retries.map(|x| x as f64)),
        (TORCH_OOMS, |t| t.ooms.map(|x| x as f64)),
    ];
    for (m, get) in families {
        f.head(&m);
        for t in &v.torch {
            if let Some(x) = get(t) {
                f.sample(&m, &label(t), x);
            }
        }
    }
}

fn render_health(f: &mut Family, v: &View) {
    if let Some(n) = v.oom_reports {
        f.head(&OOM_REPORTS);
        f.sample(&OOM_REPORTS, &[], n as f64);
    }
    f.head(&DIAGNOSES);
    for ((rule, severity), n) in &v.seen {
        let l = [("rule", rule.clone()), ("severity", severity.clone())];
        f.sample(&DIAGNOSES, &l, *n as f64);
    }
    f.head(&DIAGNOSIS_ACTIVE);
    for (rule, severity, subject) in &v.active {
        let l = [
            ("rule", rule.clone()),
            ("severity", severity.clone()),
            ("subject", subject.clone()),
        ];
        f.sample(&DIAGNOSIS_ACTIVE, &l, 1.0);
    }
    render_live(f, v);
    f.head(&SAMPLES);
    f.sample(
        &SAMPLES,
        &[("kind", "device".into())],
        v.device_samples as f64,
    );
    f.sample(
        &SAMPLES,
        &[("kind", "process".into())],
        v.process_samples as f64,
    );
    f.head(&GPUS_LOST);
    f.sample(&GPUS_LOST, &[], v.gpus_lost as f64);
}

/// What the live verdicts told: each diagnosis' moment, each GPU's forecast.
fn render_live(f: &mut Family, v: &View) {
    f.head(&DIAGNOSIS_KNOWN);
    for (rule, severity, subject, at) in &v.known {
        let l = [
            ("rule", rule.clone()),
            ("severity", severity.clone()),
            ("subject", subject.clone()),
        ];
        f.sample(&DIAGNOSIS_KNOWN, &l, *at);
    }
    f.head(&FORECAST_FULL);
    for (gpu, left) in &v.full_in {
        f.sample(&FORECAST_FULL, &[("gpu", gpu.to_string())], left.round());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watchers_count_is_of_diagnoses_beginning_to_hold_and_keeps_only_what_holds_now() {
        let d = |rule: &str, pid: u32| (rule.to_string(), "warn".to_string(), format!("pid {pid}"));
        let mut e = Episodes::default();
        e.look(&[d("leftover-holder", 1)]);
        e.look(&[d("leftover-holder", 1)]);
        let count = |e: &Episodes| e.counts()[&("leftover-holder".into(), "warn".into())];
        assert_eq!(count(&e), 1, "counted once while it holds");
        e.look(&[]);
        e.look(&[d("leftover-holder", 1)]);
        assert_eq!(count(&e), 2, "and again when it begins to hold again");
        // Days of churn: ten thousand processes, each held once; what is kept is what holds now.
        for pid in 2..10_002 {
            e.look(&[d("leftover-holder", pid)]);
        }
        assert_eq!(count(&e), 10_002);
        assert_eq!(e.holding.len(), 1);
    }

    fn view() -> View {
        View {
            host: "node-1".into(),
            job: Some("llama \"7b\"".into()),
            gpus: vec![GpuView {
                index: 0,
                name: "NVIDIA H200".into(),
                uuid: "GPU-1".into(),
                used: 3 << 30,
                total: 150754820096,
                job: Some(2 << 30),
            }],
            procs: vec![ProcView {
                pid: 42,
                gpu: 0,
                bytes: 2 << 30,
                in_job: Some(true),
                rank: Some(0),
                local_rank: Some(0),
                verdict: None,
            }],
            oom_reports: Some(0),
            active: vec![("near-capacity".into(), "warn".into(), "GPU 0".into())],
            seen: [(("near-capacity".to_string(), "warn".to_string()), 1)].into(),
            device_samples: 10,
            ..Default::default()
        }
    }

    #[test]
    fn prometheus_text() {
        let t = render(&view(), Format::Prometheus);
        assert!(t.contains("# TYPE gpudoc_gpu_memory_used_bytes gauge\n"));
        assert!(t.contains(
            "gpudoc_gpu_memory_used_bytes{host=\"node-1\",job_name=\"llama \\\"7b\\\"\",gpu=\"0\",uuid=\"GPU-1\",name=\"NVIDIA H200\"} 3221225472\n"
        ));
        assert!(t.contains("# TYPE gpudoc_diagnoses_total counter\n"));
        assert!(t.contains("rule=\"near-capacity\",severity=\"warn\"} 1\n"));
        assert!(!t.contains("# EOF"));
    }

    #[test]
    fn the_framework_view_says_whose_allocator_and_leaves_out_what_it_cannot_tell() {
        let mut v = view();
        v.torch = vec![
            TorchView {
                pid: 7,
                framework: "torch",
                allocated: 1,
                reserved: Some(2),
                ..Default::default()
            },
            TorchView {
                pid: 8,
                framework: "tensorflow",
                allocated: 3,
                reserved: None,
                ..Default::default()
            },
        ];
        let t = render(&v, Format::Prometheus);
        let sample = |name: &str, pid: u32| {
            t.lines()
                .find(|l| {
                    l.starts_with(&format!("{name}{{")) && l.contains(&format!("pid=\"{pid}\""))
                })
                .map(String::from)
        };
        let tf = sample("gpudoc_torch_allocated_bytes", 8).unwrap();
        assert!(
            tf.contains("framework=\"tensorflow\"") && tf.ends_with(" 3"),
            "{tf}"
        );
        let pt = sample("gpudoc_torch_reserved_bytes", 7).unwrap();
        assert!(
            pt.contains("framework=\"torch\"") && pt.ends_with(" 2"),
            "{pt}"
        );
        // TensorFlow does not say what its allocator holds: no series, not 0.
        assert_eq!(sample("gpudoc_torch_reserved_bytes", 8), None, "{t}");
    }

    #[test]
    fn all_names_every_family_a_full_view_shows() {
        let mut v = view();
        v.job_id = Some("4242.0".into());
        v.torch = vec![TorchView {
            step_peak_allocated: Some(1),
            step_peak_reserved: Some(1),
            ..Default::default()
        }];
        let t = render(&v, Format::Prometheus);
        let shown: Vec<&str> = t
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap())
            .collect();
        let all: Vec<&str> = ALL.iter().map(|m| m.name).collect();
        assert_eq!(shown, all);
        // The job's id is on every sample, beside the host.
        assert!(t.contains(
            "gpudoc_gpus_lost{host=\"node-1\",job_name=\"llama \\\"7b\\\"\",job_id=\"4242.0\"} 0\n"
        ));
    }

    #[test]
    fn openmetrics_names_counter_families_without_total_and_ends_with_eof() {
        let t = render(&view(), Format::OpenMetrics);
        assert!(t.contains("# TYPE gpudoc_diagnoses counter\n"));
        assert!(t.contains("\ngpudoc_diagnoses_total{"));
        assert!(t.ends_with("# EOF\n"));
        assert_eq!(
            Format::negotiate("application/openmetrics-text;version=1.0.0,text/plain;q=0.5"),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate("*/*"), Format::Prometheus);
    }

    #[test]
    fn diagnoses_are_counted_once_while_they_hold() {
        let mut v = view();
        let mut known = Episodes::default();
        v.count_new(&mut known);
        v.count_new(&mut known);
        assert_eq!(v.seen[&("near-capacity".into(), "warn".into())], 1);
        v.active
            .push(("near-capacity".into(), "warn".into(), "GPU 1".into()));
        v.count_new(&mut known);
        assert_eq!(v.seen[&("near-capacity".into(), "warn".into())], 2);
        // GPU 0's stops holding and begins again: a second episode of it.
        v.active.retain(|(_, _, subject)| subject == "GPU 1");
        v.count_new(&mut known);
        assert_eq!(v.seen[&("near-capacity".into(), "warn".into())], 2);
        v.active
            .push(("near-capacity".into(), "warn".into(), "GPU 0".into()));
        v.count_new(&mut known);
        assert_eq!(v.seen[&("near-capacity".into(), "warn".into())], 3);
    }
}
