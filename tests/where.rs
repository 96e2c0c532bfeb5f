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
    let d = diagnosis(&r, "oom-before-training").expect("the OOM's diagnosis");
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
    let own: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let peak = own[step as usize - 1]["peak"].as_u64().unwrap();
    assert_eq!(w["allocated_bytes"].as_u64().unwrap(), peak);
    assert_eq!(parts_sum(w), peak);
    assert_eq!(w["parts"]["activations"], 3216 * MIB);
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
fn snapshot_of_a_healthy_run_leaves_the_programs_history_off() {
    let m = Machine::h200s(1);
    let file = m.path("peak.pickle");
    let script = fake_torch().join("model.py");
    let (code, r, out, err) = m.python(
        &[],
        &["--snapshot", file.to_str().unwrap()],
        &[script.to_str().unwrap(), "40", "--look"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(wheres(&r)[0]["snapshot"], file.to_str().unwrap());
    assert!(file.exists());
    // gpudoc recorded memory history until the measured step; the program's own snapshots showed no
    // event and no frame of it, before and after.
    let seen: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(seen.len(), 40);
    for v in &seen {
        assert_eq!(
            (v["events"].as_u64(), v["frames"].as_u64()),
            (Some(0), Some(0)),
            "{out}"
        );
    }
}
