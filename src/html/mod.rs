//! `--html FILE`: one self-contained page of a run. The text (how it ended, the OOM, the diagnoses, the
//! gate, the processes, leak sites) is written here as HTML; the charts are drawn in the browser by uPlot
//! (inlined, MIT) from the data of `chart`, bounded in size whatever the run's length.

mod chart;

use crate::report::Report;
use crate::timeline::Timeline;
use crate::units::{fmt_bytes, fmt_secs};
use std::fmt::Write;

const UPLOT_JS: &str = include_str!("vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uPlot.min.css");
const PAGE_CSS: &str = include_str!("page.css");
const PAGE_JS: &str = include_str!("page.js");

/// The page of `report`, with its samples when there are (a run, or a trace replayed).
pub fn render(report: &Report, timeline: Option<&Timeline>) -> String {
    let data = serde_json::json!({
        "gpus": chart::gpu_charts(report, timeline),
        "steps": chart::step_charts(report),
        "diagnoses": report.diagnoses.iter().map(|d| serde_json::json!({
            "rule": d.rule, "severity": d.severity, "gpu": d.gpu.as_ref().map(|g| g.to_string()), "pid": d.pid, "at": d.at_s,
        })).collect::<Vec<_>>(),
    });
    let data = serde_json::to_string(&data)
        .expect("chart data serializes")
        .replace("</", "<\\/");
    let title = esc(&format!(
        "gpudoc: {}",
        crate::units::shorten(&report.command.join(" "), 80)
    ));
    let mut body = String::new();
    header(&mut body, report);
    diagnoses(&mut body, report);
    gpus(&mut body, report, timeline.is_some());
    gate(&mut body, report);
    processes(&mut body, report);
    leaks(&mut body, report);
    inside(&mut body, report);
    footer(&mut body, report);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"color-scheme\" content=\"light dark\">\n<title>{title}</title>\n\
         <style>{UPLOT_CSS}</style>\n<style>{PAGE_CSS}</style>\n</head>\n<body>\n{body}\
         <script type=\"application/json\" id=\"gpudoc-data\">{data}</script>\n\
         <script>{UPLOT_JS}</script>\n<script>{PAGE_JS}</script>\n</body>\n</html>\n"
    )
}

/// Text for HTML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => o.push('\u{fffd}'),
            c => o.push(c),
        }
    }
    o
}

/// The command, how it ended (with the OOM explained), where it ran.
fn header(o: &mut String, r: &Report) {
    let head = crate::summary::headline(r);
    let mut lines = head.lines();
    let first = lines.next().unwrap_or("").trim_start_matches("gpudoc: ");
    let class = if r.exit.code == Some(0) { "ok" } else { "bad" };
    let _ = write!(o, "<header>\n<h1 class=\"{class}\">{}</h1>\n", esc(first));
    let rest: Vec<&str> = lines.collect();
    if !rest.is_empty() {
        let id = if r.oom.is_some() { " id=\"oom\"" } else { "" };
        let _ = writeln!(
            o,
            "<pre class=\"explain\"{id}>{}</pre>",
            esc(rest
                .iter()
                .map(|l| l.trim_start())
                .collect::<Vec<_>>()
                .join("\n")
                .as_str())
        );
    }
    let mut facts = vec![format!("ran {}", fmt_secs(r.duration_s))];
    if !r.origin.host.is_empty() {
        facts.push(format!("on {}", r.origin.host));
    }
    if let Some(n) = &r.origin.name {
        facts.push(format!("job {n}"));
    }
    for h in &r.hosts {
        facts.push(format!(
            "host {}: {} · GPUs {:?} · ranks {:?}",
            h.origin.host,
            h.exit_code
                .map_or("ended".into(), |c| format!("exited with code {c}")),
            h.gpus,
            h.ranks
        ));
    }
    let _ = writeln!(
        o,
        "<p class=\"meta\">{}</p>\n</header>",
        esc(&facts.join(" · "))
    );
}

