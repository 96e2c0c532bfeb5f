//! The human summary printed after a run: how the command ended (with the OOM's numbers), the diagnoses,
//! then per GPU the job's peak against capacity, a sparkline of the job's memory and the processes
//! involved, the two views of PyTorch processes side by side, leftovers and notes. Pure: a report in, text
//! out; every text from another process goes through `units::printable`.

use crate::oom::{Ending, OomReport, WINDOW_S};
use crate::paint::Paint;
use crate::report::{GpuReport, Report};
use crate::units::{fmt_bytes, fmt_pct, fmt_secs, printable, shorten, sparkline};
use std::fmt::Write;

/// How the command ended, in words.
pub fn ending(r: &Report) -> String {
    let how = end_of_command(r);
    match &r.exit.stopped_on {
        Some(rule) => format!("{how}, ended by gpudoc (--stop-on {rule})"),
        None => how,
    }
}

fn end_of_command(r: &Report) -> String {
    match r.exit.signal {
        Some(sig) => {
            let name = crate::supervise::signals::signal_name(sig);
            // `--stop-on`'s kill is said with its rule (`ending`).
            let by = if r.exit.killed_by_gpudoc && r.exit.stopped_on.is_none() {
                " (gpudoc, after Ctrl-C presses it did not answer)"
            } else {
                ""
            };
            format!("killed by {name}{by}")
        }
        None => match r.exit.code {
            Some(c) => format!("exited with code {c}"),
            None => "ended (how was not recorded)".into(),
        },
    }
}

const SPARK_WIDTH: usize = 40;
/// Processes listed per GPU, and PyTorch processes in the table; the rest are counted.
const MAX_PROCS: usize = 8;
const MAX_TORCH: usize = 16;

/// Renders the summary.
pub fn render(r: &Report, p: Paint) -> String {
    let mut o = String::new();
    render_headline(&mut o, r, p);
    render_diagnoses(&mut o, r, p);
    if !r.nvml.available {
        let why = r.nvml.error.as_deref().unwrap_or("unknown reason");
        let _ = writeln!(o, "  {}", p.warn(&format!("GPU sampling was off: {why}")));
    }
    render_hosts(&mut o, r);
    for g in r.gpus.iter().filter(|g| !unused(g)) {
        render_gpu(&mut o, r, g, p);
    }
    render_unused(&mut o, r, p);
    render_torch(&mut o, r, p);
    render_inside(&mut o, r, p);
    render_leftovers(&mut o, r, p);
    for n in &r.notes {
        let _ = writeln!(o, "  {}", p.warn(&printable(n)));
    }
    for e in &r.rule_errors {
        let text = format!("a rule could not be evaluated: {e}");
        let _ = writeln!(o, "  {}", p.warn(&printable(&text)));
    }
    render_sampling(&mut o, r, p);
    o
}

/// The first line and, for an OOM or a host OOM kill, the lines that explain it; without colour.
pub fn headline(r: &Report) -> String {
    let mut o = String::new();
    render_headline(&mut o, r, Paint(false));
    o
}

/// The notebook extension's report of one cell (no process ended: the kernel runs on): the cell that ran.
fn notebook_cell(r: &Report) -> Option<&crate::torch::cells::Cell> {
    if r.exit.code.is_some() || r.exit.signal.is_some() {
        return None;
    }
    r.torch.cell_at(None, None, r.duration_s)
}

/// ` in cell 12 (`y = model(x)`)` for an OOM in a notebook cell (a kernel under gpudoc run, or the notebook
/// extension's report of a cell).
fn in_cell(r: &Report, oom: &OomReport) -> String {
    let at = oom.allocator.as_ref().map_or(oom.event.at_s, |a| a.at_s);
    let pid = oom.allocator.as_ref().map(|a| a.pid).or(oom.this_pid);
    r.torch
        .cell_at(pid, oom.gpu, at)
        .map(|c| format!(" in {}", printable(&c.label())))
        .unwrap_or_default()
}

