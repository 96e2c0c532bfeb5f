//! Beyond the training step, under the fake NVML and the fake torch: growth with no optimizer step, an OOM
//! placed among the program's phases, worker processes with CUDA contexts of their own, and inference
//! servers that preallocate on purpose (issue 28). Real H200 recordings: tests/gpu/record_phases.sh.

mod common;

use common::{Machine, diagnosis, fake_torch, fired};
use serde_json::Value;

fn program(name: &str) -> String {
    fake_torch().join(name).to_string_lossy().into_owned()
}

/// `gpudoc run -- python3 fixtures/fake_torch/phases.py WHAT`: exit code, report, stderr.
fn phases(what: &str) -> (i32, Value, String) {
    let m = Machine::h200s(1);
    let (code, r, _, err) = m.python(&[], &[], &[&program("phases.py"), what]);
    (code, r, err)
}

/// A fact a diagnosis read, as a number.
fn fact(r: &Value, rule: &str, name: &str) -> f64 {
    diagnosis(r, rule).unwrap()["facts"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("{rule} did not read {name}"))
}

const GIB: f64 = (1u64 << 30) as f64;

fn message(r: &Value, rule: &str) -> String {
    let d = diagnosis(r, rule).unwrap_or_else(|| panic!("no {rule}: {:?}", fired(r)));
    d["message"].as_str().unwrap().to_string()
}

/// tests/gpu/phases.py infer_leak on an H200, replayed: the growth is the analysis's, read from the
/// recording's samples (a live fake run of it read a loaded machine's stalls as the load's end).
#[test]
fn an_inference_loop_that_keeps_its_outputs_grows_with_no_step() {
    let r = common::report(fake_torch().join("../phases/infer_leak.trace.jsonl"), &[]);
    assert_eq!(fired(&r), ["steady-growth"]);
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with("GPU 0: with no optimizer step in the run, the job's memory grew by "),
        "{msg}"
    );
    // A recurrent state kept from chunk to chunk: 14.75 GiB over 10 s.
    assert!(
        fact(&r, "steady-growth", "gpu.growth_bytes") >= 14.0 * GIB,
        "{msg}"
    );
    assert!(
        msg.contains("/s, a straight line with R² 1.0) and never came back")
            && msg.contains("PyTorch still held 33.00 MiB of live tensors")
            && msg.contains("At that rate the GPU would be full"),
        "{msg}"
    );
}

/// tests/gpu/phases.py infer_healthy and eval_healthy on an H200, replayed: staying quiet is the analysis's,
/// read from the recordings' samples, which a loaded machine running the test does not change.
#[test]
fn a_healthy_inference_loop_and_evaluation_stay_quiet() {
    for what in ["infer_healthy", "eval_healthy"] {
        let r = common::replayed(fake_torch().join(format!("../phases/{what}.trace.jsonl")));
        assert_eq!(r["exit"]["code"], 0, "{what}");
        assert_eq!(fired(&r), Vec::<String>::new(), "{what}");
    }
}

/// tests/gpu/phases.py eval_keep on an H200 (50 training steps, then evaluation calls keeping their
/// outputs), replayed: the growth and its start after the last step are the analysis's.
#[test]
fn an_evaluation_that_keeps_its_outputs_after_training_grows_after_the_last_step() {
    let r = common::replayed(fake_torch().join("../phases/eval_keep.trace.jsonl"));
    assert_eq!(fired(&r), ["steady-growth"]);
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with(
            "GPU 0: after the last optimizer step (step 50), the job's memory grew by "
        ),
        "{msg}"
    );
    // 11.50 GiB in 5.36 s.
    assert!(
        fact(&r, "steady-growth", "gpu.growth_bytes") >= 11.0 * GIB,
        "{msg}"
    );
}

