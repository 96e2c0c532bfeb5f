//! `--metrics`: a real Prometheus server (Debian's `prometheus` package; .ci/run installs it) scrapes
//! `gpudoc run --metrics` under the fake NVML, and its HTTP API gives back the series and their values;
//! `promtool check metrics` passes on gpudoc's output.

mod common;

use common::http::{Killed, free_port, get, wait_for};
use common::{Machine, tool};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};

const GIB: u64 = 1 << 30;

/// A job holding 3 GiB on GPU 1 for a few seconds under `gpudoc run --metrics PORT --name NAME`, as task
/// 0 of Slurm job 4242's step 0.
fn metered_job(m: &Machine, port: u16, extra: &[&str], hold_ms: u64) -> Killed {
    let script = format!(r#""$FAKEGPU" alloc --gpu 1 --steps 3GiB --hold-ms {hold_ms}"#);
    Killed(
        m.gpudoc()
            .args([
                "run",
                "--quiet",
                "--metrics",
                &port.to_string(),
                "--name",
                "llama-7b",
            ])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .env("SLURM_JOB_ID", "4242")
            .env("SLURM_STEP_ID", "0")
            .env("SLURM_PROCID", "0")
            .env_remove("TORCHELASTIC_RUN_ID")
            .env_remove("PMIX_NAMESPACE")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

#[test]
fn prometheus_scrapes_a_run_and_its_api_gives_the_series_back() {
    let m = Machine::h200s(2);
    let port = free_port();
    let (_prom, pport) = prometheus(&m, port);
    let _job = metered_job(&m, port, &[], 15_000);
    let query = |q: &str| query(pport, q);
    let job = wait_for("the job's memory in Prometheus", 30, || {
        let r = query("gpudoc_job_memory_bytes%7Bgpu%3D%221%22%7D")?;
        (r[0]["value"][1] == format!("{}", 3 * GIB)).then_some(r)
    });
    let labels = &job[0]["metric"];
    assert_eq!(labels["job_name"], "llama-7b");
    // The job's id, the same on each of its nodes, so a query takes all its ranks together.
    assert_eq!(labels["job_id"], "4242.0");
    assert_eq!(labels["name"], "NVIDIA H200");
    assert!(!labels["host"].as_str().unwrap().is_empty());
    let procs = query("gpudoc_process_memory_bytes").unwrap();
    assert_eq!(procs.len(), 1, "{procs:#?}");
    assert_eq!(procs[0]["metric"]["in_job"], "true");
    assert_eq!(procs[0]["value"][1], format!("{}", 3 * GIB));
    let total = query("gpudoc_gpu_memory_total_bytes").unwrap();
    assert_eq!(total.len(), 2);
    let samples = query("gpudoc_samples_total%7Bkind%3D%22device%22%7D").unwrap();
    assert!(
        samples[0]["value"][1]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );
}

/// A real Prometheus scraping `port` every second; its API's port.
fn prometheus(m: &Machine, port: u16) -> (Killed, u16) {
    let pport = free_port();
    let config = m.path("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: gpudoc\n    \
             static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    )
    .unwrap();
    let prom = Killed(
        Command::new(tool("prometheus"))
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", m.path("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{pport}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    (prom, pport)
}

/// The series Prometheus gives for `query` (URL-encoded), if any.
fn query(pport: u16, q: &str) -> Option<Vec<Value>> {
    let (_, body) = get(pport, &format!("/api/v1/query?query={q}"), "*/*")?;
    let v: Value = serde_json::from_str(&body).ok()?;
    let r = v["data"]["result"].as_array()?.clone();
    (!r.is_empty()).then_some(r)
}

#[test]
fn prometheus_sees_the_forecast_of_a_leaking_job() {
    let m = Machine::h200s(1);
    let port = free_port();
    let (_prom, pport) = prometheus(&m, port);
    // 64 MiB kept every step of 50 ms, for 20 s: the GPU is minutes from full.
    let _job = Killed(
        m.gpudoc()
            .env("PYTHONPATH", common::fake_torch())
            .args(["run", "--quiet", "--metrics", &port.to_string(), "--"])
            .arg("python3")
            .arg(common::fake_torch().join("forecast.py"))
            .args(["leak", "400", "0.05"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let full = wait_for("the forecast in Prometheus", 30, || {
        query(pport, "gpudoc_forecast_full_seconds%7Bgpu%3D%220%22%7D")
    });
    let secs: f64 = full[0]["value"][1].as_str().unwrap().parse().unwrap();
    assert!(secs > 30.0 && secs < 3600.0, "{full:#?}");
    let known = query(pport, "gpudoc_diagnosis_known_seconds").unwrap();
    assert_eq!(known[0]["metric"]["rule"], "step-leak", "{known:#?}");
}

#[test]
fn promtool_accepts_the_exposition_and_openmetrics_is_served_when_asked() {
    let (promtool, m) = (tool("promtool"), Machine::h200s(1));
    let port = free_port();
    let _job = metered_job(&m, port, &[], 5_000);
    let body = wait_for("gpudoc's /metrics", 10, || {
        let (status, body) = get(port, "/metrics", "text/plain")?;
        (status.contains("200") && body.contains("gpudoc_job_memory_bytes")).then_some(body)
    });
    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    check
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (_, om) = get(
        port,
        "/metrics",
        "application/openmetrics-text; version=1.0.0",
    )
    .unwrap();
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE gpudoc_samples counter"), "{om}");
    let (status, _) = get(port, "/other", "*/*").unwrap();
    assert!(status.contains("404"), "{status}");
}

#[test]
fn the_end_of_the_run_is_served_while_it_lingers() {
    let m = Machine::h200s(1);
    let port = free_port();
    let _job = metered_job(&m, port, &["--metrics-linger", "5s"], 300);
    // Once the job has ended its memory is back to 0, and gpudoc still answers.
    let body = wait_for("the finished run's view", 15, || {
        let (_, body) = get(port, "/metrics", "text/plain")?;
        body.contains("gpudoc_job_memory_bytes{").then_some(())?;
        body.lines()
            .any(|l| l.starts_with("gpudoc_job_memory_bytes{") && l.ends_with(" 0"))
            .then_some(body)
    });
    assert!(body.contains("gpudoc_oom_reports_total{"), "{body}");
}

#[test]
fn a_port_that_is_taken_leaves_the_job_running_without_the_endpoint() {
    // One gpudoc per rank on a node, all given the same port: the job runs, each gpudoc that could not
    // bind says so once, and its report keeps it.
    let m = Machine::h200s(1);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let (marker, json) = (m.path("ran"), m.path("r.json"));
    let out = m
        .gpudoc()
        .args(["run", "-q", "--metrics", &port.to_string(), "--json"])
        .arg(&json)
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}; exit 3", marker.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "the command's own code");
    assert!(marker.exists(), "the command ran");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("without the endpoint").count(),
        1,
        "said once: {err}"
    );
    assert!(
        err.contains(&format!("--metrics 127.0.0.1:{port}")),
        "{err}"
    );
    let notes = common::read_json(&json)["notes"].to_string();
    assert!(notes.contains("ran without the endpoint"), "{notes}");
}

#[test]
fn watch_with_metrics_and_no_terminal_is_a_node_exporter() {
    let m = Machine::h200s(1);
    let status = m
        .fakegpu()
        .args([
            "set", "--pid", "4000000", "--gpu", "0", "--bytes", "2GiB", "--ghost",
        ])
        .status()
        .unwrap();
    assert!(status.success());
    let port = free_port();
    let mut child = Killed(
        m.gpudoc()
            .args([
                "watch",
                "--interval",
                "100ms",
                "--metrics",
                &port.to_string(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let body = wait_for("watch's /metrics", 10, || {
        let (_, body) = get(port, "/metrics", "text/plain")?;
        body.contains("gpudoc_process_memory_bytes{")
            .then_some(body)
    });
    assert!(
        body.lines()
            .any(|l| l.starts_with("gpudoc_process_memory_bytes{")
                && l.contains("pid=\"4000000\"")
                && l.contains("verdict=\"ghost\"")
                && l.ends_with(&format!(" {}", 2 * GIB))),
        "{body}"
    );
    assert!(
        !body.contains("gpudoc_job_memory_bytes"),
        "no job in watch: {body}"
    );
    // Each look reads the GPU: the counter docs/metrics.md promises counts them (it stayed 0).
    let samples = |body: &str| -> f64 {
        body.lines()
            .find(|l| l.starts_with("gpudoc_samples_total{") && l.contains("kind=\"device\""))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let first = samples(&body);
    assert!(first >= 1.0, "{body}");
    wait_for("more looks counted", 10, || {
        let (_, body) = get(port, "/metrics", "text/plain")?;
        (samples(&body) > first).then_some(())
    });
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let mut out = String::new();
    let mut stdout = child.0.stdout.take().unwrap();
    stdout.read_to_string(&mut out).unwrap();
    // A signal death, as of any program a signal ends (systemd counts SIGTERM's as a clean stop).
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(child.0.wait().unwrap().signal(), Some(libc::SIGTERM));
    assert!(out.is_empty(), "an exporter prints nothing: {out}");
}

#[test]
fn watch_counts_each_diagnosis_its_looks_found_once_after_it_stops_holding() {
    // A GPU 97% full is near-capacity in a look; `gpudoc_diagnoses_total` had no sample under watch.
    let m = Machine::h200s(1);
    let hold = |bytes: &str| {
        let status = m
            .fakegpu()
            .args([
                "set", "--pid", "4000000", "--gpu", "0", "--bytes", bytes, "--ghost",
            ])
            .status()
            .unwrap();
        assert!(status.success());
    };
    hold("136GiB");
    let port = free_port();
    let _watch = Killed(
        m.gpudoc()
            .args([
                "watch",
                "--interval",
                "100ms",
                "--metrics",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let counted = |body: &str| -> Option<f64> {
        body.lines()
            .find(|l| {
                l.starts_with("gpudoc_diagnoses_total{") && l.contains("rule=\"near-capacity\"")
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    };
    let body = wait_for("near-capacity counted", 10, || {
        let (_, body) = get(port, "/metrics", "text/plain")?;
        counted(&body).map(|_| body)
    });
    assert_eq!(counted(&body), Some(1.0), "{body}");
    assert!(
        body.contains("# TYPE gpudoc_diagnoses_total counter"),
        "{body}"
    );
    // Once the GPU is nearly empty the diagnosis no longer holds, and the counter keeps its one.
    hold("1GiB");
    let body = wait_for("near-capacity no longer active", 10, || {
        let (_, body) = get(port, "/metrics", "text/plain")?;
        let active = body.lines().any(|l| {
            l.starts_with("gpudoc_diagnosis_active{") && l.contains("rule=\"near-capacity\"")
        });
        (!active).then_some(body)
    });
    assert_eq!(counted(&body), Some(1.0), "{body}");
}