/// The first line: the command, how it ended and after how long; for an OOM or a host OOM kill, why.
fn render_headline(o: &mut String, r: &Report, p: Paint) {
    let cmd = shorten(&r.command.join(" "), 60);
    let end = ending(r);
    let end = if r.exit.code == Some(0) {
        p.good(&end)
    } else {
        p.bad(&end)
    };
    let head = p.bold("gpudoc:");
    match (&r.oom, r.exit.classification) {
        (Some(oom), Ending::GpuOom) => {
            let host = oom
                .host
                .as_deref()
                .map(|h| format!(" on {h}"))
                .unwrap_or_default();
            let vendor = oom.event.text.vendor;
            let gpu = match (oom.gpu, vendor.nvml_sees()) {
                (Some(g), _) => Some(format!("GPU {g}")),
                (None, false) => Some(
                    oom.event
                        .text
                        .gpu
                        .map_or_else(|| vendor.one(), |d| vendor.numbered(d)),
                ),
                (None, true) => None,
            };
            let on = match (gpu, oom.event.rank) {
                (Some(g), Some(rank)) => format!(" on {g}{host} (rank {rank})"),
                (Some(g), None) => format!(" on {g}{host}"),
                (None, Some(rank)) => format!("{host} (rank {rank})"),
                (None, None) => host,
            };
            let what = p.bad(&format!("ran out of {} memory{on}", vendor.chip()));
            // A notebook's cell (the kernel runs on after it), or a trace that ends without its end row.
            let end = if r.exit.code.is_none() && r.exit.signal.is_none() {
                String::new()
            } else {
                format!(": {end}")
            };
            let _ = writeln!(
                o,
                "{head} {cmd} {what} after {}{}{end}",
                fmt_secs(oom.event.at_s),
                in_cell(r, oom)
            );
            // A notebook's moment is NVML read once, at the cell's end: no seconds before to show.
            let one_look = r.sampling.device_samples <= r.gpus.len() as u64;
            render_oom(o, oom, one_look, p);
            if let Some(line) = crate::fit::remedy::suggestion(oom, &r.command) {
                let _ = writeln!(o, "  {line}");
            }
        }
        (_, Ending::HostOomKill) => {
            let what = p.bad("was killed by the kernel's OOM killer for host RAM (not GPU memory)");
            let _ = writeln!(
                o,
                "{head} {cmd} {what} after {}: {end}",
                fmt_secs(r.duration_s)
            );
            if let Some(h) = &r.exit.host_oom {
                if h.cgroup_oom_kills > 0 {
                    let _ = writeln!(
                        o,
                        "  the cgroup's oom_kill counter rose by {} during the run",
                        h.cgroup_oom_kills
                    );
                }
                for line in &h.kernel_log {
                    let _ = writeln!(o, "  kernel: {}", p.dim(&printable(line)));
                }
            }
        }
        _ => match notebook_cell(r) {
            Some(c) => {
                let took = fmt_secs((c.end_s - c.start_s).max(0.0));
                let _ = writeln!(o, "{head} {cmd} ran {} in {took}", printable(&c.label()));
            }
            None => {
                let _ = writeln!(o, "{head} {cmd} {end} after {}", fmt_secs(r.duration_s));
            }
        },
    }
}

/// What the rules found, most severe first; nothing at all for a healthy run.
fn render_diagnoses(o: &mut String, r: &Report, p: Paint) {
    for d in &r.diagnoses {
        let tag = d.severity.tag(p);
        let _ = writeln!(
            o,
            "  {tag} {} {}",
            p.bold(&printable(&d.title)),
            p.dim(&format!("[{}]", d.rule))
        );
        let _ = writeln!(o, "        {}", printable(&d.message));
        render_known(o, r, d, p);
        for line in &d.details {
            let _ = writeln!(o, "          {}", printable(line));
        }
        for a in &d.advice {
            let _ = writeln!(o, "        → {}", printable(a));
        }
        if let Some(url) = &d.docs {
            let _ = writeln!(o, "        {}", p.dim(&printable(url)));
        }
    }
}

/// When a diagnosis told during the run was first known, and its forecast against what happened.
fn render_known(o: &mut String, r: &Report, d: &crate::verdict::Diagnosis, p: Paint) {
    for line in known(r, d) {
        let _ = writeln!(o, "        {}", p.dim(&printable(&line)));
    }
}

/// In words, when a diagnosis told during the run was first known and what it forecast (with when the
/// GPU really ran out, if it did): nothing for what only the end of the run showed.
/// A diagnosis told during the run that this one's story took in (its `parts`) is said here, so what was
/// told is never silently gone.
pub fn known(r: &Report, d: &crate::verdict::Diagnosis) -> Vec<String> {
    let mut out = known_itself(r, d);
    out.extend(parts_told(d));
    out
}

