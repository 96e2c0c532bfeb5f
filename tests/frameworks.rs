//! The framework view beyond PyTorch, through the shim, with the fake `jax` and `cupy` packages of
//! fixtures/fake_frameworks (shaped like the real APIs the shim reads): each program gets its framework's
//! numbers in the report, and its leak, bloat and OOM are diagnosed with them.

mod common;

use common::{Machine, diagnosis, fired, read_json, report};
use serde_json::Value;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

fn fakes() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_frameworks")
}

/// `gpudoc run -- python3 fixtures/fake_frameworks/PROGRAM ARGS` with the fakes first on the path.
fn run(envs: &[(&str, &str)], program: &str, args: &[&str]) -> (i32, Value, String) {
    let (code, r, _, err) = run_out(envs, program, args);
    (code, r, err)
}

/// [`run`], with the program's standard output: (exit code, report, stdout, stderr).
fn run_out(envs: &[(&str, &str)], program: &str, args: &[&str]) -> (i32, Value, String, String) {
    let m = Machine::h200s(1);
    let path = fakes();
    let mut all = vec![("PYTHONPATH", path.to_str().unwrap())];
    all.extend_from_slice(envs);
    let script = path.join(program);
    let mut argv = vec![script.to_str().unwrap()];
    argv.extend_from_slice(args);
    m.python(&all, &[], &argv)
}

