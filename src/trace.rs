//! `--trace FILE`: the timeline written as it is sampled, one row per change. CSV (the columns of
//! `nvidia-smi --query-gpu=timestamp,index,memory.used,memory.total --format=csv,nounits`, plus process
//! columns) or, for a `.jsonl` name, JSON lines with exact byte counts, the shim's messages as they came
//! (`torch` rows) and, last, what the end of the run knew (the `end` row): enough for `gpudoc report` to
//! rebuild the run's own report. Flushed at least every second, so a crash or SIGKILL of gpudoc loses at
//! most a second.

use crate::gpu::GpuInfo;
use crate::output::Sink;
use crate::timeline::Micros;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// A trace written by more than one thread (the sampler and the shim's reader).
pub type SharedTrace = Arc<Mutex<TraceWriter>>;
/// Rows held before the start row (the shim may speak before NVML has answered); past this, dropped.
const MAX_PENDING: usize = 10_000;

/// Schema tag of the first line of a JSON-lines trace.
pub const SCHEMA: &str = "gpudoc.trace/2";

/// One row of a JSON-lines trace (`kind` says which). `E` is what the end row carries (the analysis'
/// `EndRow`), `M` a `torch` row's message (as it came; typed as the shim's `Message` for the schema).
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[allow(clippy::large_enum_variant)] // built once per row and written at once
pub enum Row<E, M = serde_json::Value> {
    /// The first row: what ran, where, on which GPUs.
    Start {
        schema: String,
        /// When sampling started, seconds since the Unix epoch; every `t` counts from it.
        unix_s: f64,
        command: Vec<String>,
        /// Absent in traces from before it was recorded. (Boxed, as `nvml`: a row is read back among
        /// millions, each the size of the largest kind.)
        #[serde(default)]
        origin: Box<crate::origin::Origin>,
        gpus: Vec<GpuInfo>,
        /// Absent in traces from before it was recorded.
        #[serde(default)]
        nvml: Option<Box<crate::gpu::NvmlStatus>>,
    },
    /// A GPU's memory in use changed (bytes; `nvidia-smi`'s number).
    Device {
        t: f64,
        gpu: u32,
        used: u64,
        total: u64,
    },
    /// A process's memory on a GPU changed (0 when it left the GPU); its first row says who it is.
    Process {
        t: f64,
        gpu: u32,
        pid: u32,
        used: u64,
        in_job: bool,
        #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
        first: Option<FirstSeen>,
    },
    /// The job's memory on a GPU (the sum over its processes) changed.
    Job { t: f64, gpu: u32, used: u64 },
    /// A GPU stopped answering.
    Lost { t: f64, gpu: u32, error: String },
    /// A message of the PyTorch shim, as it came (`gpudoc schema shim-message`).
    Torch { m: M },
    /// The last row: what only the end of the run knows.
    End { end: E },
}

/// Who a process is, on its first row.
#[derive(Debug, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct FirstSeen {
    pub cmdline: String,
    pub uid: Option<u32>,
    /// Absent in traces from before it was recorded (`gpudoc.trace/1`): visible.
    #[serde(default = "visible")]
    pub visible: bool,
    /// Its parent (absent in traces from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ppid: Option<u32>,
}

fn visible() -> bool {
    true
}

/// A row without an end, as a line.
fn row_line(row: Row<()>) -> String {
    serde_json::to_string(&row).expect("trace rows serialize")
}
/// Older trace schemas still read (`gpudoc.trace/1` has no `job`, `torch` or `end` rows).
pub const OLD_SCHEMAS: &[&str] = &["gpudoc.trace/1"];
/// Longest time a sampled row waits in memory before it reaches the file.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Csv,
    Jsonl,
}

/// Writes trace rows; errors are kept, not thrown, so a full disk never stops sampling.
pub struct TraceWriter {
    out: Sink,
    format: Format,
    start_wall: SystemTime,
    command: Vec<String>,
    origin: crate::origin::Origin,
    started: bool,
    /// JSON-lines rows that came before the start row.
    pending: Vec<String>,
    last_flush: Instant,
    error: Option<String>,
}

