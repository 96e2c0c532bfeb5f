//! `gpudoc watch`: every GPU and every process holding memory, judged as `gpudoc orphans` judges them,
//! and diagnosed by the rules with `look = true` as a run is: the look is a report of one moment
//! (`analysis::analyze_moment`), through the run's facts and rules. A [`Frame`] is
//! one look; it renders as a terminal screen, a JSON line or CSV rows, and as Prometheus metrics. Pure:
//! the loop, the terminal and the keys are in `commands/watch.rs`.

use crate::analysis::{self, Evidence};
use crate::gpu::GpuInfo;
use crate::metrics::{GpuView, ProcView, View};
use crate::orphans::{Holder, Listing, Verdict};
use crate::paint::Paint;
use crate::report::Moment;
use crate::rules::RuleSet;
use crate::runs::RunForecast;
use crate::timeline::{GpuTimeline, ProcTimeline, Series, Timeline};
use crate::units::{fmt_bytes, printable, shorten};
use crate::verdict::{Diagnosis, Severity};
use serde::Serialize;
use std::collections::HashMap;
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
    /// The frame of a listing, diagnosed by `rules` (the look rules) as a report of this one moment; `me`
    /// is the watcher's uid (its processes are "the job", other uids' are "others'"), `runs` the runs in
    /// progress, whose forecasts are seen at `now_unix_s`.
    pub fn of(
        listing: Listing,
        gpus: &[GpuInfo],
        me: u32,
        rules: &RuleSet,
        runs: &[crate::runs::Published],
        now_unix_s: f64,
    ) -> Frame {
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
        let report = moment(&gpus, listing.holders, me, rules, runs, now_unix_s);
        let moment = report.moment.unwrap_or_default();
        Frame {
            gpus,
            processes: moment.holders,
            diagnoses: report.diagnoses,
            rule_errors: report.rule_errors,
            forecasts: moment.forecasts,
            nvml_error: listing.nvml_error,
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

    /// The diagnoses that hold in this look: (rule, severity, subject), as a [`View`]'s `active`.
    pub fn active(&self) -> Vec<(String, String, String)> {
        self.diagnoses
            .iter()
            .map(|d| (d.rule.clone(), d.severity.name().into(), d.subject.clone()))
            .collect()
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
            active: self.active(),
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

/// The report of one look, diagnosed by `rules`: the look's GPUs and holders as a run's timeline of one
/// moment, through the run's analysis, facts and rules.
fn moment(
    gpus: &[GpuLine],
    holders: Vec<Holder>,
    me: u32,
    rules: &RuleSet,
    runs: &[crate::runs::Published],
    now_unix_s: f64,
) -> crate::report::Report {
    let ev = Evidence {
        started_unix_s: now_unix_s,
        timeline: timeline(gpus, &holders, me),
        ..Evidence::default()
    };
    let moment = Moment {
        me,
        holders,
        forecasts: crate::runs::forecasts_at(runs, now_unix_s),
    };
    analysis::analyze_moment(ev, moment, rules)
}

/// The look as a timeline of one sample, at 0 s: each GPU's memory in use and the watcher's processes'
/// sum on it (the job's series), and each holder's memory on each GPU. A holder with no memory anywhere
/// (a device file open) has no row: the facts take it from the moment's holders.
fn timeline(gpus: &[GpuLine], holders: &[Holder], me: u32) -> Timeline {
    let mut t = Timeline::default();
    for g in gpus {
        let mut gt = GpuTimeline::new(GpuInfo {
            index: g.index,
            name: g.name.clone(),
            uuid: g.uuid.clone(),
            total_bytes: g.total_bytes,
        });
        gt.used.push(0, g.used_bytes);
        t.gpus.push(gt);
    }
    let mut job: HashMap<u32, u64> = HashMap::new();
    for h in holders {
        let in_job = h.uid == Some(me);
        for &(gpu, bytes) in h.gpu_bytes.iter().filter(|g| g.1 > 0) {
            if in_job {
                *job.entry(gpu).or_default() += bytes;
            }
            let mut used = Series::default();
            used.push(0, bytes);
            let p = ProcTimeline {
                pid: h.pid,
                gpu,
                in_job,
                // Its owner is read from /proc: a ghost, which /proc does not have, has none.
                visible: h.uid.is_some(),
                cmdline: h.cmdline.clone(),
                uid: h.uid,
                ppid: h.ppid,
                used,
            };
            t.procs.insert((gpu, h.pid), p);
        }
    }
    for g in &mut t.gpus {
        g.job.push(0, job.get(&g.info.index).copied().unwrap_or(0));
    }
    t
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
            why: None,
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
        Frame::of(listing, &gpus, 1000, rules, &[], 0.0)
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

    /// The facts of a look, as the rules see them: the report of the moment through the run's facts.
    fn facts(holders: Vec<Holder>, gpus: Vec<GpuLine>, me: u32) -> crate::rules::facts::Facts {
        let rules = RuleSet::load(None, &[]).unwrap().looks();
        let r = moment(&gpus, holders, me, &rules, &[], 0.0);
        crate::rules::facts::Facts::of(&r)
    }

    #[test]
    fn the_job_is_the_watchers_the_others_other_users_and_a_ghost_neither() {
        let gpus = (0..2)
            .map(|index| GpuLine {
                index,
                name: "NVIDIA H200".into(),
                used_bytes: 30 * GIB,
                total_bytes: 100 * GIB,
                ..Default::default()
            })
            .collect();
        let mut anon = holder(3, 3000, vec![(0, 4 * GIB)], Verdict::Live);
        anon.user = None;
        let mut ghost = holder(4, 0, vec![(0, 8 * GIB)], Verdict::Ghost);
        ghost.uid = None;
        // A leftover a run recorded, holding a device file and no memory.
        let mut device = holder(5, 1000, vec![], Verdict::Orphan);
        (device.devices, device.left_by) = (vec!["/dev/nvidia0".into()], Some("run".into()));
        let holders = vec![
            holder(1, 1000, vec![(0, 10 * GIB), (1, 5 * GIB)], Verdict::Live),
            holder(2, 2000, vec![(0, GIB)], Verdict::Live),
            anon,
            ghost,
            device,
        ];
        let f = facts(holders, gpus, 1000);
        assert!(f.run.look && !f.run.live);
        assert_eq!(
            (f.run.exit_code, f.run.classification.as_str()),
            (None, "unknown")
        );
        let g = &f.gpus[0];
        assert_eq!(
            (g.peak_used_bytes, g.peak_used_pct),
            (30 * GIB as i64, 30.0)
        );
        assert_eq!(g.job_peak_bytes, 10 * GIB as i64);
        // Other users' memory, the most first; a user without a name by uid; the ghost's is nobody's.
        assert_eq!(g.others_peak_bytes, 5 * GIB as i64);
        let others: Vec<_> = g
            .others_list
            .iter()
            .map(|o| (o.pid, o.who.as_deref(), o.bytes))
            .collect();
        assert_eq!(
            others,
            [
                (3, Some("uid 3000"), 4 * GIB as i64),
                (2, Some("u2000"), GIB as i64)
            ]
        );
        assert_eq!((f.gpus[1].job_share, f.run.job_gpus), (0.5, 2));
        let p = |pid: i64| f.processes.iter().find(|p| p.pid == pid).unwrap();
        assert!(p(1).in_job && p(1).visible && !p(1).leftover);
        let held: Vec<_> = p(1).per_gpu.iter().map(|h| (h.index, h.bytes)).collect();
        assert_eq!(
            (p(1).main_gpu, held),
            (Some(0), vec![(0, 10 * GIB as i64), (1, 5 * GIB as i64)])
        );
        assert_eq!(
            (p(1).verdict.as_deref(), p(1).user.as_deref()),
            (Some("live"), Some("u1000"))
        );
        assert!(!p(4).visible && !p(4).in_job);
        // The device holder is a process of the look, a leftover holding nothing.
        assert!(
            p(5).leftover && p(5).in_job && p(5).peak_bytes == 0,
            "{:?}",
            p(5)
        );
        assert_eq!(p(5).reason.as_deref(), Some("its parent died"));
    }

    #[test]
    fn why_a_leftover_is_one_is_data_for_the_rules_and_words_for_people() {
        let mut leftover = holder(7, 1000, vec![(0, GIB)], Verdict::Detached);
        leftover.reason = String::new();
        leftover.why = Some(crate::orphans::Why {
            kind: crate::orphans::WhyKind::SessionGone,
            sid: Some(20),
            ignores_sighup: true,
            ..Default::default()
        });
        let gpus = vec![GpuLine {
            index: 0,
            used_bytes: GIB,
            total_bytes: 100 * GIB,
            ..Default::default()
        }];
        let f = facts(vec![leftover.clone()], gpus.clone(), 1000);
        let why = serde_json::to_value(&f.processes[0].why).unwrap();
        assert_eq!(
            (&why["kind"], &why["sid"], &why["ignores_sighup"]),
            (&"session_gone".into(), &20.into(), &true.into())
        );
        let reason = "its parent died: it was re-parented to init (pid 1), and the session it was started in (pid 20) is gone; but it ignores SIGHUP (started with nohup, or under `trap '' HUP`): detached on purpose, ended only with --detached";
        assert_eq!(f.processes[0].reason.as_deref(), Some(reason));
        // The screen's reason and the rule's message are the same words, a user's where the `--rules`
        // folder has them.
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("words")).unwrap();
        std::fs::write(
            dir.path().join("words/process-reason.toml"),
            "reason = [{ when = \"true\", text = \"{why.kind} since session {why.sid}\" }]\n",
        )
        .unwrap();
        let rules = RuleSet::load(Some(dir.path()), &[]).unwrap().looks();
        let mut detached = leftover.clone();
        detached.verdict = Verdict::Orphan;
        let info = [GpuInfo {
            index: 0,
            name: "NVIDIA H200".into(),
            uuid: "GPU-0".into(),
            total_bytes: 100 * GIB,
        }];
        let frame = Frame::of(
            Listing {
                holders: vec![detached],
                gpu_used: vec![(0, GIB)],
                ..Default::default()
            },
            &info,
            1000,
            &rules,
            &[],
            0.0,
        );
        assert_eq!(frame.processes[0].reason, "session_gone since session 20");
        let d = frame
            .diagnoses
            .iter()
            .find(|d| d.rule == "leftover-holder")
            .unwrap();
        assert!(
            d.message
                .contains("is an orphan: session_gone since session 20; it holds"),
            "{}",
            d.message
        );
    }

    #[test]
    fn a_run_in_progress_forecast_is_said_by_a_look_rule_that_can_be_switched_off() {
        let e = crate::verdict::Estimate {
            at_s: 10.0,
            full_at_s: 310.0,
            room_bytes: 20 * GIB,
            rate_bytes_per_s: (64 << 20) as f64,
            bytes_per_step: None,
            full_at_step: None,
        };
        let run = crate::runs::Published {
            pid: 77,
            start_ticks: 1,
            command: "python3 train.py".into(),
            started_unix_s: 1000.0,
            forecasts: vec![crate::verdict::Forecast {
                rule: "steady-growth".into(),
                subject: "GPU 0".into(),
                gpu: 0,
                first: e,
                last: e,
                held_by: None,
            }],
        };
        let look = |disabled: &[String]| {
            let rules = RuleSet::load(None, disabled).unwrap().looks();
            let gpus = vec![GpuInfo {
                index: 0,
                name: "NVIDIA H200".into(),
                uuid: "GPU-0".into(),
                total_bytes: 100 * GIB,
            }];
            // Seen 70 s after the estimate was made: 4 min left.
            Frame::of(
                Listing::default(),
                &gpus,
                1000,
                &rules,
                std::slice::from_ref(&run),
                1070.0,
            )
        };
        let f = look(&[]);
        let d = f.diagnoses.iter().find(|d| d.rule == "forecast").unwrap();
        assert_eq!(
            (d.subject.as_str(), d.gpu.as_ref().map(|g| g.to_string())),
            ("GPU 0", Some("GPU 0".to_string()))
        );
        assert_eq!(d.title, "A run in progress forecasts this GPU full");
        assert_eq!(
            d.message,
            "GPU 0 will be full in ~4 min at +64.00 MiB/s (gpudoc run, pid 77, steady-growth: python3 train.py)"
        );
        assert_eq!((f.forecasts[0].full_in_s, f.forecasts[0].pid), (240.0, 77));
        // A rule like any other: --disable-rule forecast keeps the forecast's numbers, not its words.
        let f = look(&["forecast".into()]);
        assert!(f.diagnoses.is_empty(), "{:?}", f.diagnoses);
        assert_eq!(f.forecasts.len(), 1);
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
