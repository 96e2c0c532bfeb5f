//! `gpudoc watch`: every GPU and every process holding memory, judged as `gpudoc orphans` judges them,
//! and diagnosed by the rules with `look = true` on the facts of the look (`rules::look`). A [`Frame`] is
//! one look; it renders as a terminal screen, a JSON line or CSV rows, and as Prometheus metrics. Pure:
//! the loop, the terminal and the keys are in `commands/watch.rs`.

use crate::gpu::GpuInfo;
use crate::metrics::{GpuView, ProcView, View};
use crate::orphans::{Holder, Listing, Verdict};
use crate::paint::Paint;
use crate::rules::RuleSet;
use crate::rules::facts::Facts;
use crate::rules::look::GpuNow;
use crate::units::{fmt_bytes, printable, shorten};
use crate::verdict::{Diagnosis, Severity};
use serde::Serialize;
use std::fmt::Write;

/// One look at the machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Frame {
    pub gpus: Vec<GpuLine>,
    pub processes: Vec<Holder>,
    pub diagnoses: Vec<Diagnosis>,
    /// Rules that failed on this look's facts, with why (as a run's `rule_errors`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rule_errors: Vec<String>,
    /// What runs in progress (`gpudoc run`) forecast: when a GPU will be full.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub forecasts: Vec<RunForecast>,
    /// Why NVML could not be asked, if it could not.
    pub nvml_error: Option<String>,
}

/// A GPU a run in progress forecasts full.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunForecast {
    pub gpu: u32,
    /// Seconds from this look until it is full.
    pub full_in_s: f64,
    /// The run's gpudoc, its command, and the rule that forecast it.
    pub pid: u32,
    pub command: String,
    pub rule: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct GpuLine {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// How the process table is sorted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sort {
    #[default]
    Memory,
    Pid,
    Gpu,
    Verdict,
}

impl Sort {
    pub fn next(self) -> Sort {
        match self {
            Sort::Memory => Sort::Pid,
            Sort::Pid => Sort::Gpu,
            Sort::Gpu => Sort::Verdict,
            Sort::Verdict => Sort::Memory,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Sort::Memory => "memory",
            Sort::Pid => "pid",
            Sort::Gpu => "gpu",
            Sort::Verdict => "verdict",
        }
    }
}

impl Frame {
    /// The frame of a listing, diagnosed by `rules` (the look rules); `me` is the watcher's uid (its
    /// processes are "the job", other uids' are "others'").
    pub fn of(listing: Listing, gpus: &[GpuInfo], me: u32, rules: &RuleSet) -> Frame {
        let gpus: Vec<GpuLine> = gpus
            .iter()
            .map(|g| GpuLine {
                index: g.index,
                name: g.name.clone(),
                uuid: g.uuid.clone(),
                used_bytes: listing
                    .gpu_used
                    .iter()
                    .find(|u| u.0 == g.index)
                    .map_or(0, |u| u.1),
                total_bytes: g.total_bytes,
            })
            .collect();
        let now: Vec<GpuNow> = gpus
            .iter()
            .map(|g| GpuNow {
                index: g.index,
                name: &g.name,
                used_bytes: g.used_bytes,
                total_bytes: g.total_bytes,
            })
            .collect();
        let (diagnoses, rule_errors) = rules.evaluate(&Facts::of_look(&now, &listing.holders, me));
        Frame {
            gpus,
            processes: listing.holders,
            diagnoses,
            rule_errors,
            forecasts: Vec::new(),
            nvml_error: listing.nvml_error,
        }
    }

    /// Adds what the runs in progress forecast, seen at `now_unix_s`: each as a `forecast` diagnosis.
    pub fn with_runs(&mut self, runs: &[crate::runs::Published], now_unix_s: f64) {
        for r in runs {
            let at_s = now_unix_s - r.started_unix_s;
            for f in &r.forecasts {
                let now = crate::verdict::Estimate { at_s, ..f.last };
                let mut d = diagnosis(
                    "forecast",
                    Severity::Warn,
                    "A run in progress forecasts this GPU full",
                    crate::ident::GpuRef::new(None, f.gpu).to_string(),
                    format!(
                        "{} (gpudoc run, pid {}, {}: {})",
                        f.words(&now),
                        r.pid,
                        f.rule,
                        shorten(&printable(&r.command), 60)
                    ),
                );
                d.gpu = Some(crate::ident::GpuRef::new(None, f.gpu));
                self.diagnoses.push(d);
                self.forecasts.push(RunForecast {
                    gpu: f.gpu,
                    full_in_s: now.full_in_s().max(0.0),
                    pid: r.pid,
                    command: r.command.clone(),
                    rule: f.rule.clone(),
                });
            }
        }
    }

