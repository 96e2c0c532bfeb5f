//! The charts' data: every series of a GPU as a step function on one shared time axis, reduced to at most
//! a bounded number of buckets by keeping each bucket's minimum and maximum in the order they came, so no
//! spike disappears however long the run; and PyTorch's per-step records against the step number.

use crate::report::GpuReport;
use crate::report::Report;
use crate::timeline::{GpuTimeline, Micros, Timeline};
use serde::Serialize;

/// Cells (points × series) the whole page may hold: about 7 bytes each in the file, so a few MB at most
/// whatever the run's length or the number of GPUs.
pub const CELL_BUDGET: usize = 400_000;
/// Buckets per chart, at least and at most: an hour at 1 kHz in 6,000 buckets keeps 0.6 s per bucket.
const MIN_BUCKETS: usize = 300;
const MAX_BUCKETS: usize = 6_000;
/// Job processes drawn one by one on a GPU; the rest are drawn as one series.
const MAX_JOB_SERIES: usize = 12;

/// One GPU's timeline chart.
#[derive(Debug, Serialize)]
pub struct GpuChart {
    /// As messages name it: `GPU 0`, `GPU 0 on node-a`.
    pub label: String,
    pub name: String,
    pub total_mib: f64,
    /// Seconds since the run started.
    pub x: Vec<f64>,
    pub series: Vec<ChartSeries>,
    pub marks: Vec<Mark>,
    /// When optimizer steps ended (the shim's records), seconds.
    pub steps: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct ChartSeries {
    pub label: String,
    /// `device`, `job`, `other`, `reserved`, `allocated`.
    pub kind: &'static str,
    pub pid: Option<u32>,
    /// MiB, one per `x` (null before the series began).
    pub values: Vec<Option<f64>>,
}

/// A moment drawn across a chart.
#[derive(Debug, Serialize)]
pub struct Mark {
    pub at: f64,
    /// `oom`, `lost`, `end`.
    pub kind: &'static str,
    pub text: String,
}

/// One PyTorch process's records against the step number.
#[derive(Debug, Serialize)]
pub struct StepChart {
    pub gpu: String,
    pub pid: u32,
    pub label: String,
    pub step: Vec<u64>,
    pub allocated: Vec<f64>,
    /// Null where the framework does not say what its allocator holds (a gap in the chart).
    pub reserved: Vec<Option<f64>>,
    pub peak_allocated: Vec<f64>,
    pub peak_reserved: Vec<Option<f64>>,
}

/// A series before it is put on the chart's axis: its changes, in time order.
struct Steps {
    label: String,
    kind: &'static str,
    pid: Option<u32>,
    points: Vec<(Micros, u64)>,
}

fn mib(b: u64) -> f64 {
    (b as f64 / (1u64 << 20) as f64 * 100.0).round() / 100.0
}

/// A GPU as messages name it: `GPU 0`, `GPU 0 on node-a`.
pub fn label_of(host: Option<&str>, index: u32) -> String {
    crate::ident::GpuRef::new(host, index).to_string()
}

/// A GPU the job never touched and nobody used: the page gives it a line, not a chart.
pub fn idle(g: &GpuReport) -> bool {
    g.job_peak_bytes == 0 && g.peak_used_bytes < g.total_bytes / 100
}

/// Every GPU's chart but the idle ones', from the samples when there are any, else from the report's
/// summary.
pub fn gpu_charts(report: &Report, timeline: Option<&Timeline>) -> Vec<GpuChart> {
    let end = (report.duration_s * 1e6) as Micros;
    let mut per_gpu: Vec<(usize, Vec<Steps>)> = Vec::new();
    for (i, g) in report.gpus.iter().enumerate().filter(|(_, g)| !idle(g)) {
        let sampled_gpu = timeline.and_then(|t| {
            let gt = t.gpus.iter().find(|x| x.info.index == g.index)?;
            Some((t, gt))
        });
        let series = match sampled_gpu {
            Some((t, gt)) => sampled(report, t, gt),
            None => summary_only(g),
        };
        per_gpu.push((i, series));
    }
    let total_series: usize = per_gpu.iter().map(|(_, s)| s.len().max(1)).sum();
    let buckets = (CELL_BUDGET / (2 * total_series.max(1))).clamp(MIN_BUCKETS, MAX_BUCKETS);
    per_gpu
        .into_iter()
        .map(|(i, series)| {
            let g = &report.gpus[i];
            let (x, values) = align(&series, end, buckets);
            GpuChart {
                label: label_of(g.host.as_deref(), g.index),
                name: g.name.clone(),
                total_mib: mib(g.total_bytes),
                x,
                series: series
                    .into_iter()
                    .zip(values)
                    .map(|(s, values)| ChartSeries {
                        label: s.label,
                        kind: s.kind,
                        pid: s.pid,
                        values,
                    })
                    .collect(),
                marks: marks(report, g.index, g.host.as_deref()),
                steps: step_times(report, g.index, g.host.as_deref()),
            }
        })
        .collect()
}

/// Device memory, each job process, the others together, the framework's (PyTorch's, JAX's, CuPy's) reserved and allocated per process.
fn sampled(report: &Report, t: &Timeline, g: &GpuTimeline) -> Vec<Steps> {
    let gpu = g.info.index;
    let mut out = vec![Steps {
        label: "device used (nvidia-smi)".into(),
        kind: "device",
        pid: None,
        points: g.used.points().to_vec(),
    }];
    let mut job: Vec<_> = t
        .procs
        .values()
        .filter(|p| p.gpu == gpu && p.in_job && p.used.peak() > 0)
        .collect();
    job.sort_by_key(|p| std::cmp::Reverse(p.used.peak()));
    let rest = job.split_off(job.len().min(MAX_JOB_SERIES));
    for p in job {
        out.push(Steps {
            label: format!("pid {} {}", p.pid, short(&p.cmdline)),
            kind: "job",
            pid: Some(p.pid),
            points: p.used.points().to_vec(),
        });
    }
    if !rest.is_empty() {
        out.push(Steps {
            label: format!("{} more job processes", rest.len()),
            kind: "job",
            pid: None,
            points: sum(rest.iter().map(|p| p.used.points())),
        });
    }
    let others: Vec<_> = t
        .procs
        .values()
        .filter(|p| p.gpu == gpu && !p.in_job && p.used.peak() > 0)
        .collect();
    if !others.is_empty() {
        out.push(Steps {
            label: format!("other processes ({})", others.len()),
            kind: "other",
            pid: None,
            points: sum(others.iter().map(|p| p.used.points())),
        });
    }
    for p in report
        .torch
        .processes
        .iter()
        .filter(|p| p.gpu == Some(gpu) && !p.steps.is_empty())
    {
        let at = |s: &crate::torch::Step| (s.at_s * 1e6) as Micros;
        // A framework that does not say what its allocator holds (TensorFlow): no line for it.
        let reserved: Vec<(Micros, u64)> = p
            .steps
            .iter()
            .filter_map(|s| Some((at(s), s.reserved_bytes?)))
            .collect();
        if !reserved.is_empty() {
            out.push(Steps {
                label: format!("pid {} {} reserved", p.pid, p.framework.name()),
                kind: "reserved",
                pid: Some(p.pid),
                points: reserved,
            });
        }
        out.push(Steps {
            label: format!("pid {} {} allocated", p.pid, p.framework.name()),
            kind: "allocated",
            pid: Some(p.pid),
            points: p.steps.iter().map(|s| (at(s), s.allocated_bytes)).collect(),
        });
    }
    out
}

/// A report without its samples: the job's highest memory per slice of the run.
fn summary_only(g: &GpuReport) -> Vec<Steps> {
    vec![Steps {
        label: "job (highest per slice, from the report)".into(),
        kind: "job",
        pid: None,
        points: g
            .job_timeline
            .iter()
            .map(|&(s, b)| ((s * 1e6) as Micros, b))
            .collect(),
    }]
}

fn short(cmdline: &str) -> String {
    let mut s: String = cmdline.chars().take(60).collect();
    if s.len() < cmdline.len() {
        s.push('…');
    }
    s
}

/// Every moment of the series, in order, once. Each series is in time order already: the stable sort
/// merges those runs (O(n log k)), where an unstable one sorted every moment afresh (an hour at 1 kHz took
/// seconds of a debug build's checks).
fn times_of<'a>(series: impl Iterator<Item = &'a [(Micros, u64)]>) -> Vec<Micros> {
    let mut times: Vec<Micros> = series.flat_map(|s| s.iter().map(|p| p.0)).collect();
    times.sort();
    times.dedup();
    times
}

