//! The HTML report, opened in a real headless Chromium (Debian's, installed by .ci/deps): recorded H200
//! runs (an OOM, two GPUs under DDP, a healthy run, two nodes merged) and a run through the fake NVML.
//! Each must open offline, draw every chart (pixels on the canvas, not an empty one), carry every
//! diagnosis, log no error; a diagnosis link highlights its GPU. Screenshots are left in the target
//! folder (`target/tmp/html/`).

mod common;

use common::{Machine, report_of};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(rel)
}

fn shots() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("html");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `gpudoc report FILES --html OUT`: the page and the report it shows.
fn page(name: &str, files: &[PathBuf]) -> (PathBuf, Value) {
    let html = shots().join(format!("{name}.html"));
    let r = report_of(files, &[Path::new("--html"), &html]);
    (html, r)
}

/// The page as Chromium leaves it after its scripts ran, and what Chromium logged; with `shot`, a
/// screenshot of it too, taken by the same Chromium (one start for both).
fn open(html: &Path, hash: &str, shot: Option<&str>) -> (String, String) {
    open_sized(html, hash, shot, "1300,2400")
}

/// `open` in a window of `size` ("W,H").
fn open_sized(html: &Path, hash: &str, shot: Option<&str>, size: &str) -> (String, String) {
    let url = format!("file://{}{hash}", html.display());
    let mut c = Command::new("chromium");
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ]);
    c.arg(format!("--window-size={size}"));
    // No network: a page that needed one would fail to draw.
    c.arg("--host-resolver-rules=MAP * ~NOTFOUND");
    if let Some(name) = shot {
        c.arg(format!(
            "--screenshot={}",
            shots().join(format!("{name}.png")).display()
        ));
    }
    c.arg("--dump-dom");
    let out = c.arg(&url).output().unwrap_or_else(|e| {
        panic!("chromium: {e} (.ci/deps installs it: apt-get install chromium)")
    });
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The value of `attr` on every element that has it.
fn attrs<'a>(dom: &'a str, attr: &str) -> Vec<&'a str> {
    let key = format!("{attr}=\"");
    dom.match_indices(&key)
        .map(|(i, _)| {
            let rest = &dom[i + key.len()..];
            &rest[..rest.find('"').unwrap()]
        })
        .collect()
}