/// When `d` was first known during the run and what it forecast.
fn known_itself(r: &Report, d: &crate::verdict::Diagnosis) -> Vec<String> {
    let Some(at) = d.known_at_s else {
        return Vec::new();
    };
    let mut out = vec![format!("known at {}, during the run", fmt_secs(at))];
    let Some(f) = r
        .forecasts
        .iter()
        .find(|f| f.rule == d.rule && f.subject == d.subject)
    else {
        return out;
    };
    let mut line = format!(
        "forecast at {} (full at {}): {}",
        fmt_secs(f.first.at_s),
        fmt_secs(f.first.full_at_s),
        f.words(&f.first)
    );
    if let Some(oom) = r.oom.as_ref().filter(|o| o.gpu == Some(f.gpu)) {
        let (ran, said) = (oom.event.at_s - f.first.at_s, f.first.full_in_s());
        line += &format!(
            "; it ran out at {} ({:+.0}% of the time forecast)",
            fmt_secs(oom.event.at_s),
            (ran - said) * 100.0 / said.max(1e-9)
        );
    }
    out.push(line);
    out
}

/// Each part of `d` told during the run: when, its title and rule, and that `d` is how it ended.
fn parts_told(d: &crate::verdict::Diagnosis) -> Vec<String> {
    d.parts
        .iter()
        .filter_map(|p| {
            let at = p.known_at_s?;
            Some(format!(
                "told at {}, during the run: {} [{}]; this is how that ended",
                fmt_secs(at),
                p.title,
                p.rule
            ))
        })
        .collect()
}

/// A merged report's nodes: how each one's run ended, its GPUs and ranks.
fn render_hosts(o: &mut String, r: &Report) {
    for h in &r.hosts {
        let end = match h.exit_code {
            Some(c) => format!("exited with code {c}"),
            None => "ended (how was not recorded)".into(),
        };
        let ranks: Vec<String> = h.ranks.iter().map(|x| x.to_string()).collect();
        let gpus: Vec<String> = h.gpus.iter().map(|x| x.to_string()).collect();
        let _ = writeln!(
            o,
            "  host {}: {end} after {} · GPUs {} · ranks {}",
            printable(&h.origin.host),
            fmt_secs(h.duration_s),
            if gpus.is_empty() {
                "-".into()
            } else {
                gpus.join(",")
            },
            if ranks.is_empty() {
                "-".into()
            } else {
                ranks.join(",")
            },
        );
    }
}

/// A GPU the job held nothing on and that was sampled to the end: one line for all of them.
fn unused(g: &GpuReport) -> bool {
    g.job_peak_bytes == 0 && g.lost.is_none()
}

/// The GPUs the job did not use, per host, in one line each: `GPUs 1-7: not used by the job (device
/// peak at most 4.00 GiB)`; their processes, which are others', are in `--json`.
fn render_unused(o: &mut String, r: &Report, p: Paint) {
    let mut hosts: Vec<Option<&str>> = r.gpus.iter().map(|g| g.host.as_deref()).collect();
    hosts.dedup();
    for host in hosts {
        let idle: Vec<&GpuReport> = r
            .gpus
            .iter()
            .filter(|g| unused(g) && g.host.as_deref() == host)
            .collect();
        let Some(first) = idle.first() else {
            continue;
        };
        let on = host.map(|h| format!(" on {h}")).unwrap_or_default();
        let names = if idle.iter().all(|g| g.name == first.name) {
            format!(" {}", printable(&first.name))
        } else {
            String::new()
        };
        let indices: Vec<u32> = idle.iter().map(|g| g.index).collect();
        let which = if idle.len() == 1 { "GPU" } else { "GPUs" };
        let most = idle.iter().map(|g| g.peak_used_bytes).max().unwrap_or(0);
        let text = format!(
            "{which} {}{on}{names}: not used by the job (device peak {}{})",
            ranges(&indices),
            if idle.len() == 1 { "" } else { "at most " },
            fmt_bytes(most)
        );
        let _ = writeln!(o, "  {}", p.dim(&text));
    }
}

/// Indices in short: `0, 2-5, 7`.
fn ranges(indices: &[u32]) -> String {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for &i in indices {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == i => *hi = i,
            _ => runs.push((i, i)),
        }
    }
    let words: Vec<String> = runs
        .iter()
        .map(|&(lo, hi)| match hi - lo {
            0 => lo.to_string(),
            1 => format!("{lo}, {hi}"),
            _ => format!("{lo}-{hi}"),
        })
        .collect();
    words.join(", ")
}