fn diagnoses(o: &mut String, r: &Report) {
    let _ = writeln!(o, "<section id=\"diagnoses\">\n<h2>Diagnoses</h2>");
    if r.diagnoses.is_empty() {
        let _ = writeln!(
            o,
            "<p class=\"ok\">None: the rules found nothing wrong.</p>"
        );
    }
    for (i, d) in r.diagnoses.iter().enumerate() {
        let sev = serde_json::to_value(d.severity)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let linked = if d.gpu.is_some() { " linked" } else { "" };
        let _ = write!(
            o,
            "<article class=\"diag sev-{sev}{linked}\" id=\"diag-{i}\" tabindex=\"0\">\
             <h3><span class=\"sev\">{sev}</span> {} <code>{}</code></h3>\
             <p class=\"msg\">{}</p>",
            esc(&d.title),
            esc(&d.rule),
            esc(&d.message)
        );
        for line in crate::summary::known(r, d) {
            let _ = write!(o, "<p class=\"known\">{}</p>", esc(&line));
        }
        if !d.details.is_empty() {
            let _ = write!(o, "<ul class=\"details\">");
            for l in &d.details {
                let _ = write!(o, "<li>{}</li>", esc(l));
            }
            let _ = write!(o, "</ul>");
        }
        if !d.advice.is_empty() {
            let _ = write!(o, "<ul class=\"advice\">");
            for l in &d.advice {
                let _ = write!(o, "<li>{}</li>", esc(l));
            }
            let _ = write!(o, "</ul>");
        }
        let mut foot = Vec::new();
        if let Some(g) = d.gpu.as_ref().map(|g| g.to_string()) {
            let at = d
                .at_s
                .map(|a| format!(" at {}", fmt_secs(a)))
                .unwrap_or_default();
            foot.push(format!(
                "<a href=\"#gpu-{}\" class=\"show\">show on {}{at}</a>",
                slug(&g),
                esc(&g)
            ));
        }
        if let Some(url) = &d.docs {
            foot.push(format!("<a href=\"{}\">{}</a>", esc(url), esc(url)));
        }
        if !foot.is_empty() {
            let _ = write!(o, "<p class=\"foot\">{}</p>", foot.join(" · "));
        }
        let _ = writeln!(o, "</article>");
    }
    for e in &r.rule_errors {
        let _ = writeln!(
            o,
            "<p class=\"warn\">a rule could not be evaluated: {}</p>",
            esc(e)
        );
    }
    let _ = writeln!(o, "</section>");
}

/// An id for a GPU's label.
fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect()
}

/// Per GPU: its numbers and the place of its charts (drawn by the script).
fn gpus(o: &mut String, r: &Report, sampled: bool) {
    let _ = writeln!(o, "<section id=\"gpus\">\n<h2>Memory over the run</h2>");
    if !sampled {
        let _ = writeln!(
            o,
            "<p class=\"note\">Drawn from the report, which keeps the job's highest memory in each of \
             120 slices of the run; a trace (<code>gpudoc run --trace FILE.jsonl</code>, then \
             <code>gpudoc report FILE.jsonl --html</code>) gives every sample, each process and \
             PyTorch's memory over time.</p>"
        );
    }
    let _ = writeln!(
        o,
        "<p class=\"hint\">Drag to zoom, double-click to zoom out, wheel to zoom at the cursor, \
         shift-drag to pan; the legend reads the values under the cursor.</p>"
    );
    for g in &r.gpus {
        let label = chart::label_of(g.host.as_deref(), g.index);
        if chart::idle(g) {
            let _ = writeln!(
                o,
                "<p class=\"gpu idle\" id=\"gpu-{}\" data-gpu=\"{}\">{} {}: not used by the job \
                 (device peak {})</p>",
                slug(&label),
                esc(&label),
                esc(&label),
                esc(&g.name),
                fmt_bytes(g.peak_used_bytes)
            );
            continue;
        }
        let _ = writeln!(
            o,
            "<div class=\"gpu\" id=\"gpu-{}\" data-gpu=\"{}\">\n<h3>{} {}</h3>\n\
             <p class=\"meta\">job peak {} at {} · device peak {} · capacity {} · in use at start {}</p>\n\
             <div class=\"chart timeline\"></div>\n<div class=\"steps\"></div>\n</div>",
            slug(&label),
            esc(&label),
            esc(&label),
            esc(&g.name),
            fmt_bytes(g.job_peak_bytes),
            fmt_secs(g.job_peak_at_s),
            fmt_bytes(g.peak_used_bytes),
            fmt_bytes(g.total_bytes),
            fmt_bytes(g.start_used_bytes),
        );
    }
    let _ = writeln!(o, "</section>");
}

fn gate(o: &mut String, r: &Report) {
    let Some(g) = &r.gate else { return };
    let (class, verdict) = if g.passed {
        ("ok", "passed")
    } else {
        ("bad", "failed")
    };
    let _ = writeln!(
        o,
        "<section id=\"gate\">\n<h2>Gate: <span class=\"{class}\">{verdict}</span></h2>\n<table>\
         <tr><th>check</th><th>GPU</th><th>value</th><th>limit</th><th>baseline</th><th></th></tr>"
    );
    let b = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_default();
    for c in &g.checks {
        let _ = writeln!(
            o,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if c.passed { "ok" } else { "bad" },
            esc(&c.kind),
            c.gpu.map(|x| x.to_string()).unwrap_or_default(),
            b(c.value_bytes),
            b(c.limit_bytes),
            b(c.baseline_bytes),
            esc(&c.message)
        );
    }
    let _ = writeln!(o, "</table>");
    for n in g.reasons.iter().chain(&g.notes) {
        let _ = writeln!(o, "<p>{}</p>", esc(n));
    }
    let _ = writeln!(o, "</section>");
}

