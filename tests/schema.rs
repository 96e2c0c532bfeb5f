//! The published JSON Schemas (docs/schema/) are those of the types gpudoc writes with, and what gpudoc
//! writes conforms to them: every fixture, and the outputs of the commands.

mod common;

use common::{Machine, conforms, fixture_files, gpudoc_bin, read_json};
use std::path::Path;
use std::process::Command;

const NAMES: [&str; 7] = [
    "report",
    "trace-row",
    "baseline",
    "compare",
    "orphans",
    "fit",
    "shim-message",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_published_schemas_are_the_code_s() {
    for name in NAMES {
        let out = Command::new(gpudoc_bin())
            .args(["schema", name])
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}");
        let path = root().join(format!("docs/schema/{name}.schema.json"));
        if std::env::var_os("GPUDOC_BLESS").is_some() {
            std::fs::write(&path, &out.stdout).unwrap();
        }
        let published = std::fs::read(&path).unwrap_or_default();
        assert!(
            published == out.stdout,
            "{} differs from `gpudoc schema {name}`: run GPUDOC_BLESS=1 cargo test --test schema, \
             and mind the compatibility policy (docs/schemas.md)",
            path.display()
        );
    }
}

#[test]
fn every_report_and_trace_fixture_conforms() {
    let reports = fixture_files(".report.json");
    assert!(reports.len() >= 40, "{}", reports.len());
    for f in reports {
        let r = read_json(&f);
        // Reports from before a schema's version are read (and upgraded) but not held to it.
        if r["schema"] == "gpudoc.report/2" {
            conforms("report", &r);
        }
    }
    let mut rows = 0;
    for f in fixture_files(".trace.jsonl") {
        let text = std::fs::read_to_string(&f).unwrap();
        let first: serde_json::Value =
            serde_json::from_str(text.lines().next().unwrap_or("{}")).unwrap_or_default();
        if first["kind"] != "start" || first["schema"] != "gpudoc.trace/2" {
            continue;
        }
        for line in text.lines() {
            conforms("trace-row", &serde_json::from_str(line).unwrap());
            rows += 1;
        }
    }
    assert!(rows > 10_000, "{rows} rows");
}

#[test]
fn command_outputs_conform() {
    let m = Machine::h200s(2);
    let (baseline, trace) = (m.path("base.json"), m.path("run.trace.jsonl"));
    // A run that updates a baseline and writes a trace (its report is checked by run_sh).
    m.run_sh(
        &[
            "--quiet",
            "--baseline",
            baseline.to_str().unwrap(),
            "--name",
            "t",
            "--update-baseline",
            "--trace",
            trace.to_str().unwrap(),
        ],
        r#""$FAKEGPU" alloc --gpu 1 --steps 2GiB --hold-ms 100 & wait"#,
    );
    conforms("baseline", &read_json(&baseline));
    for line in std::fs::read_to_string(&trace).unwrap().lines() {
        conforms("trace-row", &serde_json::from_str(line).unwrap());
    }
    let json = |args: &[&str]| -> serde_json::Value {
        let out = m.gpudoc().args(args).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    };
    let a = root().join("fixtures/runs/leak.report.json");
    let b = root().join("fixtures/runs/healthy.report.json");
    conforms(
        "compare",
        &json(&[
            "compare",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--json",
            "-",
        ]),
    );
    let pid = m.orphan(r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 20000"#, None);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let listing = json(&["orphans", "--json", "-"]);
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        !listing["holders"].as_array().unwrap().is_empty(),
        "{listing}"
    );
    conforms("orphans", &listing);
}

/// `value` without its members that are `null` or 0: an optional field reads the same absent, `null` or
/// 0 (the reader's types leave some out when they are: a holder's `graphs`).
fn without_nulls(value: &serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(m) => m
            .iter()
            .filter(|(_, v)| !v.is_null() && v.as_f64() != Some(0.0))
            .map(|(k, v)| (k.clone(), without_nulls(v)))
            .collect(),
        serde_json::Value::Array(a) => a.iter().map(without_nulls).collect(),
        v => v.clone(),
    }
}

#[test]
fn every_recorded_shim_message_round_trips_through_its_schema() {
    use gpudoc::torch::message::Message;
    let mut kinds = std::collections::BTreeSet::new();
    for f in fixture_files(".trace.jsonl") {
        for line in std::fs::read_to_string(&f).unwrap().lines() {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            if row["kind"] != "torch" {
                continue;
            }
            let m = &row["m"];
            conforms("shim-message", m);
            let typed: Message = serde_json::from_value(m.clone())
                .unwrap_or_else(|e| panic!("{}: {e}: {m}", f.display()));
            let back = serde_json::to_value(&typed).unwrap();
            assert_eq!(without_nulls(&back), without_nulls(m), "{}", f.display());
            kinds.insert(m["k"].as_str().unwrap().to_string());
        }
    }
    // The recordings hold every kind but a failure's and a pointer to a file (those are checked by the
    // Python side's messages, tests/python/test_shim_messages.py).
    let all: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        all,
        ["cell", "hello", "hunt", "oom", "s", "step", "where"],
        "{kinds:?}"
    );
}