#[test]
fn an_oom_in_an_evaluation_under_no_grad_gets_evaluation_advice_but_not_no_grad() {
    let (code, r, err) = phases("eval_oom");
    assert_eq!(code, 1, "{err}");
    assert_eq!(r["oom"]["cause"], "self_growth", "{err}");
    // The GPU it filled is the OOM's story: near-capacity is kept in its diagnosis, not said again.
    assert_eq!(fired(&r), ["oom-self-growth"], "{err}");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert_eq!(d["parts"][0]["rule"], "near-capacity", "{d}");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.contains("ran out of memory in an evaluation after step 20: forward calls that were no training step's"),
        "{msg}"
    );
    // It evaluated under no_grad already (oom.grad false): inference_mode is no remedy, what it kept is.
    let advice: Vec<&str> = d["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(advice[0].contains("off the GPU"), "{d}");
    assert!(advice.iter().all(|a| !a.contains("inference_mode")), "{d}");
    assert_eq!(d["facts"]["oom.phase"], "evaluation", "{d}");
    assert!(err.contains("Out of memory in an evaluation"), "{err}");
}

/// The same evaluation recorded on an idle machine (fixtures/phases/fake_eval_oom:
/// tests/programs/phases_fake.sh), replayed: how its memory grew before the OOM is read from samples (a
/// loaded machine's stalls left the live fake run's growth untold).
#[test]
fn an_oom_in_evaluation_after_training_says_how_its_memory_grew() {
    let r = common::replayed(fake_torch().join("../phases/fake_eval_oom.trace.jsonl"));
    assert_eq!(fired(&r), ["oom-self-growth"]);
    let msg = message(&r, "oom-self-growth");
    assert!(
        msg.contains("ran out of memory in an evaluation after step 20: forward calls that were no training step's")
            && msg.contains(": its memory grew by 132.00 GiB in ")
            && msg.contains(" without ever coming back, so something kept what each batch made"),
        "{msg}"
    );
    assert!(
        fact(&r, "oom-self-growth", "oom.growth_bytes") >= 64.0 * GIB,
        "{msg}"
    );
}

#[test]
fn an_oom_while_loading_gets_loading_advice() {
    let (code, r, err) = phases("load_oom");
    assert_eq!(code, 1, "{err}");
    assert_eq!(fired(&r), ["oom-self-growth"], "{err}");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("ran out of memory while loading, before its first forward call, "),
        "{d}"
    );
    assert!(
        d["advice"][0]
            .as_str()
            .unwrap()
            .contains("map_location='cpu'"),
        "{d}"
    );
}

