//! The search for the largest value that fits (pure): the runs so far bracket the answer (`lo` fits, `hi`
//! ran out of memory), and the measured peaks of the runs that fit give a line, peak ≈ a + b·value, that
//! says where the memory limit is crossed. The search jumps there, then verifies the boundary; a jump the
//! runs contradict is followed by one plain step (doubling, or halving the bracket; the next value when the
//! last run fitted with less room left than one unit takes), and runs that keep creeping up make the steps
//! double, so a model that does not hold (memory that grows faster than linearly, peaks flat under the
//! limit) costs at most about twice the runs of a bisection.

use serde::{Deserialize, Serialize};

/// peak ≈ a + b·value, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Line {
    /// Bytes at value 0: the model, the CUDA context, what does not grow with the value.
    pub a_bytes: f64,
    /// Bytes per unit of the value.
    pub b_bytes: f64,
}

impl Line {
    /// The least-squares line through (value, peak) points: `None` with fewer than two distinct values, or
    /// when memory does not grow with the value (then it tells nothing of where the limit is).
    pub fn fit(points: &[(u64, u64)]) -> Option<Line> {
        let n = points.len() as f64;
        let mx = points.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let my = points.iter().map(|p| p.1 as f64).sum::<f64>() / n;
        let sxx: f64 = points.iter().map(|p| (p.0 as f64 - mx).powi(2)).sum();
        let sxy: f64 = points
            .iter()
            .map(|p| (p.0 as f64 - mx) * (p.1 as f64 - my))
            .sum();
        if points.len() < 2 || sxx <= 0.0 || sxy <= 0.0 {
            return None;
        }
        let b = sxy / sxx;
        Some(Line {
            a_bytes: my - b * mx,
            b_bytes: b,
        })
    }

    /// The predicted peak at `value`.
    pub fn peak(&self, value: u64) -> u64 {
        (self.a_bytes + self.b_bytes * value as f64).max(0.0) as u64
    }

    /// The largest value whose predicted peak stays within `limit` (0 if none does).
    pub fn largest_within(&self, limit: u64) -> u64 {
        let v = (limit as f64 - self.a_bytes) / self.b_bytes;
        if v.is_finite() && v > 0.0 {
            v.floor().min(u64::MAX as f64 / 2.0) as u64
        } else {
            0
        }
    }
}

/// What one run said of its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// It ran without running out of memory; its peak, when measured.
    Fits(Option<u64>),
    Oom,
}

/// The search's state: the bounds asked for, what the runs said, the device's limit.
#[derive(Debug, Clone, Default)]
pub struct Search {
    pub min: u64,
    pub max: u64,
    /// Memory the job may use on its GPU, when known (NVML): the line is read against it.
    pub limit: Option<u64>,
    /// The largest value that fit, and the smallest that ran out of memory.
    pub lo: Option<u64>,
    pub hi: Option<u64>,
    /// (value, peak) of the runs that fit with a measured peak.
    pub points: Vec<(u64, u64)>,
    /// The last run was the line's guess, and its verdict contradicted the line: the next is a plain step.
    contradicted: bool,
    /// The least the next value adds to `lo`, once a run fit less than twice as high as the last `lo`
    /// (the line, or the next value after a full run, crept up): that run's step, and twice the last
    /// stride after each such run; none after a run that doubled `lo` or ran out of memory.
    stride: u64,
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Run this value; `guided`: the line chose it.
    Run { value: u64, guided: bool },
    /// The answer is known: the largest value that fits (`None`: not even `min` does).
    Done(Option<u64>),
}

impl Search {
    pub fn new(min: u64, max: u64, limit: Option<u64>) -> Search {
        Search {
            min,
            max,
            limit,
            ..Default::default()
        }
    }

    /// The line through the peaks so far.
    pub fn line(&self) -> Option<Line> {
        Line::fit(&self.points)
    }

