//! Where the memory went inside the model (issue 31), through the shim on the fake torch: a model with
//! named blocks (fixtures/fake_torch/model.py) run out of memory in backward, and run healthy.

mod common;

use common::{Machine, diagnosis, fake_torch};
use serde_json::Value;

const MIB: u64 = 1 << 20;
/// Forward's peak of model.py (parameters, activations, the input) and 600 MiB: its backward runs out in
/// the second block from the end, whose gradient (1 GiB) no longer fits.
const LIMIT: u64 = (864 + 3264 + 16 + 600) * MIB;

/// `gpudoc run [extra] -- python3 model.py STEPS [args]`, with `envs`.
fn model(
    envs: &[(&str, &str)],
    extra: &[&str],
    steps: u32,
    args: &[&str],
) -> (i32, Value, String, String) {
    let script = fake_torch().join("model.py");
    let steps = steps.to_string();
    let mut all = vec![script.to_str().unwrap(), steps.as_str()];
    all.extend(args);
    Machine::h200s(1).python(envs, extra, &all)
}

fn wheres(r: &Value) -> Vec<Value> {
    r["torch"]["processes"][0]["where"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The program's own lines: one JSON object each (its peaks).
fn lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn parts_sum(w: &Value) -> u64 {
    [
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "other",
    ]
    .iter()
    .map(|k| w["parts"][k].as_u64().unwrap())
    .sum()
}

#[test]
fn an_oom_in_backward_names_its_module_pass_and_what_memory_held() {
    let limit = LIMIT.to_string();
    let (code, r, _, err) = model(&[("FAKE_TORCH_LIMIT", &limit)], &[], 3, &[]);
    assert_eq!(code, 1, "{err}");
    let w = wheres(&r);
    assert_eq!(w.len(), 1, "{w:#?}");
    let w = &w[0];
    assert_eq!(w["why"], "oom");
    assert_eq!(w["pass"], "backward");
    assert_eq!(w["module"], "model.layers.2.mlp");
    assert_eq!(w["node"], "MmBackward0");
    assert_eq!(w["line"]["code"], "loss.backward()");
    // Parameters (864 MiB), the gradients of the blocks backward got through (head, layers.3: 256 MiB),
    // the activations the blocks below still hold for backward (1936 MiB), the rest in flight.
    assert_eq!(w["parts"]["parameters"], 864 * MIB);
    assert_eq!(w["parts"]["gradients"], 256 * MIB);
    assert_eq!(w["parts"]["activations"], 1936 * MIB);
    assert_eq!(parts_sum(w), w["allocated_bytes"].as_u64().unwrap());
    // The diagnosis says where, what held the memory, and the remedy that fits: checkpointing, not
    // loading advice (the OOM came before the first optimizer step ended, in backward).
    let d = diagnosis(&r, "oom-self-growth").expect("the OOM's diagnosis");
    let text = d.to_string();
    assert!(
        text.contains("in backward of model.layers.2.mlp (MmBackward0), at fake_torch/model.py:"),
        "{text}"
    );
    assert!(
        text.contains("activations saved for backward 1.89 GiB"),
        "{text}"
    );
    assert!(text.contains("activation checkpointing"), "{text}");
    assert!(!text.contains("map_location"), "{text}");
}

#[test]
fn a_healthy_run_measures_one_step_with_its_blocks_and_its_peak() {
    let (code, r, out, err) = model(&[], &[], 40, &[]);
    assert_eq!(code, 0, "{err}");
    let w = wheres(&r);
    assert_eq!(w.len(), 1, "{w:#?}");
    let w = &w[0];
    assert_eq!(w["why"], "peak");
    let step = w["step"].as_u64().unwrap();
    // The table: the shallowest depth with at least four modules, the ModuleList passed through.
    let rows: Vec<(String, u64)> = w["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["forward_bytes"].as_u64().unwrap() / MIB,
            )
        })
        .collect();
    let want: Vec<(String, u64)> = [
        ("model.embed", 128),
        ("model.layers.0", 768),
        ("model.layers.1", 768),
        ("model.layers.2", 768),
        ("model.layers.3", 768),
        ("model.head", 64),
    ]
    .iter()
    .map(|(n, b)| (n.to_string(), *b))
    .collect();
    assert_eq!(rows, want);
    // The breakdown adds up to the step's peak as the program itself read it, and the program's own
    // peaks are what they are without gpudoc (the measuring resets the counters it reads).
    let own = lines(&out);
    let peak = own[step as usize - 1]["peak"].as_u64().unwrap();
    assert_eq!(w["allocated_bytes"].as_u64().unwrap(), peak);
    assert_eq!(parts_sum(w), peak);
    // At the step's peak, in the backward of layers.2 (as where the OOM test runs out), what the head and
    // layers.3 saved for backward was gone: of 3216 MiB at backward's start, 1936 MiB.
    assert_eq!(w["parts"]["activations"], 1936 * MIB);
    let bare = std::process::Command::new("python3")
        .env("PYTHONPATH", fake_torch())
        .args([fake_torch().join("model.py").to_str().unwrap(), "40"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&bare.stdout), out);
    // The summary shows the step's breakdown and its top modules.
    assert!(err.contains("Inside the model"), "{err}");
    assert!(err.contains("model.layers.2"), "{err}");
}

