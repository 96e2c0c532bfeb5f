//! "Do no harm": gpudoc never replaces what it does not own, never slows, reorders or blocks the
//! command, never kills a live job, and says so in its exit code when it could not give what was asked.

mod common;

use common::{Machine, fakegpu, read_json};
use fake_nvml::state::{Delay, State};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `gpudoc run -q -- sh -c SCRIPT` on `m`.
fn quiet_sh(m: &Machine, script: &str) -> Command {
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--", "sh", "-c", script]);
    c
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn json_is_written_through_devices_and_fifos_and_follows_symlinks() {
    let m = Machine::h200s(1);
    if is_root() {
        // The issue's repro: as root, `--json /dev/null` must not turn the device into a file.
        let dev = m.path("dn");
        let st = Command::new("mknod")
            .args(["-m", "666"])
            .arg(&dev)
            .args(["c", "1", "3"])
            .status()
            .unwrap();
        assert!(st.success());
        let out = m
            .gpudoc()
            .args(["run", "-q", "--json"])
            .arg(&dev)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0));
        let ft = std::fs::metadata(&dev).unwrap().file_type();
        assert!(ft.is_char_device(), "{dev:?} is still a character device");
    }
    // A symlinked report stays a symlink; the file it points to gets the report.
    let real = m.path("real.json");
    let link = m.path("link.json");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let st = m
        .gpudoc()
        .args(["run", "-q", "--json"])
        .arg(&link)
        .args(["--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(read_json(&real)["schema"], "gpudoc.report/2");
    // So does a symlinked baseline.
    let base_real = m.path("base-real.json");
    let base_link = m.path("base.json");
    std::os::unix::fs::symlink(&base_real, &base_link).unwrap();
    let st = m
        .gpudoc()
        .args(["run", "-q", "--allow-no-gpu", "--baseline"])
        .arg(&base_link)
        .args(["--name", "t", "--update-baseline", "--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(
        std::fs::symlink_metadata(&base_link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(read_json(&base_real)["schema"], "gpudoc.baseline/1");
}

#[test]
fn json_through_a_descriptor_gives_something_a_machine_can_read() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args(["run", "--json", "-", "--", "echo", "hi"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--json -") && err.contains("/dev/fd/3"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "the command did not run");
    // The way round it: the report on fd 3, the command's output on stderr.
    let out = m
        .shell(r#""$GPUDOC" run -q --json /dev/fd/3 -- echo hi 3>&1 1>&2"#)
        .env("GITHUB_ACTIONS", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).expect("stdout is the report alone");
    assert_eq!(r["command"], serde_json::json!(["echo", "hi"]));
}

#[test]
fn no_output_of_gpudocs_is_sent_to_the_commands_stdout() {
    // `-` is stdout for `gpudoc report`; under `gpudoc run` stdout is the command's. `--html -` and
    // `--trace -` wrote a file named `-`, `--junit -` too.
    let m = Machine::h200s(1);
    let ran = m.path("ran");
    for flag in ["--json", "--html", "--trace", "--junit"] {
        let out = m
            .gpudoc()
            .current_dir(m.dir.path())
            .args(["run", flag, "-", "--", "sh", "-c"])
            .arg(format!("touch {}; echo hi", ran.display()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{flag}: {err}");
        assert!(
            err.contains(&format!(
                "{flag} -: the command's own output goes to stdout"
            )),
            "{err}"
        );
        assert!(
            out.stdout.is_empty() && !ran.exists(),
            "{flag}: refused before the command runs"
        );
        assert!(!m.path("-").exists(), "{flag}: no file named `-`");
    }
}

#[test]
fn outputs_that_cant_be_written_are_failures_the_exit_code_shows() {
    let m = Machine::h200s(1);
    let ran = m.path("ran");
    let script = format!("touch {}", ran.display());
    for (args, names) in [
        (
            vec!["--json", "/proc/gpudoc-no/r.json"],
            "--json /proc/gpudoc-no",
        ),
        (
            vec!["--junit", "/nonexistent/j.xml"],
            "--junit /nonexistent",
        ),
        (
            vec![
                "--baseline",
                "/nonexistent/b.json",
                "--name",
                "x",
                "--update-baseline",
            ],
            "--update-baseline /nonexistent",
        ),
    ] {
        let out = m
            .gpudoc()
            .arg("run")
            .args(&args)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        assert!(!ran.exists(), "{args:?}: refused before the command runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(names), "{args:?}: {err}");
    }
    // A write that fails at the end (a full device) turns a successful command's 0 into 125 ...
    let out = m
        .gpudoc()
        .args(["run", "-q", "--json", "/dev/full", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--json /dev/full"));
    // ... and a failing command's own code still wins.
    let out = m
        .gpudoc()
        .args([
            "run",
            "-q",
            "--json",
            "/dev/full",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn absurd_values_are_refused_with_a_hint() {
    let m = Machine::h200s(1);
    for (args, says) in [
        (vec!["--max-peak", "40"], "no unit: write 40GiB"),
        (
            vec!["--baseline", "b.json", "--name", "x", "--tolerance", "NaN%"],
            "percentage",
        ),
        (
            vec!["--baseline", "b.json", "--name", "x", "--tolerance", "inf%"],
            "percentage",
        ),
        (
            vec!["--baseline", "b.json", "--name", "x", "--tolerance", "5"],
            "no unit",
        ),
        (vec!["--interval", "10000000h"], "too long"),
        (vec!["--proc-interval", "50us"], "too short"),
    ] {
        let out = m
            .gpudoc()
            .current_dir(m.dir.path())
            .arg("run")
            .args(&args)
            .args(["--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    // A GPU the machine does not have is refused before the job rather than passing with no check
    // (issue 35: it was a failed gate, 122, after the whole job).
    let out = m
        .gpudoc()
        .args(["run", "-q", "--max-peak", "99=5GiB", "--", "sh", "-c"])
        .arg(r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 100"#)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(
            "GPU 99, which this machine does not have (GPUs: 0): the command was not started"
        ),
        "{err}"
    );
}

#[test]
fn a_tolerance_that_cant_be_meant_is_refused_before_the_job() {
    let m = Machine::h200s(1);
    let ran = m.path("ran");
    let script = format!("touch {}", ran.display());
    let base = ["--baseline", "b.json", "--name", "x"];
    for (args, says) in [
        (vec!["--tolerance", "NaN%"], "--baseline"),
        (
            vec!["--max-peak", "1GiB", "--tolerance", "5%"],
            "--baseline",
        ),
        (
            [&base[..], &["--tolerance", "5%,"]].concat(),
            "an empty part",
        ),
        (
            [&base[..], &["--tolerance", "5%,5%"]].concat(),
            "a second percentage",
        ),
        (
            [&base[..], &["--tolerance", "1GiB, 2GiB"]].concat(),
            "a second size",
        ),
        (
            [&base[..], &["--tolerance", ",5%"]].concat(),
            "an empty part",
        ),
        (
            [&base[..], &["--tolerance", "5 %"]].concat(),
            "a space before % (write 5%)",
        ),
        (vec!["--metrics-linger", "5s"], "--metrics"),
    ] {
        let out = m
            .gpudoc()
            .current_dir(m.dir.path())
            .arg("run")
            .args(&args)
            .args(["--", "sh", "-c", &script])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!ran.exists(), "{args:?}: refused before the command runs");
    }
    // One of each is what the flag is for.
    let out = m
        .gpudoc()
        .current_dir(m.dir.path())
        .args(["run", "-q", "--allow-no-gpu"])
        .args(base)
        .args(["--tolerance", "5%, 512MiB", "--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(ran.exists());
}

#[test]
fn parallel_baseline_updates_keep_every_entry() {
    let m = Machine::h200s(1);
    let base = m.path("base.json");
    let children: Vec<_> = (0..12)
        .map(|i| {
            m.gpudoc()
                .args(["run", "-q", "--allow-no-gpu", "--baseline"])
                .arg(&base)
                .args([
                    "--name",
                    &format!("job{i}"),
                    "--update-baseline",
                    "--",
                    "true",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let b = read_json(&base);
    assert_eq!(b["jobs"].as_object().unwrap().len(), 12, "{b:#}");
    let leftovers: Vec<_> = std::fs::read_dir(m.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn names_and_command_lines_are_printed_escaped() {
    let m = Machine::h200s(1);
    let evil = "\u{1b}]0;PWNED\u{7}\u{1b}[2J";
    // A short name, so the escape is within the 60 characters the summary shows of a command line.
    let f = m.path("f");
    std::os::unix::fs::symlink(fakegpu(), &f).unwrap();
    let out = m
        .gpudoc()
        .args(["run", "--"])
        .arg(&f)
        .args([
            "alloc",
            "--say",
            evil,
            "--steps",
            "1GiB",
            "--hold-ms",
            "300",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains('\u{1b}'),
        "no raw escape reaches the terminal: {err:?}"
    );
    assert!(err.contains("\\x1b]0;PWNED\\x07"), "{err}");
    // The command's own output is its own: passed through untouched.
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{evil}\n"));
}

/// A machine whose NVML takes `ms` to answer `func`.
fn slow(func: &str, ms: u64) -> Machine {
    let mut s = State::h200s(1);
    s.delays.push(Delay {
        func: func.into(),
        ms,
    });
    Machine::with(s)
}

#[test]
fn a_hung_nvml_delays_neither_the_start_nor_the_exit() {
    for func in [
        "nvmlInit_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "*",
    ] {
        let m = slow(func, 5000);
        let json = m.path("r.json");
        let begin = Instant::now();
        let mut child = m
            .gpudoc()
            .args(["run", "-q", "--json"])
            .arg(&json)
            .args(["--", "sh", "-c", "echo started; sleep 0.5"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let started = begin.elapsed();
        let status = child.wait().unwrap();
        let took = begin.elapsed();
        assert_eq!(line, "started\n");
        assert!(status.success(), "{func}");
        assert!(
            started < Duration::from_millis(800),
            "{func}: started after {started:?}"
        );
        // 0.5 s of command, at most 1 s of waiting for NVML, and gpudoc's own start and end.
        assert!(took < Duration::from_millis(2800), "{func}: took {took:?}");
        let r = read_json(&json);
        if func == "nvmlInit_v2" || func == "*" {
            assert_eq!(r["nvml"]["available"], false, "{func}");
            assert!(
                r["nvml"]["error"]
                    .as_str()
                    .unwrap()
                    .contains("did not answer"),
                "{func}: {r:#}"
            );
        } else {
            let notes = r["notes"].to_string();
            assert!(notes.contains("stopped answering"), "{func}: {notes}");
        }
    }
}

#[test]
fn stdout_and_stderr_sharing_a_file_keep_their_order() {
    let m = Machine::h200s(1);
    let log = m.path("out.log");
    let script = "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); echo out$i; echo err$i >&2; done";
    let f = std::fs::File::create(&log).unwrap();
    let st = quiet_sh(&m, script)
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .status()
        .unwrap();
    assert!(st.success());
    let text = std::fs::read_to_string(&log).unwrap();
    let want: String = (1..=2000).map(|i| format!("out{i}\nerr{i}\n")).collect();
    assert!(text.starts_with(&want), "the order is kept exactly");
}

#[test]
fn a_log_file_gpudoc_reads_along_keeps_its_access_time() {
    use std::os::unix::fs::MetadataExt;
    let m = Machine::h200s(1);
    let log = m.path("out.log");
    std::fs::write(&log, "before\n").unwrap();
    // An access time older than any write, as a log has that nobody read since: reading it would move it.
    let old = nix::sys::time::TimeSpec::new(1_600_000_000, 0);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &log,
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::FollowSymlink,
    )
    .unwrap();
    let f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let st = quiet_sh(&m, "echo written; sleep 0.1; echo again")
        .stdout(f)
        .status()
        .unwrap();
    assert!(st.success());
    let meta = std::fs::metadata(&log).unwrap();
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "before\nwritten\nagain\n"
    );
    assert!(meta.mtime() > 1_600_000_000, "the command wrote it");
    assert_eq!(
        meta.atime(),
        1_600_000_000,
        "gpudoc's reading left no trace"
    );
}

#[test]
fn descendants_that_already_exited_are_not_leftovers() {
    let m = Machine::h200s(1);
    for i in 0..30 {
        let (code, r, err) = m.run_sh(&["-q", "--fail-on", "warn"], "sleep 0.1 & sleep 0.1");
        assert_eq!(code, 0, "run {i}: {err}");
        assert_eq!(r["orphans"], serde_json::json!([]), "run {i}");
    }
}

/// Starts `gpudoc run -- sh -c SCRIPT` where the script starts a grandchild and prints its PID.
fn job_with_grandchild(m: &Machine) -> (std::process::Child, u32) {
    let mut child = quiet_sh(m, "sleep 300 & echo $!; wait")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().parse().unwrap())
}

fn alive(pid: u32) -> bool {
    fake_nvml::state::alive(pid)
}

fn gone_within(pid: u32, limit: Duration) -> bool {
    common::within(limit, || !alive(pid))
}

#[test]
fn a_killed_gpudoc_ends_the_whole_job() {
    let m = Machine::h200s(1);
    for sig in [libc::SIGKILL, libc::SIGTERM] {
        let (mut child, grandchild) = job_with_grandchild(&m);
        assert!(alive(grandchild));
        unsafe { libc::kill(child.id() as i32, sig) };
        let _ = child.wait();
        assert!(
            gone_within(grandchild, Duration::from_secs(8)),
            "signal {sig}: the grandchild {grandchild} runs on"
        );
    }
}

/// The shim folders (`gpudoc-*`) in `tmp`.
fn shim_folders(tmp: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("gpudoc-")
        })
        .collect()
}

#[test]
fn the_folder_a_killed_gpudoc_left_is_removed_by_the_next_run() {
    let m = Machine::h200s(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut guard = m
        .gpudoc()
        .env("TMPDIR", tmp.path())
        .args(["run", "-q", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    // The pipe is made last: by then the folder is set up, and locked.
    let set_up = || {
        shim_folders(tmp.path())
            .iter()
            .any(|f| f.join("torch.pipe").exists())
    };
    assert!(
        common::within(Duration::from_secs(10), set_up),
        "the run made its folder"
    );
    // gpudoc itself is the guard's child (beside the job keeper); SIGKILL leaves it no time to clean up.
    let gpudoc = common::gpudoc_under(guard.id());
    unsafe { libc::kill(gpudoc, libc::SIGKILL) };
    let _ = guard.wait();
    let left = shim_folders(tmp.path());
    assert_eq!(left.len(), 1, "SIGKILL left the folder");
    // Older than a run that has just made its folder and not yet locked it.
    let old = nix::sys::time::TimeSpec::new(1_600_000_000, 0);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        &left[0],
        &old,
        &old,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    let st = m
        .gpudoc()
        .env("TMPDIR", tmp.path())
        .args(["run", "-q", "--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(shim_folders(tmp.path()), Vec::<std::path::PathBuf>::new());
}

#[test]
fn a_job_started_by_pid_1_in_a_container_is_not_killed() {
    let probe = Command::new("unshare")
        .args(["-pf", "--mount-proc", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("skipped: this machine can't make a PID namespace (unshare -pf)");
        return;
    }
    let m = Machine::h200s(1);
    let entry = m.path("entry.sh");
    std::fs::write(
        &entry,
        "#!/bin/sh\n\"$FAKEGPU\" alloc --steps 1GiB --hold-ms 30000 --say ready\necho done\n",
    )
    .unwrap();
    let mut job = Command::new("unshare")
        .args(["-pf", "--mount-proc", "sh"])
        .arg(&entry)
        .env("FAKE_NVML_STATE", m.state_path())
        .env("FAKEGPU", fakegpu())
        .stdout(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(job.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // The namespace's PID 1 (the shell running entry.sh) is unshare's child.
    let init = std::fs::read_to_string(format!("/proc/{}/task/{}/children", job.id(), job.id()))
        .unwrap()
        .trim()
        .to_string();
    let out = Command::new("nsenter")
        .args(["-t", &init, "-p", "-m", "--"])
        .arg(common::gpudoc_bin())
        .args(["orphans", "--kill", "--yes", "--grace", "1s", "--json", "-"])
        .env("GPUDOC_NVML_LIB", common::fake_lib())
        .env("FAKE_NVML_STATE", m.state_path())
        .output()
        .unwrap();
    let listing: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    let holder = listing["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["cmdline"].as_str().unwrap_or("").contains("alloc"))
        .unwrap_or_else(|| panic!("{listing:#}"));
    assert_eq!(holder["verdict"], "live", "{holder:#}");
    assert_eq!(listing["ended"], serde_json::json!([]));
    assert!(job.try_wait().unwrap().is_none(), "the job still runs");
    unsafe { libc::kill(-(job.id() as i32), libc::SIGKILL) };
    let _ = job.wait();
}

const OOM_LINE: &str = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.00 GiB is free. Including non-PyTorch memory, this process has 138.00 GiB memory in use. Of the allocated memory 130.00 GiB is allocated by PyTorch, and 7.50 GiB is reserved by PyTorch but unallocated.";

/// `gpudoc run` of a command that prints an OOM text on stdout, with gpudoc's stdout set by `wire`.
fn oom_on_stdout(m: &Machine, wire: impl FnOnce(&mut Command)) -> Value {
    let json = m.path("r.json");
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--json"]).arg(&json).args([
        "--",
        "sh",
        "-c",
        &format!("echo '{OOM_LINE}'; exit 1"),
    ]);
    wire(&mut c);
    let st = c.status().unwrap();
    assert_eq!(st.code(), Some(1));
    read_json(&json)
}

#[test]
fn oom_texts_on_stdout_are_read_whatever_stdout_is() {
    let m = Machine::h200s(1);
    let log = m.path("out.log");
    let to_file = oom_on_stdout(&m, |c| {
        c.stdout(std::fs::File::create(&log).unwrap());
    });
    let to_pipe = oom_on_stdout(&m, |c| {
        c.stdout(Stdio::piped());
    });
    for (how, r) in [("a file", &to_file), ("a pipe", &to_pipe)] {
        assert_eq!(r["exit"]["classification"], "gpu_oom", "{how}: {r:#}");
        assert_eq!(r["oom"]["stream"], "stdout", "{how}");
        assert_eq!(r["oom"]["requested_bytes"], 2u64 << 30, "{how}");
    }
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("{OOM_LINE}\n"),
        "the file holds exactly what the command wrote"
    );
}

#[test]
fn the_command_gets_the_environment_as_it_was_with_only_the_shims_variables_added() {
    // PYTHONUNBUFFERED or PYTHONDONTWRITEBYTECODE would change how a Python program runs (its output's
    // buffering and interleaving, its start-up): gpudoc never sets them. (Issue 26 saw them under gpudoc
    // because the shell it ran in exported them; bare saw them too.)
    let m = Machine::h200s(1);
    let env_of = |c: &mut Command| {
        common::env_lines(
            c.env_remove("PYTHONUNBUFFERED")
                .env_remove("PYTHONDONTWRITEBYTECODE")
                .env_remove("PYTHONPATH"),
        )
    };
    let mut bare = Command::new("env");
    for (k, v) in m.gpudoc().get_envs() {
        match v {
            Some(v) => bare.env(k, v),
            None => bare.env_remove(k),
        };
    }
    // `env env` prints the environment as `env` does.
    let bare = env_of(&mut bare);
    let shim = ["GPUDOC_TORCH", "PYTHONPATH"];
    for (flags, added_by_gpudoc) in [(&["--no-torch"][..], &[][..]), (&[], &shim[..])] {
        let mut c = m.gpudoc();
        c.args(["run", "-q"]).args(flags).arg("--");
        let under = env_of(&mut c);
        let added: Vec<&str> = under
            .iter()
            .filter(|l| !bare.contains(l))
            .map(|l| l.split('=').next().unwrap())
            .collect();
        assert_eq!(added, added_by_gpudoc, "{flags:?}");
        assert!(
            bare.iter().all(|l| under.contains(l)),
            "{flags:?}: nothing removed"
        );
    }
}

#[test]
fn a_device_as_stdout_is_the_commands_own_and_stderr_is_still_read() {
    // What the command sees of its stdout and what the device does with its writes, bare and wrapped.
    let m = Machine::h200s(1);
    let script = r#"test -c /proc/self/fd/1 && echo "a device" >&2; echo hi; echo "status $?" >&2"#;
    for dev in ["/dev/null", "/dev/full"] {
        let run = |wrapper: &str| {
            let out = m
                .shell(&format!("{wrapper} sh -c '{script}' > {dev}"))
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| !l.contains("sh:") && !l.contains("echo:"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let bare = run("");
        assert!(bare.contains("a device"), "{dev}: {bare}");
        assert_eq!(run(r#""$GPUDOC" run -q --"#), bare, "{dev}");
    }
    // Where OOM reports are printed, a device is still read (`&> /dev/null`, a launcher's discarded logs).
    let json = m.path("r.json");
    let st = m
        .shell(&format!(
            r#""$GPUDOC" run -q --json {} -- sh -c "echo '{OOM_LINE}' >&2; exit 1" &> /dev/null"#,
            json.display()
        ))
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1));
    assert_eq!(read_json(&json)["exit"]["classification"], "gpu_oom");
}

#[test]
fn stdout_and_stderr_sharing_a_pipe_keep_their_order() {
    let m = Machine::h200s(1);
    let script = "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); echo out$i; echo err$i >&2; done";
    let out = m
        .shell(&format!(
            r#""$GPUDOC" run -q -- sh -c '{script}' 2>&1 | cat"#
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    let want: String = (1..=2000).map(|i| format!("out{i}\nerr{i}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&out.stdout), want);
}

/// `gpudoc run` writing 3 MB to `write_end`, which its parent made non-blocking and reads only after a
/// pause (so the destination fills); returns what arrived.
fn through_a_non_blocking(write_end: std::os::fd::OwnedFd, mut read_end: std::fs::File) -> Vec<u8> {
    use std::io::Read;
    common::set_nonblocking(&write_end);
    let m = Machine::h200s(1);
    let mut child = quiet_sh(&m, "head -c 3000000 /dev/zero | tr '\\0' x")
        .stdout(Stdio::from(write_end))
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let mut got = Vec::new();
    read_end.read_to_end(&mut got).unwrap();
    assert!(child.wait().unwrap().success());
    got
}

#[test]
fn a_destination_left_non_blocking_by_the_parent_still_gets_every_byte() {
    // A pipe (passed on inside the kernel) and a socket (copied through gpudoc).
    let (r, w) = nix::unistd::pipe().unwrap();
    let to_pipe = through_a_non_blocking(w, std::fs::File::from(r));
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    let to_socket =
        through_a_non_blocking(b.into(), std::fs::File::from(std::os::fd::OwnedFd::from(a)));
    for (how, got) in [("a pipe", to_pipe), ("a socket", to_socket)] {
        assert_eq!(got.len(), 3_000_000, "{how}");
        assert!(got.iter().all(|&c| c == b'x'), "{how}");
    }
}

#[test]
fn a_reader_that_goes_away_ends_the_command_as_without_gpudoc() {
    // `yes | head -1`: when head exits, yes gets SIGPIPE; through gpudoc the same, on stdout and stderr.
    let m = Machine::h200s(1);
    for (stream, redirect) in [("stdout", ""), ("stderr", ">&2")] {
        let started = Instant::now();
        let out = m
            .shell(&format!(
                r#""$GPUDOC" run -q -- sh -c 'yes {redirect}' 2>&1 | head -1; echo "status ${{PIPESTATUS[0]}}""#
            ))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(text, "y\nstatus 141\n", "{stream}");
        assert!(started.elapsed() < Duration::from_secs(10), "{stream}");
    }
}

#[test]
fn a_reader_gone_before_gpudoc_speaks_leaves_the_commands_exit_code_alone() {
    // `| head -c 2` has what it wants and is gone while the command still runs; the command ends with its
    // own code. gpudoc's summary (and, for a gate, its verdict and annotations) then meets a closed pipe.
    let m = Machine::h200s(1);
    for (how, args) in [
        ("the summary", "run --"),
        (
            "a gate's verdict and annotations",
            "run --max-peak 0=1GiB --",
        ),
    ] {
        let out = m
            .shell(&format!(
                r#""$GPUDOC" {args} sh -c 'echo a; sleep 0.3; exit 3' 2>&1 | head -c 2; echo "status ${{PIPESTATUS[0]}}""#
            ))
            .env("GITHUB_ACTIONS", "true")
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "a\nstatus 3\n",
            "{how}"
        );
    }
}

#[test]
fn a_stream_closed_when_gpudoc_starts_is_closed_for_the_command_too() {
    // Without gpudoc a write to a closed stdout fails with EBADF; gpudoc must not hand the command a
    // working stream instead (Rust's runtime opens /dev/null on closed 0-2 before main).
    let m = Machine::h200s(1);
    for (what, script, redirect) in [
        ("stdout", r#"echo hi; echo "status $?" >&2"#, ">&-"),
        ("stderr", r#"echo hi >&2; echo "status $?""#, "2>&-"),
        ("stdin", r#"read x; echo "status $?""#, "<&-"),
    ] {
        let run = |wrapper: &str| {
            let out = m
                .shell(&format!(
                    "{wrapper} sh -c '{script}' {redirect}; echo \"exit $?\""
                ))
                .output()
                .unwrap();
            // The shell's own complaint names the shell; the status lines are what matter.
            String::from_utf8_lossy(&[out.stdout, out.stderr].concat())
                .lines()
                .filter(|l| l.starts_with("status") || l.starts_with("exit"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        let bare = run("");
        assert!(!bare.contains("status 0"), "{what}: {bare}");
        assert_eq!(run(r#""$GPUDOC" run -q --"#), bare, "{what}");
    }
}

#[test]
fn as_root_with_another_users_home_nothing_is_made_in_it() {
    if !is_root() {
        return; // only root can be given a home it does not own
    }
    let m = Machine::h200s(1);
    let home = m.path("alice");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    // `sudo -E`: root, with the user's HOME (and XDG folders named in it); the job leaves a process
    // running, so the leftovers are recorded.
    for xdg in [false, true] {
        let mut c = quiet_sh(&m, "sleep 2 &");
        c.env("HOME", &home)
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_CACHE_HOME");
        if xdg {
            c.env("XDG_STATE_HOME", home.join(".local/state"))
                .env("XDG_CACHE_HOME", home.join(".cache"));
        }
        assert!(c.status().unwrap().success());
        let made: Vec<_> = std::fs::read_dir(&home).unwrap().flatten().collect();
        assert!(
            made.is_empty(),
            "xdg {xdg}: made in the user's home: {made:?}"
        );
    }
}