    /// Records what the run at `value` said; `guided`: the line chose that value.
    pub fn record(&mut self, value: u64, v: Verdict, guided: bool) {
        let predicted_fit = self
            .line()
            .zip(self.limit)
            .map(|(l, limit)| l.peak(value) <= limit);
        match v {
            Verdict::Fits(peak) => {
                // Peaks that flatten under the limit (PyTorch's cache filling the GPU long before the
                // job's own need does) make the line say "the next value runs out" at value after value
                // that fits: steps that double when they keep fitting bound the runs to a bisection's.
                self.stride = match self.lo {
                    Some(l) if value < l.saturating_mul(2) => (value.saturating_sub(l))
                        .max(self.stride.saturating_mul(2))
                        .max(1),
                    _ => 0,
                };
                self.lo = Some(self.lo.map_or(value, |l| l.max(value)));
                if let Some(p) = peak {
                    self.points.push((value, p));
                }
            }
            Verdict::Oom => {
                self.hi = Some(self.hi.map_or(value, |h| h.min(value)));
                self.stride = 0;
            }
        }
        self.contradicted = guided && predicted_fit != Some(matches!(v, Verdict::Fits(_)));
    }

    /// The next run, or the answer.
    pub fn next(&self) -> Next {
        let Some(lo) = self.lo else {
            return match self.hi {
                Some(h) if h <= self.min => Next::Done(None),
                // Below a value that ran out: halve towards min.
                Some(h) => Next::Run {
                    value: self.min + (h - self.min) / 2,
                    guided: false,
                },
                None => Next::Run {
                    value: self.min,
                    guided: false,
                },
            };
        };
        let top = self.hi.map_or(self.max, |h| h - 1);
        if lo >= top {
            return Next::Done(Some(lo));
        }
        // After a run that crept up (`stride`): past the values run, steps that double; below a value
        // that ran out, the middle.
        let floor = match self.hi {
            Some(h) if self.stride > 0 => lo + (h - lo) / 2,
            _ => lo.saturating_add(self.stride).min(top),
        };
        if !self.contradicted
            && let Some(g) = self.guess(lo, top)
        {
            return Next::Run {
                value: g.max(floor),
                guided: g >= floor,
            };
        }
        let value = match self.hi {
            Some(h) => lo + (h - lo) / 2,
            None if self.full_at(lo) => lo + 1,
            None => lo.saturating_mul(2).clamp(lo + 1, top),
        };
        Next::Run {
            value: value.max(floor),
            guided: false,
        }
    }

    /// Whether the run at `value` fitted with less room left under the limit than one more unit takes by
    /// the line: near the limit the allocator gives its cache back before it fails, so peaks flatten and
    /// a line that said the value would not fit is wrong by a little, not a lot; the next value is the one
    /// to run, not a doubling.
    fn full_at(&self, value: u64) -> bool {
        let (Some(line), Some(limit)) = (self.line(), self.limit) else {
            return false;
        };
        self.points
            .iter()
            .filter(|p| p.0 == value)
            .any(|p| (limit.saturating_sub(p.1) as f64) < line.b_bytes)
    }