/// The sum of step functions, as one.
fn sum<'a>(series: impl Iterator<Item = &'a [(Micros, u64)]>) -> Vec<(Micros, u64)> {
    let series: Vec<&[(Micros, u64)]> = series.collect();
    let times = times_of(series.iter().copied());
    let mut idx = vec![0usize; series.len()];
    let mut out: Vec<(Micros, u64)> = Vec::with_capacity(times.len());
    for t in times {
        let mut total = 0;
        for (s, i) in series.iter().zip(idx.iter_mut()) {
            while *i < s.len() && s[*i].0 <= t {
                *i += 1;
            }
            total += if *i > 0 { s[*i - 1].1 } else { 0 };
        }
        if out.last().map(|p| p.1) != Some(total) {
            out.push((t, total));
        }
    }
    out
}

/// The series on one time axis: every change when they fit in `buckets` × 2 points, else per bucket the
/// minimum and the maximum of each series, in the order they came.
fn align(series: &[Steps], end: Micros, buckets: usize) -> (Vec<f64>, Vec<Vec<Option<f64>>>) {
    let mut times = times_of(series.iter().map(|s| s.points.as_slice()));
    let end = end.max(times.last().copied().unwrap_or(0));
    if times.len() <= 2 * buckets {
        if times.last() != Some(&end) {
            times.push(end);
        }
        let values = series
            .iter()
            .map(|s| {
                let mut i = 0;
                times
                    .iter()
                    .map(|&t| {
                        while i < s.points.len() && s.points[i].0 <= t {
                            i += 1;
                        }
                        (i > 0).then(|| mib(s.points[i - 1].1))
                    })
                    .collect()
            })
            .collect();
        return (times.iter().map(|&t| t as f64 / 1e6).collect(), values);
    }
    let width = (end as f64 / buckets as f64).max(1.0);
    let x: Vec<f64> = (0..buckets)
        .flat_map(|b| {
            let t0 = b as f64 * width;
            [t0, t0 + width / 2.0].map(|t| (t / 1e3).round() / 1e3)
        })
        .collect();
    let values = series
        .iter()
        .map(|s| min_max(&s.points, width, buckets))
        .collect();
    (x, values)
}