/// One GPU: its peaks, the job's memory over the run, whether it was lost, and its processes.
fn render_gpu(o: &mut String, r: &Report, g: &GpuReport, p: Paint) {
    let on = g
        .host
        .as_deref()
        .map(|h| format!(" on {h}"))
        .unwrap_or_default();
    let cell = r
        .torch
        .cell_at(None, Some(g.index), g.job_peak_at_s)
        .filter(|_| g.job_peak_bytes > 0 && g.host.is_none())
        .map(|c| format!(" (cell {})", c.n))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "  GPU {}{on} {}: job peak {} ({} of {}) at {}{cell} · device peak {} · in use at start {}",
        g.index,
        printable(&g.name),
        p.bold(&fmt_bytes(g.job_peak_bytes)),
        fmt_pct(g.job_peak_bytes, g.total_bytes),
        fmt_bytes(g.total_bytes),
        fmt_secs(g.job_peak_at_s),
        fmt_bytes(g.peak_used_bytes),
        fmt_bytes(g.start_used_bytes),
    );
    // A line over time needs readings over time: a moment's one reading (a notebook cell's) draws none.
    if g.job_peak_bytes > 0 && r.sampling.process_samples > 1 {
        let values: Vec<u64> = g.job_timeline.iter().map(|&(_, v)| v).collect();
        let width = values.len().clamp(1, SPARK_WIDTH);
        let chunk = values.len().div_ceil(width).max(1);
        let squeezed: Vec<u64> = values
            .chunks(chunk)
            .map(|c| *c.iter().max().unwrap())
            .collect();
        let _ = writeln!(
            o,
            "    {} {}",
            sparkline(&squeezed, g.job_peak_bytes),
            p.dim("job memory over the run")
        );
    }
    if let Some(l) = &g.lost {
        let text = format!(
            "lost at {}: {} (no numbers for this GPU after that)",
            fmt_secs(l.at_s),
            printable(&l.error)
        );
        let _ = writeln!(o, "    {}", p.warn(&text));
    }
    for u in &g.unsupported {
        let text = format!("not supported here, not sampled: {}", printable(u));
        let _ = writeln!(o, "    {}", p.dim(&text));
    }
    let mut procs: Vec<_> = r
        .processes
        .iter()
        .filter(|q| q.gpu == g.index && q.host == g.host)
        .collect();
    procs.sort_by(|a, b| {
        b.in_job
            .cmp(&a.in_job)
            .then(b.peak_bytes.cmp(&a.peak_bytes))
    });
    for q in procs.iter().take(MAX_PROCS) {
        let who = if q.in_job { "job  " } else { "other" };
        let _ = writeln!(
            o,
            "    {who} pid {:<7} peak {:>10}  {}",
            q.pid,
            fmt_bytes(q.peak_bytes),
            p.dim(&shorten(&q.cmdline, 60))
        );
    }
    if procs.len() > MAX_PROCS {
        let _ = writeln!(
            o,
            "    … and {} more processes (see --json)",
            procs.len() - MAX_PROCS
        );
    }
}

/// The two views side by side: NVML's figure per process and PyTorch's (or another framework's), and what
/// lies outside the framework's allocator; one table per framework.
fn render_torch(o: &mut String, r: &Report, p: Paint) {
    let t = &r.torch;
    if t.processes.is_empty() {
        return;
    }
    let mut frameworks: Vec<_> = t.processes.iter().map(|q| q.framework).collect();
    frameworks.sort();
    frameworks.dedup();
    let mut shown = 0;
    for fw in frameworks {
        let rows: Vec<_> = t.processes.iter().filter(|q| q.framework == fw).collect();
        let room = MAX_TORCH.saturating_sub(shown).max(1);
        render_framework_table(o, fw, &rows[..rows.len().min(room)], p);
        shown += rows.len().min(room);
        for q in rows.iter().take(room) {
            if let Some(line) = framework_line(q) {
                let _ = writeln!(o, "    {}", printable(&line));
            }
        }
    }
    if t.processes.len() > MAX_TORCH {
        let more = t.processes.len() - MAX_TORCH;
        let _ = writeln!(o, "    … and {more} more (see --json)");
    }
    for q in t.processes.iter().filter(|q| !q.cells.is_empty()) {
        let _ = writeln!(o, "    {}", printable(&cells_line(q, &t.ooms)));
    }
    let fast = t.processes.iter().filter(|q| q.record_every > 1);
    if let Some(q) = fast.max_by_key(|q| q.record_every) {
        // PyTorch's peaks are reset at each record; JAX's are the allocator's own since the start.
        let peaks = match q.framework.is_torch() {
            true => "peaks exact over each",
            false => "peaks since the start",
        };
        let text = format!(
            "steps came fast: recorded every {} ({peaks}), the shim's cost kept under 0.5% of the step time",
            q.record_every
        );
        let _ = writeln!(o, "    {}", p.dim(&text));
    }
}

