//! `--trace FILE`: the timeline written as it is sampled, one row per change. CSV (the columns of
//! `nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,nounits`, plus process
//! columns) or, for a `.jsonl` name, JSON lines with exact byte counts. Flushed at least every second, so
//! a crash or SIGKILL of gpudoc loses at most a second.

use crate::gpu::GpuInfo;
use crate::timeline::Micros;
use serde_json::json;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

/// Schema tag of the first line of a JSON-lines trace.
pub const SCHEMA: &str = "gpudoc.trace/1";
/// Longest time a sampled row waits in memory before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Jsonl,
}

/// Writes trace rows; errors are kept, not thrown, so a full disk never stops sampling.
pub struct TraceWriter {
    out: BufWriter<File>,
    format: Format,
    start_wall: SystemTime,
    last_flush: Instant,
    error: Option<String>,
}

impl TraceWriter {
    /// Creates the file and writes its header.
    pub fn create(
        path: &Path,
        start_wall: SystemTime,
        command: &[String],
        gpus: &[GpuInfo],
        nvml: &crate::gpu::NvmlStatus,
    ) -> io::Result<TraceWriter> {
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => Format::Jsonl,
            _ => Format::Csv,
        };
        let mut out = BufWriter::new(File::create(path)?);
        match format {
            Format::Csv => writeln!(
                out,
                "timestamp, index, memory.used [MiB], memory.total [MiB], pid, used_memory [MiB], in_job"
            )?,
            Format::Jsonl => {
                let unix = start_wall
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64();
                let line = json!({"kind": "start", "schema": SCHEMA, "unix_s": unix,
                                  "command": command, "gpus": gpus, "nvml": nvml});
                writeln!(out, "{line}")?
            }
        }
        out.flush()?;
        Ok(TraceWriter {
            out,
            format,
            start_wall,
            last_flush: Instant::now(),
            error: None,
        })
    }

    fn timestamp(&self, at: Micros) -> String {
        let wall = self.start_wall + Duration::from_micros(at);
        chrono::DateTime::<chrono::Local>::from(wall)
            .format("%Y/%m/%d %H:%M:%S%.3f")
            .to_string()
    }

    fn write(&mut self, f: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>) {
        if self.error.is_none()
            && let Err(e) = f(&mut self.out)
        {
            self.error = Some(e.to_string());
        }
    }

    /// A device's memory changed (`used` as `nvidia-smi` shows it).
    pub fn device(&mut self, at: Micros, gpu: u32, used: u64, total: u64) {
        let line = match self.format {
            Format::Csv => format!(
                "{}, {gpu}, {}, {}, , , ",
                self.timestamp(at),
                crate::units::mib(used),
                crate::units::mib(total)
            ),
            Format::Jsonl => json!({"kind": "device", "t": secs(at), "gpu": gpu, "used": used,
                                    "total": total})
            .to_string(),
        };
        self.write(|o| writeln!(o, "{line}"));
    }

    /// A process's memory on a GPU changed (0 when it left the GPU). Its first row carries its command
    /// line (JSON lines only).
    pub fn process(
        &mut self,
        at: Micros,
        gpu: u32,
        pid: u32,
        used: u64,
        in_job: bool,
        cmdline: Option<&str>,
    ) {
        let line = match self.format {
            Format::Csv => format!(
                "{}, {gpu}, , , {pid}, {}, {}",
                self.timestamp(at),
                crate::units::mib(used),
                if in_job { "yes" } else { "no" }
            ),
            Format::Jsonl => {
                let mut row = json!({"kind": "process", "t": secs(at), "gpu": gpu, "pid": pid,
                                     "used": used, "in_job": in_job});
                if let Some(c) = cmdline {
                    row["cmdline"] = c.into();
                }
                row.to_string()
            }
        };
        self.write(|o| writeln!(o, "{line}"));
    }

    /// A GPU stopped answering (JSON lines only; CSV rows simply stop).
    pub fn lost(&mut self, at: Micros, gpu: u32, error: &str) {
        if self.format == Format::Jsonl {
            let line = json!({"kind": "lost", "t": secs(at), "gpu": gpu, "error": error});
            self.write(|o| writeln!(o, "{line}"));
        }
    }

    /// Flushes when the last flush is older than [`FLUSH_EVERY`].
    pub fn flush_if_due(&mut self) {
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    pub fn flush(&mut self) {
        self.last_flush = Instant::now();
        self.write(|o| o.flush());
    }

    /// The first write error, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }
}

fn secs(at: Micros) -> f64 {
    at as f64 / 1e6
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
pub fn load(path: &Path) -> Result<(Header, crate::sample::Timeline), LoadError> {
    use crate::sample::{GpuTimeline, Lost, ProcTimeline, Timeline};
    use crate::timeline::Series;
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
                timeline.gpus = gpus
                    .into_iter()
                    .map(|info| GpuTimeline {
                        info,
                        used: Series::default(),
                        driver_reserved: 0,
                        job: Series::default(),
                        lost: None,
                        unsupported: Vec::new(),
                    })
                    .collect();
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
