//! The CI gate and `gpudoc compare`.

mod common;

use common::{Machine, fake_torch, read_json};
use fake_nvml::state::GIB;
use serde_json::Value;
use std::process::Command;

const JOB_3G: &str = r#""$FAKEGPU" alloc --steps 3GiB --hold-ms 150 & wait"#;

/// `gpudoc run [args] -- sh -c script`: (exit code, report, stdout, stderr).
fn gated(m: &Machine, args: &[&str], script: &str) -> (i32, Value, String, String) {
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args(args)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    let r = if json.exists() {
        read_json(&json)
    } else {
        Value::Null
    };
    (
        out.status.code().unwrap(),
        r,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn last_line(s: &str) -> &str {
    s.lines().last().unwrap_or("")
}

#[test]
fn a_budget_passes_or_fails_and_a_failing_command_wins() {
    let m = Machine::h200s(2);
    let (code, r, _, err) = gated(&m, &["--quiet", "--max-peak", "40GiB"], JOB_3G);
    assert_eq!(code, 0);
    assert_eq!(r["gate"]["passed"], true);
    assert_eq!(last_line(&err), "gpudoc gate: passed (1 check)");

    let (code, r, _, err) = gated(&m, &["--quiet", "--max-peak", "2GiB"], JOB_3G);
    assert_eq!(code, 122, "a failed gate turns 0 into 122");
    assert_eq!(r["gate"]["passed"], false);
    assert_eq!(
        last_line(&err),
        "gpudoc gate: FAILED: GPU 0: peak 3.00 GiB over budget 2.00 GiB"
    );
    assert_eq!(r["gate"]["checks"][0]["value_bytes"], 3 * GIB);

    let (code, _, _, _) = gated(
        &m,
        &["--quiet", "--max-peak", "2GiB"],
        &format!("{JOB_3G}; exit 3"),
    );
    assert_eq!(code, 3, "the command's own failure wins");

    // Per GPU: GPU 1 has its own budget; the job is on GPU 0 only.
    let (code, r, _, err) = gated(&m, &["--quiet", "--max-peak", "1=1GiB"], JOB_3G);
    assert_eq!(code, 0, "{err}");
    assert!(
        r["gate"]["notes"][0]
            .as_str()
            .unwrap()
            .contains("GPU 1, which the job did not use")
    );
    let (code, _, _, _) = gated(&m, &["--quiet", "--max-peak", "0=1GiB"], JOB_3G);
    assert_eq!(code, 122);
}

#[test]
fn a_budget_for_a_gpu_that_is_not_there_stops_gpudoc_before_the_command_runs() {
    let m = Machine::h200s(2);
    let marker = m.path("ran");
    let script = format!("touch {}; {JOB_3G}", marker.display());
    let (code, _, _, err) = gated(&m, &["--quiet", "--max-peak", "7=20GiB"], &script);
    assert_eq!(code, 125, "{err}");
    assert!(!marker.exists(), "the command must not have run");
    assert!(
        err.contains(
            "--max-peak names GPU 7, which this machine does not have (GPUs: 0, 1): the command was not started"
        ),
        "{err}"
    );
    // A GPU that is there: the command runs as before.
    let (code, _, _, err) = gated(&m, &["--quiet", "--max-peak", "1=20GiB"], &script);
    assert_eq!(code, 0, "{err}");
    assert!(marker.exists());
}

#[test]
fn baseline_round_trip_and_tolerance() {
    let m = Machine::h200s(1);
    let base = m.path("gpu-mem.json");
    let b = base.to_str().unwrap();
    // No file yet: recorded, nothing to compare.
    let (code, r, _, err) = gated(
        &m,
        &[
            "--quiet",
            "--baseline",
            b,
            "--name",
            "train-small",
            "--update-baseline",
        ],
        JOB_3G,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        r["gate"]["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("no baseline for `train-small`")
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    assert_eq!(file["schema"], "gpudoc.baseline/1");
    assert_eq!(file["jobs"]["train-small"]["gpus"]["0"], 3 * GIB);
    assert_eq!(file["jobs"]["train-small"]["measure"], "nvml");
    // Another job's entry joins it; keys stay sorted, the first entry is kept.
    gated(
        &m,
        &[
            "--quiet",
            "--baseline",
            b,
            "--name",
            "eval",
            "--update-baseline",
        ],
        JOB_3G,
    );
    let text = std::fs::read_to_string(&base).unwrap();
    assert!(
        text.find("\"eval\"").unwrap() < text.find("\"train-small\"").unwrap(),
        "{text}"
    );

    let grown = r#""$FAKEGPU" alloc --steps 3.2GiB --hold-ms 150 & wait"#;
    let (code, r, _, err) = gated(
        &m,
        &[
            "--quiet",
            "--baseline",
            b,
            "--name",
            "train-small",
            "--tolerance",
            "5%",
        ],
        grown,
    );
    assert_eq!(code, 122, "{err}");
    assert!(
        last_line(&err).contains(
            "GPU 0: peak 3.20 GiB vs baseline `train-small` 3.00 GiB (+6.7%, allowed +153.60 MiB)"
        ),
        "{err}"
    );
    assert_eq!(r["gate"]["checks"][0]["baseline_bytes"], 3 * GIB);
    let (code, _, _, _) = gated(
        &m,
        &[
            "--quiet",
            "--baseline",
            b,
            "--name",
            "train-small",
            "--tolerance",
            "10%",
        ],
        grown,
    );
    assert_eq!(code, 0);
    let (code, _, _, _) = gated(
        &m,
        &[
            "--quiet",
            "--baseline",
            b,
            "--name",
            "train-small",
            "--tolerance",
            "5%,512MiB",
        ],
        grown,
    );
    assert_eq!(code, 0, "the larger of the two tolerances applies");
    // A missing entry is reported, not failed.
    let (code, r, _, _) = gated(&m, &["--quiet", "--baseline", b, "--name", "nope"], JOB_3G);
    assert_eq!(code, 0);
    assert!(
        r["gate"]["notes"][0]
            .as_str()
            .unwrap()
            .contains("--update-baseline to record one")
    );
}

#[test]
fn a_corrupt_baseline_stops_gpudoc_and_is_never_overwritten() {
    let m = Machine::h200s(1);
    let base = m.path("gpu-mem.json");
    std::fs::write(&base, "{ not json").unwrap();
    let marker = m.path("ran");
    let script = format!("touch {}", marker.display());
    let (code, _, _, err) = gated(
        &m,
        &[
            "--baseline",
            base.to_str().unwrap(),
            "--name",
            "x",
            "--update-baseline",
        ],
        &script,
    );
    assert_eq!(code, 125);
    assert!(err.contains("gpu-mem.json is corrupt"), "{err}");
    assert!(!marker.exists(), "the command did not run");
    assert_eq!(std::fs::read_to_string(&base).unwrap(), "{ not json");
}

#[test]
fn ci_annotations_and_junit() {
    let m = Machine::h200s(1);
    let junit = m.path("gate.xml");
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .env("GITHUB_ACTIONS", "true")
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args([
            "--quiet",
            "--max-peak",
            "2GiB",
            "--junit",
            junit.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            JOB_3G,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(122));
    // Actions reads workflow commands from stderr as from stdout; stdout is the job's alone.
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "::error title=gpudoc memory gate::GPU 0: peak 3.00 GiB over budget 2.00 GiB\n"
        ),
        "{stderr}"
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("<testsuite name=\"gpudoc memory gate\" tests=\"1\" failures=\"1\">"),
        "{xml}"
    );
    assert!(
        xml.contains("<failure message=\"GPU 0: peak 3.00 GiB over budget 2.00 GiB\"/>"),
        "{xml}"
    );
    // Without GITHUB_ACTIONS, no workflow command at all.
    let out = m
        .gpudoc()
        .args([
            "run",
            "--quiet",
            "--max-peak",
            "2GiB",
            "--",
            "sh",
            "-c",
            JOB_3G,
        ])
        .output()
        .unwrap();
    assert!(out.stdout.is_empty());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("::error"));
}

#[test]
fn annotations_never_land_in_the_jobs_stdout_file() {
    // The issue's repro: the job's data goes to a file through stdout; a failed gate under Actions must
    // leave that file as the job wrote it.
    let m = Machine::h200s(1);
    let data = m.path("data.json");
    let out = m
        .shell(&format!(
            r#""$GPUDOC" run -q --max-peak 1MiB -- sh -c '{JOB_3G}; echo data' > {}"#,
            data.display()
        ))
        .env("GITHUB_ACTIONS", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(122));
    assert_eq!(std::fs::read_to_string(&data).unwrap(), "data\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("::error title=gpudoc memory gate::"));
}

#[test]
fn fail_on_diagnoses() {
    let m = Machine::h200s(1);
    let full = r#""$FAKEGPU" alloc --steps 138GiB --hold-ms 150 & wait"#;
    let (code, r, _, err) = gated(&m, &["--quiet", "--fail-on", "warn"], full);
    assert_eq!(code, 122, "near-capacity is a warning: {err}");
    assert!(last_line(&err).contains("[near-capacity]"), "{err}");
    assert_eq!(r["gate"]["checks"][0]["kind"], "diagnoses");
    let (code, _, _, _) = gated(&m, &["--quiet", "--fail-on", "error"], full);
    assert_eq!(code, 0);
}

#[test]
fn the_framework_measure_can_be_gated() {
    let m = Machine::h200s(1);
    let json = m.path("r.json");
    let train = fake_torch().join("train.py");
    let run = |gate: &str, max: &str| {
        m.gpudoc()
            .env("PYTHONPATH", fake_torch())
            .arg("run")
            .arg("--json")
            .arg(&json)
            .args([
                "--quiet",
                "--gate",
                gate,
                "--max-peak",
                max,
                "--",
                "python3",
            ])
            .arg(&train)
            .arg("4")
            .output()
            .unwrap()
    };
    // Four steps: live tensors and the cache both peak at 1 GiB of weights + 3 × 256 MiB kept + 512 MiB of
    // activations = 2.25 GiB; NVML adds the fake 500 MiB context.
    assert_eq!(run("reserved", "2.3GiB").status.code(), Some(0));
    assert_eq!(run("reserved", "2.2GiB").status.code(), Some(122));
    assert_eq!(run("nvml", "2.3GiB").status.code(), Some(122));
    assert_eq!(run("allocated", "2.3GiB").status.code(), Some(0));
    let r = read_json(&json);
    assert_eq!(r["gate"]["measure"], "allocated");
    assert_eq!(r["gate"]["checks"][0]["value_bytes"], 2 * GIB + GIB / 4);
}

#[test]
fn compare_shows_what_changed() {
    let f = |p: &str| format!("{}/fixtures/{p}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(common::gpudoc_bin())
        .args([
            "compare",
            &f("runs/healthy.report.json"),
            &f("runs/cache_bloat.report.json"),
            "--json",
            "-",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    let job = c["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["measure"] == "job peak (NVML)")
        .unwrap();
    assert_eq!(job["old_bytes"], 1_568_669_696u64);
    assert_eq!(job["new_bytes"], 43_729_813_504u64);
    assert_eq!(job["delta_bytes"], 43_729_813_504i64 - 1_568_669_696);
    assert!(
        c["rules_added"][0]
            .as_str()
            .unwrap()
            .starts_with("cache-bloat (warn")
    );
    assert_eq!(c["rules_removed"], serde_json::json!([]));
    let out = Command::new(common::gpudoc_bin())
        .args([
            "compare",
            &f("runs/healthy.report.json"),
            &f("runs/cache_bloat.report.json"),
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("job peak (NVML)") && text.contains("+ cache-bloat"),
        "{text}"
    );
}
