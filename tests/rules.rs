//! The rule set: each bundled rule fires on its fixture (a real H200 run where one could be made) and a
//! healthy run fires none; rule files are checked at load; the human output is pinned by snapshots.

mod common;

use common::{Machine, fired, gpudoc_bin, report};
use std::path::Path;
use std::process::Command;

fn fixture(p: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(p)
        .to_string_lossy()
        .into_owned()
}

/// Every bundled rule, the real runs where it must fire, and the runs where it must not: near misses
/// (the same situation just under the rule's bar, or a look-alike with another cause) and healthy runs.
/// All recorded on H200s (fixtures/README.md), but the two rules no safe run can provoke
/// (fixtures/rules/: edited copies of a real report).
const RULE_CASES: &[(&str, &[&str], &[&str])] = &[
    (
        "allocator-thrash",
        &["runs/thrash"],
        &["oom/h200/grow_oom", "runs/healthy"],
    ),
    (
        "cache-bloat",
        &["runs/cache_bloat"],
        &["runs/cache_small", "runs/periodic_eval"],
    ),
    (
        "cell-leak",
        &["notebooks/fake_cell_leak", "notebooks/h200_run"],
        &["notebooks/fake_cell_rerun", "runs/healthy"],
    ),
    (
        "driver-too-old",
        &["rules/driver_too_old"],
        &["runs/healthy"],
    ),
    (
        "gpu-imbalance",
        &["multi/rank0_extra", "multi/stray"],
        &["multi/correct"],
    ),
    (
        "held-before-start",
        &["runs/others_before", "oom/h200/torch_other_process"],
        &["runs/healthy", "multi/correct"],
    ),
    // A rule of looks only (`gpudoc watch`) fires in tests/watch.rs; on runs it must stay quiet.
    (
        "held-by-others",
        &[],
        &["runs/others_before", "oom/h200/torch_other_process"],
    ),
    (
        "host-oom-kill",
        &["rules/host_oom_kill"],
        &["runs/signal_kill"],
    ),
    (
        "jax-preallocation",
        &["runs/jax_prealloc", "oom/h200/jax_too_big"],
        &["runs/jax_noprealloc"],
    ),
    ("leftover-holder", &[], &["runs/leftover", "runs/healthy"]),
    // A run's own forecasts are its own (told with step-leak or steady-growth), not a look's.
    ("forecast", &[], &["leaks/list", "runs/healthy"]),
    (
        "leftover-processes",
        &["runs/leftover"],
        &["runs/leftover_miss"],
    ),
    (
        "near-capacity",
        &["runs/near_capacity"],
        &["runs/near_capacity_miss"],
    ),
    (
        "oom-cap",
        &["oom/h200/fraction_cap"],
        &["oom/h200/grow_oom"],
    ),
    (
        "oom-fragmentation",
        &["oom/h200/torch_fragmentation"],
        &["oom/h200/grow_oom", "oom/h200/child_hog"],
    ),
    (
        "oom-self-growth",
        // Its variants, by the phase the shim saw (`oom_self_growth_is_told_by_the_phase`).
        &[
            "where/oom",
            "phases/h100/bw_oom",
            "phases/h100/fwd_oom",
            "phases/h100/eval_oom",
            "phases/h100/load_oom",
            "oom/h200/grow_oom",
            "oom/h200/child_hog",
            "oom/h200/torch_cublas",
            "phases/eval_oom",
            "phases/h100/val_keep",
            "phases/vllm_standin_oom",
        ],
        &[
            "oom/h200/fraction_cap",
            "oom/h200/torch_other_process",
            "oom/h200/torch_too_big",
        ],
    ),
    (
        "oom-others",
        &["oom/h200/torch_other_process", "oom/h200/torch_context"],
        &["oom/h200/child_hog"],
    ),
    (
        "oom-too-big",
        &[
            "oom/h200/torch_too_big",
            "oom/h200/jax_too_big",
            "multi/oom",
        ],
        &["oom/h200/torch_fragmentation"],
    ),
    (
        "others-arrived",
        &["others/fake_arrived"],
        &[
            "others/fake_blip",
            "runs/others_before",
            "oom/h200/torch_other_process",
            "runs/jax_prealloc",
            "runs/healthy",
        ],
    ),
    (
        "phase-peak",
        &["runs/periodic_eval", "runs/spike"],
        &[
            "runs/eval_small",
            "runs/spike_small",
            "leaks/graph",
            "oom/h200/grow_oom",
        ],
    ),
    (
        "server-preallocation",
        &["phases/vllm_standin_oom"],
        &[
            "phases/load_serve",
            "runs/jax_prealloc",
            "runs/near_capacity",
            "runs/healthy",
        ],
    ),
    (
        "steady-growth",
        &[
            "phases/infer_leak",
            "phases/infer_leak_noshim",
            "phases/eval_keep",
            "phases/model_leak",
        ],
        &[
            "phases/infer_healthy",
            "phases/eval_healthy",
            "phases/load_serve",
            "phases/up_and_back",
            "phases/compiled_step",
            "leaks/plateau",
            "runs/healthy",
            "runs/jax_prealloc",
            "runs/cache_bloat",
            "runs/spike_noshim",
            "runs/near_capacity",
            "oom/h200/grow_oom",
        ],
    ),
    (
        "step-leak",
        &[
            "leaks/list",
            "leaks/dict",
            "leaks/graph",
            "leaks/helper",
            "runs/leak",
            "traces/torch_steps_leak",
            "phases/hook_leak",
            "phases/local_leak",
        ],
        &["leaks/plateau", "leaks/healthy"],
    ),
    (
        "stray-context",
        &["multi/stray"],
        &["multi/correct", "multi/rank0_extra"],
    ),
    (
        "transient-spike",
        &["runs/spike_noshim"],
        &["runs/spike_small", "runs/spike"],
    ),
    (
        "worker-contexts",
        &["phases/workers_cuda"],
        &[
            "phases/workers_cpu",
            "oom/h200/child_hog",
            "multi/correct",
            "runs/leftover",
        ],
    ),
];