    /// The processes in the order asked.
    pub fn sorted(&self, sort: Sort) -> Vec<&Holder> {
        let mut v: Vec<&Holder> = self.processes.iter().collect();
        match sort {
            Sort::Memory => v.sort_by_key(|h| std::cmp::Reverse(h.total_bytes())),
            Sort::Pid => v.sort_by_key(|h| h.pid),
            Sort::Gpu => v.sort_by_key(|h| h.gpu_bytes.first().map_or(u32::MAX, |g| g.0)),
            Sort::Verdict => v.sort_by_key(|h| (h.verdict, std::cmp::Reverse(h.total_bytes()))),
        }
        v
    }

    /// The frame as Prometheus sees it.
    pub fn view(&self, host: &str) -> View {
        View {
            host: host.to_string(),
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuView {
                    index: g.index,
                    name: g.name.clone(),
                    uuid: g.uuid.clone(),
                    used: g.used_bytes,
                    total: g.total_bytes,
                    job: None,
                })
                .collect(),
            procs: self
                .processes
                .iter()
                .flat_map(|h| {
                    h.gpu_bytes.iter().map(|&(gpu, bytes)| ProcView {
                        pid: h.pid,
                        gpu,
                        bytes,
                        verdict: Some(verdict_name(h.verdict).into()),
                        ..Default::default()
                    })
                })
                .collect(),
            active: self
                .diagnoses
                .iter()
                .map(|d| (d.rule.clone(), d.severity.name().into(), d.subject.clone()))
                .collect(),
            full_in: self.forecasts.iter().fold(Default::default(), |mut m, f| {
                let soonest: &mut f64 = m.entry(f.gpu).or_insert(f.full_in_s);
                *soonest = soonest.min(f.full_in_s);
                m
            }),
            ..Default::default()
        }
    }

    /// One CSV row per process and GPU (and one per GPU with an empty pid): `unix_s,gpu,used,total,pid,
    /// bytes,verdict,command`.
    pub fn csv(&self, unix_s: f64) -> String {
        let mut out = String::new();
        for g in &self.gpus {
            let _ = writeln!(
                out,
                "{unix_s:.3},{},{},{},,,,",
                g.index, g.used_bytes, g.total_bytes
            );
        }
        for h in &self.processes {
            for &(gpu, bytes) in &h.gpu_bytes {
                let cmd = h.cmdline.replace('"', "\"\"");
                let _ = writeln!(
                    out,
                    "{unix_s:.3},{gpu},,,{},{bytes},{},\"{cmd}\"",
                    h.pid,
                    verdict_name(h.verdict)
                );
            }
        }
        out
    }
}

/// The header of [`Frame::csv`].
pub const CSV_HEADER: &str = "unix_s,gpu,used_bytes,total_bytes,pid,bytes,verdict,command\n";

pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Orphan => "orphan",
        Verdict::Detached => "detached",
        Verdict::Zombie => "zombie",
        Verdict::Ghost => "ghost",
        Verdict::Service => "service",
        Verdict::Live => "live",
    }
}

/// The verdict in a sentence: `pid 12 is an orphan`, `is a ghost`, `is live`.
pub fn verdict_words(v: Verdict) -> String {
    match v {
        Verdict::Orphan => "an orphan".into(),
        Verdict::Detached | Verdict::Live => verdict_name(v).into(),
        _ => format!("a {}", verdict_name(v)),
    }
}

fn diagnosis(
    rule: &str,
    severity: Severity,
    title: &str,
    subject: String,
    message: String,
) -> Diagnosis {
    Diagnosis {
        rule: rule.into(),
        severity,
        title: title.into(),
        subject,
        message,
        details: Vec::new(),
        advice: Vec::new(),
        docs: None,
        gpu: None,
        pid: None,
        at_s: None,
        facts: Default::default(),
        known_at_s: None,
        parts: Vec::new(),
    }
}

/// The lines under the processes, at most 6: the diagnoses, most severe first, then the rules that
/// failed on the look (as `gpudoc run` says them), each with its tag.
fn said(f: &Frame, p: Paint) -> Vec<(String, String)> {
    let diagnoses = f
        .diagnoses
        .iter()
        .map(|d| (d.severity.tag(p), d.message.clone()));
    let failed = f.rule_errors.iter().map(|e| {
        (
            Severity::Warn.tag(p),
            format!("a rule could not be evaluated: {e}"),
        )
    });
    diagnoses.chain(failed).take(6).collect()
}

