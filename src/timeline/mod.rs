//! The sampled memory of a run, stored as changes: a value that stays flat for an hour costs one point,
//! and every series keeps its exact peak whatever is stored. [`Timeline`] is what the sampler fills and
//! what a trace replays into.

use crate::gpu::GpuInfo;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod running;

/// Microseconds since the run started.
pub type Micros = u64;

/// One quantity over time: the points where it changed, plus its peak.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Series {
    points: Vec<(Micros, u64)>,
    peak: u64,
    peak_at: Micros,
    samples: u64,
    last_at: Micros,
    /// How many times [`Series::thin_to`] rewrote the points: a copy kept up to date by
    /// [`Series::catch_up`] knows from it that the points it has are no longer the series'.
    #[serde(skip)]
    thinned: u32,
}

impl Series {
    /// Records a sample; stores a point only when the value differs from the last one.
    pub fn push(&mut self, at: Micros, value: u64) -> bool {
        self.samples += 1;
        self.last_at = at;
        if self.samples == 1 || value > self.peak {
            self.peak = value;
            self.peak_at = at;
        }
        if self.points.last().map(|&(_, v)| v) != Some(value) {
            self.points.push((at, value));
            return true;
        }
        false
    }

    pub fn peak(&self) -> u64 {
        self.peak
    }

    pub fn peak_at(&self) -> Micros {
        self.peak_at
    }

    pub fn first(&self) -> Option<u64> {
        self.points.first().map(|&(_, v)| v)
    }

    pub fn last(&self) -> Option<u64> {
        self.points.last().map(|&(_, v)| v)
    }

    pub fn first_at(&self) -> Option<Micros> {
        self.points.first().map(|&(t, _)| t)
    }