#[test]
fn each_rule_fires_on_its_runs_and_not_on_its_near_misses() {
    let set = gpudoc::rules::RuleSet::load(None, &[]).unwrap();
    for rule in &set.rules {
        let case = RULE_CASES.iter().find(|c| c.0 == rule.id);
        let (_, fires, misses) = case.unwrap_or_else(|| panic!("{}: no fixtures", rule.id));
        let look_only = rule.look && rule.when.starts_with("run.look &&");
        assert!(
            (look_only || !fires.is_empty()) && !misses.is_empty(),
            "{}",
            rule.id
        );
    }
    for (rule, fires, misses) in RULE_CASES {
        for (runs, want) in [(fires, true), (misses, false)] {
            for run in runs.iter() {
                // The trace replays to the same diagnoses as the report (where there is one).
                let mut files = vec![format!("{run}.report.json")];
                if Path::new(&fixture(&format!("{run}.trace.jsonl"))).exists() {
                    files.push(format!("{run}.trace.jsonl"));
                }
                for file in files {
                    let got = fired(&common::replayed(fixture(&file)));
                    assert_eq!(
                        got.iter().any(|r| r == rule),
                        want,
                        "{rule} on {file}: {got:?}"
                    );
                }
            }
        }
    }
}

/// The job's own growth at an OOM is one rule whose variant is an inference server's (`run.server`), else
/// the phase the shim saw (`oom.phase`, a fact its diagnosis records): each real run gets its variant's
/// wording, and no run gets another's.
#[test]
fn oom_self_growth_is_told_by_the_phase() {
    let cases: &[(&str, Option<&str>, &str)] = &[
        (
            "where/oom",
            Some("training_step"),
            "the job ran out of memory in a training step, ",
        ),
        (
            "phases/h100/bw_oom",
            Some("training_step"),
            "the job ran out of memory in a training step, in its backward",
        ),
        (
            "phases/h100/fwd_oom",
            Some("training_step"),
            "the job ran out of memory in a training step, in its forward",
        ),
        (
            "phases/h100/eval_oom",
            Some("evaluation"),
            "the job ran out of memory in an evaluation",
        ),
        (
            "phases/h100/load_oom",
            Some("loading"),
            "the job ran out of memory while loading, before its first forward call",
        ),
        // torch_cublas: an OOM in cuBLAS with no look of the shim's at it: no phase is known, none said.
        (
            "oom/h200/torch_cublas",
            None,
            "the job ran out of memory after filling",
        ),
        ("oom/h200/grow_oom", None, "the job ran out of memory"),
        ("phases/eval_oom", None, "the job ran out of memory"),
        // A validation inside training, under grad and without eval(): forward calls no backward followed.
        (
            "phases/h100/val_keep",
            Some("evaluation"),
            "the job ran out of memory in an evaluation after step 50: 2 forward calls under grad",
        ),
        // An inference server is a variant of its own, whatever the phase: its share, not a batch size.
        (
            "phases/vllm_standin_oom",
            None,
            "vLLM ran out of memory, having filled 89.6% of the GPU itself (the job itself held 125.81 GiB when it asked for 15.98 GiB more). Its share for weights and KV cache",
        ),
    ];
    for (run, phase, says) in cases {
        let r = common::replayed(fixture(&format!("{run}.report.json")));
        let d = common::diagnosis(&r, "oom-self-growth").unwrap_or_else(|| panic!("{run}"));
        // Null where the shim's evidence did not decide, never "".
        assert_eq!(d["facts"]["oom.phase"].as_str(), *phase, "{run}");
        let message = d["message"].as_str().unwrap();
        assert!(message.contains(says), "{run}: {message}");
        for other in [
            "in a training step",
            "in an evaluation",
            "while loading",
            "without training",
            "Its share for weights and KV cache",
        ] {
            assert!(
                says.contains(other) || !message.contains(other),
                "{run}: {message}"
            );
        }
    }
}

