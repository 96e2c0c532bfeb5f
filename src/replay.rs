//! `gpudoc report FILE`: diagnose a saved run again: a report (`--json` of `gpudoc run`) or a trace
//! (`--trace FILE.jsonl`), with the rules in force now. A trace is rebuilt into the run's evidence and
//! analyzed by the same stage as the run ([`crate::analysis`]), so it gives the run's own OOM,
//! classification and diagnoses; a trace without an end row (cut short, or from an older gpudoc) says what
//! it does not know instead of inventing it.

use crate::analysis::{self, EndRow, Evidence};
use crate::gpu::NvmlStatus;
use crate::oom::{self, HostOom, scan::Scanner};
use crate::report::Report;
use crate::rules::RuleSet;
use crate::sample::{MAX_POINTS, Rates};
use crate::supervise::Stream;
use crate::timeline::{GpuTimeline, Lost, Micros, ProcTimeline, Series, Timeline};
use crate::torch::TorchTimeline;
use crate::trace::{FirstSeen, OLD_SCHEMAS as OLD_TRACES, Row, SCHEMA};
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
    if is_trace_row(&first_line(file).map_err(io)?) {
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
    let mut report: Report = typed(&value).map_err(|e| format!("{}: {e}", file.display()))?;
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

/// Whether `file` is a trace (not a report).
pub fn is_trace(file: &Path) -> bool {
    first_line(file).is_ok_and(|l| is_trace_row(&l))
}

/// A trace's rows each name their `kind`: the first line tells, without reading the file twice.
fn first_line(file: &Path) -> io::Result<String> {
    let mut first = String::new();
    io::BufRead::read_line(
        &mut io::BufReader::new(std::fs::File::open(file)?),
        &mut first,
    )?;
    Ok(first)
}

/// A trace's first line is a row: one JSON object with its `kind`. A report on one line (`--json -`)
/// has `kind`s inside it, never at its top; a row too garbled to read is still a trace's when it starts
/// as rows are written.
fn is_trace_row(first: &str) -> bool {
    match serde_json::from_str::<serde_json::Value>(first) {
        Ok(v) => v.get("kind").is_some(),
        Err(_) => first.contains("\"kind\"") && !first.trim_start().starts_with("{\"schema\""),
    }
}

/// The report in `value`; an error names the field it is about (`gpus[0].total_bytes: invalid type:
/// string "lots", expected u64`, `exit: missing field `code``). serde_json says only where in a text
/// it failed: the value is written out one field a line, and the line it failed on gives the field.
fn typed(value: &serde_json::Value) -> Result<Report, String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| {
        let words = e.to_string();
        // serde_json appends ` at line L column C`: the field replaces it.
        let words = words.split(" at line ").next().unwrap_or(&words);
        match field_at(&text, e.line()) {
            f if f.is_empty() => format!("the report: {words}"),
            f => format!("`{f}`: {words}"),
        }
    })
}

/// The field that line `line` (1-based) of serde_json's pretty text is in: `gpus[0].total_bytes`;
/// on an object's closing line, the object.
fn field_at(pretty: &str, line: usize) -> String {
    // One segment per open object or array: its name (`.gpus`, `[0]`), and for an array the next index.
    let mut stack: Vec<(String, Option<usize>)> = Vec::new();
    let path = |stack: &[(String, Option<usize>)]| {
        let joined: String = stack.iter().map(|(s, _)| s.as_str()).collect();
        joined.trim_start_matches('.').to_string()
    };
    for (i, raw) in pretty.lines().enumerate().take(line) {
        let l = raw.trim();
        let last = i + 1 == line;
        if l.starts_with('}') || l.starts_with(']') {
            if last {
                return path(&stack);
            }
            stack.pop();
            continue;
        }
        let (segment, rest) = match stack.last_mut() {
            None => (String::new(), l),
            Some((_, Some(next))) => {
                *next += 1;
                (format!("[{}]", *next - 1), l)
            }
            Some((_, None)) => match key_of(l) {
                Some((k, rest)) => (format!(".{k}"), rest),
                None => (String::new(), l),
            },
        };
        if last {
            stack.push((segment, None));
            return path(&stack);
        }
        match rest {
            "{" => stack.push((segment, None)),
            "[" => stack.push((segment, Some(0))),
            _ => {}
        }
    }
    path(&stack)
}

/// The key of a pretty-printed `"key": value` line, and the value's text.
fn key_of(line: &str) -> Option<(String, &str)> {
    let mut de = serde_json::Deserializer::from_str(line).into_iter::<String>();
    let key = de.next()?.ok()?;
    let rest = line[de.byte_offset()..].strip_prefix(": ")?;
    Some((key, rest))
}