    /// Time of the last sample (not the last change).
    pub fn last_at(&self) -> Micros {
        self.last_at
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn points(&self) -> &[(Micros, u64)] {
        &self.points
    }

    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// Heap bytes held by the stored points.
    pub fn heap_bytes(&self) -> usize {
        self.points.capacity() * std::mem::size_of::<(Micros, u64)>()
    }

    /// The value at `at` (the last change at or before it).
    pub fn value_at(&self, at: Micros) -> Option<u64> {
        let i = self.points.partition_point(|&(t, _)| t <= at);
        i.checked_sub(1).map(|i| self.points[i].1)
    }

    /// Keeps at most `max` points by merging neighbours when there are more: each merged pair keeps the
    /// earlier time and the larger value, so peaks in any window stay (an upper bound, never lower) and the
    /// series' own peak stays exact. For series that change at every sample (PyTorch's allocated memory).
    pub fn thin_to(&mut self, max: usize) {
        if self.points.len() <= max.max(2) {
            return;
        }
        self.thinned += 1;
        let last = *self.points.last().unwrap();
        let merged: Vec<(Micros, u64)> = self
            .points
            .chunks(2)
            .map(|c| (c[0].0, c.iter().map(|p| p.1).max().unwrap()))
            .collect();
        self.points = merged;
        // The final value is what the series ends at: keep it as it was.
        if self.points.last() != Some(&last) {
            self.points.push(last);
        }
    }

    /// Brings this copy of `source` up to date, taking only the points it lacks: a series only grows at its
    /// end, but when `source` was thinned since, its points are taken again (once per thinning, which
    /// halves them, so every point is copied a bounded number of times however long the run).
    pub fn catch_up(&mut self, source: &Series) {
        if self.thinned != source.thinned || self.points.len() > source.points.len() {
            self.clone_from(source);
            return;
        }
        self.points
            .extend_from_slice(&source.points[self.points.len()..]);
        (self.peak, self.peak_at) = (source.peak, source.peak_at);
        (self.samples, self.last_at) = (source.samples, source.last_at);
    }

    /// The highest value the series had at any moment in [lo, hi]: the value carried in at `lo` and every
    /// change after it up to `hi`, found by their times (a window's cost, not the series').
    pub fn max_in(&self, lo: Micros, hi: Micros) -> Option<u64> {
        let start = self.value_at(lo);
        let from = self.points.partition_point(|&(t, _)| t <= lo);
        let to = self.points.partition_point(|&(t, _)| t <= hi).max(from);
        let inside = self.points[from..to].iter().map(|&(_, v)| v).max();
        match (start, inside) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// The point nearest `at` in time (the earliest of those as near), found by its time.
    pub fn nearest(&self, at: Micros) -> Option<(Micros, u64)> {
        let after = self.points.partition_point(|&(t, _)| t < at);
        let before = after.checked_sub(1).map(|i| self.points[i].0);
        let t = match (before, self.points.get(after)) {
            (Some(b), Some(&(a, _))) if a - at < at - b => a,
            (Some(b), _) => b,
            (None, Some(&(a, _))) => a,
            (None, None) => return None,
        };
        // The first point of that time: a series may hold two changes read at one instant.
        Some(self.points[self.points.partition_point(|&(x, _)| x < t)])
    }

    /// `buckets` maxima over [0, end]: what a sparkline draws. A bucket holds the highest value the
    /// series had at any moment inside it ([`running::Maxima::bucket_max`], read from the start).
    pub fn bucket_max(&self, end: Micros, buckets: usize) -> Vec<u64> {
        let mut m = running::Maxima::default();
        m.feed(self);
        m.bucket_max(self, end, buckets)
    }

    /// How many times the points were rewritten (by [`Series::thin_to`]): what was read of them before is
    /// no longer theirs.
    pub fn rewrites(&self) -> u32 {
        self.thinned
    }
}

/// When and why a GPU stopped being sampled.
#[derive(Debug, Clone, PartialEq)]
pub struct Lost {
    pub at: Micros,
    pub error: String,
}

/// One GPU over the run.
#[derive(Debug, Clone)]
pub struct GpuTimeline {
    pub info: GpuInfo,
    /// Device memory in use, NVML v2 `used` (what `nvidia-smi` shows).
    pub used: Series,
    /// Memory the driver reserves for itself (NVML v2 `reserved`), last seen.
    pub driver_reserved: u64,
    /// The job's memory: the sum over the job's processes, at each process sample.
    pub job: Series,
    pub lost: Option<Lost>,
    /// Queries that failed as unsupported and were turned off, with the error.
    pub unsupported: Vec<(String, String)>,
}

impl GpuTimeline {
    /// A GPU with nothing sampled yet.
    pub fn new(info: GpuInfo) -> GpuTimeline {
        GpuTimeline {
            info,
            used: Series::default(),
            driver_reserved: 0,
            job: Series::default(),
            lost: None,
            unsupported: Vec::new(),
        }
    }
}

/// One process on one GPU.
#[derive(Debug, Clone)]
pub struct ProcTimeline {
    pub pid: u32,
    pub gpu: u32,
    pub in_job: bool,
    /// /proc has this PID. NVML reports host PIDs: inside a container without the host's PID namespace
    /// they are not visible, and such a process can't be placed in or out of the job.
    pub visible: bool,
    pub cmdline: String,
    pub uid: Option<u32>,
    /// Its parent when first seen (`None` where /proc did not show it, or in older traces).
    pub ppid: Option<u32>,
    pub used: Series,
}

/// Everything sampled in a run.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub gpus: Vec<GpuTimeline>,
    /// Keyed by (gpu, pid).
    pub procs: BTreeMap<(u32, u32), ProcTimeline>,
    pub device_samples: u64,
    pub process_samples: u64,
    /// Heap bytes held by stored points at the end.
    pub heap_bytes: usize,
}

/// How late after gpudoc's first look at a GPU's processes a process may be first seen and still count as
/// there at that look: processes are read at 100 Hz, and no job allocates GPU memory this soon.
pub const FIRST_LOOK_SLACK: Micros = 100_000;

impl Timeline {
    /// gpudoc's first look at GPU `gpu`'s processes: when they were first listed, the first point of the
    /// job's series (made at that listing by the sampler, and by a replay from its trace's first
    /// instant). The one definition: [`Timeline::at_first_look`] reads a process against it.
    pub fn first_look(&self, gpu: u32) -> Option<Micros> {
        self.gpus
            .iter()
            .find(|g| g.info.index == gpu)?
            .job
            .first_at()
    }