/// A kernel's notebook cells: how many ran, the one that peaked, those that ran out of memory.
/// One framework's table: per process, NVML's peak, the allocator's peaks, what lies outside it.
fn render_framework_table(
    o: &mut String,
    fw: crate::torch::framework::Framework,
    rows: &[&crate::torch::view::TorchProcReport],
    p: Paint,
) {
    let name = fw.name();
    let head = match rows.iter().all(|q| q.peak_reserved_bytes.is_some()) {
        true => format!("{name}, per process (NVML peak = reserved + non-{name}):"),
        false => format!("{name}, per process (its allocator does not say what it reserves):"),
    };
    let _ = writeln!(o, "  {}", p.bold(&head));
    let _ = writeln!(
        o,
        "    {:<8} {:<5} {:<4} {:>11} {:>14} {:>15} {:>12} {:>7} {:>8}",
        "pid",
        "rank",
        "GPU",
        "NVML peak",
        "reserved peak",
        "allocated peak",
        format!("non-{name}"),
        "steps",
        "retries"
    );
    let opt = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "-".into());
    for q in rows {
        let rank = q
            .rank
            .as_ref()
            .map(|r| printable(&r.to_string()).into_owned())
            .unwrap_or_else(|| "-".into());
        let gpu = q
            .gpu
            .map(|g| g.to_string())
            .unwrap_or_else(|| format!("cuda:{}", q.device));
        let _ = writeln!(
            o,
            "    {:<8} {:<5} {:<4} {:>11} {:>14} {:>15} {:>12} {:>7} {:>8}",
            q.pid,
            rank,
            gpu,
            opt(q.nvml_peak_bytes),
            opt(q.peak_reserved_bytes),
            fmt_bytes(q.peak_allocated_bytes),
            opt(q.non_pytorch_bytes),
            q.steps_total,
            q.alloc_retries.map_or("-".into(), |n| n.to_string())
        );
    }
}

/// What only a framework other than PyTorch tells of its allocator: its version, the settings in force,
/// its limit and largest free block (JAX), its free blocks (CuPy).
fn framework_line(q: &crate::torch::view::TorchProcReport) -> Option<String> {
    let hello = q.framework_hello.as_ref()?;
    let mut parts = vec![format!(
        "pid {}: {} {}",
        q.pid,
        q.framework.name(),
        hello.version
    )];
    if q.preallocated {
        parts.push("preallocated its pool".into());
    }
    for (k, v) in &hello.settings {
        parts.push(format!("{k}={v}"));
    }
    let bytes = [
        ("limit", q.limit_bytes),
        ("largest free block", q.largest_free_block_bytes),
    ];
    for (what, b) in bytes {
        if let Some(b) = b {
            parts.push(format!("{what} {}", fmt_bytes(b)));
        }
    }
    if let Some(n) = q.free_blocks {
        parts.push(format!("{n} free blocks"));
    }
    if let Some(n) = q.pinned_free_blocks {
        parts.push(format!("pinned pool: {n} free blocks"));
    }
    Some(parts.join(", "))
}

fn cells_line(q: &crate::torch::view::TorchProcReport, ooms: &[crate::torch::TorchOom]) -> String {
    let peak = q
        .cells
        .iter()
        .max_by_key(|c| c.peak_allocated_bytes.unwrap_or(c.allocated_bytes));
    let mut text = format!("pid {}: {} notebook cells", q.pid, q.cells.len());
    if let Some(c) = peak {
        let bytes = c.peak_allocated_bytes.unwrap_or(c.allocated_bytes);
        let _ = write!(
            text,
            "; allocated peaked at {} in {}",
            fmt_bytes(bytes),
            c.label()
        );
    }
    let mut failed: Vec<String> = ooms
        .iter()
        .filter(|m| m.pid == q.pid && m.device == q.device)
        .filter_map(|m| crate::torch::cells::at(&q.cells, m.at_s))
        .map(|c| format!("cell {}", c.n))
        .collect();
    failed.dedup();
    if !failed.is_empty() {
        let _ = write!(text, "; ran out of memory in {}", failed.join(", "));
    }
    text
}

