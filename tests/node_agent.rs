//! The node agent deploy/ ships: the systemd unit and the Kubernetes DaemonSet that run `gpudoc watch
//! --metrics` on every GPU node. Each file's command line is run as gpudoc's own CLI against the fake NVML
//! and scraped; the unit passes `systemd-analyze verify` where the machine has it; the properties a user
//! depends on (the host's PIDs, no privileges beyond two capabilities, the scraped port being the served
//! one) are asserted on the files as written.

mod common;

use common::Machine;
use common::http::{Killed, free_port, get, wait_for};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

/// The port of a `--metrics` address (`HOST:PORT` or `PORT`).
fn port_of(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// Runs a deployment's command line (`argv[0]` a path to gpudoc) as the built gpudoc against one fake
/// H200 with a ghost holding 2 GiB, its `--metrics` port moved to a free one; scrapes it once it serves
/// that process, then stops it as systemd and the kubelet do (SIGTERM). The scrape's body.
fn serve_and_scrape(argv: &[String]) -> String {
    assert!(
        argv[0].ends_with("/gpudoc"),
        "the command runs gpudoc: {argv:?}"
    );
    let mut args = argv[1..].to_vec();
    let at = args.iter().position(|a| a == "--metrics").unwrap() + 1;
    let port = free_port();
    let host = args[at].rsplit_once(':').map_or("127.0.0.1", |(h, _)| h);
    args[at] = format!("{host}:{port}");
    let m = Machine::h200s(1);
    let set = m
        .fakegpu()
        .args([
            "set", "--pid", "4000000", "--gpu", "0", "--bytes", "2GiB", "--ghost",
        ])
        .status()
        .unwrap();
    assert!(set.success());
    let mut child = Killed(
        m.gpudoc()
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let body = wait_for(&format!("/metrics of {args:?}"), 15, || {
        if let Some(status) = child.0.try_wait().unwrap() {
            let mut err = String::new();
            child
                .0
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("{args:?} exited ({status}) instead of serving: {err}");
        }
        let (_, body) = get(port, "/metrics", "text/plain")?;
        body.contains("pid=\"4000000\"").then_some(body)
    });
    unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) };
    let mut out = String::new();
    child
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child.0.wait().unwrap();
    assert!(out.is_empty(), "a node agent prints nothing: {out}");
    body
}

/// The unit's `Key=value` lines, in order (a key may repeat), less comments.
fn unit_entries(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with('['))
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn words(v: &str) -> BTreeSet<String> {
    v.split_whitespace().map(String::from).collect()
}

#[test]
fn the_systemd_unit_is_hardened_and_keeps_only_what_reading_nvml_and_proc_needs() {
    let text = std::fs::read_to_string(deploy("systemd/gpudoc-watch.service")).unwrap();
    let entries = unit_entries(&text);
    let all = |key: &str| -> Vec<&str> {
        entries
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let one = |key: &str| -> &str {
        let v = all(key);
        assert_eq!(v.len(), 1, "{key}= once: {v:?}");
        v[0]
    };
    assert_eq!(one("Restart"), "always");
    for (key, value) in [
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "read-only"),
        ("PrivateTmp", "yes"),
        ("DevicePolicy", "closed"),
    ] {
        assert_eq!(one(key), value, "{key}");
    }
    let needed = words("CAP_DAC_READ_SEARCH CAP_SYS_PTRACE");
    assert_eq!(words(one("CapabilityBoundingSet")), needed);
    assert_eq!(words(one("AmbientCapabilities")), needed);
    // What would hide the GPUs or the other users' processes (each then a ghost) is not set.
    for (key, breaks) in [
        ("PrivateDevices", "yes"),
        ("ProtectProc", "invisible"),
        ("ProtectProc", "noaccess"),
        ("PrivateUsers", "yes"),
        ("User", "root"),
    ] {
        assert!(!all(key).contains(&breaks), "{key}={breaks}");
    }
    let devices: Vec<&str> = all("DeviceAllow");
    for dev in ["/dev/nvidiactl rw", "char-nvidia-frontend rw"] {
        assert!(devices.contains(&dev), "DeviceAllow={dev}: {devices:?}");
    }
    let exec = one("ExecStart");
    assert!(
        !exec.contains(['"', '\'', '$', '%']),
        "split as written: {exec}"
    );
    let argv: Vec<String> = exec.split_whitespace().map(String::from).collect();
    let body = serve_and_scrape(&argv);
    assert!(body.contains("gpudoc_gpu_memory_used_bytes{"), "{body}");
}