    /// What `p` held at gpudoc's first look at its GPU's processes, when it was there then: its first
    /// reading came at the look or within [`FIRST_LOOK_SLACK`] of it (so it was there when the job
    /// started). `None` when it came later, or without a look.
    pub fn at_first_look(&self, p: &ProcTimeline) -> Option<u64> {
        let (look, seen) = (self.first_look(p.gpu)?, p.used.first_at()?);
        (seen <= look + FIRST_LOOK_SLACK).then(|| p.used.first().unwrap_or(0))
    }

    /// Brings this copy of `source` up to date, taking only what it lacks: the points each series gained
    /// since the last catch-up, and the GPUs and processes new since. What a look at a run in progress
    /// does instead of copying the whole timeline, whose copy grows with the run.
    pub fn catch_up(&mut self, source: &Timeline) {
        self.gpus.truncate(source.gpus.len());
        for (i, g) in source.gpus.iter().enumerate() {
            match self.gpus.get_mut(i) {
                Some(mine) if mine.info == g.info => {
                    mine.used.catch_up(&g.used);
                    mine.job.catch_up(&g.job);
                    mine.driver_reserved = g.driver_reserved;
                    mine.lost.clone_from(&g.lost);
                    mine.unsupported.clone_from(&g.unsupported);
                }
                Some(mine) => *mine = g.clone(),
                None => self.gpus.push(g.clone()),
            }
        }
        self.procs.retain(|k, _| source.procs.contains_key(k));
        for (k, p) in &source.procs {
            match self.procs.get_mut(k) {
                Some(mine) => {
                    mine.used.catch_up(&p.used);
                    mine.in_job = p.in_job;
                    mine.visible = p.visible;
                    mine.uid = p.uid;
                    mine.ppid = p.ppid;
                    mine.cmdline.clone_from(&p.cmdline);
                }
                None => {
                    self.procs.insert(*k, p.clone());
                }
            }
        }
        self.device_samples = source.device_samples;
        self.process_samples = source.process_samples;
        self.heap_bytes = source.heap_bytes;
    }

    /// The GPU with NVML index `index`.
    pub fn gpu_mut(&mut self, index: u32) -> Option<&mut GpuTimeline> {
        self.gpus.iter_mut().find(|g| g.info.index == index)
    }

    /// The infos of every GPU sampled.
    pub fn gpu_infos(&self) -> Vec<GpuInfo> {
        self.gpus.iter().map(|g| g.info.clone()).collect()
    }

