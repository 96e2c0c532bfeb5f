//! Growth found from the job's memory over time alone, where no optimizer step explains it: an inference
//! loop that keeps every output's autograd graph, an evaluation after training that keeps its outputs on
//! the GPU, a cache that never stops filling. A pure function over a timeline (`(seconds, bytes)` points:
//! the job's memory on one GPU, each point the highest it held in a slice of the run).
//!
//! What must stay silent, and the shape that tells it apart: a model load (a ramp, then flat while the model
//! runs), a healthy loop (flat after its warm-up), a program whose memory goes up and comes back. So growth
//! is said only when it runs straight (a line fits), never falls back by much, lasts a while (the slices
//! and seconds below) and is still rising at the end of the stretch, but for a short pause (the program's
//! exit: the caller cuts the stretch at the shim's exit record where there is one). A load followed by
//! the program's exit after a pause that short has the same shape: NVML alone can't tell them apart.

/// Growth that ran up to the end of a stretch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Growth {
    /// When it started and the last moment the job held memory in the stretch, seconds into the run.
    pub from_s: f64,
    pub to_s: f64,
    /// The level it started from and the level it reached.
    pub from_bytes: u64,
    pub to_bytes: u64,
    /// Least-squares slope, bytes per second, and how well the line fits (R²).
    pub rate: f64,
    pub r2: f64,
}

impl Growth {
    pub fn bytes(&self) -> u64 {
        self.to_bytes.saturating_sub(self.from_bytes)
    }

    pub fn secs(&self) -> f64 {
        self.to_s - self.from_s
    }
}

// The shape of growth, from the table of parameters (what each decides is said there).
use crate::params;
const MIN_POINTS: usize = params::GROWTH_MIN_SLICES.uint() as usize;
const MIN_SHARE: usize = params::GROWTH_MIN_SHARE.uint() as usize;
pub const MIN_SECS: f64 = params::GROWTH_MIN_S.float();
pub const MIN_SECS_AFTER_STEPS: f64 = params::GROWTH_MIN_S_AFTER_STEPS.float();
const MIN_R2: f64 = params::GROWTH_MIN_R2.float();
const NOISE: u64 = params::GROWTH_NOISE.uint();
const PLATEAU: usize = params::GROWTH_PLATEAU_SLICES.uint() as usize;
const PLATEAU_SHARE: usize = params::GROWTH_PLATEAU_SHARE.uint() as usize;

/// The growth that runs to the end of `points` (a stretch of the job's memory with no optimizer step):
/// from the end of the first plateau (what rose before it was a load, or a level that growth left), or
/// from the last time the memory
/// came back, whichever is later; `None` when the memory is flat, comes back at the end, or rises in a way
/// that is no steady growth.
pub fn find(points: &[(f64, u64)], min_secs: f64) -> Option<Growth> {
    let first = points.iter().position(|p| p.1 > 0)?;
    let last = points.iter().rposition(|p| p.1 > 0)?;
    let held = &points[first..=last];
    let held = &held[..held.len() - pause(held)];
    let start = restart(held, plateau_end(held).unwrap_or(0));
    let s = &held[start..];
    (s.len() >= MIN_POINTS && s.len() * MIN_SHARE >= held.len())
        .then(|| steady(s, min_secs))
        .flatten()
}

/// Slices at the end that stay at the last level, when they are few (two, or a twentieth of the stretch):
/// the program's last pause and exit, left out so growth up to them is judged by its own end. More is a
/// plateau, and the growth ended there.
fn pause(held: &[(f64, u64)]) -> usize {
    let end = held[held.len() - 1].1;
    let flat = held
        .iter()
        .rev()
        .skip(1)
        .take_while(|p| p.1 <= end && end - p.1 <= NOISE)
        .count();
    if flat <= 2.max(held.len() / 20) {
        flat
    } else {
        0
    }
}

/// The last slice of the first plateau: flat (within the noise) for `PLATEAU` slices and a tenth of the
/// stretch, and for as long as it stays so.
fn plateau_end(held: &[(f64, u64)]) -> Option<usize> {
    let width = PLATEAU.max(held.len() / PLATEAU_SHARE);
    let range = |w: &[(f64, u64)]| {
        w.iter()
            .fold((u64::MAX, 0), |(a, b), p| (a.min(p.1), b.max(p.1)))
    };
    let at = held.windows(width).position(|w| {
        let (lo, hi) = range(w);
        hi - lo <= NOISE
    })?;
    let mut end = at + width - 1;
    while end + 1 < held.len() {
        let (lo, hi) = range(&held[at..=end + 1]);
        if hi - lo > NOISE {
            break;
        }
        end += 1;
    }
    Some(end)
}