#[test]
fn a_later_higher_peak_step_is_measured_again_and_stands_for_the_run() {
    // Sequences twice as long from step 25: the step measured after warm-up no longer is the peak.
    let (code, r, out, err) = model(&[], &[], 40, &["--longer-from", "25"]);
    assert_eq!(code, 0, "{err}");
    let w = wheres(&r);
    assert_eq!(w.len(), 1, "{w:#?}");
    let w = &w[0];
    let step = w["step"].as_u64().unwrap();
    assert!(step >= 25, "measured at step {step}");
    let own = lines(&out);
    let peak = own[step as usize - 1]["peak"].as_u64().unwrap();
    let first = own[10]["peak"].as_u64().unwrap();
    assert!(peak > first * 3 / 2, "{peak} vs {first}");
    assert_eq!(w["allocated_bytes"].as_u64().unwrap(), peak);
    assert_eq!(parts_sum(w), peak);
    assert!(
        err.contains(&format!(
            "Inside the model (pid {}, step {step})",
            r["torch"]["processes"][0]["pid"]
        )),
        "{err}"
    );
    // The program's own peaks are as without gpudoc.
    let bare = std::process::Command::new("python3")
        .env("PYTHONPATH", fake_torch())
        .args([
            fake_torch().join("model.py").to_str().unwrap(),
            "40",
            "--longer-from",
            "25",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&bare.stdout), out);
}

#[test]
fn snapshot_at_an_oom_is_the_pickle_memory_viz_opens() {
    let m = Machine::h200s(1);
    let file = m.path("oom.pickle");
    let limit = LIMIT.to_string();
    let script = fake_torch().join("model.py");
    let (code, r, _, err) = m.python(
        &[("FAKE_TORCH_LIMIT", &limit)],
        &["--snapshot", file.to_str().unwrap()],
        &[script.to_str().unwrap(), "3"],
    );
    assert_eq!(code, 1, "{err}");
    let w = wheres(&r);
    assert_eq!(w[0]["snapshot"], file.to_str().unwrap());
    // Read as torch's own loader reads it (memory_viz: pickle.load), with the frames of live blocks
    // (history was recorded from CUDA's start for it).
    let check = std::process::Command::new("python3")
        .args([
            "-c",
            "import pickle, sys; s = pickle.load(open(sys.argv[1], 'rb')); \
             print(sorted(s), any(b['frames'] for g in s['segments'] for b in g['blocks']))",
            file.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&check.stdout),
        "['device_traces', 'segments'] True\n"
    );
    assert!(err.contains("pytorch.org/memory_viz"), "{err}");
}

#[test]
fn a_snapshot_that_could_not_be_written_is_named_nowhere_but_in_the_note() {
    // The disk filled up (/dev/full): the shim took the snapshot, gpudoc could not write it.
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.trace.jsonl");
    let limit = LIMIT.to_string();
    let (code, r, _, err) = model(
        &[("FAKE_TORCH_LIMIT", &limit)],
        &[
            "--snapshot",
            "/dev/full",
            "--trace",
            trace.to_str().unwrap(),
        ],
        3,
        &[],
    );
    assert_eq!(code, 1, "{err}");
    let note = "--snapshot /dev/full: No space left on device";
    let replay = common::report(&trace, &[]);
    for r in [&r, &replay] {
        let w = &wheres(r)[0];
        assert_eq!(
            (&w["why"], &w["snapshot"]),
            (&Value::from("oom"), &Value::Null)
        );
        assert!(r["notes"].to_string().contains(note), "{}", r["notes"]);
    }
    assert!(err.contains(note), "{err}");
    assert!(!err.contains("allocator snapshot at"), "{err}");
}

