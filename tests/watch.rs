//! `gpudoc watch` in a pseudo-terminal (it draws, redraws when memory changes, quits on `q` and Ctrl-C and
//! gives the terminal back) and as JSON lines on a pipe.

mod common;

use common::Machine;
use common::term::Term;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

const LEAVE_ALTERNATE_SCREEN: &str = "\x1b[?1049l";
const SHOW_CURSOR: &str = "\x1b[?25h";

/// A process outside the job holding memory on GPU 0: a ghost (NVML lists it, /proc has no such pid).
fn set(m: &Machine, gib: u64) {
    common::succeed(m.fakegpu().args([
        "set",
        "--pid",
        "4000000",
        "--gpu",
        "0",
        "--bytes",
        &format!("{gib}GiB"),
        "--ghost",
    ]));
}

#[test]
fn the_screen_draws_redraws_and_quits_on_q_giving_the_terminal_back() {
    let m = Machine::h200s(2);
    set(&m, 3);
    let mut c = m.gpudoc();
    c.args(["watch", "--interval", "200ms"]);
    let mut t = Term::start(c);
    t.expect("GPU 0 NVIDIA H200");
    t.expect("4000000");
    t.expect("3.00 GiB");
    t.expect("ghost");
    set(&m, 7);
    t.expect("7.00 GiB");
    t.type_bytes(b"s");
    t.expect("sort: pid");
    t.type_bytes(b"q");
    let (code, out) = t.finish();
    assert_eq!(code, 0, "{out}");
    assert!(
        out.ends_with(&format!("{SHOW_CURSOR}{LEAVE_ALTERNATE_SCREEN}")),
        "{out:?}"
    );
}

#[test]
fn ctrl_c_quits_too() {
    let m = Machine::h200s(1);
    let mut c = m.gpudoc();
    c.args(["watch", "--interval", "200ms"]);
    let mut t = Term::start(c);
    t.expect("GPU 0 NVIDIA H200");
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert_eq!(code, 0);
    assert!(out.contains(LEAVE_ALTERNATE_SCREEN), "{out:?}");
}

#[test]
fn on_a_pipe_it_prints_a_json_line_per_change() {
    let m = Machine::h200s(1);
    set(&m, 3);
    let mut child = m
        .gpudoc()
        .args(["watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next =
        || -> serde_json::Value { serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap() };
    let first = next();
    assert_eq!(first["gpus"][0]["name"], "NVIDIA H200");
    assert_eq!(first["processes"][0]["pid"], 4000000);
    assert_eq!(first["processes"][0]["verdict"], "ghost");
    assert_eq!(first["processes"][0]["gpu_bytes"][0][1], 3u64 << 30);
    assert!(first["unix_s"].as_f64().unwrap() > 1.7e9);
    let t0 = Instant::now();
    set(&m, 5);
    let second = next();
    assert_eq!(second["processes"][0]["gpu_bytes"][0][1], 5u64 << 30);
    assert!(t0.elapsed() < Duration::from_secs(5));
    // Nothing changed since: no line until the next change.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(status.success());
}

#[test]
fn e_ends_a_leftover_after_asking() {
    let m = Machine::h200s(1);
    let pid = m.orphan(r#""$FAKEGPU" alloc --steps 2GiB --hold-ms 60000"#, None);
    let mut c = m.gpudoc();
    c.args(["watch", "--interval", "200ms"]);
    let mut t = Term::start(c);
    t.expect("orphan");
    // The leftover holds the most memory: it is the first row, selected.
    t.type_bytes(b"e");
    t.expect(&format!("end pid {pid}"));
    t.type_bytes(b"y");
    t.expect(&format!("pid {pid}: ended (SIGTERM)"));
    t.type_bytes(b"q");
    let (code, _) = t.finish();
    assert_eq!(code, 0);
    assert!(!fake_nvml::state::alive(pid), "pid {pid} ended");
}

#[test]
fn what_a_run_in_a_script_left_shows_as_a_leftover() {
    // The script's shell still leads the leftover's process group, so only the run's record tells
    // that nothing will come back for it, as `gpudoc orphans` says.
    let m = Machine::h200s(1);
    let (mut script, r) = m.script_with_a_leftover("");
    let pid = r["orphans"][0]["pid"].as_u64().unwrap();
    let mut child = m
        .gpudoc()
        .args(["watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .next()
        .unwrap()
        .unwrap();
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();
    script.kill().unwrap();
    script.wait().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let first: serde_json::Value = serde_json::from_str(&line).unwrap();
    let p = first["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid}: {line}"));
    assert_eq!(p["verdict"], "orphan", "{line}");
    assert!(
        p["reason"]
            .as_str()
            .unwrap()
            .starts_with("left running by `gpudoc run sh -c "),
        "{line}"
    );
}

#[test]
fn it_shows_when_a_run_in_progress_forecasts_a_gpu_full() {
    let m = Machine::h200s(1);
    // A job under gpudoc run keeping 64 MiB more every step of 50 ms, on the fake torch.
    let mut job = m
        .gpudoc()
        .env("PYTHONPATH", common::fake_torch())
        .args(["run", "--quiet", "--", "python3"])
        .arg(common::fake_torch().join("forecast.py"))
        .args(["leak", "300", "0.05"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut watch = m
        .gpudoc()
        .args(["watch", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut seen = None;
    for line in lines {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        if let Some(f) = v["forecasts"].as_array().and_then(|f| f.first()) {
            seen = Some((f.clone(), v["diagnoses"].clone()));
            break;
        }
    }
    unsafe { libc::kill(watch.id() as i32, libc::SIGTERM) };
    watch.wait().unwrap();
    unsafe { libc::kill(job.id() as i32, libc::SIGTERM) };
    job.wait().unwrap();
    let (f, diagnoses) = seen.expect("a forecast before the job ended");
    assert_eq!(f["gpu"], 0);
    assert_eq!(f["rule"], "step-leak");
    assert!(f["full_in_s"].as_f64().unwrap() > 30.0, "{f:#}");
    let d = diagnoses
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["rule"] == "forecast")
        .unwrap_or_else(|| panic!("{diagnoses:#}"));
    assert!(
        d["message"]
            .as_str()
            .unwrap()
            .starts_with("GPU 0 will be full in ~"),
        "{d:#}"
    );
}
