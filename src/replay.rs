//! `gpudoc report FILE`: diagnose a saved run again: a report (`--json` of `gpudoc run`) or a trace
//! (`--trace FILE.jsonl`), with the rules in force now. A trace is rebuilt into the run's evidence and
//! analyzed by the same stage as the run ([`crate::analysis`]), so it gives the run's own OOM,
//! classification and diagnoses; a trace without an end row (cut short, or from an older gpudoc) says what
//! it does not know instead of inventing it.

use crate::analysis::{self, EndRow, Evidence};
use crate::gpu::{GpuInfo, NvmlStatus};
use crate::oom::{self, HostOom, scan::Scanner};
use crate::report::Report;
use crate::rules::RuleSet;
use crate::sample::Rates;
use crate::supervise::Stream;
use crate::timeline::{GpuTimeline, Lost, Micros, ProcTimeline, Series, Timeline};
use crate::torch::TorchTimeline;
use crate::trace::{OLD_SCHEMAS as OLD_TRACES, SCHEMA};
use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Report schemas this gpudoc still reads (their missing fields take their defaults).
const OLD_REPORTS: &[&str] = &["gpudoc.report/1"];

/// Reads a report or rebuilds one from a trace, diagnosed with `rules`. `output`: the command's captured
/// output, scanned for OOM text (for a trace from before gpudoc recorded what it found).
pub fn load(file: &Path, output: Option<&Path>, rules: &RuleSet) -> Result<Report, String> {
    load_with_timeline(file, output, rules, false).map(|(r, _)| r)
}

/// `load`; with `samples`, also the samples themselves when the file is a trace (a report keeps only a
/// summary of them).
pub fn load_with_timeline(
    file: &Path,
    output: Option<&Path>,
    rules: &RuleSet,
    samples: bool,
) -> Result<(Report, Option<Timeline>), String> {
    let io = |e: io::Error| format!("{}: {e}", file.display());
    // A trace's rows each name their `kind`: the first line tells, without reading the file twice.
    let mut first = String::new();
    io::BufRead::read_line(
        &mut io::BufReader::new(std::fs::File::open(file).map_err(io)?),
        &mut first,
    )
    .map_err(io)?;
    if first.contains("\"kind\"") {
        return from_trace(file, output, rules, samples);
    }
    let text = std::fs::read_to_string(file).map_err(io)?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a report or trace: {e}", file.display()))?;
    let schema = value
        .get("schema")
        .and_then(|s| s.as_str())
        .map(String::from);
    let old = match schema.as_deref() {
        Some(crate::report::SCHEMA) => false,
        Some(s) if OLD_REPORTS.contains(&s) => true,
        Some(other) => {
            return Err(format!(
                "{}: schema {other}, this gpudoc reads {}",
                file.display(),
                crate::report::SCHEMA
            ));
        }
        None => {
            return Err(format!(
                "{}: no `schema`: not a gpudoc report",
                file.display()
            ));
        }
    };
    let mut report: Report =
        serde_json::from_value(value).map_err(|e| format!("{}: {e}", file.display()))?;
    if output.is_some() {
        return Err(format!(
            "{}: --output goes with a trace; a report already holds what the output said",
            file.display()
        ));
    }
    if old {
        // Upgraded: written again, it is a report of this schema, with the note.
        report.notes.push(format!(
            "written as {}: what that version did not record is shown as unknown",
            schema.unwrap_or_default()
        ));
        report.schema = crate::report::SCHEMA.into();
    }
    crate::rules::diagnose(&mut report, rules);
    Ok((report, None))
}