/// Modules shown in the summary's table (the report has them all).
const TOP_MODULES: usize = 5;

/// Inside the model: the measured step's breakdown at its peak and its top modules (an OOM's place and
/// breakdown are under its diagnosis), and the snapshot `--snapshot` wrote.
fn render_inside(o: &mut String, r: &Report, p: Paint) {
    for q in r.torch.processes.iter().take(MAX_TORCH) {
        for w in &q.inside {
            if let Some(e) = &w.error {
                let text = format!("pid {}: where the memory went was not measured: {e}", q.pid);
                let _ = writeln!(o, "  {}", p.warn(&printable(&text)));
                continue;
            }
            if w.why == "peak" {
                render_peak(o, q.pid, w, p);
            }
            if let Some(f) = &w.snapshot {
                let at = if w.why == "oom" {
                    "the OOM".to_string()
                } else {
                    w.measured()
                };
                let text = format!(
                    "allocator snapshot at {at}: {} (open it at pytorch.org/memory_viz)",
                    printable(f)
                );
                let _ = writeln!(o, "    {}", p.dim(&text));
            }
        }
    }
}

fn render_peak(o: &mut String, pid: u32, w: &crate::torch::inside::Inside, p: Paint) {
    let _ = writeln!(
        o,
        "  {}",
        p.bold(&format!(
            "Inside the model (pid {pid}, {}), at its peak of {}:",
            w.measured(),
            fmt_bytes(w.allocated_bytes)
        ))
    );
    for l in crate::rules::hunt_words::HuntWords::bundled().look("peak", w) {
        let _ = writeln!(o, "    {}", printable(&l));
    }
    let top = w.top_modules(TOP_MODULES);
    if top.is_empty() {
        return;
    }
    let width = top
        .iter()
        .map(|m| m.name.len())
        .max()
        .unwrap_or(6)
        .clamp(6, 40);
    let columns = w.columns();
    let mut head = format!("    {:<width$}", "module");
    for (name, _) in &columns {
        head.push_str(&format!(" {name:>18}"));
    }
    let _ = writeln!(o, "{head}");
    for m in top {
        let mut line = format!("    {:<width$}", shorten(&printable(&m.name), 40));
        for (_, get) in &columns {
            let v = get(m).map(fmt_bytes).unwrap_or_else(|| "-".into());
            line.push_str(&format!(" {v:>18}"));
        }
        let _ = writeln!(o, "{line}");
    }
    if w.modules.len() > TOP_MODULES {
        let more = w.modules.len() - TOP_MODULES;
        let _ = writeln!(
            o,
            "    {}",
            p.dim(&format!("… and {more} more modules (see --json)"))
        );
    }
}

/// Descendants still running after the command exited, and what `--kill-orphans` did to them.
pub fn render_leftovers(o: &mut String, r: &Report, p: Paint) {
    for orphan in &r.orphans {
        let held: u64 = orphan.gpu_bytes.iter().map(|&(_, b)| b).sum();
        let ended = orphan
            .ended
            .as_ref()
            .map(|e| format!(": {}", e.describe()))
            .unwrap_or_default();
        let held = if held > 0 {
            format!(", holding {} of GPU memory", fmt_bytes(held))
        } else {
            String::new()
        };
        let text = format!(
            "left running: pid {} {}{held}{ended}",
            orphan.pid,
            shorten(&orphan.cmdline, 60)
        );
        let _ = writeln!(o, "  {}", p.warn(&text));
    }
}

/// NVML's driver and how often it was sampled.
fn render_sampling(o: &mut String, r: &Report, p: Paint) {
    if !r.nvml.available {
        return;
    }
    let driver = r.nvml.driver.as_deref().unwrap_or("?");
    let cuda = r.nvml.cuda_driver.as_deref().unwrap_or("?");
    // A report of a moment (the notebook extension's) read NVML once, at no rate.
    let every = |s: f64| {
        if s > 0.0 {
            format!(" every {}", fmt_interval(s))
        } else {
            String::new()
        }
    };
    let text = format!(
        "NVML: driver {}, CUDA {} · {} device samples{}, {} process samples{}",
        printable(driver),
        printable(cuda),
        r.sampling.device_samples,
        every(r.sampling.device_interval_s),
        r.sampling.process_samples,
        every(r.sampling.process_interval_s),
    );
    let _ = writeln!(o, "  {}", p.dim(&text));
}