/// Where growth counts from, given it may start at `start`: the last slice where the memory came back by
/// more than half of what it had risen since (a floor that keeps rising under periodic peaks does not).
fn restart(held: &[(f64, u64)], mut start: usize) -> usize {
    let mut top = held[start].1;
    for (i, p) in held.iter().enumerate().skip(start) {
        top = top.max(p.1);
        if top - p.1 > NOISE.max((top - held[start].1) / 2) {
            start = i;
            top = p.1;
        }
    }
    start
}

/// `s` as steady growth: a line that fits, lasting long enough, and still rising over its last quarter
/// and its last tenth at half its rate or more (a cache that fills ever more slowly does not). The tails'
/// rates are the median of their points' pairwise slopes: a slice that caught a forward pass's temporaries
/// at their height (NVML sees them come and go where the allocator gives memory back, under
/// `empty_cache()` or a machine's stall between an allocation and its free) sways a least-squares line
/// over a few slices, not the median.
fn steady(s: &[(f64, u64)], min_secs: f64) -> Option<Growth> {
    let (from, to) = (s[0], s[s.len() - 1]);
    if to.1 <= from.1 || to.0 - from.0 < min_secs {
        return None;
    }
    let (rate, r2) = line(s);
    if r2 < MIN_R2 || rate <= 0.0 {
        return None;
    }
    for tail in [s.len() / 4, s.len() / 10] {
        let tail = &s[s.len() - tail.max(3)..];
        if median_slope(tail) < rate / 2.0 {
            return None;
        }
    }
    Some(Growth {
        from_s: from.0,
        to_s: to.0,
        from_bytes: from.1,
        to_bytes: to.1,
        rate,
        r2,
    })
}

/// The Theil-Sen slope: the median of the slopes between every two points (bytes per second).
fn median_slope(s: &[(f64, u64)]) -> f64 {
    let mut slopes: Vec<f64> = s
        .iter()
        .enumerate()
        .flat_map(|(i, a)| s[i + 1..].iter().map(move |b| (a, b)))
        .filter(|(a, b)| b.0 > a.0)
        .map(|(a, b)| (b.1 as f64 - a.1 as f64) / (b.0 - a.0))
        .collect();
    if slopes.is_empty() {
        return 0.0;
    }
    slopes.sort_by(f64::total_cmp);
    slopes[slopes.len() / 2]
}

fn line(s: &[(f64, u64)]) -> (f64, f64) {
    fit(&s.iter().map(|&(t, v)| (t, v as f64)).collect::<Vec<_>>())
}