#[test]
fn workers_that_touch_cuda_are_named_with_their_contexts() {
    let m = Machine::h200s(1);
    let (code, r, _, err) = m.python(&[], &[], &[&program("workers.py"), "cuda", "4"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(fired(&r), ["worker-contexts"], "{err}");
    let msg = message(&r, "worker-contexts");
    assert!(
        msg.starts_with("4 process(es) started by the job's own GPU process held a CUDA context of their own, 2.04 GiB in all: pid "),
        "{msg}"
    );
    assert_eq!(msg.matches("522.00 MiB on GPU 0").count(), 4, "{msg}");
    let main = r["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["peak_bytes"].as_u64().unwrap() > 10 << 30)
        .unwrap();
    for p in r["processes"].as_array().unwrap() {
        if p["pid"] != main["pid"] {
            assert_eq!(p["ppid"], main["pid"], "{p}");
        }
    }
}

#[test]
fn workers_without_cuda_ranks_and_a_childs_own_work_are_no_helpers() {
    let m = Machine::h200s(1);
    let (code, r, _, err) = m.python(&[], &[], &[&program("workers.py"), "cpu", "4"]);
    assert_eq!((code, fired(&r)), (0, vec![]), "{err}");
    // torchrun: the launcher holds nothing; its ranks hold little (a small model).
    let (_, r, err) = m.run_sh(
        &[],
        r#"for i in 0 1; do "$FAKEGPU" alloc --gpu $i --steps 600MiB --hold-ms 500 & done; wait"#,
    );
    assert_eq!(fired(&r), Vec::<String>::new(), "{err}");
    // A child that is a rank of its own (RANK=1 under a process that holds the model).
    let script = r#"python3 -c 'import torch, subprocess, sys, os
torch.cuda.init(); torch.cuda._alloc(10 << 30)
child = "import torch, time; torch.cuda.init(); torch.cuda._alloc(1 << 20); time.sleep(0.5)"
subprocess.run([sys.executable, "-c", child], env=dict(os.environ, RANK="1"))'"#;
    let json = m.path("rank.json");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fake_torch())
        .args([
            "run",
            "--json",
            json.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .unwrap();
    let r = common::read_json(&json);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(r["processes"].as_array().unwrap().len() >= 2, "{err}");
    assert_eq!(fired(&r), Vec::<String>::new(), "{err}");
}

#[test]
fn an_inference_server_that_preallocates_is_recognised_and_not_a_problem() {
    let m = Machine::h200s(1);
    let server = ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"];
    let (code, r, _, err) = m.python(
        &[],
        &[],
        &[&server[..], &["--gpu-memory-utilization", "0.97"]].concat(),
    );
    assert_eq!(code, 0, "{err}");
    // 97% of the GPU: near-capacity would fire for any other job.
    assert!(r["gpus"][0]["peak_used_bytes"].as_u64().unwrap() > 135 << 30);
    assert_eq!(fired(&r), ["server-preallocation"], "{err}");
    let msg = message(&r, "server-preallocation");
    assert!(
        msg.starts_with("The job runs vLLM, which takes a fixed share of the GPU at start on purpose (--gpu-memory-utilization 0.97)"),
        "{msg}"
    );
    assert_eq!(
        diagnosis(&r, "server-preallocation").unwrap()["severity"],
        "info"
    );
    // Without the flag: its default, said as the default.
    let (_, r, _, _) = m.python(&[], &[], &server);
    let msg = message(&r, "server-preallocation");
    assert!(
        msg.contains("(its default: --gpu-memory-utilization 0.9)"),
        "{msg}"
    );
}

#[test]
fn an_inference_server_running_out_is_told_the_servers_settings_not_training_advice() {
    // PyTorch's own OOM text, raised in vLLM while it serves: batch size, gradient checkpointing and
    // optimizer state mean nothing to a server; its concurrency, context and share do.
    let m = Machine::h200s(1);
    let server = ["-m", "vllm.entrypoints.openai.api_server", "--model", "m"];
    let (code, r, _, err) = m.python(&[], &[], &[&server[..], &["--fake-overload"]].concat());
    assert_ne!(code, 0, "{err}");
    assert_eq!(r["exit"]["classification"], "gpu_oom", "{err}");
    let rule = r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"].as_str().unwrap().starts_with("oom-"))
        .unwrap_or_else(|| panic!("no OOM diagnosis: {err}"));
    let advice = rule["advice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        advice.contains("--max-num-seqs") && advice.contains("--max-model-len"),
        "{}: {advice}",
        rule["rule"]
    );
    for training in ["gradient", "optimizer", "Train in mixed precision"] {
        assert!(!advice.contains(training), "{}: {advice}", rule["rule"]);
    }
}

/// A diagnosis's detail lines.
fn details(r: &Value, rule: &str) -> Vec<String> {
    let d = diagnosis(r, rule).unwrap_or_else(|| panic!("no {rule}: {:?}", fired(r)));
    d["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_string())
        .collect()
}

/// The line of `code` in the fake torch's phases.py.
fn line_of(code: &str) -> usize {
    let script = std::fs::read_to_string(fake_torch().join("phases.py")).unwrap();
    1 + script.lines().position(|l| l.trim() == code).unwrap()
}

/// `phases.py model_leak`, a model_loop keeping its outputs: its leak hunted at the model's forward calls
/// (no optimizer step in the program), its line `y = net(x)` and holder `outs` found, and the graphs behind
/// the outputs counted apart. This is the shim's part, read from the hunt's record; that steady-growth
/// tells it, and in what words, is the analysis's, asserted on the H200's recording below (a loaded
/// machine's stalls put the fake's growth off its straight line).
#[test]
fn a_model_run_without_steps_that_keeps_its_outputs_gets_its_line_and_holder() {
    let (code, r, err) = phases("model_leak");
    assert_eq!(code, 0, "{err}");
    let hunts = r["torch"]["processes"][0]["hunts"].as_array().unwrap();
    assert_eq!(hunts.len(), 1, "{hunts:#?}");
    let hunt = &hunts[0];
    assert_eq!(hunt["clock"], "forwards", "{hunt:#}");
    let site = &hunt["sites"][0];
    assert!(
        site["file"]
            .as_str()
            .unwrap()
            .ends_with("fake_torch/phases.py"),
        "{site:#}"
    );
    assert_eq!(
        (&site["line"], &site["function"], &site["code"]),
        (
            &Value::from(line_of("y = net(x)")),
            &Value::from("model_loop"),
            &Value::from("y = net(x)")
        ),
        "{site:#}"
    );
    // 768 MiB a forward call: the output and its graph.
    assert_eq!(site["bytes_per_step"], 768 << 20, "{site:#}");
    let (list, graphs) = (&hunt["holders"][0], &hunt["holders"][1]);
    assert!(
        list["text"]
            .as_str()
            .unwrap()
            .starts_with("list `outs` (phases.py, in model_loop)"),
        "{hunt:#}"
    );
    assert_eq!(graphs["kind"], "graphs", "{hunt:#}");
    assert!(
        graphs["text"]
            .as_str()
            .unwrap()
            .contains(" tensors with grad_fn in list `outs` (phases.py, in model_loop)"),
        "{hunt:#}"
    );
    // Each output keeps 256 MiB itself and 512 MiB in its graph: the graphs, counted apart, hold more than
    // the list. Not twice as much to the byte: the list counts the tensors allocated while the window was
    // read, which on a loaded machine ran past its last call (22 of them, 24, for 20 calls) while their
    // graphs were counted for fewer (19, 18: 9 GiB behind 6, a ratio of 1.5 that failed a bound of 1.5).
    // The split to the byte is the H200 recording's, below.
    let (held, behind) = (
        list["bytes"].as_f64().unwrap(),
        graphs["bytes"].as_f64().unwrap(),
    );
    assert!(behind > held, "{behind} behind {held}");
}

/// tests/gpu/phases.py model_leak on an H200, replayed: each output (32 MiB) keeps 256 MiB in its graph;
/// the hunt counts the list's tensors and the graphs behind them apart, to the byte.
#[test]
fn the_h200s_model_run_without_steps_splits_its_outputs_from_the_graphs_behind_them() {
    let r = common::replayed(fake_torch().join("../phases/model_leak.trace.jsonl"));
    assert_eq!(fired(&r), ["steady-growth"]);
    let lines = details(&r, "steady-growth");
    assert!(
        lines[1].ends_with(
            "at forward call 34: 20 of its tensors, allocated in forward calls 14-34, hold 640.00 MiB"
        ),
        "{lines:#?}"
    );
    assert!(
        lines[2].starts_with("kept alive by the autograd graphs behind the 20 tensors with grad_fn in list `outs` (phases.py, in evaluation)")
            && lines[2].ends_with("at forward call 34: they hold 5.00 GiB"),
        "{lines:#?}"
    );
    assert_eq!(
        fact(&r, "steady-growth", "gpu.growth_graph_bytes"),
        5.0 * GIB
    );
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with("GPU 0: with no optimizer step in the run, the job's memory grew by ")
            && msg.contains(" were the autograd graphs behind the tensors held by list `outs` (phases.py, in evaluation), ")
            && msg.ends_with(": no backward ran to free them."),
        "{msg}"
    );
}

#[test]
fn training_with_an_evaluation_each_epoch_is_counted_in_steps_and_stays_quiet() {
    // Three epochs of 20 steps, each followed by 10 evaluation calls under no_grad: no hunt, nothing said.
    let m = Machine::h200s(1);
    let trace = m.path("cycles.trace.jsonl");
    let (code, r, _, err) = m.python(
        &[],
        &["--trace", trace.to_str().unwrap()],
        &[&program("phases.py"), "cycles"],
    );
    assert_eq!(code, 0, "{err}");
    // The forward clock recorded at the evaluations' calls (its records say `fwd`), never at the
    // training's: each epoch's train() after an evaluation returns it to counting calls only (for an
    // OOM's phase). Calls 1-20 train, 21-30 evaluate, 31-50 train, and so on.
    let fwd: Vec<u64> = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["m"]["fwd"].as_u64())
        .collect();
    assert!(!fwd.is_empty(), "no record at an evaluation's call");
    assert!(fwd.iter().all(|&n| n == 1 || (n - 1) % 30 >= 20), "{fwd:?}");
    assert_eq!(fired(&r), Vec::<String>::new(), "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["hunts"].as_array().map_or(0, Vec::len), 0, "{p:#}");
    assert_eq!(p["steps_total"], 60, "{p:#}");
    // The same keeping 64 MiB a training step: a step leak, hunted at the steps, not at the
    // evaluations' calls.
    let (code, r, err) = phases("cycles_leak");
    assert_eq!(code, 0, "{err}");
    assert!(fired(&r).contains(&"step-leak".to_string()), "{err}");
    let hunts = r["torch"]["processes"][0]["hunts"].as_array().unwrap();
    assert!(!hunts.is_empty(), "{err}");
    assert!(hunts.iter().all(|h| h["clock"] == "steps"), "{hunts:#?}");
    assert!(
        details(&r, "step-leak")
            .iter()
            .any(|l| l.contains("`kept.append(torch.empty(64 * MiB))`")),
        "{:#?}",
        details(&r, "step-leak")
    );
}

#[test]
fn a_model_run_under_inference_mode_is_healthy_and_never_hunted() {
    let (code, r, err) = phases("model_healthy");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fired(&r), Vec::<String>::new(), "{err}");
    assert_eq!(
        r["torch"]["processes"][0]["hunts"],
        serde_json::json!([]),
        "{err}"
    );
}

#[test]
fn an_oom_splits_what_the_list_holds_from_the_graphs_behind_it() {
    for (what, rule) in [
        ("model_oom", "oom-self-growth"),
        ("model_eval_oom", "oom-self-growth"),
    ] {
        let (code, r, err) = phases(what);
        assert_eq!(code, 1, "{what}: {err}");
        assert_eq!(fired(&r), [rule], "{what}: {err}");
        let lines = details(&r, rule);
        // 150 outputs of 256 MiB, each with 512 MiB in its graph (and, in the fake, the 1 GiB of
        // weights it allocates outside any tensor).
        assert_eq!(
            lines[0],
            "held by list `outs` (phases.py, module globals), 150 items — at the OOM: 150 of its tensors hold 37.50 GiB",
            "{what}: {lines:#?}"
        );
        assert!(
            lines[1].starts_with(
                "held by the autograd graphs behind the 150 tensors with grad_fn in list `outs` (phases.py, module globals), 150 items: "
            ) && lines[1].ends_with("— at the OOM: they hold 76.06 GiB"),
            "{what}: {lines:#?}"
        );
        let graphs = fact(&r, rule, "oom.graph_bytes");
        assert!(
            (75.0 * GIB..77.0 * GIB).contains(&graphs),
            "{what}: {graphs}"
        );
        let msg = message(&r, rule);
        let held = "Of its live tensors, 76.06 GiB were the autograd graphs behind the tensors held by list `outs` (phases.py, module globals), 150 items, ";
        if what == "model_oom" {
            // A program that never trained: its calls' graphs outlived them.
            assert_eq!(fact_str(&r, rule, "oom.phase"), "inference", "{msg}");
            assert!(
                msg.contains(&format!("{held}kept because no backward ran to free them: run the model under torch.inference_mode() (or torch.no_grad()), or keep out.detach().")),
                "{what}: {msg}"
            );
        } else {
            // Forward calls under grad after steps, without eval(), which the shim does not count: the
            // phase is not known, and no remedy presumes one.
            let phase = &diagnosis(&r, rule).unwrap()["facts"]["oom.phase"];
            assert_eq!(*phase, Value::Null, "{msg}");
            assert!(
                msg.contains(&format!("{held}which no backward had freed.")),
                "{what}: {msg}"
            );
            assert!(!msg.contains("inference_mode"), "{msg}");
        }
    }
}

fn fact_str(r: &Value, rule: &str, name: &str) -> String {
    diagnosis(r, rule).unwrap()["facts"][name]
        .as_str()
        .unwrap_or_else(|| panic!("{rule} did not read {name}"))
        .to_string()
}

#[test]
fn the_h200s_evaluation_after_training_names_the_line_and_the_list_that_keep_its_outputs() {
    // tests/gpu/phases.py eval_keep under today's shim (tests/gpu/eval_clock.sh): 50 training steps, then
    // model.eval() and 60 calls whose outputs stay on the GPU in `outs`. The growth, its start after the
    // last step and the hunt's reading are the analysis's, replayed from the recording; the shim's
    // clock of an evaluation's calls is tests/python/test_shim_evaluation.py's.
    let trace = fake_torch().join("../phases/eval_keep_clocked.trace.jsonl");
    let r = common::report(trace, &[]);
    assert_eq!(fired(&r), ["steady-growth"]);
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with("GPU 0: after the last optimizer step (step 50), "),
        "{msg}"
    );
    let hunts = r["torch"]["processes"][0]["hunts"].as_array().unwrap();
    assert_eq!(hunts[0]["clock"], "forwards", "{hunts:#?}");
    let lines = details(&r, "steady-growth");
    assert!(
        lines[0].starts_with("allocated at gpu/phases.py:75 in evaluation `y = model("),
        "{lines:#?}"
    );
    assert!(
        lines[1].starts_with("kept alive by list `outs` (phases.py, in evaluation)"),
        "{lines:#?}"
    );
}

/// The phase is what the program was doing (issue 43): a backward that runs out after a slow step (its
/// batch had doubled, 1.5 s after the last step ended) is a training step's, never "after training".
#[test]
fn an_oom_in_backward_after_a_slow_step_is_a_training_steps() {
    let (code, r, err) = phases("bw_oom");
    assert_eq!(code, 1, "{err}");
    assert_eq!(fired(&r), ["oom-self-growth"], "{err}");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert_eq!(d["facts"]["oom.phase"], "training_step", "{d}");
    let msg = message(&r, "oom-self-growth");
    assert!(
        msg.starts_with(
            "GPU 0: the job ran out of memory in a training step, in its backward (in "
        ),
        "{msg}"
    );
    assert!(msg.contains(", after step 20, "), "{msg}");
    // Its own graph is its activations, told per module; no word of graphs kept or of inference.
    assert!(
        msg.contains("What filled it: activations saved for backward, 70.4% of allocated memory"),
        "{msg}"
    );
    a_step_that_does_not_fit(&msg, d);
}

/// A training step's own OOM is told a step's remedies (the batch with gpudoc fit), never graphs kept nor
/// inference_mode.
fn a_step_that_does_not_fit(msg: &str, d: &Value) {
    let said = format!("{msg} {}", d["advice"]);
    assert!(
        !said.contains("inference_mode") && !said.contains("no backward"),
        "{said}"
    );
    assert!(said.contains("gpudoc fit"), "{said}");
}

/// A validation inside training, without eval() and without no_grad, keeps its losses as tensors: an
/// optimizer step runs out, and what filled the GPU is named apart from where it ran out.
#[test]
fn a_validation_that_keeps_its_losses_is_named_as_what_filled_the_gpu() {
    let (code, r, err) = phases("val_keep");
    assert_eq!(code, 1, "{err}");
    assert_eq!(fired(&r)[0], "oom-self-growth", "{err}");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    let msg = message(&r, "oom-self-growth");
    assert!(
        msg.contains("in a training step, in its optimizer step, after step 16, "),
        "{msg}"
    );
    assert!(
        msg.contains(
            "What filled it: 9.00 GiB of autograd graphs behind the tensors held by list `val_losses` (phases.py, in validation_kept), 12 items, "
        ) && msg.contains("made by forward calls under grad that no backward followed"),
        "{msg}"
    );
    assert_eq!(d["facts"]["oom.graphs_kept"], true, "{d}");
    let advice = d["advice"].as_array().unwrap();
    assert!(
        advice[0].as_str().unwrap().contains("torch.no_grad()"),
        "{advice:?}"
    );
    assert!(
        !d["advice"].to_string().contains("gpudoc fit"),
        "the batch is not to blame: {advice:?}"
    );
}

/// A recording of tests/gpu/phases.py NAME on an H100 (`tests/gpu/record_phases.sh verdicts`), replayed.
fn h100(name: &str) -> Value {
    common::report(
        fake_torch().join(format!("../phases/h100/{name}.trace.jsonl")),
        &[],
    )
}

#[test]
fn the_h100s_backward_after_a_slow_doubled_step_is_a_training_steps_oom() {
    // 31 steps, then the batch doubled and loaded for a second: its backward ran out (PowBackward0), a
    // second and more after the last step ended. Never "after training", never inference_mode.
    let r = h100("bw_oom");
    // The GPU it filled (99% in use) is the OOM's story, told once: no near-capacity beside it.
    assert_eq!(fired(&r), ["oom-self-growth"]);
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert_eq!(d["parts"][0]["rule"], "near-capacity", "{d}");
    assert_eq!(d["facts"]["oom.phase"], "training_step", "{d}");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "GPU 0: the job ran out of memory in a training step, in its backward, after step 31, "
        ),
        "{msg}"
    );
    a_step_that_does_not_fit(msg, d);
    assert_eq!(
        r["oom"]["allocator"]["activity"]["bw"], true,
        "{}",
        r["oom"]
    );
}

#[test]
fn the_h100s_first_training_forward_names_blocks_2_expand_and_no_kept_graphs() {
    let r = h100("fwd_oom");
    assert_eq!(fired(&r), ["oom-self-growth"]);
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.starts_with("GPU 0: the job ran out of memory in a training step, in its forward (in self.blocks.2.expand), before its first optimizer step ended, "),
        "{msg}"
    );
    assert!(
        msg.contains("What filled it: activations saved for backward, 94.0% of allocated memory"),
        "{msg}"
    );
    // The first training forward's graph is its own, whose backward was to follow: no "no backward ran
    // to free them", the remedies of a step that does not fit.
    assert_eq!(d["facts"]["oom.graphs_kept"], false, "{d}");
    assert_eq!(d["facts"]["oom.graph_bytes"], 0, "{d}");
    assert!(!msg.contains("no backward"), "{msg}");
    assert!(
        d["advice"][0]
            .as_str()
            .unwrap()
            .contains("activation checkpointing"),
        "{d}"
    );
    let advice = d["advice"].to_string();
    assert!(advice.contains("gpudoc fit"), "{advice}");
    // Whether its backward was to come is not known in a first call: the inference remedy is conditional.
    assert!(
        advice.contains("If this forward call was not for training"),
        "{advice}"
    );
}