fn processes(o: &mut String, r: &Report) {
    if r.processes.is_empty() && r.orphans.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "<section id=\"processes\">\n<h2>Processes</h2>\n<table>\
         <tr><th>pid</th><th>GPU</th><th></th><th>peak</th><th>at</th><th>at the end</th>\
         <th>command</th></tr>"
    );
    for p in &r.processes {
        let gpu = chart::label_of(p.host.as_deref(), p.gpu);
        let _ = writeln!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            p.pid,
            esc(&gpu),
            if p.in_job { "job" } else { "other" },
            fmt_bytes(p.peak_bytes),
            fmt_secs(p.peak_at_s),
            fmt_bytes(p.final_bytes),
            esc(&p.cmdline)
        );
    }
    let _ = writeln!(o, "</table>");
    for l in &r.orphans {
        let held: Vec<String> = l
            .gpu_bytes
            .iter()
            .map(|(g, b)| format!("{} on GPU {g}", fmt_bytes(*b)))
            .collect();
        let _ = writeln!(
            o,
            "<p class=\"bad\">left behind: pid {} holding {} <code>{}</code></p>",
            l.pid,
            esc(&held.join(", ")),
            esc(&l.cmdline)
        );
    }
    let _ = writeln!(o, "</section>");
}

/// The leak hunts: where the memory that stayed alive was allocated, and what holds it.
fn leaks(o: &mut String, r: &Report) {
    let hunts: Vec<_> = r
        .torch
        .processes
        .iter()
        .flat_map(|p| p.hunts.iter().map(move |h| (p, h)))
        .filter(|(_, h)| h.error.is_none() && (!h.sites.is_empty() || !h.holders.is_empty()))
        .collect();
    if hunts.is_empty() {
        return;
    }
    let _ = writeln!(o, "<section id=\"leaks\">\n<h2>Leak hunts</h2>");
    for (p, h) in hunts {
        let head = if h.why == "oom" {
            format!(
                "pid {} at its out-of-memory error: what held the GPU",
                p.pid
            )
        } else {
            format!(
                "pid {}: steps {} to {}, allocated memory {} {}",
                p.pid,
                h.from_step,
                h.to_step,
                if h.growth_bytes >= 0 {
                    "grew by"
                } else {
                    "fell by"
                },
                fmt_bytes(h.growth_bytes.unsigned_abs())
            )
        };
        let _ = writeln!(o, "<h3>{}</h3>\n<ul>", esc(&head));
        let (hunt, sites, holders) = crate::rules::facts::hunt::records(h);
        let said = crate::rules::hunt_words::HuntWords::bundled()
            .records("report", &hunt, &sites, &holders)
            .unwrap_or_else(|e| vec![e]);
        for l in &said {
            let _ = writeln!(o, "<li><code>{}</code></li>", esc(l));
        }
        let _ = writeln!(o, "</ul>");
    }
    let _ = writeln!(o, "</section>");
}

/// Where the memory went inside the model: each OOM's place and breakdown, and each measured step's or
/// call's, with a bar per module (the memory its forward added, or at an OOM what it held) and its other
/// columns.
fn inside(o: &mut String, r: &Report) {
    let all: Vec<_> = r
        .torch
        .processes
        .iter()
        .flat_map(|p| p.inside.iter().map(move |w| (p, w)))
        .filter(|(_, w)| w.error.is_none())
        .collect();
    if all.is_empty() {
        return;
    }
    let _ = writeln!(o, "<section id=\"inside\">\n<h2>Inside the model</h2>");
    for (p, w) in all {
        let head = if w.why == "oom" {
            format!("pid {} at its out-of-memory error", p.pid)
        } else {
            format!(
                "pid {}, {}: its peak, {}",
                p.pid,
                w.measured(),
                fmt_bytes(w.allocated_bytes)
            )
        };
        let _ = writeln!(o, "<h3>{}</h3>\n<ul>", esc(&head));
        let words = crate::rules::hunt_words::HuntWords::bundled();
        let lines = match w.why.as_str() {
            "oom" if w.saw_model() => words.look("inside", w),
            "oom" => Vec::new(),
            _ => words.look("peak", w),
        };
        for l in lines.iter().chain(w.snapshot.iter()) {
            let _ = writeln!(o, "<li><code>{}</code></li>", esc(l));
        }
        let _ = writeln!(o, "</ul>");
        module_bars(o, w);
    }
    let _ = writeln!(o, "</section>");
}