fn from_trace(
    file: &Path,
    output: Option<&Path>,
    rules: &RuleSet,
    samples: bool,
) -> Result<(Report, Option<Timeline>), String> {
    let trace = load_trace(file).map_err(|e| e.to_string())?;
    let end = trace.end.clone();
    let mut notes = Vec::new();
    let scanner = match (output, &end) {
        (Some(out), _) => {
            let bytes = std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))?;
            let at = (oom::replay_time(&trace.timeline) * 1e6) as u64;
            let mut s = Scanner::new();
            s.feed(Stream::Stderr, &bytes, at);
            s.finish(at);
            notes.push(format!("OOM text read from {}", out.display()));
            s
        }
        (None, Some(e)) => e.scanner(),
        (None, None) => Scanner::new(),
    };
    let mut timeline = trace.timeline;
    let ev = match end {
        Some(e) => {
            e.complete(&mut timeline);
            notes.extend(e.notes.iter().cloned());
            Evidence {
                origin: trace.header.origin.clone(),
                command: trace.header.command,
                started_unix_s: trace.header.unix_s,
                outcome: e.outcome(),
                nvml: e.nvml.clone().or(trace.header.nvml).unwrap_or_default(),
                rates: e.rates(),
                timeline,
                torch: (e.torch_enabled || trace.torch.messages > 0).then_some(trace.torch),
                scanner,
                host: e.host.clone(),
                leftovers: e.leftovers.clone(),
                ended: e.ended.clone(),
                notes,
                self_usage: (e.self_cpu_s, e.self_max_rss_bytes),
            }
        }
        None => {
            notes.push(format!(
                "rebuilt from the trace {}, which has no end row (cut short, or written by an older \
                 gpudoc): how the command ended, its leftovers and gpudoc's own costs are unknown",
                file.display()
            ));
            Evidence {
                origin: trace.header.origin.clone(),
                command: trace.header.command,
                started_unix_s: trace.header.unix_s,
                outcome: None,
                nvml: trace.header.nvml.unwrap_or(NvmlStatus {
                    available: true,
                    ..Default::default()
                }),
                rates: Rates::default(),
                timeline,
                torch: (trace.torch.messages > 0).then_some(trace.torch),
                scanner,
                host: HostOom::default(),
                leftovers: Vec::new(),
                ended: Vec::new(),
                notes,
                self_usage: (0.0, 0),
            }
        }
    };
    let timeline = samples.then(|| ev.timeline.clone());
    Ok((analysis::analyze(ev, rules), timeline))
}

/// A trace file that could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}:{line}: {what}")]
    Bad {
        path: String,
        line: usize,
        what: String,
    },
}

/// What a trace's start row holds.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub command: Vec<String>,
    pub origin: crate::origin::Origin,
    pub unix_s: f64,
    /// NVML's status at the start (traces from before it was recorded have none).
    pub nvml: Option<NvmlStatus>,
}

/// A trace read back: the timeline its rows rebuild, the shim's messages, and its end row if it has one.
#[derive(Debug, Default)]
pub struct Trace {
    pub header: Header,
    pub timeline: Timeline,
    pub torch: TorchTimeline,
    pub end: Option<EndRow>,
}

/// The job's memory per GPU summed from process rows, for traces without `job` rows (gpudoc.trace/1).
/// Rows at one instant are summed once they are all in, as the sampler did, so a process leaving as
/// another arrives never shows as a peak that was not there.
#[derive(Default)]
struct JobSums {
    /// GPU → (time of the open instant, job bytes per pid, the sums so far).
    open: BTreeMap<u32, (Micros, BTreeMap<u32, u64>, Series)>,
}

impl JobSums {
    fn add(&mut self, gpu: u32, at: Micros, pid: u32, used: u64, in_job: bool) {
        let (when, held, sums) = self.open.entry(gpu).or_default();
        if *when != at {
            sums.push(*when, held.values().sum());
            *when = at;
        }
        if in_job {
            held.insert(pid, used);
        }
    }

    /// Gives each GPU without `job` rows its summed series.
    fn finish(self, t: &mut Timeline) {
        for (gpu, (at, held, mut sums)) in self.open {
            sums.push(at, held.values().sum());
            if let Some(g) = t.gpu_mut(gpu)
                && g.job.is_empty()
            {
                g.job = sums;
            }
        }
    }
}

/// Reads a JSON-lines trace back. The job's memory per GPU is summed again from the process rows. A
/// corrupt or truncated row is an error that names the line; a trace cut off mid-line by a crash loses
/// only that line.
pub fn load_trace(path: &Path) -> Result<Trace, LoadError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: p.clone(),
        source,
    })?;
    let bad = |line: usize, what: String| LoadError::Bad {
        path: p.clone(),
        line,
        what,
    };
    let mut trace = Trace::default();
    let mut sums = JobSums::default();
    let lines: Vec<&str> = text.lines().collect();
    let complete = text.ends_with('\n');
    for (i, line) in lines.iter().enumerate() {
        let n = i + 1;
        let row: serde_json::Value = match serde_json::from_str(line) {
            Ok(v) => v,
            // A crash can cut the last line short.
            Err(_) if n == lines.len() && !complete => break,
            Err(e) => return Err(bad(n, format!("not JSON: {e}"))),
        };
        apply_row(&mut trace, &mut sums, &row).map_err(|what| bad(n, what))?;
    }
    sums.finish(&mut trace.timeline);
    if trace.header.command.is_empty() && trace.timeline.gpus.is_empty() {
        return Err(bad(1, format!("no `start` row: not a {SCHEMA} trace")));
    }
    Ok(trace)
}