/// Two values per bucket of a step function: its extremes in the bucket, the earlier one first.
fn min_max(points: &[(Micros, u64)], width: f64, buckets: usize) -> Vec<Option<f64>> {
    let mut out = Vec::with_capacity(2 * buckets);
    let mut i = 0;
    let mut current: Option<u64> = None;
    for b in 0..buckets {
        let hi = ((b + 1) as f64 * width) as Micros;
        // (value, when) of the lowest and highest, starting from the value carried in.
        let mut lo_v = current.map(|v| (v, 0usize));
        let mut hi_v = lo_v;
        let mut n = 0;
        while i < points.len() && (points[i].0 < hi || b + 1 == buckets) {
            n += 1;
            let v = points[i].1;
            if lo_v.is_none_or(|(l, _)| v < l) {
                lo_v = Some((v, n));
            }
            if hi_v.is_none_or(|(h, _)| v > h) {
                hi_v = Some((v, n));
            }
            current = Some(v);
            i += 1;
        }
        match (lo_v, hi_v) {
            (Some((l, lt)), Some((h, ht))) => {
                let (a, b) = if lt <= ht { (l, h) } else { (h, l) };
                out.push(Some(mib(a)));
                out.push(Some(mib(b)));
            }
            _ => {
                out.push(None);
                out.push(None);
            }
        }
    }
    out
}

/// The OOM, a GPU lost, and the end of the run (with what was left holding memory), on this GPU.
fn marks(report: &Report, gpu: u32, host: Option<&str>) -> Vec<Mark> {
    let mut out = Vec::new();
    if let Some(o) = &report.oom
        && o.gpu == Some(gpu)
        && o.host.as_deref() == host
    {
        let asked = o
            .event
            .text
            .requested_bytes
            .map(|b| format!(": asked for {}", crate::units::fmt_bytes(b)))
            .unwrap_or_default();
        out.push(Mark {
            at: o.event.at_s,
            kind: "oom",
            text: format!("out of memory{asked}"),
        });
    }
    let g = report
        .gpus
        .iter()
        .find(|g| g.index == gpu && g.host.as_deref() == host);
    if let Some(l) = g.and_then(|g| g.lost.as_ref()) {
        out.push(Mark {
            at: l.at_s,
            kind: "lost",
            text: format!("GPU lost: {}", l.error),
        });
    }
    let left: Vec<String> = report
        .orphans
        .iter()
        .filter(|o| o.host.as_deref() == host)
        .filter_map(|o| {
            let (_, b) = o.gpu_bytes.iter().find(|(g, _)| *g == gpu)?;
            Some(format!("pid {} ({})", o.pid, crate::units::fmt_bytes(*b)))
        })
        .collect();
    let mut text = format!("the command {}", crate::summary::ending(report));
    if !left.is_empty() {
        text.push_str(&format!("; left holding memory: {}", left.join(", ")));
    }
    out.push(Mark {
        at: report.duration_s,
        kind: "end",
        text,
    });
    out
}

