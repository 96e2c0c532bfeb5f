//! Replays that agree with the run: a trace read back by `gpudoc report` gives the run's own report (its
//! OOM, classification, diagnoses, framework view), every report fixture replays to the diagnoses it
//! stores, and a trace that lacks its end row says what it does not know.

mod common;

use common::{Machine, fake_torch, fixture_files, read_json, report};
use serde_json::Value;
use std::path::PathBuf;

/// The report without what may differ between a run and its replay: free-text notes.
fn comparable(mut r: Value) -> Value {
    r.as_object_mut().unwrap().remove("notes");
    r
}

#[test]
fn a_replayed_trace_gives_the_runs_own_report() {
    let m = Machine::h200s(2);
    let (json, trace) = (m.path("run.json"), m.path("run.trace.jsonl"));
    let train = fake_torch().join("train.py");
    // A job that grows, leaves a child holding memory on GPU 1 and dies of an OOM: every part of the
    // report has something to say.
    let script = format!(
        r#""$FAKEGPU" alloc --gpu 1 --steps 3GiB --hold-ms 100000 & python3 {} 8 --oom; exit 3"#,
        train.display()
    );
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--trace")
        .arg(&trace)
        .arg("--kill-orphans")
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let run = read_json(&json);
    assert_eq!(run["exit"]["classification"], "gpu_oom");
    assert!(!run["oom"].is_null());
    assert!(!run["torch"]["processes"].as_array().unwrap().is_empty());
    assert!(!run["orphans"].as_array().unwrap().is_empty());
    assert!(!run["diagnoses"].as_array().unwrap().is_empty());
    let back = report(&trace, &[]);
    assert_eq!(back["exit"]["code"], 3);
    for part in [
        "exit",
        "oom",
        "diagnoses",
        "gpus",
        "processes",
        "torch",
        "orphans",
    ] {
        assert_eq!(back[part], run[part], "{part} differs");
    }
    assert_eq!(comparable(back), comparable(run));
}

#[test]
fn a_processs_parent_is_recorded_and_replayed() {
    let m = Machine::h200s(1);
    let (json, trace, pid) = (m.path("r.json"), m.path("r.jsonl"), m.path("pid"));
    let script = format!(
        r#"echo $$ > {}; "$FAKEGPU" alloc --gpu 0 --steps 1GiB --hold-ms 300; true"#,
        pid.display()
    );
    common::succeed(
        m.gpudoc()
            .args(["run", "--json"])
            .arg(&json)
            .arg("--trace")
            .arg(&trace)
            .args(["--", "sh", "-c", &script]),
    );
    let parent: u64 = std::fs::read_to_string(&pid)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for r in [read_json(&json), report(&trace, &[])] {
        assert_eq!(r["processes"][0]["ppid"], parent, "{}", r["processes"]);
    }
}