/// The command's captured output, from a file or (`-`) standard input, and how to name where it came from.
fn read_output(out: &Path) -> Result<(Vec<u8>, String), String> {
    if out == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
            .map_err(|e| format!("standard input: {e}"))?;
        return Ok((bytes, "standard input".to_string()));
    }
    let bytes = std::fs::read(out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok((bytes, out.display().to_string()))
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
            let (bytes, from) = read_output(out)?;
            let at = (oom::replay_time(&trace.timeline) * 1e6) as u64;
            let mut s = Scanner::new();
            s.feed(Stream::Stderr, &bytes, at);
            s.finish(at);
            notes.push(format!("OOM text read from {from}"));
            s
        }
        (None, Some(e)) => e.scanner(),
        (None, None) => Scanner::new(),
    };
    let mut timeline = trace.timeline;
    let mut torch = trace.torch;
    torch.name_snapshot(end.as_ref().and_then(|e| e.snapshot.clone()));
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
                torch: (e.torch_enabled || torch.messages > 0).then_some(torch),
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
                torch: (torch.messages > 0).then_some(torch),
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
#[derive(Debug, Default, Clone)]
pub struct Trace {
    pub header: Header,
    pub timeline: Timeline,
    pub torch: TorchTimeline,
    pub end: Option<EndRow>,
}

/// The job's memory per GPU summed from process rows, for traces without `job` rows (gpudoc.trace/1).
/// Rows at one instant are summed once they are all in, as the sampler did, so a process leaving as
/// another arrives never shows as a peak that was not there.
#[derive(Default, Clone)]
struct JobSums {
    /// GPU → (time of the open instant, job bytes per pid, the sums so far).
    open: BTreeMap<u32, OpenInstant>,
}

/// The instant being summed on one GPU (none before the first), the job's bytes per pid, the sums so far.
type OpenInstant = (Option<Micros>, BTreeMap<u32, u64>, Series);

impl JobSums {
    fn add(&mut self, gpu: u32, at: Micros, pid: u32, used: u64, in_job: bool) {
        let (when, held, sums) = self.open.entry(gpu).or_default();
        // The series starts at the first instant, as the sampler's does: its first point is gpudoc's first
        // look at the GPU's processes (Timeline::first_look; what was there then was there before the job).
        // These traces have rows only for processes listed, so where none was at the first look, the
        // first that came is taken for one already there: it errs toward saying nothing.
        if *when != Some(at) {
            if let Some(w) = *when {
                sums.push(w, held.values().sum());
                sums.thin_to(MAX_POINTS);
            }
            *when = Some(at);
        }
        if in_job {
            held.insert(pid, used);
        }
    }

    /// Gives each GPU of `t` without `job` rows the job's series summed so far (a copy).
    fn fill(&self, t: &mut Timeline) {
        for (gpu, (at, held, sums)) in &self.open {
            if let Some(g) = t.gpu_mut(*gpu)
                && g.job.is_empty()
            {
                let mut sums = sums.clone();
                sums.push(at.unwrap_or(0), held.values().sum());
                g.job = sums;
            }
        }
    }
}

/// Reads a JSON-lines trace back. The job's memory per GPU is summed again from the process rows. A
/// corrupt or truncated row is an error that names the line; a trace cut off mid-line by a crash loses
/// only that line. Row by row: a trace of a long run is larger than the timeline it rebuilds, whose series
/// are thinned past [`MAX_POINTS`] as the sampler's were (the run's report was made from those).
pub fn load_trace(path: &Path) -> Result<Trace, LoadError> {
    let mut b = Rebuild::default();
    each_row(path, |n, row| {
        b.apply(row).map_err(|what| bad(path, n, what))
    })?;
    b.finish(path)
}

/// A row as read back: the end row boxed, since it is one of millions and many times a sample's size.
pub(crate) type ReadRow = Row<Box<EndRow>>;

/// A trace's rows, each with its line number.
pub(crate) fn rows(path: &Path) -> Result<Vec<(usize, ReadRow)>, LoadError> {
    let mut rows = Vec::new();
    each_row(path, |n, row| {
        rows.push((n, row));
        Ok(())
    })?;
    Ok(rows)
}

/// Reads the trace line by line and gives each row, with its line number, to `f`. A last line without
/// its newline that does not parse is a write a crash cut short: it is left out.
fn each_row(
    path: &Path,
    mut f: impl FnMut(usize, ReadRow) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    use io::BufRead;
    let io_error = |source| LoadError::Io {
        path: path.display().to_string(),
        source,
    };
    let mut reader = io::BufReader::new(std::fs::File::open(path).map_err(io_error)?);
    let mut line = String::new();
    for n in 1.. {
        line.clear();
        if reader.read_line(&mut line).map_err(io_error)? == 0 {
            break;
        }
        let complete = line.ends_with('\n');
        match serde_json::from_str(line.trim_end_matches(['\n', '\r'])) {
            Ok(row) => f(n, row)?,
            Err(_) if !complete => break,
            Err(e) => return Err(bad(path, n, format!("not a trace row: {e}"))),
        }
    }
    Ok(())
}