fn message(r: &Value, rule: &str) -> String {
    diagnosis(r, rule).unwrap_or_else(|| panic!("{rule} did not fire: {:?}", fired(r)))["message"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_jax_leak_is_diagnosed_with_xlas_own_numbers() {
    // Enough steps that the records past warm-up span 512 MiB of growth whatever stride a loaded
    // machine makes the shim choose.
    let (code, r, err) = run(&[], "jax_programs.py", &["leak", "100", "0.01"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "jax", "{p:#}");
    assert_eq!(p["framework_hello"]["version"], "0.11.2");
    assert_eq!(
        p["gpu"], 0,
        "JAX's device has no UUID: the one GPU NVML saw the process on"
    );
    assert_eq!(p["steps_total"], 100, "the calls of the jitted step");
    // Preallocated: XLA's pool is its limit, 75% of the fake H200, from the start.
    let limit = p["limit_bytes"].as_u64().unwrap();
    assert_eq!(limit, (139.80 * 1024.0 * 1024.0 * 1024.0 * 0.75) as u64);
    assert_eq!(p["peak_reserved_bytes"].as_u64().unwrap(), limit);
    assert_eq!(p["preallocated"], true);
    // The parameters, 99 kept outputs and the last step's 64 MiB temporary at its peak.
    assert_eq!(
        p["peak_allocated_bytes"].as_u64().unwrap(),
        (512 + 99 * 16 + 64) * MIB
    );
    // What JAX cannot tell is absent, not zero.
    for k in [
        "alloc_retries",
        "device_allocs",
        "peak_inactive_split_bytes",
    ] {
        assert_eq!(p[k], Value::Null, "{k}");
    }
    for s in p["steps"].as_array().unwrap() {
        for k in ["alloc_retries", "device_allocs", "device_frees"] {
            assert_eq!(s.get(k), None, "{k}: {s}");
        }
    }
    assert_eq!(p["non_pytorch_bytes"].as_u64().unwrap(), 500 * MIB);
    let leak = message(&r, "step-leak");
    assert!(
        leak.contains("live JAX arrays grew by 16.00 MiB per step"),
        "{leak}"
    );
    let pre = message(&r, "jax-preallocation");
    assert!(
        pre.contains("JAX preallocated 104.85 GiB and its live arrays used at most 2.11 GiB")
            && pre.contains("XLA_PYTHON_CLIENT_MEM_FRACTION=0.05"),
        "{pre}"
    );
    assert!(
        !fired(&r).contains(&"cache-bloat".to_string()),
        "a preallocated pool is no cache bloat: {:?}",
        fired(&r)
    );
    assert!(err.contains("JAX, per process"), "{err}");
    assert!(err.contains("JAX 0.11.2, preallocated its pool"), "{err}");
}

#[test]
fn a_healthy_jax_program_on_demand_is_told_nothing_and_its_settings_are_kept() {
    let (code, r, err) = run(
        &[("XLA_PYTHON_CLIENT_PREALLOCATE", "false")],
        "jax_programs.py",
        &["healthy", "40", "0.01"],
    );
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p.get("preallocated"), None, "not preallocated: absent");
    assert_eq!(
        p["framework_hello"]["settings"]["XLA_PYTHON_CLIENT_PREALLOCATE"],
        "false"
    );
    // The pool grew in 2 MiB regions to what was used at once: the parameters, the last step's output
    // and the step's temporary.
    assert_eq!(
        p["peak_reserved_bytes"].as_u64().unwrap(),
        (512 + 16 + 64) * MIB
    );
    let rules = fired(&r);
    for quiet in ["jax-preallocation", "step-leak", "cache-bloat"] {
        assert!(!rules.contains(&quiet.to_string()), "{quiet}: {rules:?}");
    }
}

#[test]
fn a_jax_oom_is_read_with_the_allocators_numbers_at_the_failure() {
    let (code, r, err) = run(&[], "jax_programs.py", &["oom", "0", "0.001"]);
    assert_eq!(code, 1, "{err}");
    let o = &r["oom"];
    assert_eq!(o["allocator"]["framework"], "jax", "{o:#}");
    assert_eq!(o["requested_bytes"].as_u64().unwrap(), 256 * MIB);
    assert_eq!(o["cause"], "cap", "{o:#}");
    let why = o["explanation"].as_str().unwrap();
    assert!(
        why.contains("may use only 104.85 GiB") && why.contains("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "{why}"
    );
    let cap = diagnosis(&r, "oom-cap").expect("oom-cap");
    let advice: Vec<&str> = cap["advice"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        advice
            .iter()
            .any(|a| a.contains("XLA_PYTHON_CLIENT_MEM_FRACTION"))
            && !advice
                .iter()
                .any(|a| a.contains("set_per_process_memory_fraction")),
        "{advice:?}"
    );
    assert!(
        fired(&r).contains(&"step-leak".to_string()),
        "{:?}",
        fired(&r)
    );
}

#[test]
fn jitted_functions_stay_jaxs_and_a_program_without_jax_loads_nothing() {
    let (code, r, out, err) = run_out(&[], "jax_programs.py", &["api"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 5, "{r:#}");
    assert_eq!(out, "lowered f\nbound 7\nf\ndone 0\n");
    let (code, r, out, err) = run_out(&[], "jax_programs.py", &["nojax"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out, "shim modules []\n",
        "nothing of the frameworks' part is loaded"
    );
    assert_eq!(r["torch"]["processes"], serde_json::json!([]));
}

#[test]
fn a_cupy_pool_that_kept_a_one_off_temporary_is_cache_bloat_with_the_pools_numbers() {
    let (code, r, err) = run(&[], "cupy_programs.py", &["bloat", "1.5"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "cupy", "{p:#}");
    assert_eq!(p["gpu"], 0, "matched by the UUID CuPy's runtime gives");
    assert_eq!(p["peak_reserved_bytes"].as_u64().unwrap(), 8192 * MIB);
    assert_eq!(p["final_reserved_bytes"].as_u64().unwrap(), 8192 * MIB);
    assert_eq!(p["steps_total"], 0, "CuPy's readings are no steps");
    assert!(p["steps"].as_array().unwrap().len() >= 8, "{p:#}");
    assert!(p["free_blocks"].as_u64().unwrap() >= 1, "{p:#}");
    assert_eq!(p["pinned_free_blocks"], 0);
    assert_eq!(p["alloc_retries"], Value::Null);
    let bloat = message(&r, "cache-bloat");
    assert!(
        bloat.contains(
            "CuPy kept 8.00 GiB reserved while live arrays peaked at 512.00 MiB in its readings"
        ),
        "{bloat}"
    );
    let advice = diagnosis(&r, "cache-bloat").unwrap()["advice"].to_string();
    assert!(
        advice.contains("free_all_blocks") && !advice.contains("torch.cuda.empty_cache"),
        "{advice}"
    );
    assert!(err.contains("CuPy, per process"), "{err}");
    let (code, r, err) = run(&[], "cupy_programs.py", &["healthy", "1.5"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        !fired(&r).contains(&"cache-bloat".to_string()),
        "{:?}",
        fired(&r)
    );
}

#[test]
fn a_cupy_pool_at_its_limit_is_an_oom_at_the_cap_with_the_framework_view() {
    let (code, r, err) = run(&[], "cupy_programs.py", &["oom"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(r["oom"]["cause"], "cap", "{:#}", r["oom"]);
    assert!(diagnosis(&r, "oom-cap").is_some(), "{:?}", fired(&r));
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "cupy");
    assert_eq!(p["limit_bytes"].as_u64().unwrap(), 4096 * MIB);
    assert_eq!(p["peak_reserved_bytes"].as_u64().unwrap(), 4096 * MIB);
}

/// A recorded JAX run (as tests/gpu/frameworks.sh records them for fixtures/) is replayed into the run's
/// own framework view and diagnoses.
#[test]
fn a_jax_runs_trace_replays_into_its_own_framework_view() {
    let m = Machine::h200s(1);
    let (json, trace) = (m.path("run.json"), m.path("run.trace.jsonl"));
    let script = fakes().join("jax_programs.py");
    let out = m
        .gpudoc()
        .env("PYTHONPATH", fakes())
        .arg("run")
        .arg("--json")
        .arg(&json)
        .arg("--trace")
        .arg(&trace)
        .args([
            "--",
            "python3",
            script.to_str().unwrap(),
            "leak",
            "30",
            "0.01",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (run, back) = (read_json(&json), report(&trace, &[]));
    assert_eq!(run["torch"]["processes"][0]["framework"], "jax");
    for part in ["torch", "diagnoses"] {
        assert_eq!(back[part], run[part], "{part} differs");
    }
}

/// A run recorded on an H100 (jax 0.11.2, cupy 14.2.0; `tests/gpu/frameworks.sh`), replayed.
fn h100(name: &str) -> Value {
    report(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("fixtures/frameworks/h100/{name}.trace.jsonl")),
        &[],
    )
}

#[test]
fn the_h100s_jax_runs_are_told_with_xlas_own_numbers() {
    // 300 jitted steps keeping their 16 MiB outputs, under JAX's default preallocation of 75%.
    let r = h100("jax_leak");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "jax", "{p:#}");
    assert_eq!(p["steps_total"], 300, "the calls of the jitted step");
    assert_eq!(
        p["peak_allocated_bytes"].as_u64().unwrap(),
        5_570_036_224,
        "peak_bytes_in_use"
    );
    let leak = message(&r, "step-leak");
    assert!(
        leak.contains("live JAX arrays grew by 16.00 MiB per step over 300 steps"),
        "{leak}"
    );
    let pre = message(&r, "jax-preallocation");
    assert!(
        pre.contains("JAX preallocated 59.38 GiB and its live arrays used at most 5.19 GiB of it")
            && pre.contains("XLA_PYTHON_CLIENT_MEM_FRACTION=0.1"),
        "{pre}"
    );
    // The same loop dropping its outputs: preallocation told, no leak.
    let r = h100("jax_healthy");
    assert_eq!(fired(&r), ["jax-preallocation"]);
    // Kept 2 GiB outputs until XLA's allocator ran out, 20 GiB short of the GPU: its RESOURCE_EXHAUSTED
    // came from `block_until_ready()`, outside the jitted call, and is read with XLA's numbers.
    let r = h100("jax_oom");
    let o = &r["oom"];
    assert_eq!(o["requested_bytes"].as_u64().unwrap(), 2 << 30, "{o:#}");
    assert_eq!(o["allocator"]["framework"], "jax", "{o:#}");
    assert_eq!(o["cause"], "cap", "{o:#}");
    let why = o["explanation"].as_str().unwrap();
    assert!(
        why.contains("may use only 59.38 GiB") && why.contains("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        "{why}"
    );
    assert_eq!(fired(&r), ["oom-cap", "step-leak"]);
}

#[test]
fn the_h100s_cupy_pool_that_kept_a_one_off_temporary_is_cache_bloat() {
    let r = h100("cupy_bloat");
    assert_eq!(r["torch"]["processes"][0]["framework"], "cupy");
    assert_eq!(fired(&r), ["cache-bloat"]);
    let msg = message(&r, "cache-bloat");
    assert!(
        msg.contains("CuPy kept 8.00 GiB reserved while live arrays peaked at 512.00 MiB"),
        "{msg}"
    );
}

#[test]
fn a_tensorflow_leak_is_a_step_leak_with_its_allocators_numbers_and_its_pool_the_preallocation() {
    // Keras's fit with TensorFlow's default (no memory growth): the BFC allocator takes nearly all of
    // the GPU at its start.
    let (code, r, err) = run(&[], "tf_programs.py", &["leak", "100", "0.01"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "tensorflow", "{p:#}");
    assert_eq!(p["framework_hello"]["version"], "2.17.0");
    assert_eq!(
        p["framework_hello"]["settings"]["memory_growth"], "false",
        "{p:#}"
    );
    assert_eq!(p["preallocated"], true);
    assert_eq!(p["gpu"], 0, "no UUID: the one GPU NVML saw the process on");
    assert_eq!(p["steps_total"], 100, "the batches of Model.fit");
    // get_memory_info's peak: the weights, 99 kept outputs and the last batch's 64 MiB temporary.
    assert_eq!(
        p["peak_allocated_bytes"].as_u64().unwrap(),
        (512 + 99 * 16 + 64) * MIB
    );
    // TensorFlow does not say what its allocator holds: nothing is made of it.
    for k in [
        "non_pytorch_bytes",
        "alloc_retries",
        "device_allocs",
        "peak_inactive_split_bytes",
    ] {
        assert_eq!(p[k], Value::Null, "{k}");
    }
    nothing_said_of_reserved(&r);
    let leak = message(&r, "step-leak");
    assert!(
        leak.contains("live TensorFlow tensors grew by 16.00 MiB per step"),
        "{leak}"
    );
    let pre = message(&r, "jax-preallocation");
    // NVML's figure for the process: all of the fake H200 but 1 GiB (the BFC's pool and its context).
    assert!(
        pre.contains("TensorFlow held 138.80 GiB")
            && pre.contains("its live tensors used at most 2.11 GiB")
            && pre.contains("TF_FORCE_GPU_ALLOW_GROWTH=true")
            && pre.contains("a memory limit of 3072 MiB"),
        "{pre}"
    );
    let advice = diagnosis(&r, "jax-preallocation").unwrap()["advice"].to_string();
    assert!(
        advice.contains("set_memory_growth") && !advice.contains("XLA_PYTHON_CLIENT"),
        "{advice}"
    );
    assert!(!fired(&r).contains(&"cache-bloat".to_string()));
    assert!(
        err.contains("TensorFlow, per process (its allocator does not say what it reserves)"),
        "{err}"
    );
    assert!(
        err.contains("TensorFlow 2.17.0, preallocated its pool"),
        "{err}"
    );
}

/// A TensorFlow process's report, which has no reserved figure: absent from its JSON (the process's and
/// each record's, 0 in the schema before), from the facts (no rule rests on one: `cache-bloat`,
/// `phase-peak`), and from what the outputs draw of it (the HTML's step chart, the metrics, the
/// TensorBoard tags).
fn nothing_said_of_reserved(r: &Value) {
    let p = &r["torch"]["processes"][0];
    for k in ["peak_reserved_bytes", "final_reserved_bytes"] {
        assert_eq!(p.get(k), None, "{k}: {p:#}");
    }
    let steps = p["steps"].as_array().unwrap();
    assert!(!steps.is_empty());
    for s in steps {
        assert_eq!(s.get("reserved_bytes"), None, "{s}");
        assert_eq!(s.get("peak_reserved_bytes"), None, "{s}");
    }
    let fired = fired(r);
    for rule in ["cache-bloat", "phase-peak"] {
        assert!(!fired.contains(&rule.to_string()), "{rule}: {fired:?}");
    }
    let report: gpudoc::report::Report = serde_json::from_value(r.clone()).unwrap();
    let facts = gpudoc::rules::facts::Facts::of(&report);
    let t = serde_json::to_value(&facts.torch_processes[0]).unwrap();
    for k in [
        "reserved_peak_bytes",
        "final_reserved_bytes",
        "steady_reserved_bytes",
        "steady_peak_reserved_bytes",
        "phase_peak_reserved_bytes",
    ] {
        assert_eq!(t[k], Value::Null, "{k}: {t:#}");
    }
    let page = gpudoc::html::render(&report, None);
    let data = page
        .split_once(r#"id="gpudoc-data">"#)
        .and_then(|(_, rest)| rest.split_once("</script>"))
        .map(|(json, _)| json.replace(r"<\/", "</"))
        .unwrap();
    let data: Value = serde_json::from_str(&data).unwrap();
    for chart in data["steps"].as_array().unwrap() {
        for k in ["reserved", "peak_reserved"] {
            let points = chart[k].as_array().unwrap();
            assert!(points.iter().all(Value::is_null), "{k}: {chart}");
        }
    }
    assert!(
        !data["gpus"].to_string().contains("TensorFlow reserved"),
        "{}",
        data["gpus"]
    );
    let metrics = gpudoc::metrics::render(
        &gpudoc::metrics::View::of_report(&report, "node", None),
        gpudoc::metrics::Format::Prometheus,
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.contains("reserved_bytes{") && l.contains("tensorflow")),
        "{metrics}"
    );
    let tags: Vec<String> = gpudoc::tensorboard::points(&report, None)
        .into_iter()
        .map(|p| p.tag)
        .collect();
    assert!(
        !tags.is_empty() && !tags.iter().any(|t| t.contains("reserved")),
        "{tags:?}"
    );
}

#[test]
fn a_tensorflow_custom_loops_steps_are_its_train_steps_calls_and_its_leak_a_step_leak() {
    // No Keras: a tf.function train step called 100 times, whose outputs the loop keeps, and an
    // evaluation tf.function called every 10 steps.
    let (code, r, err) = run(&[], "tf_programs.py", &["loop", "100", "0.01"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "tensorflow", "{p:#}");
    assert_eq!(p["steps_total"], 100, "the train step's calls: {p:#}");
    assert_eq!(
        p["peak_allocated_bytes"].as_u64().unwrap(),
        (512 + 99 * 16 + 64) * MIB
    );
    let leak = message(&r, "step-leak");
    assert!(
        leak.contains("live TensorFlow tensors grew by 16.00 MiB per step"),
        "{leak}"
    );
    nothing_said_of_reserved(&r);
}

#[test]
fn a_tensorflow_program_with_memory_growth_is_not_preallocated_however_it_sets_it() {
    for (envs, mode) in [
        (&[("TF_FORCE_GPU_ALLOW_GROWTH", "true")][..], "healthy"),
        (&[][..], "growth"),
    ] {
        let (code, r, err) = run(envs, "tf_programs.py", &[mode, "40", "0.01"]);
        assert_eq!(code, 0, "{err}");
        let p = &r["torch"]["processes"][0];
        assert_eq!(p["framework"], "tensorflow", "{mode}: {p:#}");
        assert_eq!(p.get("preallocated"), None, "{mode}: {p:#}");
        let rules = fired(&r);
        for quiet in ["jax-preallocation", "step-leak", "cache-bloat"] {
            assert!(
                !rules.contains(&quiet.to_string()),
                "{mode}: {quiet}: {rules:?}"
            );
        }
    }
}

#[test]
fn a_tensorflow_oom_is_read_with_the_bfc_allocators_stats() {
    // Batches 50 ms apart: NVML has seen the process by the failure (what was free on the GPU then).
    let (code, r, err) = run(&[], "tf_programs.py", &["oom", "0", "0.05"]);
    assert_eq!(code, 1, "{err}");
    let o = &r["oom"];
    assert_eq!(o["allocator"]["framework"], "tensorflow", "{o:#}");
    assert_eq!(o["requested_bytes"].as_u64().unwrap(), 8192 * MIB);
    let t = o;
    // The BFC's Stats: its limit and pool (all of the GPU but the context and 1 GiB), what was in use
    // (the weights and 17 kept outputs), its peak and the allocations it made.
    let limit = (139.80 * 1024.0 * 1024.0 * 1024.0) as u64 - 1524 * MIB;
    assert_eq!(t["allowed_bytes"].as_u64().unwrap(), limit, "{t:#}");
    assert_eq!(t["reserved_bytes"].as_u64().unwrap(), limit, "{t:#}");
    assert_eq!(
        t["allocated_bytes"].as_u64().unwrap(),
        (512 + 17 * 8192) * MIB,
        "{t:#}"
    );
    assert_eq!(
        t["peak_allocated_bytes"].as_u64().unwrap(),
        (512 + 17 * 8192 + 64) * MIB
    );
    assert_eq!(t["allocations"], 1 + 2 * 17 + 1);
    assert_eq!(t["largest_alloc_bytes"].as_u64().unwrap(), 8192 * MIB);
    // The GPU had no room either: the job's own tensors filled it, not a cap.
    assert_eq!(o["cause"], "self_growth", "{o:#}");
    let why = o["explanation"].as_str().unwrap();
    assert!(why.contains("the job itself held 138.31 GiB"), "{why}");
    assert!(
        fired(&r).contains(&"oom-self-growth".to_string()),
        "{:?}",
        fired(&r)
    );
}

#[test]
fn keras_fit_keeps_the_programs_callbacks_and_a_program_without_tensorflow_loads_nothing() {
    let (code, r, out, err) = run_out(&[], "tf_programs.py", &["api"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "mine 1 seen 5 fit Model.fit ['self', 'x', 'y', 'batch_size', 'epochs', 'verbose', 'callbacks']\ndone 0\n",
        "{err}"
    );
    assert_eq!(r["torch"]["processes"][0]["steps_total"], 5, "{r:#}");
    let (code, r, out, err) = run_out(&[], "tf_programs.py", &["notf"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "shim modules []\n");
    assert_eq!(r["torch"]["processes"], serde_json::json!([]));
}

#[test]
fn an_rmm_pool_that_kept_a_one_off_buffer_is_cache_bloat_with_rmms_statistics() {
    let (code, r, err) = run(&[], "rmm_programs.py", &["bloat", "1.5"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "rmm", "{p:#}");
    assert_eq!(p["framework_hello"]["version"], "25.02.00");
    assert_eq!(p["gpu"], 0, "{p:#}");
    // The pool's size is what RMM reserved; the statistics' peak, the one-off buffer.
    assert_eq!(p["peak_reserved_bytes"].as_u64().unwrap(), 8192 * MIB);
    assert_eq!(p["final_reserved_bytes"].as_u64().unwrap(), 8192 * MIB);
    assert_eq!(p["peak_allocated_bytes"].as_u64().unwrap(), 8192 * MIB);
    assert_eq!(p["steps_total"], 0, "RMM's readings are no steps");
    assert!(p["allocations"].as_u64().unwrap() >= 3, "{p:#}");
    assert_eq!(p["non_pytorch_bytes"].as_u64().unwrap(), 500 * MIB);
    assert_eq!(p["alloc_retries"], Value::Null);
    let bloat = message(&r, "cache-bloat");
    assert!(
        bloat.contains(
            "RMM kept 8.00 GiB reserved while live allocations peaked at 512.00 MiB in its readings"
        ),
        "{bloat}"
    );
    let advice = diagnosis(&r, "cache-bloat").unwrap()["advice"].to_string();
    assert!(
        advice.contains("maximum_pool_size") && !advice.contains("torch.cuda.empty_cache"),
        "{advice}"
    );
    assert!(err.contains("RMM, per process"), "{err}");
    let (code, r, err) = run(&[], "rmm_programs.py", &["healthy", "1.5"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(
        p["peak_reserved_bytes"].as_u64().unwrap(),
        512 * MIB,
        "{p:#}"
    );
    assert!(
        !fired(&r).contains(&"cache-bloat".to_string()),
        "{:?}",
        fired(&r)
    );
}

#[test]
fn rmm_without_statistics_or_a_pool_tells_nothing_and_is_absent_from_the_view() {
    let (code, r, err) = run(&[], "rmm_programs.py", &["plain", "0.5"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(r["torch"]["processes"], serde_json::json!([]), "{r:#}");
}

#[test]
fn a_program_that_imports_torch_before_jax_gets_jaxs_view_too() {
    let torch = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_torch");
    let path = format!("{}:{}", fakes().display(), torch.display());
    let m = Machine::h200s(1);
    let script = fakes().join("jax_programs.py");
    let (code, r, _, err) = m.python(
        &[("PYTHONPATH", path.as_str())],
        &[],
        &[script.to_str().unwrap(), "torch_first", "40", "0.01"],
    );
    assert_eq!(code, 0, "{err}");
    let jax: Vec<&Value> = r["torch"]["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["framework"] == "jax")
        .collect();
    assert_eq!(jax.len(), 1, "{:#}", r["torch"]);
    assert_eq!(jax[0]["steps_total"], 40);
}

#[test]
fn an_rmm_leak_is_steady_growth_with_what_rmm_held_in_its_own_words() {
    let (code, r, err) = run(&[], "rmm_programs.py", &["leak", "4"]);
    assert_eq!(code, 0, "{err}");
    let p = &r["torch"]["processes"][0];
    assert_eq!(p["framework"], "rmm", "{p:#}");
    let kept = p["final_allocated_bytes"].as_u64().unwrap();
    assert!(kept >= 1024 * MIB, "{p:#}");
    let growth = message(&r, "steady-growth");
    assert!(growth.contains("and at its end RMM still held"), "{growth}");
    assert!(!growth.contains("PyTorch"), "{growth}");
    // PyTorch's remedies are PyTorch's: none is given of memory RMM held.
    let d = diagnosis(&r, "steady-growth").unwrap();
    let said = format!("{} {}", d["advice"], d["docs"]);
    assert!(!said.contains("torch"), "{said}");
    assert!(said.contains("needs a bound"), "{said}");
}