fn step_times(report: &Report, gpu: u32, host: Option<&str>) -> Vec<f64> {
    let mut t: Vec<f64> = report
        .torch
        .processes
        .iter()
        .filter(|p| p.gpu == Some(gpu) && p.host.as_deref() == host)
        .flat_map(|p| p.steps.iter().map(|s| (s.at_s * 1e3).round() / 1e3))
        .collect();
    t.sort_by(f64::total_cmp);
    t.dedup();
    t
}

/// Each PyTorch process's records, by step.
pub fn step_charts(report: &Report) -> Vec<StepChart> {
    report
        .torch
        .processes
        .iter()
        .filter(|p| !p.steps.is_empty())
        .map(|p| {
            let col =
                |f: fn(&crate::torch::Step) -> u64| p.steps.iter().map(|s| mib(f(s))).collect();
            let told = |f: fn(&crate::torch::Step) -> Option<u64>| {
                p.steps.iter().map(|s| f(s).map(mib)).collect()
            };
            let rank = p
                .rank
                .as_ref()
                .map(|r| format!(" rank {}", r.as_str().map_or(r.to_string(), String::from)))
                .unwrap_or_default();
            StepChart {
                gpu: p.gpu.map_or_else(
                    || "an unknown GPU".into(),
                    |g| label_of(p.host.as_deref(), g),
                ),
                pid: p.pid,
                label: format!("pid {}{rank}", p.pid),
                step: p.steps.iter().map(|s| s.step).collect(),
                allocated: col(|s| s.allocated_bytes),
                reserved: told(|s| s.reserved_bytes),
                peak_allocated: col(|s| s.peak_allocated_bytes),
                peak_reserved: told(|s| s.peak_reserved_bytes),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(points: Vec<(Micros, u64)>) -> Steps {
        Steps {
            label: "s".into(),
            kind: "job",
            pid: None,
            points,
        }
    }

    #[test]
    fn few_changes_are_kept_exactly() {
        let s = [
            steps(vec![(0, 0), (1_000_000, 3 << 20), (2_000_000, 1 << 20)]),
            steps(vec![(500_000, 2 << 20)]),
        ];
        let (x, v) = align(&s, 3_000_000, 300);
        assert_eq!(x, [0.0, 0.5, 1.0, 2.0, 3.0]);
        assert_eq!(
            v[0],
            [Some(0.0), Some(0.0), Some(3.0), Some(1.0), Some(1.0)]
        );
        assert_eq!(v[1], [None, Some(2.0), Some(2.0), Some(2.0), Some(2.0)]);
    }

    #[test]
    fn a_one_sample_spike_survives_an_hour_at_one_khz() {
        // An hour of 1 ms samples alternating between two levels, with one 1 ms spike.
        let mut p: Vec<(Micros, u64)> = (0..3_600_000u64)
            .map(|i| (i * 1000, if i % 2 == 0 { 10 << 30 } else { 11 << 30 }))
            .collect();
        p[1_234_567].1 = 120 << 30;
        let (x, v) = align(&[steps(p)], 3_600_000_000, MAX_BUCKETS);
        assert_eq!(x.len(), 2 * MAX_BUCKETS);
        let top = v[0].iter().flatten().cloned().fold(0.0, f64::max);
        assert_eq!(top, (120u64 << 10) as f64);
        let low = v[0].iter().flatten().cloned().fold(f64::MAX, f64::min);
        assert_eq!(low, (10u64 << 10) as f64);
        // The spike's bucket is where it happened.
        let at = v[0]
            .iter()
            .position(|&y| y == Some((120u64 << 10) as f64))
            .unwrap();
        assert!((x[at] - 1234.567).abs() < 0.6 + 1e-9, "{}", x[at]);
    }

    #[test]
    fn sums_of_step_functions() {
        let a = [(0, 1), (10, 3)];
        let b = [(5, 2), (10, 0)];
        assert_eq!(sum([&a[..], &b[..]].into_iter()), vec![(0, 1), (5, 3)]);
    }
}
