//! Notebook cells, the framework view's clock where there are no optimizer steps: the shim's `cell`
//! records (IPython's post_run_cell, in a kernel under `gpudoc run`, or the notebook extension's trace of
//! a moment) give each cell's start and end, the allocator then, and its peaks inside the cell. From them
//! the report places an OOM or a peak in a cell, and a cell whose every run leaves more allocated is found
//! like a step leak.

use serde::{Deserialize, Serialize};

/// Cells kept per process and device; past this, the oldest are dropped.
pub const MAX_CELLS: usize = 4096;
/// A run that left at least this much more allocated than it found grew (`param.cell_grew_bytes`).
pub const GREW_BYTES: u64 = crate::params::CELL_GREW.uint();

/// One run of a notebook cell on one device.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Cell {
    /// IPython's execution count (`In [n]`).
    pub n: u64,
    /// The cell, hashed (its notebook id, else its source): the runs of one cell share it.
    pub id: String,
    /// Its first line of code.
    pub source: String,
    /// It ended without an exception.
    pub ok: bool,
    /// When it started and ended, seconds since the run started.
    pub start_s: f64,
    pub end_s: f64,
    /// PyTorch's allocated and reserved memory at its start and at its end.
    pub allocated_start_bytes: u64,
    pub reserved_start_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The peaks inside it (`null` where they are not known: with `--keep-torch-peaks`, a peak that did
    /// not rise in the cell).
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
}

impl Cell {
    /// Reads a `cell` message; `start_unix` turns its times into run time.
    pub fn from_message(v: &serde_json::Value, start_unix: f64) -> Cell {
        let u = |k: &str| v.get(k).and_then(|x| x.as_u64());
        let t = |k: &str| {
            v.get(k)
                .and_then(|x| x.as_f64())
                .map_or(0.0, |x| (x - start_unix).max(0.0))
        };
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        Cell {
            n: u("n").unwrap_or(0),
            id: s("id"),
            source: s("src"),
            ok: u("ok") != Some(0),
            start_s: t("t0"),
            end_s: t("t"),
            allocated_start_bytes: u("a0").unwrap_or(0),
            reserved_start_bytes: u("r0").unwrap_or(0),
            allocated_bytes: u("a").unwrap_or(0),
            reserved_bytes: u("r").unwrap_or(0),
            peak_allocated_bytes: u("pa"),
            peak_reserved_bytes: u("pr"),
        }
    }

    /// How a user names it: `cell 12` (`y = model(x)`).
    pub fn label(&self) -> String {
        if self.source.is_empty() {
            format!("cell {}", self.n)
        } else {
            format!("cell {} (`{}`)", self.n, self.source)
        }
    }

    /// Allocated memory it left behind (negative: it freed).
    pub fn growth(&self) -> i64 {
        self.allocated_bytes as i64 - self.allocated_start_bytes as i64
    }
}

/// The cell running at `at_s` (its end included: an error's text comes just after its record).
pub fn at(cells: &[Cell], at_s: f64) -> Option<&Cell> {
    cells
        .iter()
        .rev()
        .find(|c| c.start_s <= at_s && at_s <= c.end_s + 0.5)
}

/// A cell whose last runs each left more allocated than they found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CellLeak {
    /// The cell, by its first line (`outs.append(model(x))`), else its last number (cell 12).
    pub label: String,
    /// The growing runs (the last ones of that cell) and their execution counts.
    pub runs: u64,
    pub numbers: Vec<u64>,
    pub bytes_per_run: f64,
    pub total_bytes: u64,
}

/// The cell whose trailing runs grew the most in all, if any grew twice or more.
pub fn leak(cells: &[Cell]) -> Option<CellLeak> {
    let mut ids: Vec<&str> = cells.iter().map(|c| c.id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    ids.into_iter()
        .filter_map(|id| {
            let runs: Vec<&Cell> = cells.iter().filter(|c| c.id == id).collect();
            let grown: Vec<&Cell> = runs
                .iter()
                .rev()
                .take_while(|c| c.growth() >= GREW_BYTES as i64)
                .copied()
                .collect();
            let total: u64 = grown.iter().map(|c| c.growth() as u64).sum();
            let last = runs.last()?;
            (grown.len() >= 2).then(|| CellLeak {
                label: if last.source.is_empty() {
                    format!("cell {}", last.n)
                } else {
                    format!("`{}`", last.source)
                },
                runs: grown.len() as u64,
                numbers: grown.iter().rev().map(|c| c.n).collect(),
                bytes_per_run: total as f64 / grown.len() as f64,
                total_bytes: total,
            })
        })
        .max_by_key(|l| l.total_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Python constant of the notebook extension (`NAME = 3`, `NAME = 1 << 20`).
    fn notebook_constant(name: &str) -> u64 {
        let src = include_str!("../../python/gpudoc/notebook.py");
        let line = src
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("no {name} in notebook.py"));
        let n = |s: &str| s.trim().parse::<u64>().unwrap();
        match line.split_once("<<") {
            Some((a, b)) => n(a) << n(b),
            None => n(line),
        }
    }

    #[test]
    fn the_notebook_extension_counts_a_cells_growth_by_the_same_parameters() {
        assert_eq!(notebook_constant("GREW"), crate::params::CELL_GREW.uint());
        assert_eq!(
            notebook_constant("LEAK_RUNS"),
            crate::params::CELL_LEAK_RUNS.uint()
        );
    }

    fn run(n: u64, id: &str, a0: u64, a: u64) -> Cell {
        Cell {
            n,
            id: id.into(),
            source: format!("src {id}"),
            ok: true,
            start_s: n as f64,
            end_s: n as f64 + 0.5,
            allocated_start_bytes: a0,
            allocated_bytes: a,
            ..Default::default()
        }
    }

    #[test]
    fn a_cell_that_grows_at_each_of_its_last_runs_leaks_and_one_that_frees_does_not() {
        const G: u64 = 1 << 30;
        let cells = vec![
            run(1, "load", 0, 4 * G),
            run(2, "step", 4 * G, 4 * G),
            run(3, "step", 4 * G, 5 * G),
            run(4, "other", 5 * G, 5 * G),
            run(5, "step", 5 * G, 6 * G),
            run(6, "step", 6 * G, 7 * G),
            run(7, "reassign", 7 * G, 7 * G),
        ];
        let l = leak(&cells).unwrap();
        assert_eq!(l.runs, 3, "the run that grew nothing ends the streak");
        assert_eq!(l.numbers, vec![3, 5, 6]);
        assert_eq!(l.total_bytes, 3 * G);
        assert_eq!(l.label, "`src step`");
        // The same cell, whose last run gave its memory back, leaks no more.
        let mut healed = cells.clone();
        healed.push(run(8, "step", 7 * G, 3 * G));
        assert_eq!(leak(&healed), None);
    }

    #[test]
    fn an_instant_is_placed_in_the_cell_running_then() {
        let cells = vec![run(1, "a", 0, 0), run(2, "b", 0, 0)];
        assert_eq!(at(&cells, 2.2).map(|c| c.n), Some(2));
        assert_eq!(at(&cells, 1.9).map(|c| c.n), Some(1), "just after its end");
        assert_eq!(at(&cells, 0.5), None);
    }
}
