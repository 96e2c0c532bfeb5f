//! What an analysis reads of a run's series, kept as their points come, so that a look at a run in
//! progress reads only the points since the last look: the highest value of every block of points (the
//! job's memory history a report draws, [`Maxima`]) and the longest stretch a process stayed high
//! ([`Stretch`]). [`Running`] keeps them for every GPU and process between looks; a fresh one reads the
//! run from its start, which is what the end of a run does: one implementation, fed all at once or look
//! by look, gives the same numbers.
//!
//! A series only grows at its end, except when it is thinned ([`Series::thin_to`] rewrites its points)
//! or replaced: what was read of it is then read again from its start ([`Read`]), at most once per
//! thinning, which halves the points, so every point is read a bounded number of times however long the
//! run.

use super::{Micros, Series};
use std::collections::BTreeMap;

/// Points each block of [`Maxima`] covers: a window's highest value takes its whole blocks and at most
/// two blocks' points at its ends.
const BLOCK: usize = 128;

/// How far a series has been read: the points read, and the last of them, as the series had them. A
/// series is known by these and by its rewrites: one that has them all is taken to be the series read
/// (a series grows only at its end; a copy of it is the same series).
#[derive(Debug, Clone, Default, PartialEq)]
struct Read {
    rewrites: u32,
    count: usize,
    last: Option<(Micros, u64)>,
}

impl Read {
    /// Whether `s` is the series read so far, grown or not: the same rewrites, and the last point read
    /// still where it was.
    fn continues(&self, s: &Series) -> bool {
        let points = s.points();
        self.rewrites == s.rewrites()
            && points.len() >= self.count
            && self.count.checked_sub(1).map(|i| points[i]) == self.last
    }

    /// Marks every point of `s` read.
    fn read_all(&mut self, s: &Series) {
        self.rewrites = s.rewrites();
        self.count = s.points().len();
        self.last = s.points().last().copied();
    }
}

/// The highest value of each block of [`BLOCK`] points of a series, taken as its points come.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Maxima {
    read: Read,
    blocks: Vec<u64>,
}

impl Maxima {
    /// Takes the points of `s` not read yet (all of them, when `s` is not the series read so far).
    pub fn feed(&mut self, s: &Series) {
        if !self.read.continues(s) {
            *self = Maxima::default();
        }
        let points = s.points();
        for (i, &(_, v)) in points.iter().enumerate().skip(self.read.count) {
            match self.blocks.get_mut(i / BLOCK) {
                Some(m) => *m = (*m).max(v),
                None => self.blocks.push(v),
            }
        }
        self.read.read_all(s);
    }

    /// The highest value among points `from..to` of `s` (fed up to `to` at least).
    fn max_of(&self, s: &Series, from: usize, to: usize) -> Option<u64> {
        if from >= to {
            return None;
        }
        let value = |i: usize| s.points()[i].1;
        let (first, last) = (from.div_ceil(BLOCK), to / BLOCK);
        if first >= last {
            return (from..to).map(value).max();
        }
        let head = (from..first * BLOCK).map(value);
        let tail = (last * BLOCK..to).map(value);
        head.chain(self.blocks[first..last].iter().copied())
            .chain(tail)
            .max()
    }

    /// `buckets` maxima over [0, end] of `s` (which this has been fed): what a sparkline draws. A bucket
    /// holds the highest value the series had at any moment inside it: the value carried into it, and
    /// every change inside it. The last bucket runs to the end and past it: the run's last reading (an
    /// OOM's peak) is in.
    pub fn bucket_max(&self, s: &Series, end: Micros, buckets: usize) -> Vec<u64> {
        debug_assert!(self.read.continues(s) && self.read.count == s.points().len());
        if buckets == 0 || s.points().is_empty() {
            return Vec::new();
        }
        let width = (end / buckets as u64).max(1);
        let index = |at: Micros| s.points().partition_point(|&(t, _)| t < at);
        (0..buckets as u64)
            .map(|b| {
                let lo = b * width;
                let hi = if b + 1 == buckets as u64 {
                    u64::MAX
                } else {
                    (b + 1) * width
                };
                let carried = s.value_at(lo).unwrap_or(0);
                let inside = self.max_of(s, index(lo), index(hi));
                inside.map_or(carried, |m| m.max(carried))
            })
            .collect()
    }
}

/// The longest stretch (its start and length) in which a series stayed at or above a bar, and above
/// zero, taken as its points come. A bar other than the one read so far reads the series again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stretch {
    read: Read,
    bar: u64,
    /// The stretch going on at the last point read: since when.
    open: Option<Micros>,
    best: (Micros, Micros),
}

impl Stretch {
    /// The longest stretch of `s` at or above `bar` (and above zero); one still open at the series' last
    /// point lasts to `end`. (0, 0) when there is none.
    pub fn longest(&mut self, s: &Series, bar: u64, end: Micros) -> (Micros, Micros) {
        if !self.read.continues(s) || self.bar != bar {
            *self = Stretch {
                bar,
                ..Stretch::default()
            };
        }
        for &(at, v) in &s.points()[self.read.count..] {
            match (self.open, v > 0 && v >= bar) {
                (None, true) => self.open = Some(at),
                (Some(from), false) => {
                    self.best = longer(self.best, from, at);
                    self.open = None;
                }
                _ => {}
            }
        }
        self.read.read_all(s);
        // The run's end, not the series' last point: a stretch still open is so far, and is read on.
        match self.open {
            Some(from) => longer(self.best, from, end.max(from)),
            None => self.best,
        }
    }
}