    /// The line's guess of the largest value that fits, within what the runs left open.
    fn guess(&self, lo: u64, top: u64) -> Option<u64> {
        let g = self.line()?.largest_within(self.limit?);
        // A line that says a value that ran out fits is wrong here already: no run at the value below.
        if self.hi.is_some_and(|h| g >= h) {
            return None;
        }
        Some(g.clamp(lo + 1, top))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// Runs a search against a program whose peak at `v` is `peak(v)` and which runs out of memory above
    /// `limit`: the answer and the values run.
    fn play(
        min: u64,
        max: u64,
        limit: u64,
        known_limit: bool,
        peak: impl Fn(u64) -> u64,
    ) -> (Option<u64>, Vec<u64>) {
        let mut s = Search::new(min, max, known_limit.then_some(limit));
        let mut ran = Vec::new();
        loop {
            match s.next() {
                Next::Done(a) => return (a, ran),
                Next::Run { value, guided } => {
                    assert!(!ran.contains(&value), "{value} run twice: {ran:?}");
                    assert!((min..=max).contains(&value), "{value} out of bounds");
                    ran.push(value);
                    let p = peak(value);
                    let v = if p <= limit {
                        Verdict::Fits(Some(p))
                    } else {
                        Verdict::Oom
                    };
                    s.record(value, v, guided);
                }
            }
            assert!(ran.len() < 80, "no end: {ran:?}");
        }
    }

    #[test]
    fn a_linear_program_is_answered_in_four_runs() {
        // 16 GiB of weights, 1.5 GiB a sample, 139.8 GiB usable: 82 fits, 83 does not.
        let (answer, ran) = play(1, 1 << 20, 140 * GIB, true, |v| 16 * GIB + v * 3 * GIB / 2);
        assert_eq!(answer, Some(82));
        assert_eq!(ran, vec![1, 2, 82, 83]);
    }

    #[test]
    fn a_run_that_fits_at_the_limit_is_followed_by_the_next_value_not_a_doubling() {
        // The H200's runs of tests/gpu/fit_model.py (fixtures/fit): near the limit the allocator gives
        // back its cache before it fails, so the peaks flatten under the 139.8 GiB and the line's
        // "98 runs out" is wrong by a little; 98 left 0.3 GiB, less than one more sample takes.
        let limit = 139_800 * GIB / 1000;
        let peak = |v: u64| {
            if v >= 99 {
                limit + 1
            } else {
                (21_030 * GIB / 1000 + v * 1_220 * GIB / 1000).min(139_510 * GIB / 1000)
            }
        };
        let (answer, ran) = play(1, 1 << 20, limit, true, peak);
        assert_eq!(answer, Some(98));
        assert!(ran.len() <= 6 && ran.iter().all(|&v| v <= 99), "{ran:?}");
    }

    #[test]
    fn peaks_flat_under_the_limit_far_below_the_answer_cost_about_a_bisection_not_a_crawl() {
        // PyTorch's cache fills the GPU long before the job's own need does: from 83 on every run peaks
        // 0.3 GiB under the limit (less than a unit's 1.5 GiB: the line says each next value runs out),
        // and the first OOM is at 400. One value at a time was 110 runs (each a real run of the job).
        let limit = 139_800 * GIB / 1000;
        let flat = |at: u64, oom: u64| {
            move |v: u64| {
                if v >= oom {
                    limit + 1
                } else {
                    (16 * GIB + v * 3 * GIB / 2).min(at * GIB / 1000)
                }
            }
        };
        let (answer, ran) = play(1, 1 << 20, limit, true, flat(139_500, 400));
        assert_eq!(answer, Some(399));
        assert!(ran.len() <= 2 * 20, "{} runs: {ran:?}", ran.len());
        // Flat well under the limit: the line's guesses creep up by a few values at a time, each
        // fitting as it said (75 runs to 4999).
        let (answer, ran) = play(1, 1 << 20, limit, true, flat(120_000, 5000));
        assert_eq!(answer, Some(4999));
        assert!(ran.len() <= 2 * 20, "{} runs: {ran:?}", ran.len());
    }

    #[test]
    fn without_a_known_limit_it_doubles_then_bisects() {
        let (answer, ran) = play(1, 1 << 20, 100, false, |v| v);
        assert_eq!(answer, Some(100));
        assert!(ran.len() <= 15, "{ran:?}");
    }

    #[test]
    fn memory_that_grows_faster_than_the_line_still_converges_in_few_runs() {
        // Attention over a sequence: quadratic; the line from small values guesses far too high.
        let (answer, ran) = play(1, 1 << 20, 1 << 30, true, |v| (1 << 20) + v * v * 64);
        let truth = (1..)
            .take_while(|v| (1 << 20) + v * v * 64 <= 1 << 30)
            .last();
        assert_eq!(answer, truth);
        assert!(ran.len() <= 2 * 22, "{ran:?}");
    }

    #[test]
    fn max_that_fits_is_the_answer_without_running_past_it() {
        let (answer, ran) = play(4, 64, 1 << 40, true, |v| 1000 + v);
        assert_eq!(answer, Some(64));
        assert!(ran.iter().all(|&v| v <= 64));
    }

    #[test]
    fn when_min_runs_out_nothing_fits() {
        let (answer, ran) = play(8, 64, 10, true, |v| 100 + v);
        assert_eq!((answer, ran), (None, vec![8]));
    }

    #[test]
    fn a_line_needs_two_values_and_growth() {
        assert_eq!(Line::fit(&[(1, 10)]), None);
        assert_eq!(Line::fit(&[(1, 10), (2, 10)]), None);
        let l = Line::fit(&[(1, 12), (2, 14), (3, 16)]).unwrap();
        assert_eq!((l.a_bytes, l.b_bytes), (10.0, 2.0));
        assert_eq!(l.largest_within(31), 10);
        assert_eq!(l.largest_within(5), 0);
    }
}