pub(crate) fn bad(path: &Path, line: usize, what: String) -> LoadError {
    LoadError::Bad {
        path: path.display().to_string(),
        line,
        what,
    }
}

/// A trace being rebuilt row by row: what the rows so far give.
#[derive(Default, Clone)]
pub(crate) struct Rebuild {
    trace: Trace,
    sums: JobSums,
}

impl Rebuild {
    pub(crate) fn apply(&mut self, row: ReadRow) -> Result<(), String> {
        apply_row(&mut self.trace, &mut self.sums, row)
    }

    /// The trace as the rows applied so far left it (a job summed from process rows not finished).
    #[cfg(test)]
    pub(crate) fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Brings copies of the trace so far up to date with the rows applied since they were last
    /// (`Timeline::catch_up`, `TorchTimeline::catch_up`), the job's memory summed where its rows did not
    /// give it (copied whole: a trace from before gpudoc wrote the job's rows); its header.
    pub(crate) fn catch_up(&self, timeline: &mut Timeline, torch: &mut TorchTimeline) -> &Header {
        timeline.catch_up(&self.trace.timeline);
        torch.catch_up(&self.trace.torch);
        self.sums.fill(timeline);
        &self.trace.header
    }

    /// The trace, its job's memory summed where its rows did not give it (`path` names it in an error).
    pub(crate) fn finish(self, path: &Path) -> Result<Trace, LoadError> {
        let trace = self.trace_of();
        if trace.header.command.is_empty() && trace.timeline.gpus.is_empty() {
            return Err(bad(
                path,
                1,
                format!("no `start` row: not a {SCHEMA} trace"),
            ));
        }
        Ok(trace)
    }

    fn trace_of(self) -> Trace {
        let Rebuild { mut trace, sums } = self;
        sums.fill(&mut trace.timeline);
        trace
    }
}

/// One row of a trace into what is being rebuilt.
fn apply_row(tr: &mut Trace, sums: &mut JobSums, row: ReadRow) -> Result<(), String> {
    let timeline = &mut tr.timeline;
    let unknown = |gpu: u32| format!("GPU {gpu} is not in the header");
    match row {
        Row::Start {
            schema,
            unix_s,
            command,
            origin,
            gpus,
            nvml,
        } => {
            if schema != SCHEMA && !OLD_TRACES.contains(&schema.as_str()) {
                return Err(format!("not a {SCHEMA} trace (schema {schema:?})"));
            }
            tr.header = Header {
                command,
                origin: *origin,
                unix_s,
                nvml: nvml.map(|n| *n),
            };
            tr.timeline.gpus = gpus.into_iter().map(GpuTimeline::new).collect();
        }
        Row::Device { t, gpu, used, .. } => {
            let g = timeline.gpu_mut(gpu).ok_or_else(|| unknown(gpu))?;
            g.used.push(micros(t), used);
            g.used.thin_to(MAX_POINTS);
            timeline.device_samples += 1;
        }
        Row::Process {
            t,
            gpu,
            pid,
            used,
            in_job,
            first,
        } => apply_process(timeline, sums, (micros(t), gpu, pid, used, in_job), first),
        Row::Job { t, gpu, used } => {
            let g = timeline.gpu_mut(gpu).ok_or_else(|| unknown(gpu))?;
            g.job.push(micros(t), used);
            g.job.thin_to(MAX_POINTS);
        }
        Row::Lost { t, gpu, error } => {
            if let Some(g) = timeline.gpu_mut(gpu) {
                g.lost = Some(Lost {
                    at: micros(t),
                    error,
                });
            }
        }
        Row::Torch { m } => {
            tr.torch.apply(m.to_string().as_bytes(), tr.header.unix_s);
        }
        Row::End { end } => tr.end = Some(*end),
    }
    Ok(())
}

/// A row's time `t` (seconds) in microseconds.
fn micros(t: f64) -> Micros {
    (t * 1e6).round() as Micros
}