fn escaped(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Opens the page, checks it drew `charts` charts with ink, carries every diagnosis and logged no error;
/// leaves a screenshot.
fn check(name: &str, html: &Path, report: &Value, charts: usize) -> String {
    let text = std::fs::read_to_string(html).unwrap();
    for needle in ["<script src", "<link", "@import", "url(http"] {
        assert!(!text.contains(needle), "{name}: loads something: {needle}");
    }
    let (dom, log) = open(html, "", Some(name));
    assert!(
        dom.contains("data-ready=\"1\""),
        "{name}: the script did not finish\n{log}"
    );
    assert!(
        !dom.contains("data-errors="),
        "{name}: {:?}",
        attrs(&dom, "data-errors")
    );
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(console_errors.is_empty(), "{name}: {console_errors:#?}");
    assert_eq!(
        attrs(&dom, "data-charts"),
        [charts.to_string().as_str()],
        "{name}"
    );
    let ink = attrs(&dom, "data-ink");
    assert_eq!(ink.len(), charts, "{name}: {ink:?}");
    for i in &ink {
        let n: u64 = i.parse().unwrap_or_else(|_| panic!("{name}: ink {i}"));
        assert!(n > 300, "{name}: a chart is (nearly) empty: {ink:?}");
    }
    let diags = report["diagnoses"].as_array().unwrap();
    for d in diags {
        let msg = escaped(d["message"].as_str().unwrap());
        assert!(dom.contains(&msg), "{name}: missing on the page: {msg}");
    }
    assert_eq!(dom.matches("class=\"diag ").count(), diags.len(), "{name}");
    dom
}

#[test]
fn an_h200_oom_is_drawn_with_its_moment_and_diagnoses() {
    let (html, r) = page("oom", &[fixture("oom/h200/grow_oom.trace.jsonl")]);
    assert_eq!(r["exit"]["classification"], "gpu_oom");
    assert!(!r["diagnoses"].as_array().unwrap().is_empty());
    // GPU 0's timeline and its process's steps; GPU 1 was idle and is a line.
    let dom = check("oom", &html, &r, 2);
    assert!(dom.contains("id=\"oom\""), "the OOM explained");
    assert!(dom.contains("not used by the job"));
    // The OOM's label, at the chart's right edge where the run ended, clear of the capacity line along
    // the top and of its label (issue 35).
    let nums = |a: &str| -> Vec<i64> { a.split(' ').map(|n| n.parse().unwrap()).collect() };
    let (label, cap) = (
        nums(attrs(&dom, "data-labeloom")[0]),
        nums(attrs(&dom, "data-capacity")[0])[0],
    );
    let (top, bottom) = (label[1], label[1] + label[3]);
    // Clear of the line by more than the text's descent, or below the capacity label.
    assert!(
        bottom + 6 <= cap || top >= cap + 18,
        "label {label:?}, capacity at {cap}"
    );
    // The first diagnosis, opened by its link, highlights GPU 0's chart.
    let first = &r["diagnoses"][0];
    assert_eq!(first["gpu"], "GPU 0");
    let (dom, _) = open(&html, "#diag-0", None);
    assert_eq!(attrs(&dom, "data-highlight"), ["diag-0"]);
    assert!(
        dom.contains("class=\"diag sev-error linked active\""),
        "the card is marked"
    );
}

/// The README's picture (docs/img/html-report.png) is this page's top, taken by this test: the diagnoses it
/// shows are listed beside it (html-report.txt), and a page whose diagnoses differ fails here until
/// `GPUDOC_BLESS=1 cargo test --test html` takes the picture again, so it never shows what gpudoc no longer
/// says.
#[test]
fn the_readmes_picture_shows_what_the_page_says_now() {
    let (html, r) = page("readme", &[fixture("oom/h200/grow_oom.trace.jsonl")]);
    open_sized(&html, "", Some("readme"), "1200,992");
    let shown: String = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            format!(
                "{} [{}] {}\n",
                d["severity"].as_str().unwrap(),
                d["rule"].as_str().unwrap(),
                d["title"].as_str().unwrap()
            )
        })
        .collect();
    let img = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/img");
    if std::env::var_os("GPUDOC_BLESS").is_some() {
        std::fs::copy(shots().join("readme.png"), img.join("html-report.png")).unwrap();
        std::fs::write(img.join("html-report.txt"), &shown).unwrap();
    }
    let said = std::fs::read_to_string(img.join("html-report.txt")).unwrap_or_default();
    assert_eq!(
        said, shown,
        "docs/img/html-report.png is stale: GPUDOC_BLESS=1 cargo test --test html"
    );
    let png = std::fs::read(img.join("html-report.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
}

#[test]
fn a_long_command_does_not_squeeze_the_processes_table_and_steps_are_whole() {
    let mut r = common::read_json(&fixture("runs/leak.report.json"));
    let long = format!(
        "python3 /data/{}/train.py --config={}",
        "x".repeat(300),
        "y".repeat(300)
    );
    r["processes"][0]["cmdline"] = long.into();
    // Few steps: uPlot's own ticks would fall at 1.5, 2.5, ...
    r["torch"]["processes"][0]["steps"]
        .as_array_mut()
        .unwrap()
        .truncate(6);
    let file = shots().join("long_command.report.json");
    std::fs::write(&file, r.to_string()).unwrap();
    let (html, r) = page("long_command", &[file]);
    let dom = check("long_command", &html, &r, 2);
    assert_eq!(attrs(&dom, "data-squeezed"), Vec::<&str>::new());
    // Steps are whole: the step chart's ticks too.
    let ticks = attrs(&dom, "data-ticks");
    assert!(!ticks.is_empty());
    for t in ticks.iter().flat_map(|t| t.split(' ')) {
        assert_eq!(
            t.parse::<f64>().unwrap().fract(),
            0.0,
            "a tick at step {t}: {ticks:?}"
        );
    }
}

#[test]
fn two_gpus_under_ddp_each_get_their_charts() {
    let (html, r) = page("ddp", &[fixture("multi/rank0_extra.trace.jsonl")]);
    assert_eq!(r["gpus"].as_array().unwrap().len(), 2);
    // Per GPU: the timeline and the rank's per-step chart.
    check("ddp", &html, &r, 4);
}

#[test]
fn a_healthy_run_says_so() {
    let (html, r) = page("healthy", &[fixture("runs/healthy.trace.jsonl")]);
    assert!(r["diagnoses"].as_array().unwrap().is_empty());
    let dom = check("healthy", &html, &r, 2);
    assert!(dom.contains("the rules found nothing wrong"));
}

#[test]
fn merged_nodes_are_drawn_from_their_reports() {
    let files = ["node-a", "node-b"].map(|h| fixture(&format!("merge/oom_{h}.report.json")));
    let (html, r) = page("merged", &files);
    let dom = check("merged", &html, &r, 4);
    assert!(dom.contains("data-gpu=\"GPU 1 on node-b\""));
    assert!(
        dom.contains("Drawn from the report"),
        "it says what it lacks"
    );
}

#[test]
fn gpudoc_run_writes_the_page() {
    let m = Machine::h200s(1);
    let html = m.path("run.html");
    let (code, r, _) = m.run_sh(
        &["--quiet", "--html", html.to_str().unwrap()],
        r#""$FAKEGPU" alloc --steps 2GiB,6GiB,1GiB --step-ms 100 --hold-ms 100 & wait"#,
    );
    assert_eq!(code, 0);
    let dom = check("run", &html, &r, 1);
    assert!(
        dom.contains("job peak 6.00 GiB"),
        "the page's numbers are the run's"
    );
    // An --html that cannot be written is refused before the command runs.
    let out = m
        .gpudoc()
        .args(["run", "--html", "/nonexistent/dir/x.html", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--html /nonexistent/dir/x.html"));
}

#[test]
fn text_from_the_run_cannot_become_markup() {
    let m = Machine::h200s(1);
    let html = m.path("run.html");
    m.run_sh(
        &["--quiet", "--html", html.to_str().unwrap()],
        r#"exec -a '<img src=x onerror=alert(1)>' "$FAKEGPU" alloc --steps 1GiB --hold-ms 200"#,
    );
    let text = std::fs::read_to_string(&html).unwrap();
    assert!(!text.contains("<img src=x"), "a command line is text");
    assert!(text.contains("&lt;img src=x onerror=alert(1)&gt;"));
}

#[test]
fn the_page_on_stdout_leaves_the_other_outputs_alone() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("r.json");
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .arg(fixture("runs/leak.report.json"))
        .args(["--html", "-", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stdout.starts_with(b"<!DOCTYPE html>"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[step-leak]"),
        "the summary goes to stderr: {err}"
    );
    assert!(json.exists(), "--json is still written");
    // Two outputs cannot share stdout.
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .arg(fixture("runs/leak.report.json"))
        .args(["--html", "-", "--json", "-"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only one of --json -, --html - and --facts")
    );
}
