//! Leak hunting through the shim, on the fake torch (fixtures/fake_torch/leaks.py plants the leaks that
//! tests/gpu/leaks.py plants on a real GPU; fixtures/leaks/ holds those real runs).

mod common;

use common::{Machine, fake_torch};
use serde_json::Value;

/// `gpudoc run [extra] -- python3 leaks.py MODE STEPS` on the fake torch, with `envs`: (exit code, report,
/// stdout, stderr).
fn leaks(
    envs: &[(&str, &str)],
    extra: &[&str],
    mode: &str,
    steps: u32,
) -> (i32, Value, String, String) {
    let script = fake_torch().join("leaks.py");
    let steps = steps.to_string();
    Machine::h200s(1).python(envs, extra, &[script.to_str().unwrap(), mode, &steps])
}

/// A leak run that must succeed: its report and stderr.
fn leak_run(mode: &str, steps: u32, extra: &[&str]) -> (Value, String) {
    let (code, r, _, err) = leaks(&[], extra, mode, steps);
    assert_eq!(code, 0, "{err}");
    (r, err)
}

/// [`leak_run`] of a leak that ends once its hunt has, after `min` steps at least (`leaks.py
/// --until-hunted`: a test of what the hunt found needs no step after it; the step-leak diagnosis needs
/// 512 MiB of growth past warm-up), `steps` at most: steps enough for the window even when a loaded
/// machine makes the shim record only every few steps (its stride follows its cost), which puts off
/// noticing the growth.
fn hunted_run(mode: &str, min: u32, steps: u32) -> (Value, String) {
    let script = fake_torch().join("leaks.py");
    let (min, steps) = (min.to_string(), steps.to_string());
    let (code, r, _, err) = Machine::h200s(1).python(
        &[],
        &[],
        &[
            script.to_str().unwrap(),
            mode,
            &steps,
            "--until-hunted",
            &min,
        ],
    );
    assert_eq!(code, 0, "{err}");
    (r, err)
}

