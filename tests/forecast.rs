//! Live verdicts and forecasts (issue 33): rules judged during the run on the fake torch, said on stderr
//! between the job's lines, recorded with their moments in the report, and `--stop-on`.

mod common;

use common::{Machine, conforms, fake_torch, read_json};
use serde_json::Value;
use std::time::Instant;

/// `gpudoc run [extra] -- python3 forecast.py MODE STEPS SLEEP` with the job's output and gpudoc's stderr
/// in one pipe, so their order is the order they were written in: (exit code, report, that output,
/// seconds it took).
fn job(extra: &str, mode: &str, steps: u32, sleep: f64) -> (i32, Value, String, f64) {
    job_into("2>&1", extra, mode, steps, sleep)
}

/// [`job`] with the output redirected as `redirect` says (`2>&1`: the pipe read back; `> FILE 2>&1`: a
/// file the job writes itself).
fn job_into(
    redirect: &str,
    extra: &str,
    mode: &str,
    steps: u32,
    sleep: f64,
) -> (i32, Value, String, f64) {
    let m = Machine::h200s(1);
    let json = m.path("report.json");
    let script = format!(
        r#""$GPUDOC" run --json '{}' {extra} -- python3 '{}' {mode} {steps} {sleep} {redirect}"#,
        json.display(),
        fake_torch().join("forecast.py").display()
    );
    let started = Instant::now();
    let out = m
        .shell(&script)
        .env("PYTHONPATH", fake_torch())
        .output()
        .unwrap();
    let took = started.elapsed().as_secs_f64();
    let report = read_json(&json);
    conforms("report", &report);
    (
        out.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        took,
    )
}

/// What came before the job's last line.
fn before_the_end(output: &str) -> &str {
    let end = output
        .find("JOB-DONE")
        .unwrap_or_else(|| panic!("{output}"));
    &output[..end]
}

#[test]
fn a_leaking_job_is_told_while_it_runs_that_it_leaks_and_when_the_gpu_is_full() {
    let (code, r, out, _) = job("", "leak", 160, 0.05);
    assert_eq!(code, 0, "{out}");
    let mid = before_the_end(&out);
    let said = mid
        .lines()
        .find(|l| l.starts_with("gpudoc: step-leak [warn] at "))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(said.contains("64.00 MiB per step"), "{said}");
    let forecast = mid
        .lines()
        .find(|l| l.starts_with("gpudoc: GPU 0 will be full in ~"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(forecast.contains("(around step "), "{forecast}");
    assert!(forecast.contains("at +64.00 MiB/step"), "{forecast}");
    // Said between the job's lines, never inside one.
    for l in mid.lines() {
        assert!(
            l.starts_with("gpudoc: ") || l.starts_with("step "),
            "a line mixed: {l:?}\n{out}"
        );
    }
    // Told once, however long it holds.
    assert_eq!(mid.matches("gpudoc: step-leak").count(), 1, "{out}");
    // The report keeps when it was first known, and the forecast with its time.
    let d = common::diagnosis(&r, "step-leak").unwrap();
    let known = d["known_at_s"].as_f64().unwrap();
    assert!(
        known > 0.0 && known < r["duration_s"].as_f64().unwrap(),
        "{d:#}"
    );
    let f = &r["forecasts"][0];
    assert_eq!(f["rule"], "step-leak");
    assert_eq!(f["gpu"], 0);
    assert_eq!(f["first"]["at_s"].as_f64().unwrap(), known);
    // 64 MiB a step into ~137 GiB of room, at 20 steps a second at most: minutes away.
    let full_in = f["first"]["full_at_s"].as_f64().unwrap() - known;
    assert!(full_in > 60.0, "{f:#}");
    // The fit's slope: 64 MiB, to the float's last bits.
    let per_step = f["first"]["bytes_per_step"].as_f64().unwrap();
    assert!((per_step - 64.0 * 1048576.0).abs() < 1.0, "{f:#}");
    // And the summary says when it was known.
    let summary = &out[out.find("JOB-DONE").unwrap()..];
    assert!(summary.contains("known at "), "{summary}");
    assert!(summary.contains("forecast at "), "{summary}");
}

#[test]
fn in_a_log_file_the_job_writes_itself_the_words_come_between_its_lines() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let (code, _, _, _) = job_into(
        &format!("> '{}' 2>&1", log.display()),
        "",
        "leak",
        160,
        0.05,
    );
    let out = std::fs::read_to_string(&log).unwrap();
    assert_eq!(code, 0, "{out}");
    let mid = before_the_end(&out);
    assert_eq!(
        mid.matches("gpudoc: step-leak [warn] at ").count(),
        1,
        "{out}"
    );
    for l in mid.lines() {
        assert!(
            l.starts_with("gpudoc: ") || l.starts_with("step "),
            "a line mixed: {l:?}\n{out}"
        );
    }
}

#[test]
fn a_healthy_job_is_told_nothing_while_it_runs() {
    let (code, r, out, _) = job("", "healthy", 160, 0.05);
    assert_eq!(code, 0, "{out}");
    let mid = before_the_end(&out);
    assert!(!mid.contains("gpudoc"), "{out}");
    assert!(r.get("forecasts").is_none(), "{r:#}");
}

#[test]
fn stop_on_step_leak_ends_a_leaking_job_early_with_123() {
    // 4000 steps of 50 ms: over three minutes, unless stopped.
    let (code, r, out, took) = job("--stop-on step-leak", "leak", 4000, 0.05);
    assert_eq!(code, 123, "{out}");
    assert!(took < 60.0, "took {took} s");
    assert!(!out.contains("JOB-DONE"), "{out}");
    assert!(
        out.contains("gpudoc: --stop-on step-leak: ending the job as Ctrl-C would"),
        "{out}"
    );
    assert_eq!(r["exit"]["stopped_on"], "step-leak");
    // Python's Ctrl-C: KeyboardInterrupt, then death by SIGINT.
    assert_eq!(r["exit"]["signal"], 2, "{:#}", r["exit"]);
    assert!(
        out.contains("ended by gpudoc (--stop-on step-leak)"),
        "{out}"
    );
}

#[test]
fn stop_on_names_only_rules_judged_during_the_run() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["run", "--stop-on", "step-leak,oom-cap", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--stop-on: `oom-cap` is not a rule judged during the run"),
        "{err}"
    );
}
