//! Beyond the training step, under the fake NVML and the fake torch: growth with no optimizer step, and an
//! OOM placed among the program's phases (issue 28). Real H200 recordings: tests/gpu/record_phases.sh.

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

#[test]
fn an_inference_loop_that_keeps_its_outputs_grows_with_no_step() {
    let (code, r, err) = phases("infer_leak");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fired(&r), ["steady-growth"], "{err}");
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with("GPU 0: with no optimizer step in the run, the job's memory grew by "),
        "{msg}"
    );
    // 45 chunks of 256 MiB kept; a stall of a loaded machine may start the count a little later.
    assert!(
        fact(&r, "steady-growth", "gpu.growth_bytes") >= 6.0 * GIB,
        "{msg}"
    );
    assert!(
        msg.contains("/s, a straight line with R² 1.0) and never came back")
            && msg.contains("PyTorch still held 12.25 GiB of live tensors")
            && msg.contains("At that rate the GPU would be full"),
        "{msg}"
    );
}

#[test]
fn a_healthy_inference_loop_and_evaluation_stay_quiet() {
    for what in ["infer_healthy", "eval_healthy"] {
        let (code, r, err) = phases(what);
        assert_eq!(code, 0, "{what}: {err}");
        assert_eq!(fired(&r), Vec::<String>::new(), "{what}: {err}");
    }
}

#[test]
fn an_evaluation_that_keeps_its_outputs_after_training_grows_after_the_last_step() {
    let (code, r, err) = phases("eval_leak");
    assert_eq!(code, 0, "{err}");
    assert_eq!(fired(&r), ["steady-growth"], "{err}");
    let msg = message(&r, "steady-growth");
    assert!(
        msg.starts_with(
            "GPU 0: after the last optimizer step (step 20), the job's memory grew by "
        ),
        "{msg}"
    );
    assert!(
        fact(&r, "steady-growth", "gpu.growth_bytes") >= 16.0 * GIB,
        "{msg}"
    );
}

#[test]
fn an_oom_in_evaluation_after_training_gets_evaluation_advice() {
    let (code, r, err) = phases("eval_oom");
    assert_eq!(code, 1, "{err}");
    assert_eq!(r["oom"]["cause"], "self_growth", "{err}");
    assert_eq!(fired(&r), ["near-capacity", "oom-after-training"], "{err}");
    let d = diagnosis(&r, "oom-after-training").unwrap();
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.contains("after its last optimizer step (step 20), in what ran after training"),
        "{msg}"
    );
    assert!(msg.contains(": its memory grew by "), "{msg}");
    assert!(
        fact(&r, "oom-after-training", "oom.growth_bytes") >= 64.0 * GIB,
        "{msg}"
    );
    assert!(
        d["advice"][0]
            .as_str()
            .unwrap()
            .contains("torch.inference_mode()"),
        "{d}"
    );
    assert_eq!(d["facts"]["oom.phase"], "after_steps", "{d}");
    assert!(err.contains("Out of memory after training"), "{err}");
}

#[test]
fn an_oom_while_loading_gets_loading_advice() {
    let (code, r, err) = phases("load_oom");
    assert_eq!(code, 1, "{err}");
    assert_eq!(fired(&r), ["near-capacity", "oom-before-training"], "{err}");
    let d = diagnosis(&r, "oom-before-training").unwrap();
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .contains("before its first optimizer step ended (loading the model"),
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