fn hunts(r: &Value) -> Vec<Value> {
    r["torch"]["processes"][0]["hunts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn each_planted_leak_is_found_at_its_line_with_its_holder() {
    let cases = [
        (
            "list",
            "leaks.py",
            "y = torch.empty(16 * MiB)",
            "list `kept` (leaks.py, module globals)",
        ),
        (
            "dict",
            "leaks.py",
            "cache[step] = torch.empty(8 * MiB)",
            "dict `cache` (leaks.py, module globals)",
        ),
        (
            "graph",
            "leaks.py",
            "y = torch.empty(16 * MiB)",
            "the autograd graph of `total` (leaks.py, module globals)",
        ),
        (
            "helper",
            "leak_helper.py",
            "_seen.append(torch.empty(t.nbytes() // 2))",
            "list `_seen` (leak_helper.py, module globals)",
        ),
    ];
    for (mode, file, code, holder) in cases {
        let (r, err) = hunted_run(mode, 40, 120);
        // leaks.py holds objects that say so on stderr when anything touches them: the hunt never does.
        assert!(
            !err.contains("touched") && !err.contains("iterated") && !err.contains("len\n"),
            "{err}"
        );
        let h = hunts(&r);
        assert_eq!(h.len(), 1, "{mode}: {h:#?}");
        let h = &h[0];
        assert_eq!(h["why"], "auto", "{mode}");
        let site = &h["sites"][0];
        assert!(
            site["file"].as_str().unwrap().ends_with(file),
            "{mode}: {site:#}"
        );
        assert_eq!(site["code"], code, "{mode}");
        assert!(site["blocks"].as_u64().unwrap() >= 10, "{mode}: {site:#}");
        let held = h["holders"][0]["text"].as_str().unwrap();
        assert!(held.starts_with(holder), "{mode}: {h:#}");
        assert_eq!(h["error"], Value::Null);
    }
}

#[test]
fn the_step_leak_diagnosis_names_the_line_and_the_holder() {
    let (r, err) = leak_run("list", 60, &[]);
    let d = common::diagnosis(&r, "step-leak").unwrap_or_else(|| panic!("{err}"));
    let details = d["details"].as_array().unwrap();
    let script = std::fs::read_to_string(fake_torch().join("leaks.py")).unwrap();
    let line = 1 + script
        .lines()
        .position(|l| l.trim() == "y = torch.empty(16 * MiB)")
        .unwrap();
    let want = format!(
        "allocated at fake_torch/leaks.py:{line} in <module> `y = torch.empty(16 * MiB)`: +16.00 MiB a step"
    );
    assert!(
        details[0].as_str().unwrap().starts_with(&want),
        "{details:#?}"
    );
    assert!(
        details[1]
            .as_str()
            .unwrap()
            .starts_with("kept alive by list `kept` (leaks.py, module globals)"),
        "{details:#?}"
    );
    assert!(err.contains("kept alive by list `kept`"), "{err}");
}

#[test]
fn a_leak_every_fifth_step_is_hunted_and_named_with_its_line_and_holder() {
    // Flat for four steps, 64 MiB more at the fifth: the level rises as stairs (a validation every 5
    // steps that keeps what it made), never record after record.
    let (r, err) = leak_run("every5", 80, &[]);
    let d =
        common::diagnosis(&r, "step-leak").unwrap_or_else(|| panic!("{err}\n{:#}", r["diagnoses"]));
    let details = d["details"].as_array().unwrap();
    let script = std::fs::read_to_string(fake_torch().join("leaks.py")).unwrap();
    let line = 1 + script
        .lines()
        .position(|l| l.trim() == "kept.append(torch.empty(64 * MiB))")
        .unwrap();
    let site = format!("allocated at fake_torch/leaks.py:{line} in <module>");
    assert!(
        details[0].as_str().unwrap().starts_with(&site),
        "{details:#?}"
    );
    assert!(
        details[1]
            .as_str()
            .unwrap()
            .starts_with("kept alive by list `kept` (leaks.py, module globals)"),
        "{details:#?}"
    );
}

#[test]
fn healthy_and_plateau_runs_report_no_leak() {
    let (r, _) = leak_run("healthy", 40, &[]);
    assert!(hunts(&r).is_empty(), "a healthy job never records history");
    let (r, _) = leak_run("plateau", 60, &[]);
    for h in hunts(&r) {
        assert!(h["sites"].as_array().unwrap().is_empty(), "{h:#}");
    }
    assert!(
        r["diagnoses"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["rule"] != "step-leak"),
        "{:#}",
        r["diagnoses"]
    );
}

#[test]
fn hunting_on_and_off() {
    // On: from warm-up on, also in a healthy job; it finds nothing there.
    let (r, _) = leak_run("healthy", 40, &["--hunt-leaks"]);
    let h = hunts(&r);
    assert_eq!(h.len(), 1);
    assert_eq!(h[0]["why"], "on");
    assert!(h[0]["sites"].as_array().unwrap().is_empty());
    // Off: never, even with a leak.
    let (r, _) = leak_run("list", 40, &["--hunt-leaks=off"]);
    assert!(hunts(&r).is_empty());
}

#[test]
fn an_oom_names_what_filled_the_gpu() {
    let (code, r, _, err) = leaks(&[], &[], "oom", 12);
    assert_eq!(code, 1);
    assert!(!err.contains("touched"), "{err}");
    let oom = hunts(&r)
        .into_iter()
        .find(|h| h["why"] == "oom")
        .unwrap_or_else(|| panic!("{r:#}"));
    // The largest holders first: the weights, then the list the loop filled.
    let texts: Vec<&str> = oom["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        texts[..3],
        [
            "global `weights` (leaks.py, module globals)",
            "a `Sneaky` object",
            "list `kept` (leaks.py, module globals), 12 items"
        ]
    );
    assert_eq!(oom["holders"][2]["bytes"], (12 * 16) << 20);
    let d = &r["diagnoses"][0];
    assert!(d["rule"].as_str().unwrap().starts_with("oom-"), "{d:#}");
    assert_eq!(
        d["details"][2],
        "held by list `kept` (leaks.py, module globals), 12 items — at the OOM: 12 of its tensors hold 192.00 MiB",
        "{d:#}"
    );
}

#[test]
fn a_program_that_records_history_itself_is_left_alone() {
    let (_, r, out, _) = leaks(&[], &[], "own_history", 40);
    assert_eq!(out, "history on\n");
    assert!(hunts(&r).is_empty());
}

#[test]
fn a_hunt_that_cannot_run_says_why_and_the_program_goes_on() {
    for (var, value, why) in [
        (
            "FAKE_TORCH_BREAK_HISTORY",
            "1",
            "memory history broken on purpose",
        ),
        (
            "FAKE_TORCH_VERSION",
            "2.0.1",
            "torch 2.0.1 has no memory history with Python stacks",
        ),
    ] {
        // 90 steps: the leak stays well over the rule's thresholds on a loaded machine too.
        let (code, r, _, err) = leaks(&[(var, value)], &[], "list", 90);
        assert_eq!(code, 0, "{err}");
        let h = hunts(&r);
        assert_eq!(h.len(), 1, "{var}");
        assert!(h[0]["error"].as_str().unwrap().contains(why), "{:#}", h[0]);
        let leak = common::diagnosis(&r, "step-leak")
            .unwrap_or_else(|| panic!("no step-leak: {:#}", r["torch"]["processes"][0]));
        assert!(
            leak["details"][0]
                .as_str()
                .unwrap()
                .starts_with("the leak hunt could not run:"),
            "{leak:#}"
        );
        // The numbers of the framework view go on after the failed hunt.
        assert_eq!(r["torch"]["processes"][0]["steps_total"], 90);
    }
}

/// The Pythons of this machine the fake torch runs on, of those a leak hunt must never pin memory on.
fn pythons() -> Vec<std::path::PathBuf> {
    ["3.8", "3.10", "3.11", "3.12", "3.13"]
        .iter()
        .filter_map(|v| {
            let dir = std::fs::read_dir("/root/.pyenv/versions").ok()?;
            dir.filter_map(|e| e.ok())
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&format!("{v}."))
                })
                .map(|p| p.join("bin/python"))
        })
        .collect()
}

