//! `gpudoc report FILE`: diagnose a saved run again: a report (`--json` of `gpudoc run`) or a trace
//! (`--trace FILE.jsonl`, with the command's captured output for its OOM text, if any), with the rules in
//! force now. A rule can be developed and checked on recorded runs this way.

use crate::gpu::GpuInfo;
use crate::oom::{self, HostOom, scan::Scanner};
use crate::report::{Inputs, Report};
use crate::sample::Rates;
use crate::supervise::{Outcome, ProcessEnd, Stream};
use crate::timeline::{GpuTimeline, Lost, Micros, ProcTimeline, Series, Timeline};
use crate::trace::SCHEMA;
use std::io;
use std::path::Path;
use std::time::Duration;

/// Reads a report or rebuilds one from a trace.
pub fn load(file: &Path, output: Option<&Path>) -> Result<Report, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let first = text.lines().next().unwrap_or("");
    if first.contains("\"gpudoc.trace/1\"") || first.contains("\"kind\"") {
        return from_trace(file, output);
    }
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{}: not a report or trace: {e}", file.display()))?;
    match value.get("schema").and_then(|s| s.as_str()) {
        Some(crate::report::SCHEMA) => {}
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
    }
    serde_json::from_value(value).map_err(|e| format!("{}: {e}", file.display()))
}

fn from_trace(file: &Path, output: Option<&Path>) -> Result<Report, String> {
    let (header, timeline) = load_trace(file).map_err(|e| e.to_string())?;
    let mut scanner = Scanner::new();
    if let Some(out) = output {
        let bytes = std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))?;
        let at = (oom::replay_time(&timeline) * 1e6) as u64;
        scanner.feed(Stream::Stderr, &bytes, at);
        scanner.finish(at);
    }
    let end = timeline
        .gpus
        .iter()
        .map(|g| g.used.last_at())
        .max()
        .unwrap_or(0);
    // A trace does not record how the command ended: an OOM text means it failed.
    let code = if scanner.events.is_empty() { 0 } else { 1 };
    let outcome = Outcome {
        end: ProcessEnd::Exited(code),
        duration: Duration::from_micros(end),
        escalated: false,
        terminate: false,
        forwarded: Vec::new(),
    };
    let (mut ending, oom, _) = oom::classify(&oom::Evidence {
        end: outcome.end,
        scanner: &scanner,
        timeline: &timeline,
        host: HostOom::default(),
    });
    if oom.is_none() {
        ending = oom::Ending::Unknown;
    }
    let gpus: Vec<_> = timeline.gpus.iter().map(|g| g.info.clone()).collect();
    let torch = crate::torch::view::build(&Default::default(), &timeline, &gpus, false);
    let r = Report::build(Inputs {
        command: header.command,
        started_unix_s: header.unix_s,
        outcome: &outcome,
        nvml: header.nvml.unwrap_or(crate::gpu::NvmlStatus {
            available: true,
            ..Default::default()
        }),
        rates: Rates::default(),
        timeline: &timeline,
        leftovers: &[],
        ended: &[],
        ending,
        torch,
        oom,
        host_oom: None,
        self_usage: (0.0, 0),
        notes: vec![format!(
            "rebuilt from the trace {}: no exit status, no PyTorch view",
            file.display()
        )],
    });
    Ok(r)
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

/// What a trace holds besides its timeline.
#[derive(Debug, Clone, Default)]
pub struct Header {
    pub command: Vec<String>,
    pub unix_s: f64,
    /// NVML's status at the start (traces from before it was recorded have none).
    pub nvml: Option<crate::gpu::NvmlStatus>,
}

/// Reads a JSON-lines trace back into a timeline (the command it ran, and its GPUs and processes). The
/// job's memory per GPU is summed again from the process rows. A corrupt or truncated row is an error that
/// names the line; a trace cut off mid-line by a crash loses only that line.
pub fn load_trace(path: &Path) -> Result<(Header, Timeline), LoadError> {
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
    let mut timeline = Timeline::default();
    let mut header = Header::default();
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
        let num = |k: &str| {
            row.get(k)
                .and_then(|v| v.as_f64())
                .ok_or_else(|| bad(n, format!("no number `{k}`")))
        };
        let at = |r: &serde_json::Value| {
            r.get("t")
                .and_then(|v| v.as_f64())
                .map(|t| (t * 1e6).round() as Micros)
        };
        match row.get("kind").and_then(|k| k.as_str()) {
            Some("start") => {
                if row.get("schema").and_then(|s| s.as_str()) != Some(SCHEMA) {
                    return Err(bad(n, format!("not a {SCHEMA} trace")));
                }
                header.command = serde_json::from_value(row["command"].clone()).unwrap_or_default();
                header.unix_s = row["unix_s"].as_f64().unwrap_or(0.0);
                header.nvml = serde_json::from_value(row["nvml"].clone()).ok();
                let gpus: Vec<GpuInfo> = serde_json::from_value(row["gpus"].clone())
                    .map_err(|e| bad(n, format!("bad `gpus`: {e}")))?;
                timeline.gpus = gpus.into_iter().map(GpuTimeline::new).collect();
            }
            Some("device") => {
                let t = at(&row).ok_or_else(|| bad(n, "no time `t`".into()))?;
                let gpu = num("gpu")? as u32;
                let used = num("used")? as u64;
                let g = timeline
                    .gpus
                    .iter_mut()
                    .find(|g| g.info.index == gpu)
                    .ok_or_else(|| bad(n, format!("GPU {gpu} is not in the header")))?;
                g.used.push(t, used);
                timeline.device_samples += 1;
            }
            Some("process") => {
                let t = at(&row).ok_or_else(|| bad(n, "no time `t`".into()))?;
                let (gpu, pid, used) =
                    (num("gpu")? as u32, num("pid")? as u32, num("used")? as u64);
                let in_job = row.get("in_job").and_then(|v| v.as_bool()).unwrap_or(false);
                let entry = timeline
                    .procs
                    .entry((gpu, pid))
                    .or_insert_with(|| ProcTimeline {
                        pid,
                        gpu,
                        in_job,
                        visible: true,
                        cmdline: String::new(),
                        uid: None,
                        used: Series::default(),
                    });
                if let Some(c) = row.get("cmdline").and_then(|c| c.as_str()) {
                    entry.cmdline = c.to_string();
                }
                entry.used.push(t, used);
                let job: u64 = timeline
                    .procs
                    .values()
                    .filter(|p| p.gpu == gpu && p.in_job)
                    .filter_map(|p| p.used.last())
                    .sum();
                if let Some(g) = timeline.gpus.iter_mut().find(|g| g.info.index == gpu) {
                    g.job.push(t, job);
                }
                timeline.process_samples += 1;
            }
            Some("lost") => {
                let t = at(&row).ok_or_else(|| bad(n, "no time `t`".into()))?;
                let gpu = num("gpu")? as u32;
                let error = row
                    .get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or("")
                    .to_string();
                if let Some(g) = timeline.gpus.iter_mut().find(|g| g.info.index == gpu) {
                    g.lost = Some(Lost { at: t, error });
                }
            }
            other => return Err(bad(n, format!("unknown row kind {other:?}"))),
        }
    }
    if header.command.is_empty() && timeline.gpus.is_empty() {
        return Err(bad(1, format!("no `start` row: not a {SCHEMA} trace")));
    }
    Ok((header, timeline))
}