/// The numbers of an OOM: what was asked, what was free, who held the rest, and the seconds before (what
/// each process held then, where NVML was read `one_look` only).
fn render_oom(o: &mut String, oom: &OomReport, one_look: bool, p: Paint) {
    render_oom_request(o, oom, p);
    let vendor = oom.event.text.vendor;
    if !vendor.nvml_sees() {
        let _ = writeln!(
            o,
            "  {}: NVML cannot see {}, so the numbers are the text's alone",
            vendor.names().1,
            vendor.one()
        );
    }
    render_oom_holders(o, oom);
    let _ = writeln!(
        o,
        "  cause: {}: {}",
        p.bold(oom.cause.words()),
        printable(&oom.explanation)
    );
    if let Some(ff) = &oom.first_failure
        && let Some(rank) = ff.rank
    {
        let pid = ff.pid.map(|p| format!(", pid {p}")).unwrap_or_default();
        let _ = writeln!(o, "  torchrun: rank {rank} failed first{pid}");
    }
    if !oom.before.is_empty() && one_look {
        let _ = writeln!(o, "  then (NVML, read once):");
        for b in oom.before.iter().take(6) {
            let who = if b.in_job { "job  " } else { "other" };
            let _ = writeln!(
                o,
                "    {who} pid {:<7} {}  {}",
                b.pid,
                fmt_bytes(b.bytes_at.max(b.peak_bytes)),
                p.dim(&shorten(&b.cmdline, 50))
            );
        }
    } else if !oom.before.is_empty() {
        let _ = writeln!(o, "  in the {WINDOW_S} s before (NVML):");
        for b in oom.before.iter().take(6) {
            let who = if b.in_job { "job  " } else { "other" };
            // Taken before the job began, not in the window: said, never `0 B →`.
            let held = if b.held_from_start {
                " (held from the start)"
            } else {
                ""
            };
            let _ = writeln!(
                o,
                "    {who} pid {:<7} {}{held} → {} (peak {})  {}",
                b.pid,
                fmt_bytes(b.bytes_before),
                fmt_bytes(b.bytes_at),
                fmt_bytes(b.peak_bytes),
                p.dim(&shorten(&b.cmdline, 50))
            );
        }
    }
}

/// What was asked for, with what free, in which words.
fn render_oom_request(o: &mut String, oom: &OomReport, p: Paint) {
    let t = &oom.event.text;
    let mut asked = String::from("  ");
    if let Some(req) = t.requested_bytes {
        let _ = write!(asked, "asked for {}", p.bold(&fmt_bytes(req)));
        if let Some(free) = t.free_bytes {
            let _ = write!(asked, " with {} free", fmt_bytes(free));
        }
        if let Some(total) = t.total_bytes {
            let _ = write!(asked, " of {}", fmt_bytes(total));
        }
    } else {
        asked.push_str("the output does not say how much was asked for");
    }
    let from = t.exception.clone().unwrap_or_else(|| t.format.clone());
    let partial = if t.complete { "" } else { ", partial text" };
    let _ = writeln!(
        o,
        "{asked} {}",
        p.dim(&format!("({}{partial})", printable(&from)))
    );
}

/// Who held the memory: the failing process (in PyTorch's words), and the others.
fn render_oom_holders(o: &mut String, oom: &OomReport) {
    let t = &oom.event.text;
    if let Some(alloc) = t.allocated_bytes {
        // PyTorch prints "this process has 0 bytes" when NVML can't see it (in a container): unknown.
        let total = t.process_bytes.filter(|&b| b > 0);
        let mut held = String::from("  the process held ");
        if let Some(total) = total {
            let _ = write!(held, "{}: ", fmt_bytes(total));
        }
        let _ = write!(held, "{} in live tensors", fmt_bytes(alloc));
        if let Some(u) = t.reserved_unallocated_bytes {
            let _ = write!(held, ", {} cached by PyTorch but unallocated", fmt_bytes(u));
        }
        if let (Some(total), Some(res)) = (total, t.reserved_bytes) {
            let outside = fmt_bytes(total.saturating_sub(res));
            let _ = write!(held, ", {outside} outside PyTorch");
        }
        let _ = writeln!(o, "{held}");
    }
    if oom.job_others_bytes > 0 {
        let _ = writeln!(
            o,
            "  the job's other processes held {} (the text names them as other processes)",
            fmt_bytes(oom.job_others_bytes)
        );
    }
    if oom.others_bytes == 0 {
        return;
    }
    let mut names: Vec<String> = t
        .other_processes
        .iter()
        .map(|q| {
            let cmd = oom
                .before
                .iter()
                .find(|b| b.pid == q.pid)
                .map(|b| format!(" {}", shorten(&b.cmdline, 40)))
                .unwrap_or_default();
            format!("pid {}{cmd} {}", q.pid, fmt_bytes(q.bytes))
        })
        .collect();
    if names.is_empty() {
        names = oom
            .before
            .iter()
            .filter(|b| !b.in_job && b.visible)
            .map(|b| {
                let cmd = shorten(&b.cmdline, 40);
                format!("pid {} {cmd} {}", b.pid, fmt_bytes(b.bytes_at))
            })
            .collect();
    }
    let _ = writeln!(
        o,
        "  other processes held {}: {}",
        fmt_bytes(oom.others_bytes),
        names.join("; ")
    );
}

