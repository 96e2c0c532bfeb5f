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

/// `gpudoc watch --interval 100ms` on `m`, its JSON lines on a pipe.
fn on_a_pipe(m: &Machine) -> std::process::Child {
    m.gpudoc()
        .args(["watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_signal_that_stops_it_is_its_death() {
    // A supervisor or a script's `timeout` reads 128+N (or 124), not a clean 0, as of any program that
    // dies of a signal.
    use std::os::unix::process::ExitStatusExt;
    let m = Machine::h200s(1);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        let mut child = on_a_pipe(&m);
        // Its first line: it is looking, its handlers are in place.
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        unsafe { libc::kill(child.id() as i32, sig) };
        let status = child.wait().unwrap();
        assert_eq!(status.signal(), Some(sig), "{status:?}");
    }
}

#[test]
fn under_timeout_on_a_terminal_it_ends_when_the_time_is_up() {
    // `timeout` runs gpudoc in a process group of its own, in the terminal's background: the screen's raw
    // mode would stop it (SIGTTOU), drawing nothing and never taking the timeout's SIGTERM. It writes
    // lines instead, and ends at the timeout.
    let m = Machine::h200s(1);
    // The shell stays (no exec): `timeout` leads a group of its own only when it does not lead the session.
    let c = m.shell(r#"timeout 2 "$GPUDOC" watch --interval 200ms; echo "timeout said $?""#);
    let mut t = Term::start(c);
    t.expect("\"gpus\"");
    let (code, out) = t.finish();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("timeout said 124"), "{out}");
}

#[test]
fn on_a_pipe_it_prints_a_json_line_per_change() {
    let m = Machine::h200s(1);
    set(&m, 3);
    let mut child = on_a_pipe(&m);
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
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
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

/// `gpudoc watch` on a pipe with `args`: the first JSON line for which `want` holds, or `None` if none
/// came within 20 s.
fn watch_until(
    m: &Machine,
    args: &[&str],
    want: impl Fn(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    let mut child = m
        .gpudoc()
        .args(["watch", "--interval", "100ms"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // A watchdog, so a line that never comes ends the watch (and the test) instead of hanging it.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    std::thread::spawn(move || {
        let t0 = Instant::now();
        while !flag.load(std::sync::atomic::Ordering::SeqCst) {
            if t0.elapsed() > Duration::from_secs(20) {
                unsafe { libc::kill(pid, libc::SIGTERM) };
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let found = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .map(|l| serde_json::from_str::<serde_json::Value>(&l).unwrap())
        .find(|v| want(v));
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    unsafe { libc::kill(pid, libc::SIGTERM) };
    child.wait().unwrap();
    found
}

/// The diagnoses of a watch's JSON line by a rule.
fn by_rule<'a>(line: &'a serde_json::Value, rule: &str) -> Vec<&'a serde_json::Value> {
    line["diagnoses"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["rule"] == rule)
        .collect()
}

#[test]
fn a_nearly_full_gpu_is_diagnosed_by_the_near_capacity_rule_with_its_advice() {
    let m = Machine::h200s(1);
    set(&m, 139);
    let line = watch_until(&m, &[], |_| true).expect("a line");
    let d = by_rule(&line, "near-capacity");
    assert_eq!(d.len(), 1, "{line:#}");
    assert_eq!(d[0]["subject"], "GPU 0");
    assert!(
        d[0]["message"]
            .as_str()
            .unwrap()
            .starts_with("GPU 0: memory in use is 139.00 GiB, 99.0% of 140.40 GiB: "),
        "{:#}",
        d[0]
    );
    let advice = d[0]["advice"].as_array().unwrap();
    assert!(
        advice[0].as_str().unwrap().starts_with("Keep headroom"),
        "{advice:?}"
    );
    assert_eq!(d[0]["facts"]["gpu.peak_used_bytes"], 139u64 << 30);
}

/// A process whose command line starts with `name` holding `size` on GPU 0 for 20 s, left running.
fn playing(m: &Machine, name: &str, size: &str) -> u32 {
    m.orphan(
        &format!(r#"bash -c 'exec -a {name} "$FAKEGPU" alloc --steps {size} --hold-ms 20000'"#),
        None,
    )
}

/// Whether a watch line lists every one of `pids`.
fn lists(pids: &[u32]) -> impl Fn(&serde_json::Value) -> bool + '_ {
    move |l| {
        l["processes"]
            .as_array()
            .is_some_and(|ps| pids.iter().all(|pid| ps.iter().any(|p| p["pid"] == *pid)))
    }
}

#[test]
fn an_inference_server_that_fills_its_gpu_on_purpose_is_no_near_capacity_warning() {
    // A vLLM server takes 90% of the GPU at start (its KV cache): a look at it is no "nearly full" alarm.
    let m = Machine::h200s(1);
    let pid = playing(&m, "vllm", "136GiB");
    let line = watch_until(&m, &[], lists(&[pid]));
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let line = line.expect("a line with the server");
    assert!(
        line["gpus"][0]["used_bytes"].as_u64().unwrap() >= 136 << 30,
        "{line:#}"
    );
    assert!(by_rule(&line, "near-capacity").is_empty(), "{line:#}");
}

#[test]
fn a_process_beside_an_inference_server_is_still_warned_that_the_gpu_is_nearly_full() {
    // vLLM took 126 GiB of GPU 0; a training job has the 14 GiB it left. The server fills its share on
    // purpose, but the job beside it runs out at its next allocation: near capacity, in a look and in
    // the job's own run.
    let m = Machine::h200s(1);
    let server = playing(&m, "vllm", "126GiB");
    let job = playing(&m, "python", "10GiB");
    let line = watch_until(&m, &[], lists(&[server, job]));
    unsafe { libc::kill(job as i32, libc::SIGKILL) };
    let line = line.expect("a line with the server and the job");
    assert_eq!(by_rule(&line, "near-capacity").len(), 1, "{line:#}");
    let (_, r, err) = m.run_sh(&[], r#""$FAKEGPU" alloc --steps 11GiB --hold-ms 500"#);
    unsafe { libc::kill(server as i32, libc::SIGKILL) };
    assert!(
        common::diagnosis(&r, "near-capacity").is_some(),
        "{err}\n{:#}",
        r["diagnoses"]
    );
}

#[test]
fn disable_rule_switches_a_look_rule_off() {
    let m = Machine::h200s(1);
    set(&m, 139);
    let line = watch_until(&m, &["--disable-rule", "near-capacity"], |_| true).expect("a line");
    assert!(by_rule(&line, "near-capacity").is_empty(), "{line:#}");
    assert_eq!(line["processes"][0]["pid"], 4000000, "{line:#}");
}

#[test]
fn a_look_rule_of_the_users_fires_in_watch_and_a_broken_one_stops_it_before_it_starts() {
    let m = Machine::h200s(1);
    set(&m, 3);
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().to_str().unwrap();
    let busy = "id = \"busy\"\nseverity = \"info\"\ntitle = \"Busy\"\neach = \"gpu\"\nlook = true\n\
                when = \"run.look && gpu.peak_used_bytes >= 2 * GiB\"\n\
                message = \"{gpu.label} is busy: {fmt_bytes(gpu.peak_used_bytes)}\"\n";
    std::fs::write(dir.path().join("busy.toml"), busy).unwrap();
    let line = watch_until(&m, &["--rules", rules], |_| true).expect("a line");
    let d = by_rule(&line, "busy");
    assert_eq!(d.len(), 1, "{line:#}");
    assert_eq!(d[0]["message"], "GPU 0 is busy: 3.00 GiB");
    // A rule that names no fact: a usage error naming its file and line, before anything is shown.
    std::fs::write(
        dir.path().join("busy.toml"),
        busy.replace("peak_used", "peak_usd"),
    )
    .unwrap();
    let out = m
        .gpudoc()
        .args(["watch", "--format", "jsonl", "--rules", rules])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("busy.toml:6: when: unknown fact `gpu.peak_usd_bytes`"),
        "{err}"
    );
}

#[test]
fn a_leftover_is_diagnosed_with_its_verdict_why_and_memory() {
    let m = Machine::h200s(1);
    let pid = m.orphan(r#""$FAKEGPU" alloc --steps 2GiB --hold-ms 60000"#, None);
    let line = watch_until(&m, &[], |v| !by_rule(v, "leftover-holder").is_empty());
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let line = line.expect("a leftover diagnosed");
    let d = by_rule(&line, "leftover-holder");
    assert_eq!(
        (&d[0]["subject"], &d[0]["pid"]),
        (&format!("pid {pid}").into(), &pid.into())
    );
    let message = d[0]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("pid {pid} (")) && message.ends_with("; it holds 2.00 GiB"),
        "{message}"
    );
    assert!(message.contains(") is an orphan: "), "{message}");
}

#[test]
fn a_small_context_on_a_second_gpu_is_a_stray_context() {
    let m = Machine::h200s(2);
    set(&m, 20);
    common::succeed(m.fakegpu().args([
        "set", "--pid", "4000000", "--gpu", "1", "--bytes", "512MiB", "--ghost",
    ]));
    let line = watch_until(&m, &[], |_| true).expect("a line");
    let d = by_rule(&line, "stray-context");
    assert_eq!(d.len(), 1, "{line:#}");
    assert_eq!(d[0]["subject"], "pid 4000000");
    assert!(
        d[0]["message"]
            .as_str()
            .unwrap()
            .contains("works on GPU 0 (20.00 GiB) but also holds 512.00 MiB on GPU 1"),
        "{:#}",
        d[0]
    );
    // The rule's own: the GPU it is about, and what to do.
    assert_eq!(d[0]["gpu"], "GPU 0");
    let advice = d[0]["advice"][0].as_str().unwrap_or_default();
    assert!(
        advice.starts_with("Call torch.cuda.set_device"),
        "{:#}",
        d[0]
    );
}