impl TraceWriter {
    /// Creates the file now (so a path that can't be written stops gpudoc before the command starts; a FIFO
    /// nobody reads yet is opened once a reader comes, see [`Sink`]); a CSV trace gets its header row at
    /// once, a JSON-lines trace its start row with [`Self::start`].
    pub fn create(
        path: &Path,
        start_wall: SystemTime,
        command: &[String],
        origin: &crate::origin::Origin,
    ) -> io::Result<TraceWriter> {
        let format = match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl") => Format::Jsonl,
            _ => Format::Csv,
        };
        let mut out = Sink::open(path)?;
        if format == Format::Csv {
            out.line(
                "timestamp, index, memory.used [MiB], memory.total [MiB], pid, used_memory [MiB], in_job",
            )?;
        }
        out.push()?;
        Ok(TraceWriter {
            out,
            format,
            start_wall,
            command: command.to_vec(),
            origin: origin.clone(),
            started: false,
            pending: Vec::new(),
            last_flush: Instant::now(),
            error: None,
        })
    }

    /// The start row, once NVML has said what it has: the GPUs and its status. Rows before it are not
    /// written (there are none: sampling starts after).
    pub fn start(&mut self, gpus: &[GpuInfo], nvml: &crate::gpu::NvmlStatus) {
        if self.started {
            return;
        }
        self.started = true;
        if self.format == Format::Jsonl {
            let unix = self
                .start_wall
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64();
            let line = row_line(Row::Start {
                schema: SCHEMA.into(),
                unix_s: unix,
                command: self.command.clone(),
                origin: Box::new(self.origin.clone()),
                gpus: gpus.to_vec(),
                nvml: Some(Box::new(nvml.clone())),
            });
            self.write(&line);
            for row in std::mem::take(&mut self.pending) {
                self.write(&row);
            }
        }
    }

    /// Writes a JSON-lines row, or holds it until the start row is out.
    fn row(&mut self, line: String) {
        if self.started {
            self.write(&line);
        } else if self.pending.len() < MAX_PENDING {
            self.pending.push(line);
        }
    }

    /// One message from the shim, as it came (JSON lines only). `line` is a JSON object.
    pub fn torch(&mut self, line: &[u8]) {
        if self.format == Format::Jsonl {
            let mut row = Vec::with_capacity(line.len() + 24);
            row.extend_from_slice(b"{\"kind\":\"torch\",\"m\":");
            row.extend_from_slice(line);
            row.push(b'}');
            self.row(String::from_utf8_lossy(&row).into_owned());
        }
    }

    /// The last row: what the end of the run knew (JSON lines only); then everything is written, waiting
    /// at most [`crate::output::PATIENCE`] for a FIFO's reader.
    pub fn end(&mut self, end: &impl serde::Serialize) {
        if self.format == Format::Jsonl {
            let row = serde_json::to_string(&Row::<_>::End { end }).expect("trace rows serialize");
            self.row(row);
        }
        self.last_flush = Instant::now();
        self.keep(|o| o.finish(crate::output::PATIENCE));
    }

    /// Whether the start row was written.
    pub fn started(&self) -> bool {
        self.started
    }

    fn timestamp(&self, at: Micros) -> String {
        let wall = self.start_wall + Duration::from_micros(at);
        chrono::DateTime::<chrono::Local>::from(wall)
            .format("%Y/%m/%d %H:%M:%S%.3f")
            .to_string()
    }

    /// Writes a line (in time: see [`Sink`]).
    fn write(&mut self, line: &str) {
        self.keep(|o| o.line(line));
    }

    /// Does `f` to the file unless an error came before: the first error stops the writing.
    fn keep(&mut self, f: impl FnOnce(&mut Sink) -> io::Result<()>) {
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
            Format::Jsonl => {
                let t = secs(at);
                return self.row(row_line(Row::Device {
                    t,
                    gpu,
                    used,
                    total,
                }));
            }
        };
        self.write(&line);
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
        first: Option<&crate::timeline::ProcTimeline>,
    ) {
        let line = match self.format {
            Format::Csv => format!(
                "{}, {gpu}, , , {pid}, {}, {}",
                self.timestamp(at),
                crate::units::mib(used),
                if in_job { "yes" } else { "no" }
            ),
            Format::Jsonl => {
                let first = first.map(|p| FirstSeen {
                    cmdline: p.cmdline.clone(),
                    uid: p.uid,
                    visible: p.visible,
                    ppid: p.ppid,
                });
                let t = secs(at);
                return self.row(row_line(Row::Process {
                    t,
                    gpu,
                    pid,
                    used,
                    in_job,
                    first,
                }));
            }
        };
        self.write(&line);
    }

    /// The job's memory on a GPU changed: the sum over its processes at one process sample (JSON lines
    /// only).
    pub fn job(&mut self, at: Micros, gpu: u32, used: u64) {
        if self.format == Format::Jsonl {
            let t = secs(at);
            self.row(row_line(Row::Job { t, gpu, used }));
        }
    }

    /// A GPU stopped answering (JSON lines only; CSV rows simply stop).
    pub fn lost(&mut self, at: Micros, gpu: u32, error: &str) {
        if self.format == Format::Jsonl {
            let t = secs(at);
            let error = error.to_string();
            self.row(row_line(Row::Lost { t, gpu, error }));
        }
    }

    /// Flushes when the last flush is older than [`FLUSH_EVERY`].
    pub fn flush_if_due(&mut self) {
        if self.last_flush.elapsed() >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Writes what the file takes now, without waiting.
    pub fn flush(&mut self) {
        self.last_flush = Instant::now();
        self.keep(Sink::push);
    }

    /// The first write error, or the rows dropped while the file's reader fell behind, if any.
    pub fn error(&self) -> Option<String> {
        let dropped = self.out.dropped();
        self.error.clone().or_else(|| {
            (dropped > 0).then(|| {
                format!(
                    "its reader fell {} MiB behind: {dropped} rows dropped",
                    crate::output::BEHIND_MAX >> 20
                )
            })
        })
    }
}

fn secs(at: Micros) -> f64 {
    at as f64 / 1e6
}