/// Least-squares slope and R² of y over x.
pub fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    if points.len() < 3 {
        return (0.0, 0.0);
    }
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), &(x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for &(x, y) in points {
        sxx += (x - mx) * (x - mx);
        sxy += (x - mx) * (y - my);
        syy += (y - my) * (y - my);
    }
    if sxx == 0.0 {
        return (0.0, 0.0);
    }
    let slope = sxy / sxx;
    let r2 = if syy == 0.0 {
        0.0
    } else {
        (sxy * sxy) / (sxx * syy)
    };
    (slope, r2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_straight_line_fits_exactly() {
        let (slope, r2) = fit(&[(1.0, 10.0), (2.0, 12.0), (3.0, 14.0), (4.0, 16.0)]);
        assert!((slope - 2.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
        let (slope, _) = fit(&[(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)]);
        assert_eq!(slope, 0.0);
    }

    const GIB: f64 = (1u64 << 30) as f64;

    /// Growth in a run without steps.
    fn no_steps(points: &[(f64, u64)]) -> Option<Growth> {
        find(points, MIN_SECS)
    }

    /// A timeline sampled every `dt` seconds from GiB values.
    fn series(dt: f64, gib: &[f64]) -> Vec<(f64, u64)> {
        gib.iter()
            .enumerate()
            .map(|(i, &g)| (i as f64 * dt, (g * GIB) as u64))
            .collect()
    }

    /// `n` values from `a` to `b` in a straight line.
    fn ramp(a: f64, b: f64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| a + (b - a) * i as f64 / (n - 1) as f64)
            .collect()
    }

    fn flat(v: f64, n: usize) -> Vec<f64> {
        vec![v; n]
    }

    fn cat(parts: &[Vec<f64>]) -> Vec<f64> {
        parts.concat()
    }

    #[test]
    fn a_streaming_loop_that_keeps_its_graphs_grows_from_the_start() {
        // The H200's inference loop without no_grad: nothing, a context, then 0.5 -> 17.8 GiB in 13 s,
        // a pause as the program exits, then the process is gone (the timeline drops to 0).
        let gib = cat(&[
            flat(0.0, 25),
            flat(0.5, 2),
            ramp(0.6, 17.8, 88),
            flat(17.8, 4),
            flat(0.0, 1),
        ]);
        let g = no_steps(&series(0.15, &gib)).expect("growth");
        assert!((g.to_bytes as f64 / GIB - 17.8).abs() < 0.01, "{g:?}");
        assert!(g.bytes() as f64 > 16.0 * GIB, "{g:?}");
        let rate = g.rate / GIB;
        assert!((1.2..1.45).contains(&rate), "{rate} GiB/s");
        assert!(g.r2 > 0.99 && g.secs() > 12.0, "{g:?}");
    }

    #[test]
    fn a_leak_whose_slices_caught_some_forward_passes_at_their_height_still_grows() {
        // tests/phases.rs' inference loop: 45 batches 0.15 s apart, each 2 GiB of temporaries given back
        // but 0.25 GiB; NVML caught two of the last few passes at their height (a stall between the
        // allocation and its free), and the least-squares slope of the last tenth came out negative.
        let mut gib = cat(&[flat(1.0, 2), ramp(1.25, 12.25, 176)]);
        let n = gib.len();
        for i in [n - 17, n - 15] {
            gib[i] += 1.75;
        }
        let g = no_steps(&series(0.04, &gib)).expect("growth");
        assert!(g.bytes() as f64 > 10.0 * GIB, "{g:?}");
    }

    #[test]
    fn a_load_ramp_is_left_out_once_a_plateau_ends_it() {
        // 20 GiB of weights in 2 s, 3 s flat, then a slow leak of 5 GiB over 15 s.
        let gib = cat(&[ramp(0.5, 20.0, 20), flat(20.0, 30), ramp(20.0, 25.0, 150)]);
        let g = no_steps(&series(0.1, &gib)).expect("growth");
        assert!(g.from_s >= 2.0, "starts after the load: {g:?}");
        assert!((g.bytes() as f64 / GIB - 5.0).abs() < 0.1, "{g:?}");
    }

    #[test]
    fn healthy_shapes_stay_silent() {
        let cases = [
            // A healthy inference loop: the cache warms up, then flat to the end.
            (
                "warm-up then flat",
                cat(&[ramp(0.5, 6.0, 15), flat(6.0, 100)]),
            ),
            // A model load: a ramp, then flat while it serves.
            (
                "load then flat",
                cat(&[ramp(0.5, 60.0, 40), flat(60.0, 80)]),
            ),
            // Loaded, then a short run of the model before exit: flat for a tenth of the run.
            (
                "load then a short run",
                cat(&[ramp(0.5, 60.0, 100), flat(60.0, 12)]),
            ),
            // Up and back down before the end.
            (
                "up and back",
                cat(&[ramp(0.5, 30.0, 50), ramp(30.0, 1.0, 10), flat(1.0, 50)]),
            ),
            // A sawtooth: an evaluation every so often, freed after.
            (
                "sawtooth",
                (0..120)
                    .map(|i| if i % 20 >= 15 { 40.0 } else { 5.0 })
                    .collect(),
            ),
            // A step up at the end (outputs gathered once).
            ("late step", cat(&[flat(5.0, 110), flat(9.0, 10)])),
            // A cache that fills ever more slowly (a line fits it with R² 0.94).
            (
                "saturating",
                (0..120)
                    .map(|i| 10.0 * (1.0 - (-(i as f64) / 60.0).exp()))
                    .collect(),
            ),
            // Rising, but ragged: 3 GiB up and down at every slice around a 12 GiB rise.
            (
                "ragged",
                (0..120)
                    .map(|i| 0.1 * i as f64 + 3.0 * (i % 2) as f64)
                    .collect(),
            ),
            // Growth too small to be more than the allocator's noise.
            ("noise", ramp(5.0, 5.05, 120)),
            // Flat from start to end (JAX's preallocation).
            ("flat", flat(104.8, 120)),
        ];
        for (what, gib) in cases {
            assert_eq!(no_steps(&series(0.25, &gib)), None, "{what}");
        }
    }

    #[test]
    fn growth_must_last() {
        // A straight rise over one second: a program loading, not a leak.
        assert_eq!(no_steps(&series(0.01, &ramp(0.5, 10.0, 100))), None);
        // Loaded, flat, then growth over too small a share of the run (a fifth; a third is enough).
        let late = |n| cat(&[ramp(0.5, 10.0, 5), flat(10.0, 120 - n), ramp(10.0, 20.0, n)]);
        assert_eq!(no_steps(&series(1.0, &late(25))), None);
        let g = no_steps(&series(1.0, &late(40))).expect("growth");
        assert!(g.from_s > 80.0, "{g:?}");
        // The same without the load: growth counts from the end of the level it left.
        let g =
            no_steps(&series(1.0, &cat(&[flat(10.0, 80), ramp(10.0, 20.0, 40)]))).expect("growth");
        assert!(g.from_s >= 79.0, "{g:?}");
    }

    #[test]
    fn memory_that_came_back_starts_the_count_again() {
        // Up to 30 GiB, back to 5 GiB for a moment, then up from there.
        let gib = cat(&[ramp(0.5, 30.0, 60), flat(5.0, 1), ramp(30.0, 60.0, 59)]);
        let g = no_steps(&series(0.5, &gib)).expect("growth");
        assert!(g.from_s >= 30.0, "{g:?}");
        // A floor that keeps rising under periodic peaks (each coming back by 2.7 GiB) is growth.
        let saw: Vec<f64> = (0..120)
            .map(|i| 0.3 * i as f64 + 0.3 * (i % 10) as f64)
            .collect();
        let g = no_steps(&series(0.5, &saw)).expect("growth");
        assert!(g.from_s < 6.0, "{g:?}");
    }

    #[test]
    fn growth_that_bends_is_said_only_while_a_line_still_fits() {
        // Quadratic, as a cache that grows with the sequence length: a line fits with R² 0.95.
        let quad: Vec<f64> = (0..120)
            .map(|i| 0.5 + 30.0 * (i as f64 / 120.0).powi(2))
            .collect();
        assert!(no_steps(&series(0.25, &quad)).is_some());
        // A load that flows straight into a slower rise: no one line (R² 0.71), and no rate to give.
        let knee: Vec<f64> = (0..120)
            .map(|i| match i {
                0..12 => 0.5 + 20.0 * i as f64 / 12.0,
                _ => 20.5 + 10.0 * (i - 12) as f64 / 108.0,
            })
            .collect();
        assert_eq!(no_steps(&series(0.25, &knee)), None);
    }

    #[test]
    fn an_evaluation_that_keeps_its_outputs_grows_in_uneven_stairs() {
        // The job's memory after the last step of the fake evaluation (tests/phases.rs, eval_oom): 4 GiB
        // kept per batch, one bucket of 29 ms each, the scheduler's jitter making some stairs 4 or 5
        // buckets long; then the OOM and the exit's pause.
        let gib = [
            3.5, 5.5, 9.5, 9.5, 9.5, 13.5, 13.5, 13.5, 17.5, 17.5, 21.5, 21.5, 21.5, 25.5, 25.5,
            29.5, 29.5, 29.5, 29.5, 33.5, 37.5, 37.5, 41.5, 41.5, 41.5, 45.5, 45.5, 45.5, 49.5,
            49.5, 53.5, 53.5, 53.5, 57.5, 57.5, 57.5, 57.5, 57.5, 61.5, 61.5, 61.5, 65.5, 65.5,
            69.5, 69.5, 69.5, 73.5, 73.5, 77.5, 77.5, 81.5, 81.5, 81.5, 85.5, 85.5, 89.5, 89.5,
            89.5, 93.5, 93.5, 97.5, 97.5, 97.5, 101.5, 101.5, 105.5, 105.5, 105.5, 109.5, 109.5,
            113.5, 113.5, 113.5, 117.5, 117.5, 121.5, 121.5, 121.5, 125.5, 125.5, 129.5, 129.5,
            129.5, 133.5, 133.5, 137.5, 137.5, 137.5, 137.5, 137.5,
        ];
        let points = series(0.0294, &gib);
        let g = find(&points, MIN_SECS_AFTER_STEPS).expect("growth");
        assert_eq!(
            (g.from_bytes, g.to_bytes),
            ((3.5 * GIB) as u64, (137.5 * GIB) as u64)
        );
        // The same 2.5 s with no step before it would be too short to tell from a load.
        assert_eq!(find(&points[..70], MIN_SECS), None);
    }

    #[test]
    fn stairs_that_keep_climbing_are_growth() {
        // 512 MiB more every 6 slices (a large tensor kept per iteration).
        let gib: Vec<f64> = (0..120).map(|i| 2.0 + 0.5 * (i / 6) as f64).collect();
        let g = no_steps(&series(1.0, &gib)).expect("growth");
        assert!(g.r2 > 0.95, "{g:?}");
    }
}
