//! `--tensorboard DIR`: event files read back by the real `tensorboard` package's event reader (.ci/deps
//! installs it from PyPI), each scalar with its steps and values; the program's own files left untouched.

mod common;

use common::{Machine, fake_torch, read_json};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const GIB: f64 = (1u64 << 30) as f64;

/// Every scalar in the TensorBoard run at `run`: tag → [[step, value], ...].
fn scalars(run: &Path) -> Value {
    let script = r#"
import json, sys
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError:
    sys.exit("the tensorboard package is missing: .ci/deps installs it (pip install tensorboard)")
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"#;
    let out = common::succeed(
        Command::new(common::python_with_packages())
            .args(["-c", script])
            .arg(run),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn a_run_writes_its_memory_beside_the_programs_own_curves() {
    let m = Machine::h200s(1);
    let dir = m.path("tb");
    std::fs::create_dir_all(&dir).unwrap();
    // The program's own event file, which gpudoc must leave alone.
    let own = dir.join("events.out.tfevents.1.host.1");
    std::fs::write(&own, b"the program's own bytes").unwrap();
    let tb = dir.to_str().unwrap();
    let train = fake_torch().join("train.py");
    let (code, r, stdout, err) = m.python(
        &[],
        &["--tensorboard", tb],
        &[train.to_str().unwrap(), "6", "--sleep", "0.15"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(std::fs::read(&own).unwrap(), b"the program's own bytes");
    let s = scalars(&dir.join("gpudoc"));
    // The job's memory over time: its peak is the report's.
    let job = s["gpudoc/gpu0/job_memory_GiB"].as_array().unwrap();
    let peak = job
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .fold(0.0, f64::max);
    let want = r["gpus"][0]["job_peak_bytes"].as_f64().unwrap() / GIB;
    assert!((peak - want).abs() < 1e-3, "{peak} vs {want}");
    // PyTorch's numbers at each optimizer step, as torch printed them.
    let pid = &r["torch"]["processes"][0]["pid"];
    let allocated = s[format!("gpudoc/torch/pid{pid}/gpu0/allocated_GiB")]
        .as_array()
        .unwrap()
        .clone();
    let own: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(allocated.len(), own.len());
    for (p, o) in allocated.iter().zip(&own) {
        assert_eq!(p[0], o["step"]);
        let v = o["allocated"].as_f64().unwrap() / GIB;
        assert!((p[1].as_f64().unwrap() - v).abs() < 1e-4, "{p:?} vs {v}");
    }
}

#[test]
fn a_saved_report_writes_the_same_afterwards() {
    let m = Machine::h200s(1);
    let json = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/leaks/list.report.json");
    let dir = m.path("tb");
    common::succeed(
        m.gpudoc()
            .arg("report")
            .arg(&json)
            .arg("--tensorboard")
            .arg(&dir),
    );
    let s = scalars(&dir.join("gpudoc"));
    let r = read_json(&json);
    let pid = &r["torch"]["processes"][0]["pid"];
    let reserved = s[format!("gpudoc/torch/pid{pid}/gpu0/reserved_GiB")]
        .as_array()
        .unwrap();
    let steps = r["torch"]["processes"][0]["steps"].as_array().unwrap();
    assert_eq!(reserved.len(), steps.len());
    assert_eq!(reserved.last().unwrap()[0], steps.last().unwrap()["step"]);
}

#[test]
fn a_saved_trace_writes_the_curve_the_run_wrote() {
    let m = Machine::h200s(1);
    let (live, replayed, trace) = (m.path("live"), m.path("replayed"), m.path("t.jsonl"));
    let train = fake_torch().join("train.py");
    let (code, _, _, err) = m.python(
        &[],
        &[
            "--tensorboard",
            live.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        &[train.to_str().unwrap(), "6", "--sleep", "0.15"],
    );
    assert_eq!(code, 0, "{err}");
    common::succeed(
        m.gpudoc()
            .arg("report")
            .arg(&trace)
            .arg("--tensorboard")
            .arg(&replayed),
    );
    let tag = "gpudoc/gpu0/job_memory_GiB";
    let (a, b) = (
        scalars(&live.join("gpudoc")),
        scalars(&replayed.join("gpudoc")),
    );
    // The samples, not the report's summary of them: the same points as the live run wrote.
    assert!(a[tag].as_array().unwrap().len() > 100, "{}", a[tag]);
    assert_eq!(a[tag], b[tag]);
}

#[test]
fn a_framework_beyond_pytorch_is_tagged_by_its_name_and_what_it_cannot_tell_has_no_curve() {
    let m = Machine::h200s(1);
    let dir = m.path("tb");
    let fakes = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_frameworks");
    let program = fakes.join("tf_programs.py");
    let (code, r, _, err) = m.python(
        &[("PYTHONPATH", fakes.to_str().unwrap())],
        &["--tensorboard", dir.to_str().unwrap()],
        &[program.to_str().unwrap(), "healthy", "20", "0.01"],
    );
    assert_eq!(code, 0, "{err}");
    let pid = &r["torch"]["processes"][0]["pid"];
    let s = scalars(&dir.join("gpudoc"));
    let tags: Vec<&String> = s.as_object().unwrap().keys().collect();
    let allocated = format!("gpudoc/tensorflow/pid{pid}/gpu0/allocated_GiB");
    assert!(s.get(&allocated).is_some(), "{tags:?}");
    // TensorFlow does not say what its allocator reserves: no curve, not a flat 0.
    assert!(
        tags.iter()
            .all(|t| !t.contains("reserved") && !t.contains("/torch/")),
        "{tags:?}"
    );
}
