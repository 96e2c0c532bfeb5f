//! The published JSON Schemas (docs/schema/) are those of the types gpudoc writes with, and what gpudoc
//! writes conforms to them: every fixture, and the outputs of the commands.

mod common;

use common::{Machine, conforms, fixture_files, gpudoc_bin, read_json};
use std::path::Path;
use std::process::Command;

const NAMES: [&str; 6] = [
    "report",
    "trace-row",
    "baseline",
    "compare",
    "orphans",
    "fit",
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
