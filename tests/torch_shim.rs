//! The framework view through the shim, with the fake `torch` package in fixtures/fake_torch.

mod common;

use common::{Machine, fake_torch, read_json};
use fake_nvml::state::{Delay, State};
use serde_json::Value;
use std::process::Command;

const MIB: u64 = 1 << 20;

fn python(m: &Machine, extra: &[&str], args: &[&str]) -> (i32, Value, String, String) {
    m.python(&[], extra, args)
}

fn train() -> String {
    fake_torch().join("train.py").to_string_lossy().into_owned()
}

#[test]
fn every_file_of_the_shims_folder_is_shipped_in_the_binary() {
    // The binary writes the shim from torch::SHIM where no installed package's folder can be used: a file
    // left out of it (a new part of _gpudoc_torch.py) would be missing from every job's shim.
    let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python/gpudoc/_shim");
    let mut files: Vec<String> = std::fs::read_dir(&folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".py"))
        .collect();
    files.sort();
    let mut shipped: Vec<String> = gpudoc::torch::SHIM
        .iter()
        .map(|(n, _)| n.to_string())
        .filter(|n| n.ends_with(".py"))
        .collect();
    shipped.sort();
    assert_eq!(shipped, files);
    for (name, text) in gpudoc::torch::SHIM {
        if name.ends_with(".py") {
            assert_eq!(
                std::fs::read_to_string(folder.join(name)).unwrap(),
                text,
                "{name}"
            );
        }
    }
}