/// `best`, or the stretch from `from` to `to` where it is longer (the earlier of two as long).
fn longer(best: (Micros, Micros), from: Micros, to: Micros) -> (Micros, Micros) {
    if to.saturating_sub(from) > best.1 {
        (from, to - from)
    } else {
        best
    }
}

/// What the analysis of a run has read of it, kept between looks at a run in progress: the job's
/// [`Maxima`] per GPU (its index) and each process' [`Stretch`] (by GPU and pid). A fresh one reads the
/// run from its start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Running {
    jobs: BTreeMap<u32, Maxima>,
    highs: BTreeMap<(u32, u32), Stretch>,
}

impl Running {
    /// GPU `gpu`'s job series, as read so far.
    pub fn job(&mut self, gpu: u32) -> &mut Maxima {
        self.jobs.entry(gpu).or_default()
    }

    /// The stretches process `pid` on GPU `gpu` stayed high, as read so far.
    pub fn high(&mut self, gpu: u32, pid: u32) -> &mut Stretch {
        self.highs.entry((gpu, pid)).or_default()
    }

    /// Forgets the GPUs and processes a timeline no longer has.
    pub fn keep_only(&mut self, t: &super::Timeline) {
        self.jobs
            .retain(|gpu, _| t.gpus.iter().any(|g| g.info.index == *gpu));
        self.highs.retain(|k, _| t.procs.contains_key(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a sparkline's buckets hold, read point by point from the start: the reference.
    fn buckets_read_whole(s: &Series, end: Micros, buckets: usize) -> Vec<u64> {
        let width = (end / buckets as u64).max(1);
        (0..buckets as u64)
            .map(|b| {
                let lo = b * width;
                let hi = if b + 1 == buckets as u64 {
                    u64::MAX
                } else {
                    lo + width
                };
                let inside = s.points().iter().filter(|p| p.0 >= lo && p.0 < hi);
                inside
                    .map(|p| p.1)
                    .fold(s.value_at(lo).unwrap_or(0), u64::max)
            })
            .collect()
    }

    /// The longest stretch at or above `bar` (and above zero), read point by point: the reference.
    fn stretch_read_whole(s: &Series, bar: u64, end: Micros) -> (Micros, Micros) {
        let (mut best, mut open) = ((0, 0), None);
        for &(at, v) in s.points() {
            match (open, v > 0 && v >= bar) {
                (None, true) => open = Some(at),
                (Some(from), false) => (best, open) = (longer(best, from, at), None),
                _ => {}
            }
        }
        open.map_or(best, |from| longer(best, from, end.max(from)))
    }

    /// Memory that rises in steps and falls back, drops to zero now and then, flickers at every sample
    /// and spikes now and then, thinned at 300 points as the sampler thins at its MAX_POINTS: its points
    /// are rewritten every few dozen samples (a block's points are others then), and its peak (so a
    /// stretch's bar) moves as it rises.
    fn sample(s: &mut Series, i: u64) {
        let level = if i % 900 < 40 {
            0
        } else {
            100 + (i / 250) % 40
        };
        let spike = if i.is_multiple_of(1009) {
            300 + i / 100
        } else {
            0
        };
        s.push(i * 10, level + (i * 7919) % 13 + spike);
        s.thin_to(300);
    }

    #[test]
    fn maxima_and_stretches_read_look_by_look_are_what_a_whole_reading_gives() {
        let (mut s, mut read) = (Series::default(), Running::default());
        for i in 0..20_000u64 {
            sample(&mut s, i);
            if i % 61 != 0 && i % 97 != 0 {
                continue;
            }
            let end = i * 10 + 5;
            let job = read.job(0);
            job.feed(&s);
            assert_eq!(
                job.bucket_max(&s, end, 120),
                buckets_read_whole(&s, end, 120),
                "{i}"
            );
            // Half-way to the peak, as a report's bar; near the peak, whose points above it change as
            // it rises; and a bar of its own.
            for (pid, bar) in [(1, s.peak() / 2), (2, s.peak().saturating_sub(8)), (3, 105)] {
                let got = read.high(0, pid).longest(&s, bar, end);
                assert_eq!(
                    got,
                    stretch_read_whole(&s, bar, end),
                    "sample {i}, bar {bar}"
                );
            }
        }
        assert!(s.rewrites() > 20, "{}", s.rewrites());
    }

    #[test]
    fn what_was_read_of_another_series_is_read_again() {
        let (mut a, mut b) = (Series::default(), Series::default());
        for i in 0..1_000u64 {
            a.push(i, i % 10);
        }
        for i in 0..600u64 {
            b.push(i, if i == 500 { 99 } else { i % 10 });
        }
        let mut m = Maxima::default();
        m.feed(&a);
        assert_eq!(m.bucket_max(&a, 1_000, 2), vec![9, 9]);
        // Another series in its place (a GPU of another identity at that position): fewer points, or
        // not the last one read where it was, and it is read from its start.
        m.feed(&b);
        assert_eq!(m.bucket_max(&b, 1_000, 2), vec![9, 99]);
        let mut s = Stretch::default();
        assert_eq!(s.longest(&a, 9, 2_000), (999, 1_001));
        assert_eq!(s.longest(&b, 9, 2_000), stretch_read_whole(&b, 9, 2_000));
        assert_eq!(s.longest(&b, 9, 2_000), (599, 1_401));
    }
}
