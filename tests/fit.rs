//! `gpudoc fit`: the largest value of `{}` that runs without running out of GPU memory, from real runs of
//! a fake training loop (fixtures/fake_torch/batch.py: batch 80 fits the fake H200, 81 raises PyTorch's
//! OOM text) under gpudoc run's own machinery.

mod common;

use common::{Machine, conforms, fake_torch, read_json};

/// `gpudoc fit --json fit.json [extra] -- python3 batch.py --batch-size {}`: (exit code, result, stderr).
fn fit(m: &Machine, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let json = m.path("fit.json");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args(["fit", "--json"])
        .arg(&json)
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(fake_torch().join("batch.py"))
        .args(["--batch-size", "{}"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let result = if json.exists() {
        let r = read_json(&json);
        conforms("fit", &r);
        r
    } else {
        serde_json::Value::Null
    };
    (out.status.code().unwrap_or(-1), result, stderr)
}

fn runs(r: &serde_json::Value) -> Vec<(u64, String)> {
    r["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["value"].as_u64().unwrap(),
                p["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_program_that_runs_out_above_80_is_fitted_to_80_in_a_few_runs() {
    let m = Machine::h200s(1);
    let (code, r, stderr) = fit(&m, &[]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(r["answer"], 80, "{stderr}");
    assert_eq!(r["verified"], true);
    assert_eq!(r["smallest_oom"], 81);
    let ran = runs(&r);
    assert!(ran.len() <= 10, "{ran:?}");
    assert!(ran.contains(&(80, "fits".into())), "{ran:?}");
    assert!(ran.contains(&(81, "oom".into())), "{ran:?}");
    // Measured, and within what the fake H200 leaves the job.
    let peak = r["measured_peak_bytes"].as_u64().unwrap();
    let limit = r["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit, (143771 - 615) << 20);
    assert_eq!(peak, (500 + 16384 + 80 * 1568) << 20);
    assert_eq!(r["headroom_bytes"].as_u64().unwrap(), limit - peak);
    assert!(
        stderr.contains("80 is the largest value that fits (81 ran out of memory)"),
        "{stderr}"
    );
}

#[test]
fn each_run_is_ended_like_a_ctrl_c_after_its_steps() {
    let m = Machine::h200s(1);
    let (_, r, stderr) = fit(&m, &["--steps", "3", "--max", "2"]);
    let first = &r["runs"][0];
    assert_eq!(first["outcome"], "fits", "{stderr}");
    // The loop never ends by itself: gpudoc's SIGINT ended it, as KeyboardInterrupt (death by SIGINT).
    assert_eq!(first["exit_code"], 130, "{stderr}");
    assert!(stderr.contains("KeyboardInterrupt"), "{stderr}");
    let steps = first["steps"].as_u64().unwrap();
    assert!((3..10).contains(&steps), "{steps}");
    assert_eq!(r["answer"], 2);
}

#[test]
fn the_runs_and_the_budget_are_printed_first_and_never_exceeded() {
    let m = Machine::h200s(1);
    let (code, r, stderr) = fit(&m, &["--runs", "2", "--budget", "10m"]);
    assert!(
        stderr.starts_with(
            "gpudoc fit: values 1 to 1048576, at most 2 runs and 10m; each run is ended after 5 optimizer steps"
        ),
        "{stderr}"
    );
    assert_eq!(runs(&r).len(), 2, "{stderr}");
    assert_eq!(r["stop"], "runs");
    assert_eq!(r["verified"], false);
    assert_eq!(r["answer"], 2, "the largest that fit so far");
    assert_eq!(code, 3);
}

#[test]
fn a_command_without_a_placeholder_is_refused_before_anything_runs() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["fit", "--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no `{}` in it"));
}

#[test]
fn a_run_still_going_when_the_budget_is_spent_is_ended_and_the_fit_stops() {
    let m = Machine::h200s(1);
    let started = std::time::Instant::now();
    let (code, r, stderr) = fit(&m, &["--budget", "2s", "--steps", "100000"]);
    let took = started.elapsed();
    assert_eq!(runs(&r), vec![(1, "cut".to_string())], "{stderr}");
    assert_eq!(r["stop"], "budget");
    assert_eq!(r["answer"], serde_json::Value::Null);
    assert_eq!(code, 3);
    // The budget, plus the run's own end (SIGINT is enough for this loop) and gpudoc's collection.
    assert!(took < std::time::Duration::from_secs(6), "{took:?}");
}

#[test]
fn a_run_that_fails_for_another_reason_stops_the_fit() {
    let m = Machine::h200s(1);
    let json = m.path("fit.json");
    let out = m
        .gpudoc()
        .args(["fit", "--json"])
        .arg(&json)
        .args(["--for", "10s", "--no-torch", "--", "sh", "-c", "exit $(( {} > 1 ))"])
        .output()
        .unwrap();
    let r = read_json(&json);
    conforms("fit", &r);
    assert_eq!(
        runs(&r),
        vec![(1, "fits".to_string()), (2, "failed".to_string())]
    );
    assert_eq!(r["stop"], "failed");
    assert_eq!(r["answer"], 1);
    assert_eq!(out.status.code(), Some(4));
}