/// One row of a trace into what is being rebuilt.
fn apply_row(tr: &mut Trace, sums: &mut JobSums, row: &serde_json::Value) -> Result<(), String> {
    let timeline = &mut tr.timeline;
    match row.get("kind").and_then(|k| k.as_str()) {
        Some("start") => apply_start(tr, row)?,
        Some("device") => {
            let (t, gpu, used) = (at(row)?, num(row, "gpu")? as u32, num(row, "used")? as u64);
            let g = timeline
                .gpu_mut(gpu)
                .ok_or_else(|| format!("GPU {gpu} is not in the header"))?;
            g.used.push(t, used);
            timeline.device_samples += 1;
        }
        Some("process") => apply_process(timeline, sums, row)?,
        Some("job") => {
            let (t, gpu, used) = (at(row)?, num(row, "gpu")? as u32, num(row, "used")? as u64);
            let g = timeline
                .gpu_mut(gpu)
                .ok_or_else(|| format!("GPU {gpu} is not in the header"))?;
            g.job.push(t, used);
        }
        Some("lost") => {
            let (t, gpu) = (at(row)?, num(row, "gpu")? as u32);
            let error = row.get("error").and_then(|e| e.as_str()).unwrap_or("");
            if let Some(g) = timeline.gpu_mut(gpu) {
                g.lost = Some(Lost {
                    at: t,
                    error: error.to_string(),
                });
            }
        }
        Some("torch") => {
            let m = row.get("m").ok_or("a torch row without its message `m`")?;
            tr.torch.apply(m.to_string().as_bytes(), tr.header.unix_s);
        }
        Some("end") => {
            let e = serde_json::from_value(row["end"].clone())
                .map_err(|e| format!("bad end row: {e}"))?;
            tr.end = Some(e);
        }
        other => return Err(format!("unknown row kind {other:?}")),
    }
    Ok(())
}

/// A row's number `k`.
fn num(row: &serde_json::Value, k: &str) -> Result<f64, String> {
    row.get(k)
        .and_then(|v| v.as_f64())
        .ok_or_else(|| format!("no number `{k}`"))
}

/// A row's time `t`, in microseconds.
fn at(row: &serde_json::Value) -> Result<Micros, String> {
    row.get("t")
        .and_then(|v| v.as_f64())
        .map(|t| (t * 1e6).round() as Micros)
        .ok_or_else(|| "no time `t`".to_string())
}

/// The header row: the schema checked, the run's command, origin, NVML and GPUs.
fn apply_start(tr: &mut Trace, row: &serde_json::Value) -> Result<(), String> {
    let schema = row.get("schema").and_then(|s| s.as_str()).unwrap_or("");
    if schema != SCHEMA && !OLD_TRACES.contains(&schema) {
        return Err(format!("not a {SCHEMA} trace (schema {schema:?})"));
    }
    let h = &mut tr.header;
    h.command = serde_json::from_value(row["command"].clone()).unwrap_or_default();
    h.origin = serde_json::from_value(row["origin"].clone()).unwrap_or_default();
    h.unix_s = row["unix_s"].as_f64().unwrap_or(0.0);
    h.nvml = serde_json::from_value(row["nvml"].clone()).ok();
    let gpus: Vec<GpuInfo> =
        serde_json::from_value(row["gpus"].clone()).map_err(|e| format!("bad `gpus`: {e}"))?;
    tr.timeline.gpus = gpus.into_iter().map(GpuTimeline::new).collect();
    Ok(())
}

/// One process's memory on one GPU at one time.
fn apply_process(
    timeline: &mut Timeline,
    sums: &mut JobSums,
    row: &serde_json::Value,
) -> Result<(), String> {
    let t = at(row)?;
    let (gpu, pid, used) = (
        num(row, "gpu")? as u32,
        num(row, "pid")? as u32,
        num(row, "used")? as u64,
    );
    let flag = |k: &str| row.get(k).and_then(|v| v.as_bool());
    let in_job = flag("in_job").unwrap_or(false);
    let entry = timeline
        .procs
        .entry((gpu, pid))
        .or_insert_with(|| ProcTimeline {
            pid,
            gpu,
            in_job,
            visible: flag("visible").unwrap_or(true),
            cmdline: String::new(),
            uid: row.get("uid").and_then(|u| u.as_u64()).map(|u| u as u32),
            used: Series::default(),
        });
    if let Some(c) = row.get("cmdline").and_then(|c| c.as_str()) {
        entry.cmdline = c.to_string();
    }
    entry.used.push(t, used);
    sums.add(gpu, t, pid, used, in_job);
    timeline.process_samples += 1;
    Ok(())
}
