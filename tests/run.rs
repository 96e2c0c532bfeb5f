//! `gpudoc run` end to end: the real binary, a fake NVML, real child processes.

mod common;

use common::{Machine, read_json};
use fake_nvml::state::{GIB, State};
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn exit_codes_pass_through() {
    let m = Machine::h200s(1);
    for (script, want) in [
        ("exit 0", 0),
        ("exit 3", 3),
        ("kill -TERM $$", 128 + 15),
        ("kill -KILL $$", 128 + 9),
    ] {
        let (code, report, _) = m.run_sh(&["--quiet"], script);
        assert_eq!(code, want, "{script}");
        assert_eq!(report["exit"]["code"], want, "{script}");
    }
    let (_, report, _) = m.run_sh(&["--quiet"], "kill -TERM $$");
    assert_eq!(report["exit"]["signal"], 15);
}

#[test]
fn a_command_killed_by_a_signal_kills_gpudoc_with_it() {
    // A shell stops a loop, and `make` stops, only when its child died of SIGINT itself: gpudoc must not
    // turn the command's death by a signal into an exit code.
    use std::os::unix::process::ExitStatusExt;
    let m = Machine::h200s(1);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGKILL, libc::SIGSEGV] {
        let out = m
            .gpudoc()
            .args(["run", "-q", "--", "sh", "-c"])
            .arg(format!("kill -{sig} $$"))
            .output()
            .unwrap();
        assert_eq!(out.status.signal(), Some(sig), "{out:?}");
        assert!(
            !out.status.core_dumped(),
            "gpudoc's own core is not the job's"
        );
    }
    // A loop of runs stops at Ctrl-C (SIGINT to the whole foreground group, the shell included): bash
    // stops only when its child died of SIGINT too.
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let mut bash =
        m.shell(r#"for i in 1 2 3; do echo run $i; "$GPUDOC" run -q -- sleep 5; done; echo after"#);
    bash.process_group(0).stdout(Stdio::piped());
    let mut child = bash.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "run 1");
    std::thread::sleep(Duration::from_millis(700));
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let rest: Vec<String> = lines.map(|l| l.unwrap()).collect();
    let status = child.wait().unwrap();
    assert_eq!(rest, Vec::<String>::new(), "the loop went on");
    assert_eq!(status.signal(), Some(libc::SIGINT));
}