#[test]
fn healthy_runs_stay_quiet() {
    for run in [
        "runs/healthy",
        "multi/correct",
        "leaks/healthy",
        "leaks/healthy_on",
        "leaks/plateau",
        "traces/alloc_known",
        "traces/torch_steps_plain",
        "traces/context_shim",
        "traces/context_noshim",
    ] {
        let r = common::replayed(fixture(&format!("{run}.report.json")));
        assert_eq!(fired(&r), Vec::<String>::new(), "{run}");
    }
}

#[test]
fn the_two_gpu_runs_name_ranks_gpus_and_numbers() {
    let r = report(fixture("multi/stray.report.json"), &[]);
    let stray = common::diagnosis(&r, "stray-context").unwrap().clone();
    let pid = stray["subject"]
        .as_str()
        .unwrap()
        .trim_start_matches("pid ")
        .to_string();
    assert_eq!(
        stray["message"],
        format!(
            "pid {pid} (rank 1) works on GPU 1 (2.72 GiB) but also holds 2.79 GiB on GPU 0: a stray CUDA context, the classic pile-up on GPU 0."
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
    let oom = common::diagnosis(&r, "oom-others").unwrap();
    assert_eq!(
        oom["message"],
        "GPU 0: the job asked for 38.78 GiB with 28.77 GiB free while processes outside the job held 100.51 GiB: pid 2501 (python3 tests/gpu/hold.py 100) 100.51 GiB."
    );
    assert_eq!(r["diagnoses"][0]["severity"], "error", "most severe first");
    // The held-out OOMs of issue 13, each with its own culprit and no number made up.
    let message = |run: &str, rule: &str| -> String {
        let r = common::replayed(fixture(&format!("oom/h200/{run}.report.json")));
        let d = common::diagnosis(&r, rule);
        d.unwrap_or_else(|| panic!("{run}: no {rule}"))["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let context = message("torch_context", "oom-others");
    assert!(context.starts_with("GPU 0: the job could not get the memory it asked for while processes outside the job held 139.59 GiB"), "{context}");
    assert!(!context.contains(" 0 B"), "{context}");
    let cap = message("fraction_cap", "oom-cap");
    assert!(cap.starts_with("GPU 0: the job ran out at the cap it was given, not at the GPU's capacity: the process may use only 34.95 GiB of the GPU (torch.cuda.set_per_process_memory_fraction) and already held 34.58 GiB"), "{cap}");
    let child = message("child_hog", "oom-self-growth");
    assert!(
        child.contains("its other processes 110.51 GiB") && !child.contains("outside"),
        "{child}"
    );
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
    let stray = common::diagnosis(&r, "stray-context").unwrap();
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
    // A user's copy of a rule sets its parameters.
    .replace("min_used_pct = 95.0", "min_used_pct = 0.5");
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
fn advice_with_a_condition_is_given_only_where_it_holds_and_checked_at_load() {
    let rule = |when: &str| {
        format!(
            "id = \"long-run\"\nseverity = \"info\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"run.duration_s > 5.0\"\nmessage = \"m\"\nadvice = [\n  \"always\",\n  {{ when = \"{when}\", text = \"only then\" }},\n]\n"
        )
    };
    let advice = |when: &str| {
        let d = rules_dir(&[("long.toml", &rule(when))]);
        let r = report(
            fixture("runs/healthy.report.json"),
            &["--rules", d.path().to_str().unwrap()],
        );
        common::diagnosis(&r, "long-run").unwrap()["advice"].clone()
    };
    assert_eq!(
        advice("run.duration_s > 5.0"),
        serde_json::json!(["always", "only then"])
    );
    assert_eq!(
        advice("run.duration_s < 5.0"),
        serde_json::json!(["always"])
    );
    // A condition on a fact that does not exist fails at load, with the file and the line.
    let d = rules_dir(&[("long.toml", &rule("run.durations > 1.0"))]);
    let out = Command::new(gpudoc_bin())
        .args(["rules", "list", "--rules", d.path().to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("long.toml:7: advice: unknown fact `run.durations`"),
        "{err}"
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
        text.contains("the steady level of reserved memory over the steps after warm-up"),
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
        String::from_utf8_lossy(&out.stderr)
            .contains("t.jsonl:4: not a trace row: missing field `gpu`"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A crash that cut the last row short, mid-line: the trace reads as without it.
    let rows: Vec<&str> = good.lines().collect();
    let head = rows[..rows.len() - 1].join("\n") + "\n";
    let last = rows[rows.len() - 1];
    let report_of = |text: &str| {
        std::fs::write(&t, text).unwrap();
        report(&t, &[])
    };
    assert_eq!(
        report_of(&format!("{head}{}", &last[..last.len() / 2])),
        report_of(&head)
    );
}

#[test]
fn human_output_snapshots() {
    for (name, file) in [
        ("cache_bloat", "runs/cache_bloat.report.json"),
        (
            "oom_fragmentation",
            "oom/h200/torch_fragmentation.trace.jsonl",
        ),
        ("oom_grow", "oom/h200/grow_oom.report.json"),
        ("leak_list", "leaks/list.report.json"),
        ("periodic_eval", "runs/periodic_eval.report.json"),
        ("healthy", "runs/healthy.report.json"),
    ] {
        let out = Command::new(gpudoc_bin())
            .arg("report")
            .arg(fixture(file))
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

/// One story, one teller (issue 43): a rule that explains an OOM owns what the GPU's memory did up to it.
#[test]
fn a_full_gpu_that_another_process_filled_is_the_oom_others_story_not_a_near_capacity_warning() {
    // The H200 run whose context could not be made beside another user's 139.59 GiB: the job held
    // 104 MiB. "Memory in use peaked at 99.5% (the job: 104.00 MiB)" only restated oom-others.
    let r = report(fixture("oom/h200/torch_context.trace.jsonl"), &[]);
    assert_eq!(
        fired(&r),
        ["held-before-start", "oom-others"],
        "{:#}",
        r["diagnoses"]
    );
    let d = common::diagnosis(&r, "oom-others").unwrap();
    assert_eq!(d["parts"][0]["rule"], "near-capacity", "{d:#}");
    assert!(
        d["parts"][0]["message"]
            .as_str()
            .unwrap()
            .contains("(the job: 104.00 MiB)"),
        "{d:#}"
    );
}

#[test]
fn a_spike_that_was_the_ooms_own_child_filling_the_gpu_is_no_transient_spike() {
    // The job holds 4 GiB; a child of it fills the GPU, prints its OOM and dies; the job goes on at
    // 4 GiB. The "spike" came down because the OOM ended the child: the OOM's story, told once.
    let m = Machine::h200s(1);
    let text = fixture("oom/h200/grow_oom.stderr");
    let script = format!(
        r#""$FAKEGPU" alloc --steps 4GiB --hold-ms 5000 --say held & P=$!
        sleep 1.2; sh -c '"$FAKEGPU" alloc --steps 135GiB --hold-ms 700 & sleep 0.4; cat {text} >&2; wait'
        wait $P; exit 1"#
    );
    let (code, r, err) = m.run_sh(&[], &script);
    assert_eq!(code, 1, "{err}");
    assert_eq!(r["exit"]["classification"], "gpu_oom", "{err}");
    let all = fired(&r);
    assert!(
        !all.contains(&"transient-spike".to_string()),
        "{all:?}: {err}"
    );
    assert!(
        !all.contains(&"near-capacity".to_string()),
        "{all:?}: {err}"
    );
    let teller = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"].as_str().unwrap().starts_with("oom-"))
        .unwrap_or_else(|| panic!("no OOM diagnosis: {all:?}"));
    let parts: Vec<&str> = teller["parts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["rule"].as_str().unwrap())
        .collect();
    assert_eq!(parts, ["near-capacity", "transient-spike"], "{teller:#}");
}

/// What tests/gpu/`script` says of the programs recorded in fixtures/judgement/`folder`, their reports
/// diagnosed again by today's rules (with the programs' own stdout, which some expectations read).
fn judged(folder: &str, script: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root.join("fixtures/judgement").join(folder)).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.ends_with(".report.json") {
            let r = common::replayed(&path);
            std::fs::write(dir.path().join(&name), r.to_string()).unwrap();
        } else if name.ends_with(".stdout") {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    let out = Command::new("python3")
        .arg(root.join("tests/gpu").join(script))
        .arg("check")
        .arg(dir.path())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Ten programs gpudoc had never seen, run on an H100 (fixtures/judgement/h100, tests/gpu/judgement.sh):
/// each is told as an expert would tell it, and given no remedy that does not apply (a backward per
/// micro-batch, not inference_mode, for a gradient accumulation; no batch size for Adam's first step; no
/// no_grad for a generation already under it; no leak for a slow load or a cache after an evaluation).
/// The expectations are judgement.py's own (`EXPECT`), checked against the reports diagnosed again by
/// today's rules.
#[test]
fn programs_gpudoc_never_saw_are_told_as_an_expert_would() {
    let said = judged("h100", "judgement.py");
    assert!(said.contains("judgement: 70 ok, 0 BAD"), "{said}");
}

/// Nine more (fixtures/judgement/round2, tests/gpu/judgement2.sh; compiled_step recorded again on an H200
/// after its phase was mended), checked the same way. What is still told wrong is listed here, each miss by
/// name, so that a regression elsewhere fails and a mend updates the list: a compiled model's forward
/// temporaries are not counted as activations (inductor's buffers carry no graph while its forward runs);
/// a checkpoint snapshot whose cache stays reserved is no phase of the step records' reserved peaks; and
/// the recording's own harness left the evaluator of detached_eval holding 2.97 GiB when
/// empty_cache_loop started (held-before-start was right; judgement2.sh now waits for it to go).
#[test]
fn nine_more_programs_are_told_as_an_expert_would_but_three_known_misses() {
    let said = judged("round2", "judgement2.py");
    let bad: Vec<&str> = said
        .lines()
        .filter(|l| l.starts_with("BAD"))
        .map(|l| l.split(" (").next().unwrap())
        .collect();
    assert_eq!(
        bad,
        [
            "BAD compiled_step: oom.largest_part is activations",
            "BAD empty_cache_loop: no other warn/error diagnosis",
            "BAD ckpt_snapshot: phase-peak fires",
            "BAD ckpt_snapshot: its advice says /checkpoints? from the CPU/",
        ],
        "{said}"
    );
    assert!(said.contains("judgement: 84 ok, 4 BAD"), "{said}");
}

/// The slow load of the first ten programs (25 s of shards, then inference), replayed look by look as `gpudoc run`
/// judged it live: no look tells its climb as a steady growth, so `--stop-on steady-growth` never ends it.
#[test]
fn a_slow_load_is_never_told_steady_growth_live() {
    let trace = fixture("judgement/h100/slow_load.trace.jsonl");
    let rules = gpudoc::rules::RuleSet::load(None, &[]).unwrap();
    let live = gpudoc::live::replay::verdicts(Path::new(&trace), &rules).unwrap();
    let told: Vec<&str> = live.told().map(|t| t.diagnosis.rule.as_str()).collect();
    assert!(!told.contains(&"steady-growth"), "{told:?}");
    assert!(fired(&common::replayed(&trace)).is_empty());
}