#[test]
fn the_h100s_validation_keeping_its_losses_is_an_evaluation_and_a_step_leak_with_site_and_holder() {
    // Every 5 steps a validation under grad, without eval(), keeps its losses as tensors: their graphs
    // fill the GPU. The OOM came in a validation's loss, two forward calls under grad after the last
    // backward: an evaluation (issue 43, item 3), with the list whose graphs filled the GPU named.
    let r = h100("val_keep");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert_eq!(d["facts"]["oom.phase"], "evaluation", "{d}");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.starts_with("GPU 0: the job ran out of memory in an evaluation after step 50: 2 forward calls under grad since the last backward, which no backward followed"),
        "{msg}"
    );
    assert!(
        details(&r, "oom-self-growth")[0].contains("`val_losses.append(model(xv).pow(2).mean())`"),
        "{d}"
    );
    assert!(
        msg.contains("GiB were the autograd graphs behind the tensors held by list `val_losses`"),
        "{msg}"
    );
    let advice = d["advice"].to_string();
    assert!(advice.contains("loss.item()"), "{advice}");
    // The saved activations are the kept graphs': checkpointing the model would not help.
    assert!(!advice.contains("activation checkpointing"), "{advice}");
    assert!(!advice.contains("Reduce the batch size"), "{advice}");
    // The leak grows only every fifth step: the hunt still found its line and its holder.
    let lines = details(&r, "step-leak");
    assert!(
        lines[0].contains("in validation_kept `val_losses.append(model(xv).pow(2).mean())`"),
        "{lines:#?}"
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("kept alive by the autograd graphs behind")
                && l.contains("list `val_losses`")
        ),
        "{lines:#?}"
    );
}