/// One process's memory on one GPU at one time; its first row says who it is.
fn apply_process(
    timeline: &mut Timeline,
    sums: &mut JobSums,
    (t, gpu, pid, used, in_job): (Micros, u32, u32, u64, bool),
    first: Option<FirstSeen>,
) {
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
            ppid: None,
            used: Series::default(),
        });
    if let Some(f) = first {
        entry.cmdline = f.cmdline;
        entry.visible = f.visible;
        entry.uid = f.uid;
        entry.ppid = f.ppid;
    }
    entry.used.push(t, used);
    entry.used.thin_to(MAX_POINTS);
    sums.add(gpu, t, pid, used, in_job);
    timeline.process_samples += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_trace_is_thinned_as_the_sampler_thinned_it_keeping_its_peaks() {
        let mut b = Rebuild::default();
        b.apply(Row::Start {
            schema: SCHEMA.into(),
            unix_s: 0.0,
            command: vec!["train".into()],
            origin: Default::default(),
            gpus: vec![crate::gpu::GpuInfo {
                index: 0,
                name: "H200".into(),
                uuid: "GPU-0".into(),
                total_bytes: 150 << 30,
            }],
            nvml: None,
        })
        .unwrap();
        // Memory that changes at every 10 ms sample for 3 hours, its peak once in the middle.
        let n = 2 * MAX_POINTS as u64 + 7;
        for i in 0..n {
            let t = i as f64 / 100.0;
            let used = (10 << 30) + ((i % 50) << 20) + if i == n / 2 { 1 << 30 } else { 0 };
            b.apply(Row::Device {
                t,
                gpu: 0,
                used,
                total: 150 << 30,
            })
            .unwrap();
            let first = (i == 0).then(|| FirstSeen {
                cmdline: "train".into(),
                uid: None,
                visible: true,
                ppid: None,
            });
            b.apply(Row::Process {
                t,
                gpu: 0,
                pid: 7,
                used,
                in_job: true,
                first,
            })
            .unwrap();
        }
        let t = b.finish(Path::new("t.jsonl")).unwrap().timeline;
        let peak = (10 << 30) + (((n / 2) % 50) << 20) + (1 << 30);
        let g = &t.gpus[0];
        let p = &t.procs[&(0, 7)];
        for s in [&g.used, &g.job, &p.used] {
            assert!(s.points().len() <= MAX_POINTS + 1, "{}", s.points().len());
            assert_eq!(s.peak(), peak);
            assert_eq!(s.last(), Some((10 << 30) + (((n - 1) % 50) << 20)));
        }
        assert_eq!(t.device_samples, n);
    }

    fn leak() -> serde_json::Value {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/runs/leak.report.json"
        );
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn a_field_of_the_wrong_type_is_named() {
        let mut r = leak();
        r["gpus"][0]["total_bytes"] = "lots".into();
        let e = typed(&r).unwrap_err();
        assert_eq!(
            e,
            "`gpus[0].total_bytes`: invalid type: string \"lots\", expected u64"
        );
    }

    #[test]
    fn a_missing_field_is_named_with_the_object_it_is_missing_from() {
        let mut r = leak();
        r["exit"].as_object_mut().unwrap().remove("core_dumped");
        assert_eq!(
            typed(&r).unwrap_err(),
            "`exit`: missing field `core_dumped`"
        );
        let mut r = leak();
        r.as_object_mut().unwrap().remove("duration_s");
        assert_eq!(
            typed(&r).unwrap_err(),
            "the report: missing field `duration_s`"
        );
        let mut r = leak();
        r["diagnoses"][0]["details"][1] = serde_json::json!(7);
        assert!(
            typed(&r)
                .unwrap_err()
                .starts_with("`diagnoses[0].details[1]`: invalid type"),
            "{}",
            typed(&r).unwrap_err()
        );
    }

    #[test]
    fn an_end_row_without_what_its_writer_cannot_know_reads_it_as_absent() {
        // The notebook's trace of a moment (python/gpudoc/_report.py): no exit, no signal, no leftovers.
        let row: ReadRow = serde_json::from_str(
            r#"{"kind":"end","end":{"duration_s":1.5,"torch_enabled":true,"device_samples":1,
                "gpus":[{"index":0,"driver_reserved_bytes":644874240}]}}"#,
        )
        .unwrap();
        let Row::End { end } = row else {
            panic!("an end row")
        };
        assert_eq!(
            (end.code, end.signal, end.duration_s, end.torch_enabled),
            (None, None, 1.5, true)
        );
        assert_eq!(end.gpus[0].driver_reserved_bytes, 644874240);
        assert!(end.gpus[0].unsupported.is_empty() && end.leftovers.is_empty());
        assert!(end.oom_events.is_empty() && end.nvml.is_none() && !end.escalated);
    }

    #[test]
    fn a_report_on_one_line_is_read_as_a_report_not_a_trace() {
        let one_line = serde_json::to_string(&leak()).unwrap();
        assert!(one_line.contains("\"kind\""));
        assert!(!is_trace_row(&one_line));
        assert!(is_trace_row(r#"{"command":["x"],"kind":"start"}"#));
        assert!(is_trace_row(r#"{"gpu":0,"kind":"device","t":0.02"#));
    }
}
