//! One job across nodes: reports written by `gpudoc run` on different hosts (each a fake machine of its
//! own here; two H200s in fixtures/merge/) merge into one report that the rules, `compare` and a later
//! `gpudoc report` read like any other.

mod common;

use common::{Machine, read_json, report};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// A node: its host name, the script it runs, and what is on its machine before.
type Node<'a> = (&'a str, &'a str, &'a dyn Fn(&Machine));

/// The nodes of one job, run at once as a launcher starts them: on each node (a machine of its own, set up
/// by its function) `gpudoc run --host HOST --name llama --json DIR/HOST.json -- sh -c SCRIPT`. Their
/// reports.
fn job(dir: &Path, nodes: &[Node]) -> Vec<PathBuf> {
    let running: Vec<_> = nodes
        .iter()
        .map(|&(host, script, setup)| {
            let m = Machine::h200s(1);
            setup(&m);
            let json = dir.join(format!("{host}.json"));
            let child = m
                .gpudoc()
                .args([
                    "run", "--quiet", "--host", host, "--name", "llama", "--json",
                ])
                .arg(&json)
                .args(["--", "sh", "-c", script])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (m, child, json)
        })
        .collect();
    running
        .into_iter()
        .map(|(_m, mut child, json)| {
            child.wait().unwrap();
            json
        })
        .collect()
}

fn nothing(_: &Machine) {}

fn alloc(gib: u32) -> String {
    format!(r#""$FAKEGPU" alloc --gpu 0 --steps {gib}GiB --hold-ms 300"#)
}

const OOM: &str = "echo '[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. \
GPU 0 has a total capacity of 139.80 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this \
process has 138.80 GiB memory in use. Of the allocated memory 130.00 GiB is allocated by PyTorch, and \
8.00 GiB is reserved by PyTorch but unallocated.' >&2; exit 1";

fn rules(r: &Value) -> Vec<(String, String)> {
    r["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["rule"].as_str().unwrap().into(),
                d["subject"].as_str().unwrap().into(),
            )
        })
        .collect()
}