fn fmt_interval(s: f64) -> String {
    humantime::format_duration(std::time::Duration::from_secs_f64(s)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(json: &str) -> Report {
        serde_json::from_str(json).unwrap()
    }

    /// A real H200 OOM (fixtures/oom/h200/torch_other_process): another user's 100 GiB squeezed the job.
    fn squeezed() -> Report {
        report(include_str!(
            "../fixtures/oom/h200/torch_other_process.report.json"
        ))
    }

    #[test]
    fn an_oom_is_headlined_with_its_numbers_and_cause() {
        let text = render(&squeezed(), Paint(false));
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("gpudoc: python3 tests/gpu/oom.py squeeze ran out of GPU memory on GPU 0 after 3.01 s: exited with code 1"),
            "{}",
            lines[0]
        );
        assert!(lines[1].contains("asked for 38.78 GiB with 28.77 GiB free of 139.80 GiB"));
        assert!(text.contains("cause: other processes:"));
        assert!(
            text.contains("error Out of memory because other processes held the GPU [oom-others]")
        );
        // The headline alone (for the HTML page) is the same first lines.
        assert!(text.starts_with(&headline(&squeezed())));
    }

    #[test]
    fn unused_gpus_are_one_line() {
        let mut r = squeezed();
        let gpu = r.gpus[0].clone();
        r.gpus.truncate(1);
        for i in 1..8 {
            let mut g = gpu.clone();
            g.index = i;
            g.job_peak_bytes = 0;
            g.peak_used_bytes = if i == 3 { 4 << 30 } else { 0 };
            r.gpus.push(g);
        }
        let text = render(&r, Paint(false));
        assert!(!text.contains("job peak 0 B"), "{text}");
        assert_eq!(text.matches("not used by the job").count(), 1, "{text}");
        assert!(
            text.contains(
                "GPUs 1-7 NVIDIA H200: not used by the job (device peak at most 4.00 GiB)"
            ),
            "{text}"
        );
        assert_eq!(ranges(&[0, 2, 3, 4, 5, 7, 8]), "0, 2-5, 7, 8");
    }

    #[test]
    fn colours_only_when_asked() {
        let r = squeezed();
        assert!(!render(&r, Paint(false)).contains('\u{1b}'));
        let painted = render(&r, Paint(true));
        assert!(painted.contains("\u{1b}["), "colour codes");
        // The same words under the colours.
        let stripped: String = {
            let mut out = String::new();
            let mut esc = false;
            for c in painted.chars() {
                match (esc, c) {
                    (_, '\u{1b}') => esc = true,
                    (true, 'm') => esc = false,
                    (true, _) => {}
                    (false, c) => out.push(c),
                }
            }
            out
        };
        assert_eq!(stripped, render(&r, Paint(false)));
    }

    #[test]
    fn a_healthy_run_is_a_few_lines_and_no_diagnosis() {
        let r = report(include_str!("../fixtures/runs/healthy.report.json"));
        let text = render(&r, Paint(false));
        assert!(text.starts_with("gpudoc: "), "{text}");
        assert!(text.contains("exited with code 0"));
        for sev in ["error ", "warn  ", "info  "] {
            assert!(!text.contains(&format!("  {sev}")), "{text}");
        }
        assert!(text.lines().count() < 15, "{text}");
    }

    #[test]
    fn other_users_text_cannot_drive_the_terminal() {
        let mut r = squeezed();
        r.processes[0].cmdline = "evil\u{1b}]0;PWNED\u{7}\u{1b}[2J".into();
        r.oom.as_mut().unwrap().before[0].cmdline = r.processes[0].cmdline.clone();
        let text = render(&r, Paint(false));
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
    }
}