#[test]
fn the_h100s_evaluation_load_and_caching_server_are_told_from_their_evidence() {
    // After eval(), 34 calls with no backward: an evaluation, with the graphs its list keeps.
    let r = h100("eval_oom");
    let msg = message(&r, "oom-self-growth");
    assert!(
        msg.contains("in an evaluation after step 50: 34 forward calls under grad since the last backward, which no backward followed (a validation or an evaluation without torch.no_grad())"),
        "{msg}"
    );
    assert!(
        msg.contains(
            "held by list `outs` (phases.py, in evaluation), 34 items, kept because no backward ran"
        ),
        "{msg}"
    );
    // Shards onto the GPU before any call: loading.
    let r = h100("load_oom");
    let msg = message(&r, "oom-self-growth");
    assert!(
        msg.contains("ran out of memory while loading, before its first forward call"),
        "{msg}"
    );
    // A server's cache of inference tensors: its site and holder, no graph, so no inference_mode remedy.
    let r = h100("infer_cache");
    assert_eq!(fired(&r), ["steady-growth"]);
    let lines = details(&r, "steady-growth");
    assert!(
        lines[0].contains("in handle `out = self.model(x)`"),
        "{lines:#?}"
    );
    assert!(
        lines[1].starts_with("kept alive by dict attribute `cache` of a `CachingServer`"),
        "{lines:#?}"
    );
    let d = diagnosis(&r, "steady-growth").unwrap();
    assert!(!d["advice"].to_string().contains("inference_mode"), "{d}");
}