#[test]
fn imbalance_across_nodes_is_found_in_the_merge() {
    let dir = tempfile::tempdir().unwrap();
    let (a10, a2) = (alloc(10), alloc(2));
    let reports = job(
        dir.path(),
        &[("node-a", &a10, &nothing), ("node-b", &a2, &nothing)],
    );
    for f in &reports {
        assert!(rules(&read_json(f)).is_empty(), "each node alone is fine");
    }
    let m = report(dir.path(), &[]);
    assert_eq!(m["hosts"].as_array().unwrap().len(), 2);
    assert_eq!(m["origin"]["name"], "llama");
    // The nodes started at once: their order is their start's, either.
    let mut gpus: Vec<(&str, u64)> = m["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["host"].as_str().unwrap(),
                g["job_peak_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    gpus.sort();
    assert_eq!(gpus, [("node-a", 10 << 30), ("node-b", 2 << 30)]);
    let d = &m["diagnoses"][0];
    assert_eq!(d["rule"], "gpu-imbalance");
    assert_eq!(
        d["message"],
        "The job peaked at 10.00 GiB on GPU 0 on node-a but 2.00 GiB on GPU 0 on node-b (5.0x): the busiest GPU sets the batch size for all of them."
    );
}

#[test]
fn the_node_and_rank_that_ran_out_first_leftovers_and_memory_held_before() {
    let dir = tempfile::tempdir().unwrap();
    // node-a leaves a child holding memory behind.
    let leftover = r#""$FAKEGPU" alloc --gpu 0 --steps 4GiB --hold-ms 3000 & sleep 0.5"#;
    let oom = format!("{}; {OOM}", alloc(4));
    let held_before = |m: &Machine| {
        let status = m
            .fakegpu()
            .args([
                "set", "--pid", "4000000", "--gpu", "0", "--bytes", "3GiB", "--ghost",
            ])
            .status()
            .unwrap();
        assert!(status.success());
    };
    job(
        dir.path(),
        &[
            ("node-a", leftover, &nothing),
            ("node-b", &oom, &held_before),
        ],
    );
    let m = report(dir.path(), &[]);
    assert_eq!(m["exit"]["classification"], "gpu_oom");
    assert_eq!(m["oom"]["host"], "node-b");
    assert_eq!(m["oom"]["rank"], 3);
    let got = rules(&m);
    assert_eq!(m["orphans"][0]["host"], "node-a");
    for want in [
        ("oom-self-growth", "run"),
        ("held-before-start", "GPU 0 on node-b"),
        ("leftover-processes", "run"),
    ] {
        assert!(
            got.iter().any(|g| (g.0.as_str(), g.1.as_str()) == want),
            "{want:?} in {got:?}"
        );
    }
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .arg(dir.path())
        .args(["--color", "never"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ran out of GPU memory on GPU 0 on node-b (rank 3)"),
        "{text}"
    );
    assert!(text.contains("host node-a: exited with code 0"), "{text}");
    assert!(text.contains("host node-b: exited with code 1"), "{text}");
}

#[test]
fn a_merged_report_is_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let (a6, a1) = (alloc(6), alloc(1));
    let [a, b] = <[PathBuf; 2]>::try_from(job(
        dir.path(),
        &[("node-a", &a6, &nothing), ("node-b", &a1, &nothing)],
    ))
    .unwrap();
    let merged = dir.path().join("merged.json");
    let status = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .args([&a, &b])
        .arg("--json")
        .arg(&merged)
        .output()
        .unwrap()
        .status;
    assert!(status.success());
    // Read back: the same diagnoses, and compare works against a node's own report.
    let again = report(&merged, &[]);
    assert_eq!(again["diagnoses"], read_json(&merged)["diagnoses"]);
    common::succeed(
        std::process::Command::new(common::gpudoc_bin())
            .arg("compare")
            .args([&a, &merged])
            .args(["--json", "-"]),
    );
}

/// The reports of the two "nodes" of one torchrun job recorded on two H200s (`tests/gpu/record_nodes.sh`:
/// each node a `gpudoc run` owning one GPU through CUDA_VISIBLE_DEVICES).
fn h200_nodes(scenario: &str) -> Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/merge");
    let files = ["node-a", "node-b"].map(|h| dir.join(format!("{scenario}_{h}.report.json")));
    common::report_of(&files, &["--color", "never"])
}

#[test]
fn real_nodes_rank_zero_carrying_more_is_imbalance_across_nodes() {
    let m = h200_nodes("rank0_extra");
    let hosts: Vec<&str> = m["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["origin"]["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["node-a", "node-b"]);
    assert_eq!(m["origin"]["name"], "ddp-rank0_extra");
    let d = common::diagnosis(&m, "gpu-imbalance").expect("imbalance across the nodes");
    let msg = d["message"].as_str().unwrap();
    assert!(
        msg.contains("GPU 0 on node-a") && msg.contains("GPU 1 on node-b"),
        "{msg}"
    );
    // Each node alone has one GPU and nothing to compare it with.
    let alone = read_json(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/merge/rank0_extra_node-a.report.json"),
    );
    assert!(rules(&alone).iter().all(|(r, _)| r != "gpu-imbalance"));
}

#[test]
fn real_nodes_the_rank_that_ran_out_is_named_with_its_host_and_gpu() {
    let m = h200_nodes("oom");
    assert_eq!(m["exit"]["classification"], "gpu_oom");
    let oom = &m["oom"];
    assert_eq!(oom["host"], "node-b");
    // cuda:0 inside node-b's job is NVML's GPU 1 there (CUDA_VISIBLE_DEVICES=1).
    assert_eq!(oom["gpu"], 1);
    assert_eq!(oom["rank"], 1);
    assert_eq!(oom["first_failure"]["rank"], 1);
    assert_eq!(oom["cause"], "too_big");
    let d = &m["diagnoses"][0];
    assert_eq!(d["rule"], "oom-too-big");
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .starts_with("GPU 1 on node-b:"),
        "{d}"
    );
    // node-a's rank waited on the lost peer until it was stopped: a failure, not an OOM of its own.
    let a = &m["hosts"][0];
    assert_eq!(
        (a["origin"]["host"].as_str(), a["classification"].as_str()),
        (Some("node-a"), Some("failure"))
    );
}

/// `gpudoc report FILES...`: exit code and stderr.
fn refused(files: &[PathBuf]) -> String {
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .args(files)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "refused: {err}");
    assert!(out.stdout.is_empty(), "no report made up");
    err
}