#[test]
fn a_trace_without_its_end_row_says_what_it_does_not_know() {
    let m = Machine::h200s(1);
    let trace = m.path("t.jsonl");
    let script = r#""$FAKEGPU" alloc --gpu 0 --steps 2GiB --hold-ms 300; exit 3"#;
    m.run_sh(&["--trace", trace.to_str().unwrap()], script);
    // Cut the end row off, as a crash of gpudoc would.
    let text = std::fs::read_to_string(&trace).unwrap();
    let kept: String = text
        .lines()
        .filter(|l| !l.contains(r#""kind":"end""#))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&trace, kept).unwrap();
    let back = report(&trace, &[]);
    assert_eq!(back["exit"]["code"], Value::Null, "never invented as 0");
    assert_eq!(back["exit"]["classification"], "unknown");
    assert_eq!(back["gpus"][0]["job_peak_bytes"], 2u64 << 30);
    let notes = back["notes"].to_string();
    assert!(notes.contains("no end row"), "{notes}");
    let out = m.gpudoc().arg("report").arg(&trace).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("how was not recorded"), "{text}");
    assert!(!text.contains("exited with code 0"), "{text}");
}

#[test]
fn every_report_fixture_replays_to_the_diagnoses_it_stores() {
    let files = fixture_files(".report.json");
    assert!(files.len() >= 20, "{files:?}");
    for f in files {
        let stored = read_json(&f);
        let back = common::replayed(&f);
        for part in ["exit", "oom", "diagnoses", "rule_errors"] {
            assert_eq!(back[part], stored[part], "{}: {part}", f.display());
        }
    }
}

#[test]
fn every_trace_fixture_with_an_end_row_replays_to_its_report() {
    let mut checked = 0;
    for t in fixture_files(".trace.jsonl") {
        let text = std::fs::read_to_string(&t).unwrap();
        let stored = PathBuf::from(t.to_string_lossy().replace(".trace.jsonl", ".report.json"));
        if !text.contains(r#""kind":"end""#) || !stored.exists() {
            continue;
        }
        let (mut stored, mut back) = (read_json(&stored), common::replayed(&t));
        // When a diagnosis was told during the run (`known_at_s`) depends on when the run's live looks
        // came (a loaded machine's come later); what is told, and when the trace's evidence places it
        // (`at_s`), is the replay's to give again.
        for r in [&mut stored, &mut back] {
            for d in r["diagnoses"].as_array_mut().into_iter().flatten() {
                d.as_object_mut().unwrap().remove("known_at_s");
                for p in d["parts"].as_array_mut().into_iter().flatten() {
                    p.as_object_mut().unwrap().remove("known_at_s");
                }
            }
        }
        // A report recorded before the OOM's finding was kept (`oom.finding`, an additive field) has none:
        // the rest of its OOM, its explanation included, is what the replay must give.
        if stored["oom"].is_object() && stored["oom"].get("finding").is_none() {
            let finding = back["oom"]
                .as_object_mut()
                .and_then(|o| o.remove("finding"));
            assert!(
                finding.is_some(),
                "{}: a replay keeps its finding",
                t.display()
            );
        }
        for part in [
            "exit",
            "oom",
            "diagnoses",
            "gpus",
            "processes",
            "torch",
            "orphans",
        ] {
            assert_eq!(back[part], stored[part], "{}: {part}", t.display());
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} traces with an end row");
}

#[test]
fn every_diagnosis_points_at_a_gpu_of_its_run_and_a_moment_inside_it() {
    let mut marked = 0;
    for f in fixture_files(".report.json") {
        let r = read_json(&f);
        let labels: Vec<String> = r["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| match g["host"].as_str() {
                Some(h) => format!("GPU {} on {h}", g["index"]),
                None => format!("GPU {}", g["index"]),
            })
            .collect();
        let duration = r["duration_s"].as_f64().unwrap();
        for d in r["diagnoses"].as_array().unwrap() {
            if let Some(gpu) = d["gpu"].as_str() {
                assert!(labels.iter().any(|l| l == gpu), "{}: {d}", f.display());
                marked += 1;
            }
            if let Some(at) = d["at_s"].as_f64() {
                assert!((0.0..=duration + 0.5).contains(&at), "{}: {d}", f.display());
            }
            let rule = d["rule"].as_str().unwrap();
            if rule.starts_with("oom-") {
                assert_eq!(d["at_s"], r["oom"]["at_s"], "{}: {d}", f.display());
            }
        }
    }
    assert!(marked >= 20, "only {marked} diagnoses name their GPU");
}

#[test]
fn a_trace_of_the_first_schema_is_still_read() {
    // gpudoc.trace/1: no origin, no job, torch or end rows; a process's first row names only its command.
    let m = Machine::h200s(1);
    let trace = m.path("old.jsonl");
    let rows = [
        r#"{"kind":"start","schema":"gpudoc.trace/1","unix_s":1795987808.8,"command":["python3","train.py"],"gpus":[{"index":0,"name":"NVIDIA H200","total_bytes":150754820096,"uuid":"GPU-daf5dac6-8b71-b198-a6c3-4825bca75ad3"}],"nvml":{"available":true,"cuda_driver":"13.0","driver":"580.159.04","error":null,"library":"libnvidia-ml.so.1"}}"#,
        r#"{"kind":"device","t":0.01,"gpu":0,"used":0,"total":150754820096}"#,
        r#"{"kind":"process","t":0.5,"gpu":0,"pid":4242,"used":1073741824,"in_job":true,"cmdline":"python3 train.py"}"#,
        r#"{"kind":"device","t":0.5,"gpu":0,"used":1073741824,"total":150754820096}"#,
        r#"{"kind":"process","t":1.0,"gpu":0,"pid":4242,"used":3221225472,"in_job":true}"#,
        r#"{"kind":"device","t":1.0,"gpu":0,"used":3221225472,"total":150754820096}"#,
        r#"{"kind":"process","t":1.5,"gpu":0,"pid":4242,"used":0,"in_job":true}"#,
    ];
    std::fs::write(&trace, rows.join("\n") + "\n").unwrap();
    let back = report(&trace, &[]);
    assert_eq!(back["command"], serde_json::json!(["python3", "train.py"]));
    assert_eq!(back["gpus"][0]["job_peak_bytes"], 3u64 << 30);
    assert_eq!(back["gpus"][0]["peak_used_bytes"], 3u64 << 30);
    let p = &back["processes"][0];
    assert_eq!(p["pid"], 4242);
    assert_eq!(p["cmdline"], "python3 train.py");
    assert_eq!(p["visible"], true);
    assert_eq!(p["peak_bytes"], 3u64 << 30);
}

#[test]
fn a_report_missing_a_field_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = read_json(&PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/runs/leak.report.json"
    )));
    r["gpus"][0].as_object_mut().unwrap().remove("total_bytes");
    // On one line, as `--json -` writes it: it has `kind`s inside, and was read as a broken trace.
    let file = dir.path().join("one-line.json");
    std::fs::write(&file, serde_json::to_string(&r).unwrap()).unwrap();
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("one-line.json: `gpus[0]`: missing field `total_bytes`"),
        "{err}"
    );
}

/// The H200's evaluation after training: the shim read the allocator at step 50 and again at the OOM,
/// 7.5 s later, with NVML's peak between them. PyTorch's reserved memory at that peak is the OOM's
/// reading, not step 50's: the evaluation's 139 GiB of tensors are PyTorch's, and the CUDA context and
/// libraries' ~0.85 GiB are what is outside it (it said 133.72 GiB).
#[test]
fn memory_outside_pytorch_is_measured_where_both_views_read_it() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/phases");
    for name in ["eval_oom", "eval_keep"] {
        let r = report(dir.join(format!("{name}.trace.jsonl")), &[]);
        let p = &r["torch"]["processes"][0];
        let outside = p["non_pytorch_bytes"].as_u64().unwrap();
        assert!(
            (256 << 20..2 << 30).contains(&outside),
            "{name}: {outside} B outside PyTorch of {} B at NVML's peak",
            p["nvml_peak_bytes"]
        );
    }
}