    /// Time of the last device sample on any GPU.
    pub fn end(&self) -> Micros {
        self.gpus
            .iter()
            .map(|g| g.used.last_at())
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_hour_at_1khz_is_one_point() {
        let mut s = Series::default();
        for i in 0..3_600_000u64 {
            s.push(i * 1000, 42 << 30);
        }
        assert_eq!(s.points().len(), 1);
        assert_eq!(s.samples(), 3_600_000);
        assert!(s.heap_bytes() < 1 << 20);
    }

    #[test]
    fn peak_is_exact_even_when_brief() {
        let mut s = Series::default();
        s.push(0, 10);
        s.push(1, 99);
        s.push(2, 10);
        assert_eq!((s.peak(), s.peak_at()), (99, 1));
        assert_eq!(s.points(), &[(0, 10), (1, 99), (2, 10)]);
        assert_eq!(s.value_at(5), Some(10));
        assert_eq!(s.value_at(1), Some(99));
    }

    #[test]
    fn thinning_bounds_points_and_keeps_peaks() {
        let mut s = Series::default();
        for i in 0..1_000_000u64 {
            s.push(i, i % 7 + if i == 500_001 { 100 } else { 0 });
            s.thin_to(10_000);
        }
        assert!(s.points().len() <= 10_001);
        assert_eq!((s.peak(), s.peak_at()), (105, 500_001));
        assert_eq!(
            s.max_in(499_000, 501_000),
            Some(105),
            "a window's peak survives"
        );
        assert_eq!(s.last(), Some(999_999 % 7));
    }

    #[test]
    fn max_in_a_window_counts_the_value_carried_in() {
        let mut s = Series::default();
        s.push(0, 5);
        s.push(100, 2);
        s.push(200, 8);
        assert_eq!(s.max_in(50, 150), Some(5));
        assert_eq!(s.max_in(150, 250), Some(8));
        assert_eq!(s.max_in(101, 199), Some(2));
    }

    #[test]
    fn windows_and_nearest_points_found_by_time_are_those_a_reading_of_every_point_finds() {
        let mut s = Series::default();
        for i in 0..3_000u64 {
            s.push(i * 10, (i * 7919) % 101);
            // Two changes read at one instant.
            if i % 17 == 0 {
                s.push(i * 10, 200 + i % 5);
            }
            s.thin_to(500);
        }
        for (lo, hi) in [(0, 0), (5, 95), (1234, 5678), (29_000, 40_000), (100, 99)] {
            let inside = s.points().iter().filter(|&&(t, _)| t > lo && t <= hi);
            let every = inside.map(|p| p.1).chain(s.value_at(lo)).max();
            assert_eq!(s.max_in(lo, hi), every, "[{lo}, {hi}]");
        }
        for at in [0, 1, 15, 1234, 1700, 1705, 29_999, 50_000] {
            let every = s.points().iter().min_by_key(|p| p.0.abs_diff(at)).copied();
            assert_eq!(s.nearest(at), every, "{at}");
        }
        assert_eq!(Series::default().nearest(5), None);
    }

    #[test]
    fn buckets_keep_short_peaks() {
        let mut s = Series::default();
        s.push(0, 1);
        s.push(250, 9);
        s.push(260, 1);
        assert_eq!(s.bucket_max(1000, 4), vec![1, 9, 1, 1]);
    }

    #[test]
    fn the_last_bucket_holds_the_runs_last_reading() {
        // A peak read at the very end (an OOM's), and an end that the buckets do not divide.
        let mut s = Series::default();
        s.push(0, 1);
        s.push(1000, 9);
        assert_eq!(s.bucket_max(1000, 4), vec![1, 1, 1, 9]);
        let mut s = Series::default();
        s.push(0, 1);
        s.push(1002, 7);
        assert_eq!(s.bucket_max(1003, 4), vec![1, 1, 1, 7]);
    }

    #[test]
    fn a_copy_caught_up_now_and_then_is_the_timeline_through_thinning_and_new_processes() {
        let info = |index| GpuInfo {
            index,
            name: "NVIDIA H200".into(),
            uuid: format!("GPU-{index}"),
            total_bytes: 100,
        };
        let mut t = Timeline::default();
        t.gpus.push(GpuTimeline::new(info(0)));
        let mut copy = Timeline::default();
        for i in 0..5_000u64 {
            // Memory that changes at every sample, thinned at 64 points as the sampler thins at its
            // MAX_POINTS: the copy's points are rewritten every few dozen samples.
            let g = &mut t.gpus[0];
            g.used.push(i * 10, (i * 7919) % 1000);
            g.used.thin_to(64);
            g.job.push(i * 10, i % 13);
            if i == 1_000 {
                t.gpus.push(GpuTimeline::new(info(1)));
            }
            if i >= 1_000 {
                t.gpus[1].used.push(i * 10, i % 3);
            }
            let pid = (i / 700) as u32;
            let p = t.procs.entry((0, pid)).or_insert_with(|| ProcTimeline {
                pid,
                gpu: 0,
                in_job: true,
                visible: true,
                cmdline: format!("p{pid}"),
                uid: None,
                ppid: None,
                used: Series::default(),
            });
            p.used.push(i * 10, i % 5);
            if i % 97 == 0 || i % 101 == 0 {
                copy.catch_up(&t);
                let same = |a: &Timeline, b: &Timeline| {
                    a.gpus.len() == b.gpus.len()
                        && a.gpus
                            .iter()
                            .zip(&b.gpus)
                            .all(|(x, y)| x.info == y.info && x.used == y.used && x.job == y.job)
                        && a.procs.len() == b.procs.len()
                        && a.procs.iter().zip(&b.procs).all(|(x, y)| {
                            x.0 == y.0 && x.1.used == y.1.used && x.1.cmdline == y.1.cmdline
                        })
                };
                assert!(same(&copy, &t), "at sample {i}");
            }
        }
        assert!(t.gpus[0].used.thinned > 10, "{}", t.gpus[0].used.thinned);
    }
}