#[test]
fn unrelated_runs_are_refused_naming_the_files_and_what_differs() {
    // The H200 recordings of fixtures/runs: eighteen runs one after another, not one job's nodes.
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/runs");
    let err = refused(&[runs]);
    assert!(
        err.contains("is not part of the job of") && err.contains("nothing says they are one job"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let [a, b] = <[PathBuf; 2]>::try_from(job(
        dir.path(),
        &[
            ("node-a", &alloc(1), &nothing),
            ("node-b", &alloc(1), &nothing),
        ],
    ))
    .unwrap();
    // Two runs that merely started together: no name, Slurm step, launcher or ranks says they are one job.
    let (na, nb) = (dir.path().join("na.json"), dir.path().join("nb.json"));
    for (from, to) in [(&a, &na), (&b, &nb)] {
        let mut r: Value = read_json(from);
        r["origin"]["name"] = Value::Null;
        std::fs::write(to, r.to_string()).unwrap();
    }
    let err = refused(&[na, nb]);
    assert!(err.contains("nothing says they are one job"), "{err}");
    // Two runs given other names, though at the same time.
    let mut other: Value = read_json(&b);
    other["origin"]["name"] = "gpt".into();
    std::fs::write(&b, other.to_string()).unwrap();
    let err = refused(&[a.clone(), b.clone()]);
    assert!(
        err.contains(&format!(
            "{} is not part of the job of {}: --name `llama` and `gpt`",
            b.display(),
            a.display()
        )),
        "{err}"
    );
}

/// The tasks of Slurm job JOB's step 0, started at once as `srun --ntasks N` starts them (each a node: a
/// fake machine of its own, one H200, all with this machine's hostname): `gpudoc run --report-dir DIR --
/// fakegpu alloc` with rank K holding K+1 GiB, and the `SLURM_*` variables srun gives each task. The
/// ranks given.
fn srun(dir: &Path, job: &str, ranks: &[u32], tasks: u32) {
    let running: Vec<_> = ranks
        .iter()
        .map(|&k| {
            let m = Machine::h200s(1);
            let child = m
                .gpudoc()
                .args(["run", "--quiet", "--report-dir"])
                .arg(dir)
                .args(["--", "sh", "-c", &alloc(k + 1)])
                .env("SLURM_JOB_ID", job)
                .env("SLURM_STEP_ID", "0")
                .env("SLURM_NODEID", k.to_string())
                .env("SLURM_PROCID", k.to_string())
                .env("SLURM_NTASKS", tasks.to_string())
                .env_remove("TORCHELASTIC_RUN_ID")
                .env_remove("PMIX_NAMESPACE")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            (m, child)
        })
        .collect();
    for (_m, mut child) in running {
        assert!(child.wait().unwrap().success());
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_slurm_job_on_four_nodes_merges_into_one_report_from_its_report_dir() {
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().join("reports");
    srun(&reports, "4242", &[0, 1, 2, 3], 4);
    let host = nix::unistd::gethostname().unwrap();
    let host = host.to_string_lossy();
    // One report per task, named by the job's step, the host and the rank; nothing else left there.
    let want: Vec<String> = (0..4)
        .map(|k| format!("4242.0-{host}-rank{k}.json"))
        .collect();
    assert_eq!(names(&reports), want);
    let out = std::process::Command::new(common::gpudoc_bin())
        .arg("report")
        .arg(&reports)
        .args(["--json", "-"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["origin"]["slurm"]["job_id"], "4242");
    assert_eq!(r["origin"]["slurm"]["step_id"], "0");
    assert_eq!(r["origin"]["world_size"], 4);
    let hosts = r["hosts"].as_array().unwrap();
    let mut ranks: Vec<u64> = hosts
        .iter()
        .map(|h| h["origin"]["rank"].as_u64().unwrap())
        .collect();
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1, 2, 3]);
    // Every node's GPU, with the memory its rank held.
    let mut peaks: Vec<u64> = r["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["job_peak_bytes"].as_u64().unwrap() >> 30)
        .collect();
    peaks.sort_unstable();
    assert_eq!(peaks, [1, 2, 3, 4]);
    common::conforms("report", &r);
}

#[test]
fn a_report_dir_holding_another_job_or_another_attempt_is_refused_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().to_path_buf();
    srun(&reports, "4242", &[0, 1], 2);
    // A task of another job, given the same folder.
    srun(&reports, "4243", &[0], 1);
    let err = refused(std::slice::from_ref(&reports));
    let host = nix::unistd::gethostname().unwrap();
    let host = host.to_string_lossy();
    let (first, other) = (
        reports.join(format!("4242.0-{host}-rank0.json")),
        reports.join(format!("4243.0-{host}-rank0.json")),
    );
    assert!(
        err.contains(&format!(
            "{} is not part of the job of {}: Slurm job `4242` and `4243`",
            other.display(),
            first.display()
        )),
        "{err}"
    );
    std::fs::remove_file(&other).unwrap();
    // Rank 1 of job 4242 run again (a requeued job, a rerun): its report lands beside the first, never
    // over it, and the two attempts do not merge.
    srun(&reports, "4242", &[1], 2);
    let again = reports.join(format!("4242.0-{host}-rank1-2.json"));
    assert!(again.exists(), "{:?}", names(&reports));
    let err = refused(std::slice::from_ref(&reports));
    assert!(
        err.contains(&format!(
            "{} is not part of the job of {}: both are rank 1 of the launch",
            reports.join(format!("4242.0-{host}-rank1.json")).display(),
            again.display()
        )),
        "{err}"
    );
}

#[test]
fn a_report_dir_that_cannot_be_written_is_refused_before_the_job_or_failed_after_it() {
    let m = Machine::h200s(1);
    std::fs::write(m.path("file"), "").unwrap();
    let ran = m.path("ran");
    let run = |dir: &Path, script: &str| {
        m.gpudoc()
            .args(["run", "--quiet", "--report-dir"])
            .arg(dir)
            .args(["--", "sh", "-c", script])
            .output()
            .unwrap()
    };
    // A folder that cannot be made: refused before the command runs.
    let blocked = m.path("file").join("reports");
    let out = run(&blocked, &format!("touch {}", ran.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("gpudoc: --report-dir {}: ", blocked.display())),
        "{err}"
    );
    assert!(!ran.exists(), "the command ran");
    // A folder gone by the end: the command ran and succeeded, the report could not be written.
    let gone = m.path("reports");
    let out = run(&gone, &format!("rm -r {}", gone.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("gpudoc: --report-dir {}: ", gone.display())),
        "{err}"
    );
}