#[test]
fn snapshot_of_a_healthy_run_leaves_the_programs_history_off() {
    let m = Machine::h200s(1);
    let (file, trace) = (m.path("peak.pickle"), m.path("run.trace.jsonl"));
    let script = fake_torch().join("model.py");
    let (code, r, out, err) = m.python(
        &[],
        &[
            "--snapshot",
            file.to_str().unwrap(),
            "--trace",
            trace.to_str().unwrap(),
        ],
        &[script.to_str().unwrap(), "40", "--look"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(wheres(&r)[0]["snapshot"], file.to_str().unwrap());
    assert!(file.exists());
    // The trace's replay names the file the run wrote, not the shim's own name for it.
    assert_eq!(wheres(&common::report(&trace, &[])), wheres(&r));
    // gpudoc recorded memory history until the measured step; the program's own snapshots showed no
    // event and no frame of it, before and after.
    let seen = lines(&out);
    assert_eq!(seen.len(), 40);
    for v in &seen {
        assert_eq!(
            (v["events"].as_u64(), v["frames"].as_u64()),
            (Some(0), Some(0)),
            "{out}"
        );
    }
}

/// `gpudoc run -- python3 attention.py ARGS`, with `envs`.
fn attention(envs: &[(&str, &str)], args: &[&str]) -> (i32, Value, String, String) {
    let script = fake_torch().join("attention.py");
    let mut all = vec![script.to_str().unwrap()];
    all.extend(args);
    Machine::h200s(1).python(envs, &[], &all)
}

/// The rows' (name, saved for backward in MiB).
fn saved_rows(w: &Value) -> Vec<(String, u64)> {
    w["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_string(),
                m["activation_bytes"].as_u64().unwrap() / MIB,
            )
        })
        .collect()
}

fn rows(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(n, b)| (n.to_string(), *b)).collect()
}

/// attention.py's first step allocates 7424 MiB in the softmax's backward of blocks.2 and 7552 MiB in
/// that of blocks.1: between the two, blocks.1's runs out.
const ATTENTION_LIMIT: u64 = 7488 * MIB;

#[test]
fn an_oom_in_an_operation_without_parameters_names_the_module_it_ran_in() {
    let limit = ATTENTION_LIMIT.to_string();
    let (code, r, _, err) = attention(&[("FAKE_TORCH_LIMIT", &limit)], &["3"]);
    assert_eq!(code, 1, "{err}");
    let w = &wheres(&r)[0];
    // The softmax between qkv and proj: the parameters nearest below it are qkv's, but it ran in attn.
    assert_eq!(
        (&w["pass"], &w["module"], &w["node"]),
        (
            &Value::from("backward"),
            &Value::from("model.blocks.1.attn"),
            &Value::from("SoftmaxBackward0")
        )
    );
    // What the blocks whose backward had not run yet still held for it: blocks.1 the scores' softmax
    // (512 MiB) and its input's (64), blocks.0 all three (640), the embedding its input (16); each
    // storage once, the weights a node saved counted as parameters.
    assert_eq!(w["parts"]["activations"], 1232 * MIB);
    assert_eq!(
        saved_rows(w),
        rows(&[
            ("model.embed", 16),
            ("model.blocks.0", 640),
            ("model.blocks.1", 576),
            ("model.blocks.2", 0),
            ("model.blocks.3", 0),
            ("model.head", 0),
        ])
    );
    let text = diagnosis(&r, "oom-self-growth").unwrap().to_string();
    assert!(
        text.contains("in backward of model.blocks.1.attn (SoftmaxBackward0)"),
        "{text}"
    );
    assert!(
        text.contains(
            "saved for backward by model.blocks.0 640.00 MiB, model.blocks.1 576.00 MiB, \
             model.embed 16.00 MiB"
        ),
        "{text}"
    );
}