#[test]
fn a_leak_held_by_a_running_functions_local_is_named_and_never_kept_alive() {
    let pythons = pythons();
    assert!(
        !pythons.is_empty(),
        "no Python 3.8-3.13 under /root/.pyenv/versions"
    );
    let script = fake_torch().join("locals.py");
    let cases = [
        (
            "graph",
            "the autograd graph of `total` (locals.py, in graph)",
        ),
        ("list", "list `kept` (locals.py, in kept_list)"),
        ("generator", "list `buf` (locals.py, in batches)"),
    ];
    std::thread::scope(|s| {
        // Bare, every case drops all it made (the fake torch's own count, checked on one Python).
        for (case, _) in cases {
            let script = &script;
            s.spawn(move || {
                let bare = std::process::Command::new("python3")
                    .env("PYTHONPATH", fake_torch())
                    .args([script.to_str().unwrap(), case])
                    .output()
                    .unwrap();
                assert_eq!(String::from_utf8_lossy(&bare.stdout), "0\n", "bare {case}");
            });
        }
        for python in &pythons {
            let script = &script;
            s.spawn(move || {
                for (case, holder) in cases {
                    let m = Machine::h200s(1);
                    let (code, r, out, err) = m.python_with(
                        python.to_str().unwrap(),
                        &[],
                        &["--hunt-leaks"],
                        &[script.to_str().unwrap(), case],
                    );
                    let what = format!("{} {case}", python.display());
                    assert_eq!(code, 0, "{what}: {err}");
                    // Dropped in the function, freed at once: what is left is what is left bare.
                    assert_eq!(out, "0\n", "{what}: {err}");
                    let h = hunts(&r);
                    let text = h[0]["holders"][0]["text"].as_str().unwrap_or("");
                    assert!(text.starts_with(holder), "{what}: {h:#?}");
                }
            });
        }
    });
}

