//! The rule set: each bundled rule fires on its fixture (a real H200 run where one could be made) and a
//! healthy run fires none; rule files are checked at load; the human output is pinned by snapshots.

mod common;

use common::{Machine, gpudoc_bin, report};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn fixture(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(p)
        .to_string_lossy()
        .into_owned()
}

fn fired(r: &Value) -> Vec<String> {
    let mut ids: Vec<String> = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["rule"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

#[test]
fn each_rule_fires_on_its_fixture_and_healthy_runs_stay_quiet() {
    let reports: [(&str, &[&str]); 18] = [
        // DDP on two H200s under torchrun (issue 8): balanced; every rank loading a checkpoint onto cuda:0
        // before set_device; rank 0 keeping an evaluation copy; rank 1 running out of memory.
        ("multi/correct.report.json", &[]),
        (
            "multi/stray.report.json",
            &["gpu-imbalance", "stray-context"],
        ),
        ("multi/rank0_extra.report.json", &["gpu-imbalance"]),
        ("multi/oom.report.json", &["oom-too-big"]),
        ("runs/healthy.report.json", &[]),
        ("traces/alloc_known.report.json", &[]),
        ("traces/torch_steps_plain.report.json", &[]),
        ("runs/cache_bloat.report.json", &["cache-bloat"]),
        ("runs/near_capacity.report.json", &["near-capacity"]),
        ("runs/others_before.report.json", &["held-before-start"]),
        ("runs/leak.report.json", &["step-leak"]),
        // The framework view places the spike at step 30: said with the step, not twice.
        ("runs/spike.report.json", &["phase-peak"]),
        ("runs/thrash.report.json", &["allocator-thrash"]),
        ("runs/jax_prealloc.report.json", &["jax-preallocation"]),
        ("runs/oom_observer.report.json", &["oom-too-big"]),
        ("rules/host_oom_kill.report.json", &["host-oom-kill"]),
        ("rules/driver_too_old.report.json", &["driver-too-old"]),
        ("traces/torch_steps_leak.report.json", &["step-leak"]),
    ];
    for (file, want) in reports {
        assert_eq!(fired(&report(fixture(file), &[])), want, "{file}");
    }
    // OOMs recorded on the H200, rebuilt from their traces and the command's output.
    let ooms: [(&str, &[&str]); 5] = [
        ("torch_too_big", &["oom-too-big"]),
        (
            "torch_fragmentation",
            &["near-capacity", "oom-fragmentation"],
        ),
        ("torch_other_process", &["held-before-start", "oom-others"]),
        ("torch_cublas", &["near-capacity", "oom-near-capacity"]),
        ("jax_too_big", &["jax-preallocation", "oom-too-big"]),
    ];
    for (name, want) in ooms {
        let r = report(
            fixture(&format!("oom/h200/{name}.trace.jsonl")),
            &["--output", &fixture(&format!("oom/h200/{name}.stderr"))],
        );
        assert_eq!(fired(&r), want, "{name}");
    }
}

#[test]
fn the_two_gpu_runs_name_ranks_gpus_and_numbers() {
    let r = report(fixture("multi/stray.report.json"), &[]);
    let stray = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"] == "stray-context")
        .unwrap()
        .clone();
    let pid = stray["subject"]
        .as_str()
        .unwrap()
        .trim_start_matches("pid ")
        .to_string();
    assert_eq!(
        stray["message"],
        format!(
            "pid {pid} (rank 1) works on GPU 1 (2.46 GiB) but also holds 2.79 GiB on GPU 0: a stray CUDA context, the classic pile-up on GPU 0."
        )
    );
    let r = report(fixture("multi/rank0_extra.report.json"), &[]);
    assert_eq!(
        r["diagnoses"][0]["message"],
        "The job peaked at 18.46 GiB on GPU 0 but 2.46 GiB on GPU 1 (7.5x): the busiest GPU sets the batch size for all of them."
    );
    let r = report(fixture("multi/oom.report.json"), &[]);
    assert_eq!(r["oom"]["gpu"], 1);
    assert_eq!(r["oom"]["rank"], 1);
    assert_eq!(r["oom"]["first_failure"]["rank"], 1);
    let out = Command::new(gpudoc_bin())
        .args([
            "report",
            &fixture("multi/oom.report.json"),
            "--color",
            "never",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ran out of GPU memory on GPU 1 (rank 1)")
            && text.contains("torchrun: rank 1 failed first"),
        "{text}"
    );
}

#[test]
fn messages_carry_the_numbers() {
    let r = report(fixture("runs/cache_bloat.report.json"), &[]);
    let d = &r["diagnoses"][0];
    assert_eq!(d["severity"], "warn");
    assert_eq!(
        d["subject"],
        format!("pid {}", r["torch"]["processes"][0]["pid"])
    );
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "GPU 0: PyTorch kept 40.00 GiB reserved while live tensors peaked at 641.13 MiB per step; \
             a one-off phase held 40.00 GiB once and filled the cache"
        ),
        "{msg}"
    );
    let r = report(
        fixture("oom/h200/torch_other_process.trace.jsonl"),
        &["--output", &fixture("oom/h200/torch_other_process.stderr")],
    );
    let oom = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"] == "oom-others")
        .unwrap();
    assert_eq!(
        oom["message"],
        "GPU 0: the job asked for 38.78 GiB with 28.77 GiB free while processes outside the job held 100.51 GiB: pid 643 100.51 GiB."
    );
    assert_eq!(r["diagnoses"][0]["severity"], "error", "most severe first");
}

#[test]
fn multi_gpu_imbalance_and_a_stray_context_under_the_fake_nvml() {
    let m = Machine::h200s(2);
    // Rank 0 works on GPU 0; rank 1 works on GPU 1 but also created a context on GPU 0.
    let script = r#"
        "$FAKEGPU" alloc --gpu 0 --steps 30GiB --hold-ms 700 &
        "$FAKEGPU" alloc --gpu 1 --steps 10GiB --hold-ms 700 & R1=$!
        sleep 0.1; "$FAKEGPU" set --pid $R1 --gpu 0 --bytes 520MiB
        wait
    "#;
    let (code, r, err) = m.run_sh(&[], script);
    assert_eq!(code, 0);
    assert_eq!(fired(&r), ["gpu-imbalance", "stray-context"], "{err}");
    let stray = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"] == "stray-context")
        .unwrap();
    assert!(
        stray["message"]
            .as_str()
            .unwrap()
            .contains("holds 520.00 MiB on GPU 0"),
        "{stray}"
    );
    assert!(
        err.contains("error One process holds") || err.contains("stray-context"),
        "{err}"
    );
    let (_, r, _) = m.run_sh(&["--disable-rule", "stray-context"], script);
    assert_eq!(fired(&r), ["gpu-imbalance"]);
}

#[test]
fn leftover_processes_are_diagnosed() {
    let m = Machine::h200s(1);
    let (_, r, _) = m.run_sh(
        &["--kill-orphans"],
        r#"( "$FAKEGPU" alloc --steps 1GiB --hold-ms 20000 & ); sleep 0.3"#,
    );
    assert_eq!(fired(&r), ["leftover-processes"]);
}

fn rules_dir(files: &[(&str, &str)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(d.path().join(name), text).unwrap();
    }
    d
}

#[test]
fn a_broken_rule_file_fails_at_load_with_file_line_and_reason() {
    let bad = "id = \"mine\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"gpu\"\nwhen = \"gpu.job_peak_bytess > 0\"\nmessage = \"m\"\n";
    let d = rules_dir(&[("mine.toml", bad)]);
    let out = Command::new(gpudoc_bin())
        .args([
            "report",
            &fixture("runs/healthy.report.json"),
            "--rules",
            d.path().to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mine.toml:5: when: unknown fact `gpu.job_peak_bytess`"),
        "{err}"
    );

    // Under `gpudoc run` it is gpudoc's own failure (125), and the command never starts.
    let m = Machine::h200s(1);
    let marker = m.path("ran");
    let out = m
        .gpudoc()
        .args([
            "run",
            "--rules",
            d.path().to_str().unwrap(),
            "--",
            "touch",
            marker.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(!marker.exists());

    let out = Command::new(gpudoc_bin())
        .args(["rules", "list", "--disable-rule", "no-such-rule"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no rule `no-such-rule`"));
}

#[test]
fn user_rules_add_to_and_override_the_bundled_ones() {
    let strict = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/near-capacity.toml"),
    )
    .unwrap()
    .replace("gpu.peak_used_pct >= 95.0", "gpu.peak_used_pct >= 0.5");
    let mine = "id = \"long-run\"\nseverity = \"info\"\ntitle = \"A long run\"\neach = \"run\"\nwhen = \"run.duration_s > 5.0\"\nmessage = \"ran {fmt_secs(run.duration_s)}\"\n";
    let d = rules_dir(&[("near-capacity.toml", &strict), ("long.toml", mine)]);
    let r = report(
        fixture("runs/healthy.report.json"),
        &["--rules", d.path().to_str().unwrap()],
    );
    assert_eq!(fired(&r), ["long-run", "near-capacity"]);
    let out = Command::new(gpudoc_bin())
        .args(["rules", "list", "--rules", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains("long-run")
            && list.contains(&format!(
                "{}",
                d.path().join("near-capacity.toml").display()
            )),
        "{list}"
    );
}

#[test]
fn rules_list_and_explain() {
    let out = Command::new(gpudoc_bin())
        .args(["rules", "list"])
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        list.lines().count(),
        1 + gpudoc::rules::bundled::RULES.len()
    );
    let out = Command::new(gpudoc_bin())
        .args(["rules", "explain", "cache-bloat"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("fires when:") && text.contains("torch.steady_reserved_bytes"),
        "{text}"
    );
    assert!(
        text.contains("median reserved over the steps after warm-up"),
        "facts are explained: {text}"
    );
    let out = Command::new(gpudoc_bin())
        .args(["rules", "explain", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn a_corrupt_report_or_trace_is_an_error_that_names_it() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("r.json");
    std::fs::write(&f, "{\"schema\": \"gpudoc.report/2\", \"command\": 3}").unwrap();
    let out = Command::new(gpudoc_bin())
        .arg("report")
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("r.json"));
    let t = d.path().join("t.jsonl");
    let good = std::fs::read_to_string(fixture("oom/h200/torch_too_big.trace.jsonl")).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    lines.insert(3, "{\"kind\": \"device\", \"t\": 1.0}");
    std::fs::write(&t, lines.join("\n") + "\n").unwrap();
    let out = Command::new(gpudoc_bin())
        .arg("report")
        .arg(&t)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("t.jsonl:4: no number `gpu`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn human_output_snapshots() {
    for (name, file, extra) in [
        ("cache_bloat", "runs/cache_bloat.report.json", vec![]),
        (
            "oom_fragmentation",
            "oom/h200/torch_fragmentation.trace.jsonl",
            vec![
                "--output".to_string(),
                fixture("oom/h200/torch_fragmentation.stderr"),
            ],
        ),
        ("healthy", "runs/healthy.report.json", vec![]),
    ] {
        let out = Command::new(gpudoc_bin())
            .arg("report")
            .arg(fixture(file))
            .args(&extra)
            .args(["--color", "never"])
            .output()
            .unwrap();
        let text =
            String::from_utf8_lossy(&out.stdout).replace(env!("CARGO_MANIFEST_DIR"), "[repo]");
        insta::assert_snapshot!(name, text);
    }
}

#[test]
fn demo_without_a_gpu_shows_a_recorded_diagnosis() {
    let out = Command::new(gpudoc_bin())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("GPUDOC_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .args(["demo", "--color", "never"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("recorded on an NVIDIA H200") && text.contains("[cache-bloat]"),
        "{text}"
    );
}