/// A load is not a leak (issue 43): memory that climbed before the program first called its model is
/// loading, and steady-growth counts only from that call on.
#[test]
fn a_load_before_the_first_call_is_not_growth() {
    let (code, r, err) = phases("load_then_call");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fired(&r), Vec::<String>::new(), "{err}");
    assert!(
        r["torch"]["processes"][0]["first_work_s"]
            .as_f64()
            .is_some(),
        "{}",
        r["torch"]["processes"][0]
    );
}

/// The same validation running out in one of its own calls, two calls after a step: every step called
/// the model once, so calls beyond that with no backward are an evaluation inside training, with the list
/// that keeps its graphs (issue 43, item 3's edge).
#[test]
fn a_validation_call_that_runs_out_after_a_step_is_an_evaluation_inside_training() {
    let (code, r, err) = phases("val_call");
    assert_eq!(code, 1, "{err}");
    let act = &r["oom"]["allocator"]["activity"];
    assert_eq!(
        (act["fg"].as_u64(), act["fps"].as_u64()),
        (Some(2), Some(1)),
        "{act}"
    );
    assert!(
        act["fpb"].as_u64() > Some(1),
        "the rounds' calls made the most larger: {act}"
    );
    // The list grows by a validation's graphs every 5 steps: step-leak may tell that too, its own story.
    let all = fired(&r);
    assert_eq!(all[0], "oom-self-growth", "{err}");
    assert!(all[1..].iter().all(|x| x == "step-leak"), "{all:?}: {err}");
    let d = diagnosis(&r, "oom-self-growth").unwrap();
    assert_eq!(d["facts"]["oom.phase"], "evaluation", "{d}");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.contains("ran out of memory in an evaluation after step 16: 2 forward calls under grad since the last backward, which no backward followed (a validation or an evaluation without torch.no_grad())"),
        "{msg}"
    );
    assert!(
        msg.contains("held by list `val_losses` (phases.py, in validation_kept)"),
        "{msg}"
    );
    assert!(!d["advice"].to_string().contains("gpudoc fit"), "{d}");
}