#[test]
fn per_step_numbers_equal_torchs_own() {
    let m = Machine::h200s(1);
    // Steps slow enough that recording each one costs under the shim's budget.
    let (code, r, out, err) = python(&m, &[], &[&train(), "6", "--sleep", "0.15"]);
    assert_eq!(code, 0, "{err}");
    let procs = r["torch"]["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{r:#}");
    let p = &procs[0];
    assert_eq!(p["gpu"], 0, "matched to NVML's GPU by UUID");
    assert_eq!(p["torch_version"], "2.11.0+fake");
    assert_eq!(p["steps_total"], 6);
    // torch's own numbers, printed by the script after each step.
    let own: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let steps = p["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6);
    for (s, o) in steps.iter().zip(&own) {
        assert_eq!(s["step"], o["step"]);
        assert_eq!(s["allocated_bytes"], o["allocated"]);
        assert_eq!(s["reserved_bytes"], o["reserved"]);
    }
    // Per-step peaks: the 512 MiB of activations on top of what the step started with.
    assert_eq!(
        steps[1]["peak_allocated_bytes"].as_u64().unwrap(),
        own[0]["allocated"].as_u64().unwrap() + 512 * MIB
    );
    let reserved_peak = p["peak_reserved_bytes"].as_u64().unwrap();
    assert_eq!(reserved_peak, 1024 * MIB + 6 * 256 * MIB + 256 * MIB);
    assert_eq!(
        p["nvml_peak_bytes"].as_u64().unwrap(),
        reserved_peak + 500 * MIB
    );
    assert_eq!(
        p["non_pytorch_bytes"].as_u64().unwrap(),
        500 * MIB,
        "NVML − reserved: the fake context"
    );
    // The exit record is the allocator's last reading: after the last step, before the run's end.
    let last = p["last_reading_s"].as_f64().unwrap();
    let last_step = steps[5]["at_s"].as_f64().unwrap();
    assert!(
        last > last_step && last <= r["duration_s"].as_f64().unwrap(),
        "{p}"
    );
    assert!(err.contains("PyTorch, per process"), "{err}");
    assert!(err.contains("500.00 MiB"), "{err}");
}

/// Every time in the report counts from one origin, the session's start: the run's duration too, though
/// the command starts later (here after a `--max-peak` for GPU 0 waited 0.6 s for NVML to open).
#[test]
fn the_runs_duration_covers_every_reading_when_the_command_starts_late() {
    let mut s = State::h200s(1);
    s.delays.push(Delay {
        func: "nvmlInit_v2".into(),
        ms: 600,
    });
    let m = Machine::with(s);
    let (code, r, _, err) = python(
        &m,
        &["--max-peak", "0=100GiB"],
        &[&train(), "3", "--sleep", "0.05"],
    );
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    let duration = r["duration_s"].as_f64().unwrap();
    let last = p["last_reading_s"].as_f64().unwrap();
    assert!(last >= 0.6, "the command started after NVML opened: {p}");
    assert!(last <= duration, "last reading {last} s, run {duration} s");
}

#[test]
fn keep_torch_peaks_leaves_the_programs_peaks_alone() {
    let m = Machine::h200s(1);
    let (_, r, _, _) = python(
        &m,
        &["--keep-torch-peaks"],
        &[&train(), "3", "--sleep", "0.15"],
    );
    let steps = r["torch"]["processes"][0]["steps"]
        .as_array()
        .unwrap()
        .clone();
    // Without resets the peak only grows: step 3's peak is the run's peak so far.
    let peaks: Vec<u64> = steps
        .iter()
        .map(|s| s["peak_allocated_bytes"].as_u64().unwrap())
        .collect();
    assert!(peaks.windows(2).all(|w| w[1] >= w[0]));
    let (_, r, _, _) = python(&m, &[], &[&train(), "3", "--sleep", "0.15"]);
    let reset: Vec<u64> = r["torch"]["processes"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["peak_allocated_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(reset.len(), 3);
    assert!(
        reset[2] - reset[1] == 256 * MIB,
        "each step's own peak: {reset:?}"
    );
}

#[test]
fn the_oom_observer_records_the_allocator_before_unwinding() {
    let m = Machine::h200s(1);
    let (code, r, _, err) = python(&m, &[], &[&train(), "2", "--oom"]);
    assert_eq!(code, 1, "{err}");
    let t = &r["torch"]["ooms"][0];
    assert_eq!(t["requested_bytes"], 64u64 << 30);
    assert_eq!(t["allocated_bytes"], (1024 + 2 * 256) * MIB);
    assert_eq!(
        r["oom"]["allocator"]["requested_bytes"],
        64u64 << 30,
        "joined with the OOM text"
    );
    assert_eq!(r["torch"]["processes"][0]["ooms"], 1);
}

#[test]
fn ranks_subprocesses_and_python_m_are_all_seen() {
    let m = Machine::h200s(2);
    let script = m.path("launch.py");
    std::fs::write(
        &script,
        format!(
            r#"
import os, subprocess, sys
procs = []
for rank in (0, 1):
    env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), FAKE_TORCH_DEVICES="2")
    code = "import torch; torch.cuda.set_device(%d); exec(open(%r).read())" % (rank, {train:?})
    # close_fds (the default) drops inherited descriptors: the shim must not depend on them.
    procs.append(subprocess.Popen([sys.executable, "-c", code, "3"], env=env, stdout=subprocess.DEVNULL))
sys.exit(max(p.wait() for p in procs))
"#,
            train = train()
        ),
    )
    .unwrap();
    let (code, r, _, err) = python(&m, &[], &[script.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let procs = r["torch"]["processes"].as_array().unwrap();
    let mut ranks: Vec<(i64, i64)> = procs
        .iter()
        .map(|p| (p["rank"].as_i64().unwrap(), p["gpu"].as_i64().unwrap()))
        .collect();
    ranks.sort();
    assert_eq!(ranks, vec![(0, 0), (1, 1)], "{r:#}");
    assert!(procs.iter().all(|p| p["steps_total"] == 3));

    let (code, r, _, err) = {
        let json = m.path("m.json");
        let out = m
            .gpudoc()
            .env("PYTHONPATH", fake_torch())
            .current_dir(fake_torch())
            .arg("run")
            .arg("--json")
            .arg(&json)
            .args(["--", "python3", "-m", "train", "2"])
            .output()
            .unwrap();
        (
            out.status.code(),
            read_json(&json),
            (),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 2, "python -m");
}

#[test]
fn fast_steps_are_recorded_every_nth_with_exact_peaks_over_each_record() {
    let m = Machine::h200s(1);
    let (code, r, _, err) = python(&m, &[], &[&train(), "400", "--sleep", "0"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["steps_total"], 400);
    let every = p["record_every"].as_u64().unwrap();
    assert!(every > 1, "a fast loop is recorded every Nth step: {p:#}");
    // It adapts its stride to keep its share small (aiming at 0.3%; the H200 figures are in bench/README.md).
    // Recording every step of this near-empty loop would cost most of its time; the bound is loose because a
    // loaded test machine times its records unevenly.
    let cost = p["shim_cost_pct"].as_f64().unwrap();
    assert!(cost < 5.0, "the shim's share of the step time: {cost}%");
    let steps = p["steps"].as_array().unwrap();
    // The records tile the steps: together they cover every step up to the last one recorded.
    let covered: u64 = steps.iter().map(|s| s["steps"].as_u64().unwrap()).sum();
    assert_eq!(covered, steps.last().unwrap()["step"].as_u64().unwrap());
    assert!(covered + 4 * every > 400, "{covered} of 400, every {every}");
    // Each step leaks 256 MiB after a 512 MiB transient: a record's peak, over all the steps it covers,
    // is its last step's transient on top of what that step started with.
    for s in &steps[1..] {
        let (a, pa) = (
            s["allocated_bytes"].as_u64().unwrap(),
            s["peak_allocated_bytes"].as_u64().unwrap(),
        );
        assert_eq!(pa, a + 256 * MIB, "{s}");
    }
}

#[test]
fn the_shim_starts_no_thread() {
    let m = Machine::h200s(1);
    let script = m.path("threads.py");
    std::fs::write(
        &script,
        r#"
import threading, torch
torch.cuda.init()
opt = torch.optim.SGD()
torch.cuda._alloc(1 << 20)
for _ in range(5):
    opt.step()
print(threading.active_count())
"#,
    )
    .unwrap();
    let (code, r, out, err) = python(&m, &[], &[script.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "1", "only the program's own thread");
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 5);
}

#[test]
fn a_broken_shim_goes_quiet_and_is_reported() {
    let m = Machine::h200s(1);
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .env("FAKE_TORCH_BREAK", "1")
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args([
            "--",
            "python3",
            "-c",
            "import torch, time; torch.cuda.init(); time.sleep(0.3); print('fine')",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the program is not broken by the shim"
    );
    assert_eq!(out.stdout, b"fine\n");
    let r = read_json(&json);
    assert!(
        r["torch"]["errors"][0]
            .as_str()
            .unwrap()
            .contains("broken on purpose"),
        "{r:#}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("the PyTorch view was lost"));
}

#[test]
fn an_existing_sitecustomize_still_runs() {
    let m = Machine::h200s(1);
    let site = m.path("site");
    std::fs::create_dir(&site).unwrap();
    let marker = m.path("marker");
    std::fs::write(
        site.join("sitecustomize.py"),
        format!("open({:?}, 'w').write('ran')\n", marker.to_str().unwrap()),
    )
    .unwrap();
    let path = format!("{}:{}", site.display(), fake_torch().display());
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", &path)
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args(["--", "python3", &train(), "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "ran");
    assert_eq!(
        read_json(&json)["torch"]["processes"][0]["steps_total"],
        1,
        "and the shim ran too"
    );
}

/// Module names a plain Python (no torch) loads, with or without gpudoc.
fn modules(cmd: &mut Command) -> Vec<String> {
    let out = common::succeed(cmd.args([
        "python3",
        "-c",
        "import sys; print('\\n'.join(sorted(sys.modules)))",
    ]));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

#[test]
fn commands_without_torch_are_unaffected() {
    let m = Machine::h200s(1);
    let bare = modules(Command::new("env").env_remove("PYTHONPATH"));
    let mut wrapped = m.gpudoc();
    wrapped
        .env_remove("PYTHONPATH")
        .args(["run", "--quiet", "--"]);
    let under = modules(&mut wrapped);
    let extra: Vec<&String> = under.iter().filter(|m| !bare.contains(m)).collect();
    assert!(extra.is_empty(), "the shim imports nothing: {extra:?}");

    // A non-Python command sees only the shim's variables added to its environment.
    let env_of = common::env_lines;
    let mut plain = m.gpudoc();
    plain.args(["run", "--quiet", "--no-torch", "--"]);
    let mut shimmed = m.gpudoc();
    shimmed.args(["run", "--quiet", "--"]);
    let (a, b) = (env_of(&mut plain), env_of(&mut shimmed));
    let added: Vec<&str> = b
        .iter()
        .filter(|l| !a.contains(l))
        .map(|l| l.split('=').next().unwrap())
        .collect();
    assert_eq!(added, vec!["GPUDOC_TORCH", "PYTHONPATH"]);
    // The shim is told warm-up's one definition.
    let told = b.iter().find(|l| l.starts_with("GPUDOC_TORCH=")).unwrap();
    let warmup = format!(";warmup={};", gpudoc::torch::warmup::STEPS);
    assert!(told.contains(&warmup), "{told}");
    assert!(
        a.iter().all(|l| b.contains(l)),
        "--no-torch adds nothing and the shim removes nothing"
    );
}