#[test]
fn systemd_analyze_verifies_the_unit() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("no systemd-analyze here: the unit's ExecStart is still run by the test above");
        return;
    }
    let text = std::fs::read_to_string(deploy("systemd/gpudoc-watch.service")).unwrap();
    // `verify` checks that the program exists: the built gpudoc stands where the unit installs it.
    let dir = tempfile::tempdir().unwrap();
    let unit = dir.path().join("gpudoc-watch.service");
    let built = env!("CARGO_BIN_EXE_gpudoc");
    std::fs::write(&unit, text.replace("/usr/local/bin/gpudoc", built)).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // An unknown or misspelt key is only a warning: nothing said is the pass.
    assert!(out.status.success() && said.is_empty(), "{said}");
}

/// The YAML documents of a manifest, as JSON values.
fn manifest(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy(path)).unwrap();
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).unwrap())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// The container's command line as the kubelet runs it: `command` then `args`, each `$(VAR)` of its `env`
/// expanded (the downward API's values given in `fields`).
fn kube_argv(container: &Value, fields: &[(&str, &str)]) -> Vec<String> {
    let mut argv = strings(&container["command"]);
    argv.extend(strings(&container["args"]));
    for env in container["env"].as_array().unwrap() {
        let name = env["name"].as_str().unwrap();
        let value = match env["value"].as_str() {
            Some(v) => v.to_string(),
            None => {
                let field = env["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap();
                let (_, v) = fields.iter().find(|(f, _)| *f == field).unwrap();
                v.to_string()
            }
        };
        for a in &mut argv {
            *a = a.replace(&format!("$({name})"), &value);
        }
    }
    argv
}

#[test]
fn the_daemonset_sees_the_hosts_processes_and_gpus_without_privileges() {
    let docs = manifest("kubernetes/gpudoc-daemonset.yaml");
    let pod = &of_kind(&docs, "DaemonSet")["spec"]["template"];
    let spec = &pod["spec"];
    assert_eq!(spec["hostPID"], true, "else every process is a ghost");
    assert_ne!(spec["hostNetwork"], true);
    assert_eq!(spec["runtimeClassName"], "nvidia");
    let containers = spec["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(env("NVIDIA_VISIBLE_DEVICES"), Some("all".into()));
    let resources = c["resources"].to_string();
    assert!(
        !resources.contains("nvidia.com/gpu"),
        "it takes no GPU from the jobs: {resources}"
    );
    let sc = &c["securityContext"];
    assert_ne!(sc["privileged"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let added: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
    assert_eq!(added, words("DAC_READ_SEARCH SYS_PTRACE"));

    // The port scraped is the one served: the container's, the annotation's and the Service's.
    let argv = kube_argv(c, &[("spec.nodeName", "gpu-node-7")]);
    let at = argv.iter().position(|a| a == "--metrics").unwrap() + 1;
    let served = port_of(&argv[at]);
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .unwrap();
    assert_eq!(port["containerPort"], served);
    assert_eq!(
        pod["metadata"]["annotations"]["prometheus.io/port"],
        served.to_string()
    );
    let service = &of_kind(&docs, "Service")["spec"];
    assert_eq!(service["selector"], pod["metadata"]["labels"]);
    assert_eq!(service["ports"][0]["targetPort"], "metrics");
    assert_eq!(service["ports"][0]["port"], served);
    let monitor = &manifest("kubernetes/gpudoc-servicemonitor.yaml")[0]["spec"];
    assert_eq!(
        monitor["selector"]["matchLabels"],
        of_kind(&docs, "Service")["metadata"]["labels"]
    );
    assert_eq!(monitor["endpoints"][0]["port"], "metrics");

    // Its command line is gpudoc's, and names each series by the node, not by the pod.
    let body = serve_and_scrape(&argv);
    assert!(
        body.lines()
            .filter(|l| l.starts_with("gpudoc_"))
            .all(|l| l.contains("host=\"gpu-node-7\"")),
        "{body}"
    );
}