#[test]
fn the_programs_own_memory_history_never_shows_gpudocs() {
    let script = fake_torch().join("history.py");
    for when in ["after", "during"] {
        let bare = std::process::Command::new("python3")
            .env("PYTHONPATH", fake_torch())
            .args([script.to_str().unwrap(), when])
            .output()
            .unwrap();
        let (code, r, out, err) =
            Machine::h200s(1).python(&[], &["--hunt-leaks"], &[script.to_str().unwrap(), when]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(out, String::from_utf8_lossy(&bare.stdout), "{when}: {err}");
        if when == "after" {
            // The window did run, before the program looked.
            assert_eq!(hunts(&r).len(), 1, "{r:#}");
        }
    }
}

#[test]
fn a_hunt_on_a_large_heap_pauses_no_step_long_and_collects_nothing_the_program_sees() {
    let script = fake_torch().join("big_heap.py");
    let args = [script.to_str().unwrap(), "400000", "150"];
    let bare = std::process::Command::new("python3")
        .env("PYTHONPATH", fake_torch())
        .args(args)
        .output()
        .unwrap();
    let bare: Value = serde_json::from_slice(&bare.stdout).unwrap();
    let (code, r, out, err) = Machine::h200s(1).python(&[], &["--hunt-leaks"], &args);
    assert_eq!(code, 0, "{err}");
    let under: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        under["gc_in_step"], bare["gc_in_step"],
        "{under} against {bare}"
    );
    // The search runs in slices of a few milliseconds; a walk of the whole heap in one step took
    // about a second here. The step's own work, in its thread's CPU time: a loaded machine's waits for
    // a core made the wall clock's longest step pass 150 ms with slices of 8 ms.
    let longest = under["longest_cpu_ms"].as_f64().unwrap();
    assert!(
        longest < 150.0,
        "longest step {longest} ms of CPU ({under}, bare {bare})"
    );
    assert_eq!(hunts(&r).len(), 1, "{r:#}");
}

#[test]
fn holders_behind_attributes_closures_and_caches_are_named() {
    let cases = [
        ("probe", "list attribute `acts` of a `Probe`"),
        ("closure", "list `seen`, a closure variable of `record`"),
        (
            "lru",
            "the lru_cache of `features` (leaks.py, module globals)",
        ),
    ];
    for (mode, holder) in cases {
        let (r, _) = hunted_run(mode, 40, 120);
        let h = hunts(&r);
        assert_eq!(h.len(), 1, "{mode}: {h:#?}");
        let text = h[0]["holders"][0]["text"].as_str().unwrap_or("");
        assert!(text.starts_with(holder), "{mode}: {h:#?}");
    }
}

#[test]
fn a_package_installed_into_a_folder_of_its_own_is_not_the_programs_code() {
    // `pip install --target DIR` (or a folder on PYTHONPATH that pip installed into): the leak's site is
    // the program's line that called the package, not the package's line, as for site-packages.
    let m = Machine::h200s(1);
    let (prog, lib) = (m.path("prog"), m.path("lib"));
    std::fs::create_dir_all(&prog).unwrap();
    std::fs::create_dir_all(lib.join("leak_helper-1.0.dist-info")).unwrap();
    std::fs::copy(fake_torch().join("leaks.py"), prog.join("leaks.py")).unwrap();
    std::fs::copy(
        fake_torch().join("leak_helper.py"),
        lib.join("leak_helper.py"),
    )
    .unwrap();
    let path = format!("{}:{}", lib.display(), fake_torch().display());
    let script = prog.join("leaks.py");
    let (code, r, _, err) = m.python(
        &[("PYTHONPATH", &path)],
        &[],
        &[
            script.to_str().unwrap(),
            "helper",
            "120",
            "--until-hunted",
            "40",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let h = hunts(&r);
    let site = &h[0]["sites"][0];
    assert!(
        site["file"].as_str().unwrap().ends_with("prog/leaks.py"),
        "{site:#}"
    );
    assert_eq!(site["code"], "leak_helper.remember(y)", "{site:#}");
}

#[test]
fn leaks_through_a_forward_hook_and_a_models_attribute_name_the_model_call_and_the_holder() {
    // The model's call allocates eight activations a step and the leak keeps one of them: a site that
    // keeps a small share of what it allocates, but keeps it step after step.
    let cases = [
        (
            "hook",
            "net(x).backward()",
            "list attribute `acts` of a `Probe`",
        ),
        (
            "module_attr",
            "out = self.body(x)",
            "list attribute `outputs` of a `Net`",
        ),
    ];
    for (mode, code, holder) in cases {
        let (r, err) = hunted_run(mode, 60, 120);
        let d = common::diagnosis(&r, "step-leak").unwrap_or_else(|| panic!("{mode}: {err}"));
        let details = d["details"].as_array().unwrap();
        let site = details[0].as_str().unwrap();
        assert!(
            site.contains(&format!("`{code}`: +16.00 MiB a step, ")),
            "{mode}: {details:#?}"
        );
        let held = details[1].as_str().unwrap();
        assert!(
            held.starts_with(&format!("kept alive by {holder}")),
            "{mode}: {details:#?}"
        );
    }
}
