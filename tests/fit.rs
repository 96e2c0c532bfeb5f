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
        .args([
            "--for",
            "10s",
            "--no-torch",
            "--",
            "sh",
            "-c",
            "exit $(( {} > 1 ))",
        ])
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

/// `gpudoc run [extra] -- python3 fragments.py` with the fake torch and `envs`: (exit code, stderr).
fn fragments(m: &Machine, envs: &[(&str, &str)], extra: &[&str]) -> (i32, String) {
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .env_remove("PYTORCH_CUDA_ALLOC_CONF")
        .envs(envs.iter().copied())
        .arg("run")
        .args(extra)
        .arg("--")
        .arg("python3")
        .arg(fake_torch().join("fragments.py"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_fragmentation_oom_gets_try_expandable_segments_proposed() {
    let m = Machine::h200s(1);
    let (code, stderr) = fragments(&m, &[], &[]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("cause: fragmentation"), "{stderr}");
    let script = fake_torch().join("fragments.py");
    assert!(
        stderr.contains(&format!(
            "  try: gpudoc run --try expandable_segments -- python3 {} (",
            script.display()
        )),
        "{stderr}"
    );
}

#[test]
fn try_expandable_segments_reruns_with_it_merged_into_the_users_allocator_settings() {
    let m = Machine::h200s(1);
    let json = m.path("after.json");
    let (code, stderr) = fragments(
        &m,
        &[(
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size_mb:128,expandable_segments:False",
        )],
        &[
            "--try",
            "expandable_segments",
            "--json",
            json.to_str().unwrap(),
        ],
    );
    assert!(
        stderr.starts_with("gpudoc run --try expandable_segments:True: 2 runs"),
        "{stderr}"
    );
    // The first run as the user set it, the second with the remedy merged in (their other key kept).
    assert!(
        stderr
            .contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:False\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True\n"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "  as is      out of memory (fragmentation): 2 steps, peak 99.08 GiB, fragmentation 58.59 GiB\n"
        ),
        "{stderr}"
    );
    // Ended once it ran 5 steps past where the first run ran out (at the shim's first record past them).
    let with = stderr
        .split("  with it    fits: ")
        .nth(1)
        .unwrap_or_else(|| panic!("{stderr}"));
    let steps: u64 = with.split(' ').next().unwrap().parse().unwrap();
    assert!(steps >= 7, "{stderr}");
    assert!(
        with.contains("steps, peak 99.08 GiB, fragmentation 0 B\n"),
        "{stderr}"
    );
    assert_eq!(code, 0, "{stderr}");
    let after = read_json(&json);
    conforms("report", &after);
    assert_eq!(after["exit"]["classification"], "signal");
}