#[test]
fn own_failures_use_their_own_codes() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["run", "--", "no-such-command-xyz"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-command-xyz: command not found")
    );

    let script = m.path("not-executable.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    let out = m
        .gpudoc()
        .arg("run")
        .arg("--")
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(126));

    // An unknown flag is a run failure (125), also after a global option with its value.
    for args in [
        &["run", "--no-such-flag", "--", "true"][..],
        &["--color", "never", "run", "--bogus", "--", "true"],
        &["--color=never", "run", "--bogus"],
    ] {
        let out = m.gpudoc().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(125), "{args:?}");
    }
    let out = m
        .gpudoc()
        .args(["run", "--interval", "soon", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--interval"));
    let out = m
        .gpudoc()
        .args(["run", "--json", "/no/such/dir/r.json", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/dir"));
}

/// Starts `gpudoc run --quiet [extra] -- sh -c SCRIPT` and waits for the child to print `ready`.
fn start_ready(
    m: &Machine,
    extra: &[&std::ffi::OsStr],
    script: &str,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = m
        .gpudoc()
        .args(["run", "--quiet"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, out)
}

#[test]
fn signals_are_forwarded_to_the_child() {
    let m = Machine::h200s(1);
    for (sig, name) in [
        (libc::SIGTERM, "TERM"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
    ] {
        let script = format!(
            "trap 'echo got {name}; exit 7' {name}; echo ready; while :; do sleep 0.02; done"
        );
        let (mut child, mut out) = start_ready(&m, &[], &script);
        unsafe { libc::kill(child.id() as i32, sig) };
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, format!("got {name}\n"));
        assert_eq!(child.wait().unwrap().code(), Some(7), "{name}");
    }
    let json = m.path("r.json");
    let script = "trap 'exit 0' USR2; echo ready; while :; do sleep 0.02; done";
    let (mut child, _out) = start_ready(&m, &["--json".as_ref(), json.as_os_str()], script);
    unsafe { libc::kill(child.id() as i32, libc::SIGUSR2) };
    child.wait().unwrap();
    assert_eq!(
        read_json(&json)["exit"]["forwarded_signals"],
        serde_json::json!(["SIGUSR2"])
    );
}

#[test]
fn job_memory_counts_descendants_and_not_others() {
    let m = Machine::h200s(1);
    // Another user's process on the same GPU: this test process, holding 5 GiB.
    let me = std::process::id().to_string();
    let st = m
        .fakegpu()
        .args(["set", "--pid", &me, "--bytes", "5GiB"])
        .status()
        .unwrap();
    assert!(st.success());
    // A grandchild (sh → sh → fakegpu) and an orphan whose parent subshell exits at once.
    let script = r#"
        ( "$FAKEGPU" alloc --steps 1GiB --hold-ms 600 & )
        sh -c '"$FAKEGPU" alloc --steps 2GiB --hold-ms 400 & wait'
        wait; sleep 0.3
    "#;
    let (code, r, _) = m.run_sh(&["--quiet"], script);
    assert_eq!(code, 0);
    let gpu = &r["gpus"][0];
    assert_eq!(
        gpu["job_peak_bytes"],
        3 * GIB,
        "grandchild and orphan both count: {r:#}"
    );
    assert_eq!(gpu["peak_used_bytes"], 8 * GIB);
    assert_eq!(
        gpu["start_used_bytes"],
        5 * GIB,
        "in use by others before the job"
    );
    let procs = r["processes"].as_array().unwrap();
    let foreign = procs
        .iter()
        .find(|p| p["pid"] == std::process::id())
        .unwrap();
    assert_eq!(foreign["in_job"], false);
    assert_eq!(procs.iter().filter(|p| p["in_job"] == true).count(), 2);
    assert!(procs.iter().any(|p| {
        p["in_job"] == true
            && p["cmdline"]
                .as_str()
                .unwrap()
                .contains("alloc --steps 2GiB")
            && p["peak_bytes"] == 2 * GIB
    }));
}

#[test]
fn peak_is_exact_and_timeline_follows_the_steps() {
    let m = Machine::h200s(2);
    let script =
        r#""$FAKEGPU" alloc --gpu 1 --steps 1GiB,5GiB,2GiB,0 --step-ms 150 --hold-ms 100 & wait"#;
    let trace = m.path("trace.jsonl");
    let (_, r, _) = m.run_sh(&["--quiet", "--trace", trace.to_str().unwrap()], script);
    assert_eq!(r["gpus"][1]["job_peak_bytes"], 5 * GIB);
    assert_eq!(r["gpus"][1]["peak_used_bytes"], 5 * GIB);
    assert_eq!(r["gpus"][0]["job_peak_bytes"], 0);
    assert_eq!(r["gpus"][1]["job_final_bytes"], 0);
    // The trace holds every step, in order, for the process.
    let text = std::fs::read_to_string(&trace).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows[0]["schema"], "gpudoc.trace/2");
    assert_eq!(rows[0]["gpus"][1]["name"], "NVIDIA H200");
    assert_eq!(rows[0]["nvml"]["driver"], "580.159.04");
    // Read back, the trace gives the same peak and names the driver.
    let out = m
        .gpudoc()
        .arg("report")
        .arg(&trace)
        .args(["--json", "-"])
        .output()
        .unwrap();
    let back: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(back["gpus"][1]["job_peak_bytes"], 5 * GIB);
    assert_eq!(back["nvml"]["driver"], "580.159.04");
    assert_eq!(back["exit"], r["exit"]);
    let steps: Vec<u64> = rows
        .iter()
        .filter(|r| r["kind"] == "process" && r["gpu"] == 1)
        .map(|r| r["used"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, vec![GIB, 5 * GIB, 2 * GIB, 0]);
    let device: Vec<u64> = rows
        .iter()
        .filter(|r| r["kind"] == "device" && r["gpu"] == 1)
        .map(|r| r["used"].as_u64().unwrap())
        .collect();
    // The first device read may come before or after the first step on a
    // busy machine; after it, one row per change and none in between.
    let from_first_step = device.strip_prefix(&[0]).unwrap_or(&device);
    assert_eq!(
        from_first_step,
        [GIB, 5 * GIB, 2 * GIB, 0],
        "device rows are written on change only: {device:?}"
    );
}

#[test]
fn csv_trace_has_nvidia_smi_columns() {
    let m = Machine::h200s(1);
    let trace = m.path("trace.csv");
    let (_, _, _) = m.run_sh(
        &["--quiet", "--trace", trace.to_str().unwrap()],
        r#""$FAKEGPU" alloc --steps 3GiB --hold-ms 100 & wait"#,
    );
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next().unwrap(),
        "timestamp, index, memory.used [MiB], memory.total [MiB], pid, used_memory [MiB], in_job"
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(", ").collect()).collect();
    assert!(
        rows.iter()
            .any(|r| r[1] == "0" && r[2] == "3072" && r[3] == "143771"),
        "{text}"
    );
    assert!(
        rows.iter()
            .any(|r| r[4].parse::<u32>().is_ok() && r[5] == "3072" && r[6] == "yes"),
        "{text}"
    );
    // nvidia-smi's timestamp format: 2026/11/29 15:40:06.123
    let ts = rows[0][0];
    assert_eq!(ts.len(), 23, "{ts}");
    assert_eq!(&ts[4..5], "/");
}

#[test]
fn without_nvml_the_command_still_runs() {
    let m = Machine::h200s(1);
    let json = m.path("r.json");
    let out = m
        .gpudoc()
        .env("GPUDOC_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .arg("run")
        .arg("--json")
        .arg(&json)
        .args(["--", "sh", "-c", "echo hello; exit 4"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    assert_eq!(out.stdout, b"hello\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("GPU sampling was off").count(),
        1,
        "said once: {err}"
    );
    assert!(err.contains("/nonexistent/libnvidia-ml.so.1"));
    let r = read_json(&json);
    assert_eq!(r["nvml"]["available"], false);
    assert!(r["nvml"]["error"].as_str().unwrap().contains("cannot load"));
    assert_eq!(r["gpus"].as_array().unwrap().len(), 0);
}

#[test]
fn a_gpu_lost_mid_run_is_reported_and_the_job_goes_on() {
    let m = Machine::h200s(2);
    let script = r#"
        held=$(mktemp)
        "$FAKEGPU" alloc --gpu 0 --steps 2GiB --hold-ms 400 --say held > "$held" &
        "$FAKEGPU" alloc --gpu 1 --steps 1GiB --hold-ms 600 &
        # Lost once its memory is held and sampled (a busy machine starts the holder late).
        until grep -q held "$held"; do sleep 0.01; done
        sleep 0.15
        "$FAKEGPU" error --func nvmlDeviceGetMemoryInfo_v2 --gpu 0 --code 15
        wait; rm -f "$held"; echo done
    "#;
    let (code, r, err) = m.run_sh(&[], script);
    assert_eq!(code, 0);
    let lost = &r["gpus"][0]["lost"];
    assert!(
        lost["error"].as_str().unwrap().ends_with("(GpuLost)"),
        "{r:#}"
    );
    assert!(lost["at_s"].as_f64().unwrap() > 0.05);
    assert_eq!(
        r["gpus"][0]["job_peak_bytes"],
        2 * GIB,
        "what was sampled before the loss stays"
    );
    assert!(r["gpus"][1]["lost"].is_null());
    assert_eq!(
        r["gpus"][1]["job_peak_bytes"], GIB,
        "the other GPU is still sampled"
    );
    assert!(
        err.contains("GPU 0 NVIDIA H200") && err.contains("lost at"),
        "{err}"
    );
}

#[test]
fn unsupported_queries_are_not_retried() {
    let mut state = State::h200s(1);
    state.errors.push(fake_nvml::state::Injected {
        func: "nvmlDeviceGetGraphicsRunningProcesses_v3".into(),
        gpu: None,
        code: 3,
    });
    let m = Machine::with(state);
    let (code, r, _) = m.run_sh(
        &["--quiet"],
        r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 300 & wait"#,
    );
    assert_eq!(code, 0);
    let calls = m.calls();
    assert_eq!(
        calls["nvmlDeviceGetGraphicsRunningProcesses_v3"], 1,
        "{calls:#}"
    );
    assert!(
        calls["nvmlDeviceGetComputeRunningProcesses_v3"]
            .as_u64()
            .unwrap()
            > 10
    );
    assert!(r["gpus"][0]["lost"].is_null());
    assert_eq!(r["gpus"][0]["job_peak_bytes"], GIB);
    assert!(
        r["gpus"][0]["unsupported"][0]
            .as_str()
            .unwrap()
            .starts_with("graphics processes")
    );
}

#[test]
fn sampling_runs_at_the_asked_rates() {
    let m = Machine::h200s(1);
    let (_, r, _) = m.run_sh(
        &["--quiet", "--interval", "2ms", "--proc-interval", "20ms"],
        "sleep 0.5",
    );
    let dev = r["sampling"]["device_samples"].as_u64().unwrap() as f64;
    let proc_ = r["sampling"]["process_samples"].as_u64().unwrap() as f64;
    let secs = r["duration_s"].as_f64().unwrap();
    // Never faster than asked (the run's own length bounds the count), and the two rates apart as asked.
    // A busy machine (CI's two cores) stretches every sleep, so slower than asked is only bounded loosely.
    assert!(
        dev <= secs / 0.002 * 1.1 + 2.0,
        "device samples {dev} in {secs} s"
    );
    assert!(
        proc_ <= secs / 0.02 * 1.1 + 2.0,
        "process samples {proc_} in {secs} s"
    );
    assert!(dev >= 50.0, "device samples {dev} in {secs} s");
    assert!(
        dev >= proc_ * 4.0,
        "device {dev} vs process {proc_} samples"
    );
    assert_eq!(r["sampling"]["device_interval_s"], 0.002);
}

#[test]
fn flat_memory_slows_device_sampling_to_the_idle_rate() {
    let m = Machine::h200s(1);
    let rate = |interval: &str, idle: &str| {
        let (_, r, _) = m.run_sh(
            &["--quiet", "--interval", interval, "--idle-interval", idle],
            "sleep 2.5",
        );
        r["sampling"]["device_samples"].as_u64().unwrap()
    };
    // One second at 1 kHz, then 1.5 s at 100 Hz: about 1150; at 1 kHz throughout: about 2500; at 100 Hz
    // throughout: about 250. Compared with each other, so a busy machine that stretches every sleep
    // doesn't change the verdict.
    let adaptive = rate("1ms", "10ms");
    let fixed = rate("1ms", "1ms");
    let idle = rate("10ms", "10ms");
    assert!(
        adaptive * 10 < fixed * 7,
        "adaptive {adaptive} vs fixed {fixed}"
    );
    assert!(
        adaptive * 2 > idle * 3,
        "the first second still runs at 1 kHz: {adaptive} vs {idle} at 100 Hz"
    );
}

#[test]
fn output_bytes_are_unchanged() {
    let m = Machine::h200s(1);
    let data: Vec<u8> = (0..200_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let file = m.path("data.bin");
    std::fs::write(&file, &data).unwrap();
    let script = format!(
        "cat '{0}'; cat '{0}' >&2; printf 'no newline at end'",
        file.display()
    );
    let out = m
        .gpudoc()
        .args(["run", "--quiet", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let mut want = data.clone();
    want.extend_from_slice(b"no newline at end");
    assert!(out.stdout == want, "stdout differs");
    assert!(
        out.stderr == data,
        "stderr differs ({} bytes)",
        out.stderr.len()
    );
}

#[test]
fn report_goes_to_a_descriptor_written_through() {
    let m = Machine::h200s(1);
    // `-` is refused for `run` (stdout is the command's); a descriptor the user names is written through.
    let out = m
        .gpudoc()
        .args(["run", "--quiet", "--json", "/dev/stdout", "--", "true"])
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["schema"], "gpudoc.report/2");
    assert_eq!(r["command"], serde_json::json!(["true"]));
    assert_eq!(r["gpus"][0]["total_bytes"], 143771u64 << 20);
    assert_eq!(r["nvml"]["driver"], "580.159.04");
    for key in [
        "duration_s",
        "exit",
        "processes",
        "oom",
        "orphans",
        "diagnoses",
        "gate",
    ] {
        assert!(r.get(key).is_some(), "{key}");
    }
}

#[test]
fn summary_names_peak_capacity_and_ending() {
    let m = Machine::h200s(1);
    let (_, _, err) = m.run_sh(
        &[],
        r#""$FAKEGPU" alloc --steps 70GiB --hold-ms 100 & wait; exit 2"#,
    );
    assert!(err.contains("exited with code 2"), "{err}");
    assert!(
        err.contains("job peak 70.00 GiB (49.9% of 140.40 GiB)"),
        "{err}"
    );
    assert!(err.contains("driver 580.159.04"), "{err}");
    assert!(!err.contains('\u{1b}'), "NO_COLOR: no escapes");
    let (_, _, err) = m.run_sh(&["--color", "always"], "true");
    assert!(err.contains('\u{1b}'), "--color always wins over NO_COLOR");
}

#[test]
fn leftover_descendants_are_reported() {
    let m = Machine::h200s(1);
    let (code, r, err) = m.run_sh(
        &[],
        r#"( "$FAKEGPU" alloc --steps 1GiB --hold-ms 1500 & ); sleep 0.2"#,
    );
    assert_eq!(code, 0);
    let orphans = r["orphans"].as_array().unwrap();
    assert_eq!(orphans.len(), 1, "{r:#}");
    assert!(orphans[0]["cmdline"].as_str().unwrap().contains("fakegpu"));
    assert_eq!(orphans[0]["gpu_bytes"][0], serde_json::json!([0, GIB]));
    assert!(err.contains("left running: pid"), "{err}");
    let pid = orphans[0]["pid"].as_i64().unwrap() as i32;
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(50));
}

#[test]
fn if_gpudoc_is_killed_the_command_is_told_and_the_trace_survives() {
    let m = Machine::h200s(1);
    let trace = m.path("trace.jsonl");
    let told = m.path("told");
    let script = format!(
        r#"trap 'echo TERM > "{}"; exit 0' TERM
        "$FAKEGPU" alloc --steps 3GiB --hold-ms 2500 &
        echo ready; while :; do sleep 0.02; done"#,
        told.display()
    );
    let (mut child, _out) = start_ready(&m, &["--trace".as_ref(), trace.as_os_str()], &script);
    // Long enough for the allocation to be sampled and the trace flushed (at most every 0.5 s).
    std::thread::sleep(Duration::from_millis(1200));
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // The trap's redirection makes the file before its echo writes to it: wait for the words.
    let said = || std::fs::read_to_string(&told).unwrap_or_default();
    while said().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(said(), "TERM\n", "the command got SIGTERM");
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        text.lines()
            .any(|l| l.contains(r#""kind":"process""#)
                && l.contains(&format!(r#""used":{}"#, 3 * GIB))),
        "rows sampled before the kill are on disk: {text}"
    );
}