#[test]
fn an_evaluation_after_training_is_measured_on_one_call_at_its_own_peak() {
    let (code, r, out, err) = attention(&[], &["20", "--eval", "5"]);
    assert_eq!(code, 0, "{err}");
    let w = wheres(&r);
    let phases: Vec<&str> = w.iter().map(|w| w["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["training", "evaluation"], "{w:#?}");
    let own = lines(&out);
    // The training step: each block saved 640 MiB for backward, as its forward added; at the step's
    // peak (in blocks.0's backward) the blocks after it had let theirs go.
    let (train, eval) = (&w[0], &w[1]);
    let step = train["step"].as_u64().unwrap() as usize;
    assert_eq!(train["allocated_bytes"], own[step - 1]["peak"]);
    assert_eq!(parts_sum(train), train["allocated_bytes"].as_u64().unwrap());
    assert_eq!(
        saved_rows(train),
        rows(&[
            ("model.embed", 16),
            ("model.blocks.0", 640),
            ("model.blocks.1", 640),
            ("model.blocks.2", 640),
            ("model.blocks.3", 640),
            ("model.head", 64),
        ])
    );
    assert_eq!(train["parts"]["activations"], (640 + 16) * MIB);
    // The evaluation's first call under no_grad, at its own peak (the program's own for that call):
    // nothing saved, no backward; its temporaries are the scores and their softmax.
    assert_eq!(eval["allocated_bytes"], own[20]["peak"], "{out}");
    assert_eq!(eval["parts"]["activations"], 0);
    assert_eq!(eval["parts"]["gradients"], 0);
    assert_eq!(eval["parts"]["other"], (16 + 64 + 512 + 512) * MIB);
    let m = &eval["modules"][1];
    assert_eq!(
        (m["name"].as_str(), m["forward_bytes"].as_u64()),
        (Some("model.blocks.0"), Some(64 * MIB))
    );
    assert!(m.get("backward_peak_bytes").is_none(), "{m}");
    // The program sees what it would without gpudoc.
    let bare = std::process::Command::new("python3")
        .env("PYTHONPATH", fake_torch())
        .args([
            fake_torch().join("attention.py").to_str().unwrap(),
            "20",
            "--eval",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&bare.stdout), out);
    assert!(
        err.contains("Inside the model (pid ")
            && err.contains(", an evaluation call), at its peak"),
        "{err}"
    );
}

#[test]
fn a_program_without_optimizer_steps_is_measured_on_one_inference_call() {
    let (code, r, out, err) = attention(&[], &["0", "--infer", "30", "--grad"]);
    assert_eq!(code, 0, "{err}");
    let w = wheres(&r);
    assert_eq!(w.len(), 1, "{w:#?}");
    let w = &w[0];
    assert_eq!(w["phase"], "inference");
    // At that call's own peak (every call's is the same); run with grad, its graph keeps what each block
    // saved, with the input the embedding saved and the head's.
    let own = lines(&out);
    assert_eq!(w["allocated_bytes"], own[29]["peak"]);
    assert_eq!(w["parts"]["activations"], (4 * 640 + 16 + 64) * MIB);
    assert_eq!(saved_rows(w)[1], ("model.blocks.0".to_string(), 640));
}

/// fixtures/where: the H200's records of tests/gpu/where.sh (torch 2.11), as the shim sent them.
#[test]
fn forwards_accumulating_gradients_before_the_first_step_are_training_not_inference() {
    // 16 micro-batches per optimizer step: the forward clock sees 16 forwards before the first step,
    // past its warm-up; a call measured then would be told as an inference call.
    let (code, r, _, err) = attention(&[], &["2", "--accumulate", "16"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        r["torch"]["processes"][0]["steps_total"].as_u64() == Some(2),
        "{err}"
    );
    let phases: Vec<Value> = wheres(&r).iter().map(|w| w["phase"].clone()).collect();
    assert!(!phases.contains(&Value::from("inference")), "{phases:?}");
}

fn h200(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fixtures/where/{name}"))
}

/// The report of an H200 trace whose OOM came in the backward of a softmax, and its record there, whose
/// module must be `module`.
fn h200_softmax_oom(trace: &str, module: Value) -> (Value, Value) {
    let r = common::report(h200(trace), &[]);
    let w = wheres(&r).remove(0);
    assert_eq!(
        (&w["why"], &w["pass"], &w["node"], &w["module"]),
        (
            &Value::from("oom"),
            &Value::from("backward"),
            &Value::from("SoftmaxBackward0"),
            &module
        )
    );
    (r, w)
}

#[test]
fn the_h200s_records_of_an_oom_in_backward_read_into_the_report() {
    // Recorded before the graph walk held its nodes: the pass, the node and the line were right, the
    // module was not found and the saved tensors were undercounted (the fix: tests above).
    let (r, w) = h200_softmax_oom("first/oom.trace.jsonl", Value::Null);
    let w = &w;
    assert_eq!(w["line"]["code"], "loss.backward()");
    assert_eq!(w["allocated_bytes"], 134519579648u64);
    assert_eq!(parts_sum(w), 134519579648);
    let names: Vec<&str> = w["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 9);
    assert_eq!(
        (names[0], names[1], names[8]),
        ("model.embed", "model.layers.0", "model.head")
    );
    assert_eq!(w["modules"][8]["parameter_bytes"], 131072000);
    // The shim took a snapshot (snapshot-532-1.pickle, its own name); the trace, older than the end
    // row's record of the file it went to, does not say which file: none is claimed.
    assert_eq!(w["snapshot"], Value::Null);
    let text = diagnosis(&r, "oom-self-growth").unwrap().to_string();
    assert!(
        text.contains("in backward (SoftmaxBackward0), at gpu/where.py:77 `loss.backward()`"),
        "{text}"
    );
}

#[test]
fn the_h200s_record_of_a_measured_step_adds_up_to_the_programs_own_peak() {
    let r = common::report(h200("first/healthy.trace.jsonl"), &[]);
    let w = &wheres(&r)[0];
    assert_eq!(
        (&w["why"], &w["step"]),
        (&Value::from("peak"), &Value::from(12))
    );
    // A record without a phase (before phases were measured) is a training step's.
    assert!(w.get("phase").is_none(), "{w}");
    let own = lines(&std::fs::read_to_string(h200("first/healthy.stdout")).unwrap());
    assert_eq!(w["allocated_bytes"], own[11]["peak"]);
    assert_eq!(parts_sum(w), own[11]["peak"].as_u64().unwrap());
    assert_eq!(w["at_backward_bytes"], 44520199680u64);
    let blocks: Vec<(u64, u64)> = w["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["forward_bytes"].as_u64().unwrap(),
                m["backward_peak_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(blocks.len(), 9);
    // Each block's forward added the same; the peak inside backward grew block by block to the step's.
    assert!(blocks[1..7].iter().all(|b| b.0 == 6901690368), "{blocks:?}");
    assert_eq!(blocks[6].1, own[11]["peak"].as_u64().unwrap());
}

/// The H200's records of today's shim (tests/gpu/where.sh): an OOM in the backward of a block's attention.
#[test]
fn the_h200s_oom_in_backward_names_the_blocks_attention_and_places_what_it_saved() {
    let (r, w) = h200_softmax_oom("oom.trace.jsonl", Value::from("model.layers.5.attn"));
    let w = &w;
    let allocated = w["allocated_bytes"].as_u64().unwrap();
    assert_eq!(parts_sum(w), allocated);
    // Every block but the one running holds its attention's saved tensors: most of the memory, and
    // (nearly) all of it placed in the table's blocks.
    let saved = w["parts"]["activations"].as_u64().unwrap();
    assert!(saved * 2 >= allocated, "{saved} of {allocated}");
    let placed: u64 = w["modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["activation_bytes"].as_u64().unwrap_or(0))
        .sum();
    assert!(placed * 10 >= saved * 9, "{placed} of {saved}");
    let text = diagnosis(&r, "oom-self-growth").unwrap().to_string();
    assert!(
        text.contains("in backward of model.layers.5.attn (SoftmaxBackward0)"),
        "{text}"
    );
    assert!(text.contains("activation checkpointing"), "{text}");
}

#[test]
fn the_h200s_measured_step_and_calls_are_the_programs_own_peaks() {
    let r = common::report(h200("healthy.trace.jsonl"), &[]);
    let own = lines(&std::fs::read_to_string(h200("healthy.stdout")).unwrap());
    let (steps, calls): (Vec<&Value>, Vec<&Value>) =
        own.iter().partition(|o| o.get("step").is_some());
    let w = wheres(&r);
    let phases: Vec<&str> = w.iter().map(|w| w["phase"].as_str().unwrap()).collect();
    assert_eq!(phases, ["training", "evaluation"]);
    let step = w[0]["step"].as_u64().unwrap() as usize;
    assert_eq!(w[0]["allocated_bytes"], steps[step - 1]["peak"]);
    assert_eq!(parts_sum(&w[0]), steps[step - 1]["peak"].as_u64().unwrap());
    // Six blocks, each adding in forward what it saves for backward.
    let blocks: Vec<&Value> = w[0]["modules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["name"].as_str().unwrap().starts_with("model.layers."))
        .collect();
    assert_eq!(blocks.len(), 6);
    for b in blocks {
        assert!(b["forward_bytes"].as_u64().unwrap() > 6 << 30, "{b}");
    }
    assert_eq!(w[1]["allocated_bytes"], calls[0]["peak"]);
    // Inference alone: one call of the model under inference_mode, its own peak.
    let r = common::report(h200("infer.trace.jsonl"), &[]);
    let own = lines(&std::fs::read_to_string(h200("infer.stdout")).unwrap());
    let w = &wheres(&r)[0];
    assert_eq!(w["phase"], "inference");
    assert_eq!(w["allocated_bytes"], own[0]["peak"]);
    assert_eq!(parts_sum(w), own[0]["peak"].as_u64().unwrap());
}