/// What the terminal view shows besides the frame.
#[derive(Debug, Clone, Default)]
pub struct Ui {
    pub sort: Sort,
    /// The selected row, in the sorted order.
    pub selected: usize,
    /// A question or a result, on the last line.
    pub status: String,
    pub host: String,
    pub interval: String,
}

/// The screen: at most `height` lines of at most `width` columns.
pub fn screen(f: &Frame, ui: &Ui, width: usize, height: usize, p: Paint) -> Vec<String> {
    let fit = |s: String| shorten(&s, width);
    let mut lines = vec![p.bold(&fit(format!(
        "gpudoc watch · {} · every {} · sort: {}   (q quit, ↑↓ select, s sort, e end a leftover)",
        ui.host,
        ui.interval,
        ui.sort.name()
    )))];
    if let Some(e) = &f.nvml_error {
        lines.push(p.bad(&fit(format!("NVML: {e}"))));
    }
    for g in &f.gpus {
        let frac = g.used_bytes as f64 / g.total_bytes.max(1) as f64;
        let cells = 24;
        let full = ((frac * cells as f64).round() as usize).min(cells);
        let bar = format!("{}{}", "█".repeat(full), "░".repeat(cells - full));
        lines.push(fit(format!(
            "GPU {} {}  {bar} {} / {} ({:.0}%)",
            g.index,
            g.name,
            fmt_bytes(g.used_bytes),
            fmt_bytes(g.total_bytes),
            frac * 100.0
        )));
    }
    lines.push(p.dim("  PID      USER       GPU   MEMORY       VERDICT   COMMAND"));
    let rows = f.sorted(ui.sort);
    let said = said(f, p);
    let room = height.saturating_sub(lines.len() + said.len() + 3).max(1);
    let first = ui.selected.saturating_sub(room.saturating_sub(1));
    for (i, h) in rows.iter().enumerate().skip(first).take(room) {
        let gpus: Vec<String> = h.gpu_bytes.iter().map(|g| g.0.to_string()).collect();
        let row = format!(
            "{} {:<8} {:<10} {:<5} {:>10}   {:<9} {}",
            if i == ui.selected { ">" } else { " " },
            h.pid,
            shorten(h.user.as_deref().unwrap_or("?"), 10),
            gpus.join(","),
            fmt_bytes(h.total_bytes()),
            verdict_name(h.verdict),
            printable(&h.cmdline)
        );
        let row = shorten(&row, width);
        lines.push(match h.verdict {
            Verdict::Orphan | Verdict::Zombie | Verdict::Ghost => p.warn(&row),
            _ => row,
        });
    }
    if rows.is_empty() {
        lines.push(p.dim("  no process holds GPU memory or an NVIDIA device"));
    }
    for (tag, text) in said {
        lines.push(format!("{tag} {}", shorten(&text, width.saturating_sub(6))));
    }
    if !ui.status.is_empty() {
        lines.push(p.bold(&fit(ui.status.clone())));
    }
    lines.truncate(height.max(1));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(pid: u32, uid: u32, gpu_bytes: Vec<(u32, u64)>, verdict: Verdict) -> Holder {
        Holder {
            pid,
            verdict,
            reason: "its parent died".into(),
            gpu_bytes,
            devices: vec![],
            ppid: Some(1),
            parent_cmd: None,
            pgid: None,
            sid: None,
            tty: None,
            uid: Some(uid),
            user: Some(format!("u{uid}")),
            state: None,
            start_ticks: None,
            age_s: None,
            cmdline: format!("python3 job{pid}.py"),
            left_by: None,
        }
    }

    const GIB: u64 = 1 << 30;

    /// Two GPUs of 100 GiB, GPU 0 96% full; a process of the watcher's (uid 1000) working on GPU 0 with a
    /// context on GPU 1, another user's on GPU 1, and a leftover of the watcher's.
    fn a_look(rules: &RuleSet) -> Frame {
        let gpus: Vec<GpuInfo> = (0..2)
            .map(|index| GpuInfo {
                index,
                name: "NVIDIA H200".into(),
                uuid: format!("GPU-{index}"),
                total_bytes: 100 * GIB,
            })
            .collect();
        let listing = Listing {
            holders: vec![
                holder(10, 1000, vec![(0, 90 * GIB), (1, GIB / 2)], Verdict::Live),
                holder(11, 2000, vec![(1, 8 * GIB)], Verdict::Live),
                holder(12, 1000, vec![(0, 6 * GIB)], Verdict::Orphan),
            ],
            gpu_used: vec![(0, 96 * GIB), (1, 10 * GIB)],
            ..Default::default()
        };
        Frame::of(listing, &gpus, 1000, rules)
    }

    fn said(f: &Frame) -> Vec<(&str, &str)> {
        f.diagnoses
            .iter()
            .map(|d| (d.rule.as_str(), d.subject.as_str()))
            .collect()
    }

    #[test]
    fn a_look_is_diagnosed_by_the_look_rules() {
        let f = a_look(&RuleSet::load(None, &[]).unwrap().looks());
        assert_eq!(
            said(&f),
            vec![
                ("stray-context", "pid 10"),
                ("leftover-holder", "pid 12"),
                ("near-capacity", "GPU 0"),
                ("held-by-others", "GPU 1"),
            ]
        );
        let d = &f.diagnoses;
        assert_eq!(
            d[0].message,
            "pid 10 (python3 job10.py) works on GPU 0 (90.00 GiB) but also holds 512.00 MiB on GPU 1: \
             a stray CUDA context, the classic pile-up on GPU 0."
        );
        assert_eq!(
            d[1].message,
            "pid 12 (python3 job12.py) is an orphan: its parent died; it holds 6.00 GiB"
        );
        assert!(
            d[2].message
                .starts_with("GPU 0: memory in use is 96.00 GiB, 96.0% of 100.00 GiB: one more"),
            "{}",
            d[2].message
        );
        assert_eq!(
            (d[2].at_s, d[2].gpu.clone()),
            (None, Some(crate::ident::GpuRef::new(None, 0)))
        );
        assert!(!d[2].advice.is_empty());
        assert_eq!(
            d[3].message,
            "GPU 1: other users hold 8.00 GiB: pid 11 (u2000) 8.00 GiB"
        );
        assert!(f.rule_errors.is_empty(), "{:?}", f.rule_errors);
        assert_eq!(verdict_words(Verdict::Ghost), "a ghost");
        assert_eq!(verdict_words(Verdict::Live), "live");
    }

    #[test]
    fn a_look_obeys_disable_rule_and_a_rule_that_fails_on_it_is_said() {
        let set = RuleSet::load(None, &["near-capacity".into(), "stray-context".into()]);
        let f = a_look(&set.unwrap().looks());
        assert_eq!(
            said(&f),
            vec![("leftover-holder", "pid 12"), ("held-by-others", "GPU 1")]
        );
        // Other users hold nothing on GPU 0: a careless rule divides by zero there, said, not a crash.
        let dir = tempfile::tempdir().unwrap();
        let rule = "id = \"ratio\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"gpu\"\nlook = true\n\
                    when = \"gpu.total_bytes / gpu.others_peak_bytes > 0\"\nmessage = \"m\"\n";
        std::fs::write(dir.path().join("ratio.toml"), rule).unwrap();
        let f = a_look(&RuleSet::load(Some(dir.path()), &[]).unwrap().looks());
        assert!(
            f.rule_errors.iter().any(|e| e.starts_with("rule ratio: ")),
            "{:?}",
            f.rule_errors
        );
        let screen = screen(&f, &Ui::default(), 200, 40, Paint(false));
        assert!(
            screen
                .iter()
                .any(|l| l.starts_with("warn  a rule could not be evaluated: rule ratio: ")),
            "{screen:#?}"
        );
    }

    #[test]
    fn the_screen_fits_and_marks_the_selection() {
        let f = Frame {
            gpus: vec![GpuLine {
                index: 0,
                name: "NVIDIA H200".into(),
                total_bytes: 100,
                used_bytes: 50,
                ..Default::default()
            }],
            processes: vec![
                holder(7, 0, vec![(0, 50)], Verdict::Live),
                holder(8, 0, vec![(0, 10)], Verdict::Orphan),
            ],
            ..Default::default()
        };
        let ui = Ui {
            selected: 1,
            host: "h".into(),
            interval: "1s".into(),
            ..Default::default()
        };
        let s = screen(&f, &ui, 80, 20, Paint(false));
        assert!(
            s[1].starts_with("GPU 0 NVIDIA H200  ████████████░░░░░░░░░░░░ 50 B / 100 B (50%)"),
            "{s:#?}"
        );
        assert!(s[3].starts_with("  7 "), "{s:#?}");
        assert!(s[4].starts_with("> 8 "), "{s:#?}");
        assert!(s.iter().all(|l| l.chars().count() <= 80));
    }
}