/// The table of modules, a bar each (scaled to the largest), then the columns its rows have.
fn module_bars(o: &mut String, w: &crate::torch::inside::Inside) {
    if w.modules.is_empty() {
        return;
    }
    let bar = if w.why == "peak" {
        "forward adds"
    } else {
        "parameters, gradients, optimizer state, saved for backward"
    };
    // The bar is the first column's figure (forward adds) on a measured step or call.
    let mut columns = w.columns();
    columns.retain(|(name, _)| *name != "forward adds");
    let _ = write!(o, "<table>\n<tr><th>module</th><th>{bar}</th>");
    for (name, _) in &columns {
        let _ = write!(o, "<th>{name}</th>");
    }
    let _ = writeln!(o, "</tr>");
    let top = w
        .modules
        .iter()
        .map(|m| m.weight())
        .max()
        .unwrap_or(0)
        .max(1);
    for m in &w.modules {
        let width = m.weight() * 100 / top;
        let _ = write!(
            o,
            "<tr><td><code>{}</code></td><td class=\"bars\"><span class=\"bar\" style=\"width:{width}%\"></span>{}</td>",
            esc(&m.name),
            fmt_bytes(m.weight()),
        );
        for (_, get) in &columns {
            let _ = write!(o, "<td>{}</td>", get(m).map(fmt_bytes).unwrap_or_default());
        }
        let _ = writeln!(o, "</tr>");
    }
    let _ = writeln!(o, "</table>");
}

fn footer(o: &mut String, r: &Report) {
    let _ = writeln!(o, "<footer>");
    for n in &r.notes {
        let _ = writeln!(o, "<p class=\"warn\">{}</p>", esc(n));
    }
    let nvml = if r.nvml.available {
        format!(
            "NVML: driver {}, CUDA {}",
            r.nvml.driver.as_deref().unwrap_or("?"),
            r.nvml.cuda_driver.as_deref().unwrap_or("?")
        )
    } else {
        format!(
            "GPU sampling was off: {}",
            r.nvml.error.as_deref().unwrap_or("NVML unavailable")
        )
    };
    let _ = writeln!(
        o,
        "<p class=\"meta\">{} · written by gpudoc {} · charts by uPlot (MIT)</p>\n</footer>",
        esc(&nvml),
        esc(&r.gpudoc_version)
    );
}

/// Writes the page of `report` to `path` (`-` for stdout).
pub fn write(
    target: &crate::output::Target,
    report: &Report,
    timeline: Option<&Timeline>,
) -> std::io::Result<()> {
    crate::output::write(target, render(report, timeline).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timeline::{GpuTimeline, ProcTimeline};

    /// An hour of 1 kHz device samples and eight job processes sampled at 100 Hz, every sample a change.
    fn an_hour() -> (Report, Timeline) {
        let mut r: Report =
            serde_json::from_str(include_str!("../../fixtures/runs/healthy.report.json")).unwrap();
        r.duration_s = 3600.0;
        r.gpus.truncate(1);
        let mut t = Timeline::default();
        let mut g = GpuTimeline::new(crate::gpu::GpuInfo {
            index: r.gpus[0].index,
            name: r.gpus[0].name.clone(),
            uuid: r.gpus[0].uuid.clone(),
            total_bytes: r.gpus[0].total_bytes,
        });
        for i in 0..3_600_000u64 {
            g.used.push(i * 1000, (40 << 30) + (i % 7) * (1 << 20));
        }
        t.gpus.push(g);
        for pid in 0..8u32 {
            let mut used = crate::timeline::Series::default();
            for i in 0..360_000u64 {
                used.push(i * 10_000, (5 << 30) + ((i + pid as u64) % 5) * (1 << 20));
            }
            t.procs.insert(
                (r.gpus[0].index, 1000 + pid),
                ProcTimeline {
                    pid: 1000 + pid,
                    gpu: r.gpus[0].index,
                    in_job: true,
                    visible: true,
                    cmdline: format!("python train.py --rank {pid}"),
                    uid: Some(0),
                    ppid: None,
                    used,
                },
            );
        }
        (r, t)
    }

    #[test]
    fn an_hour_at_one_khz_stays_under_five_megabytes() {
        let (r, t) = an_hour();
        let page = render(&r, Some(&t));
        println!("an hour at 1 kHz, 8 processes: {} bytes", page.len());
        assert!(page.len() < 5_000_000, "{} bytes", page.len());
        // Every series reached the page, bucketed.
        assert_eq!(page.matches("python train.py --rank").count(), 8);
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(
            esc("<script>\"a\" & 'b'\u{1b}]0;x"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;\u{fffd}]0;x"
        );
        assert_eq!(slug("GPU 1 on node-b"), "gpu-1-on-node-b");
    }
}
