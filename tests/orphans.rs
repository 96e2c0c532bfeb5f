//! `gpudoc orphans` and `gpudoc run --kill-orphans`: real processes made orphans, holding fake-NVML
//! memory and an open fake device file.

mod common;

use common::Machine;
use fake_nvml::state::{GIB, Proc, State};
use gpudoc::orphans::end::{self, Ended, Policy};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A machine with a fake device file, world-readable so other users' processes can hold it.
fn machine() -> (Machine, PathBuf) {
    let m = Machine::h200s(1);
    let dev = m.path("nvidia0");
    std::fs::write(&dev, "").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::set_permissions(m.state_path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    (m, dev)
}

fn orphans(m: &Machine, dev: &std::path::Path, args: &[&str]) -> (i32, Value, String) {
    let out = m
        .gpudoc()
        .env("GPUDOC_NVIDIA_DEV_PREFIX", dev.with_file_name("nvidia"))
        .args(["orphans", "--json", "-"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    (
        out.status.code().unwrap(),
        v,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn holder(v: &Value, pid: u32) -> &Value {
    v["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["pid"] == pid)
        .unwrap_or_else(|| panic!("no pid {pid} in {v:#}"))
}

/// A live job process (a child of this test) holding 3 GiB.
fn live_holder(m: &Machine) -> std::process::Child {
    let mut live = m
        .fakegpu()
        .args([
            "alloc",
            "--steps",
            "3GiB",
            "--hold-ms",
            "20000",
            "--say",
            "held",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    common::line_of(&mut live);
    live
}

fn alive(pid: u32) -> bool {
    fake_nvml::state::alive(pid)
}

#[test]
fn lists_orphans_live_processes_and_ghosts() {
    let (m, dev) = machine();
    State::update(&m.state_path(), |s| {
        s.procs.push(Proc {
            pid: 999_999_999,
            gpu: 0,
            bytes: 2 * GIB,
            graphics: false,
            ghost: true,
        })
    })
    .unwrap();
    let o = m.orphan(
        &format!(
            r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 20000 --open {}"#,
            dev.display()
        ),
        None,
    );
    let mut live = live_holder(&m);

    let (code, v, _) = orphans(&m, &dev, &[]);
    assert_eq!(code, 1, "leftovers found");
    let h = holder(&v, o);
    assert_eq!(h["verdict"], "orphan", "{h:#}");
    assert_eq!(h["gpu_bytes"], serde_json::json!([[0, GIB]]));
    assert_eq!(h["devices"], serde_json::json!([dev.to_str().unwrap()]));
    assert!(
        h["cmdline"]
            .as_str()
            .unwrap()
            .contains("alloc --steps 1GiB")
    );
    assert!(h["age_s"].as_f64().unwrap() >= 0.0);
    assert_eq!(holder(&v, live.id())["verdict"], "live");
    let ghost = holder(&v, 999_999_999);
    assert_eq!(ghost["verdict"], "ghost");
    assert!(
        ghost["reason"]
            .as_str()
            .unwrap()
            .contains("another PID namespace")
    );

    // The human table names the same.
    let out = m
        .gpudoc()
        .env("GPUDOC_NVIDIA_DEV_PREFIX", dev.with_file_name("nvidia"))
        .arg("orphans")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("VERDICT") && table.contains("orphan") && table.contains("ghost"),
        "{table}"
    );
    unsafe { libc::kill(o as i32, libc::SIGKILL) };
    live.kill().unwrap();
    live.wait().unwrap();
}

#[test]
fn kill_ends_leftovers_and_gives_the_memory_back() {
    let (m, dev) = machine();
    let polite = m.orphan(
        &format!(
            r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 20000 --open {}"#,
            dev.display()
        ),
        None,
    );
    // This one ignores SIGTERM: it takes the SIGKILL after the grace period.
    let stubborn = m.orphan(
        r#"sh -c 'trap "" TERM; "$FAKEGPU" set --pid $$ --bytes 2GiB; while :; do sleep 0.05; done'"#,
        None,
    );
    let mut live = live_holder(&m);

    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    assert_eq!(code, 0, "all leftovers ended: {err}");
    let ended = v["ended"].as_array().unwrap();
    let outcome = |pid: u32| ended.iter().find(|r| r["pid"] == pid).cloned().unwrap();
    assert_eq!(outcome(polite)["outcome"], "ended");
    assert_eq!(outcome(polite)["signal"], "SIGTERM");
    assert_eq!(outcome(stubborn)["signal"], "SIGKILL");
    assert!(!alive(polite) && !alive(stubborn));
    assert_eq!(
        v["freed"],
        serde_json::json!([[0, 3 * GIB]]),
        "NVML shows the memory back"
    );
    assert!(alive(live.id()), "a live job is never touched");
    live.kill().unwrap();
    live.wait().unwrap();
}

#[test]
fn without_yes_and_no_terminal_nothing_is_ended() {
    let (m, dev) = machine();
    let o = m.orphan(r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 20000"#, None);
    let (code, _, err) = orphans(&m, &dev, &["--kill"]);
    assert_eq!(code, 1);
    assert!(err.contains("without --yes"), "{err}");
    assert!(alive(o));
    unsafe { libc::kill(o as i32, libc::SIGKILL) };
}

#[test]
fn other_users_processes_are_left_alone() {
    let (m, dev) = machine();
    if !nix::unistd::geteuid().is_root() {
        // Without root there is no other user to start; --all-users must then be refused.
        let out = m
            .gpudoc()
            .args(["orphans", "--all-users"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        return;
    }
    let nobody = 65534;
    // Holds the device as that user; its GPU memory is set for it (the state file is root's).
    let o = m.orphan(
        &format!("sh -c 'exec 3<{}; exec sleep 20'", dev.display()),
        Some(nobody),
    );
    State::update(&m.state_path(), |s| {
        s.procs.push(Proc {
            pid: o,
            gpu: 0,
            bytes: GIB,
            graphics: false,
            ghost: false,
        })
    })
    .unwrap();
    let (code, v, _) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    assert_eq!(code, 1, "the leftover is still there");
    let r = v["ended"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == o)
        .unwrap()
        .clone();
    assert_eq!(r["outcome"], "skipped");
    assert!(
        r["why"]
            .as_str()
            .unwrap()
            .contains("another user's process"),
        "{r}"
    );
    assert!(alive(o));
    let (code, v, _) = orphans(
        &m,
        &dev,
        &["--kill", "--yes", "--grace", "1s", "--all-users"],
    );
    assert_eq!(code, 0);
    assert_eq!(v["ended"][0]["outcome"], "ended");
    assert!(!alive(o));
}

#[test]
fn a_reused_pid_is_never_signalled() {
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let mut h = gpudoc::orphans::describe(child.id(), vec![(0, GIB)], vec![]);
    // As if the listed process had exited and its PID been given to this one since.
    h.start_ticks = h.start_ticks.map(|t| t - 1);
    let r = end::end(
        &[h.clone()],
        Duration::from_millis(200),
        &Policy::here(false),
    );
    assert!(
        matches!(&r[0].result, Ended::Skipped { why } if why.contains("another process")),
        "{r:?}"
    );
    assert!(alive(child.id()));
    // The real identity is ended.
    let h = gpudoc::orphans::describe(child.id(), vec![], vec![]);
    let r = end::end(&[h], Duration::from_secs(2), &Policy::here(false));
    assert_eq!(
        r[0].result,
        Ended::Ended {
            signal: "SIGTERM".into()
        }
    );
    child.wait().unwrap();
}

#[test]
fn pid_1_gpudoc_and_its_ancestors_are_refused() {
    let policy = Policy::here(true);
    for pid in [
        1,
        std::process::id(),
        nix::unistd::getppid().as_raw() as u32,
    ] {
        let h = gpudoc::orphans::describe(pid, vec![], vec![]);
        assert!(policy.refuse(&h).is_some(), "pid {pid}");
    }
}

#[test]
fn run_kill_orphans_ends_what_the_job_left_behind() {
    let m = Machine::h200s(1);
    let script = r#"( "$FAKEGPU" alloc --steps 1GiB --hold-ms 20000 & ); sleep 0.3"#;
    let (code, r, err) = m.run_sh(&["--kill-orphans"], script);
    assert_eq!(code, 0);
    let o = &r["orphans"][0];
    assert_eq!(o["ended"]["outcome"], "ended", "{r:#}");
    assert!(!alive(o["pid"].as_u64().unwrap() as u32));
    assert!(
        err.contains("left running") && err.contains("ended (SIGTERM)"),
        "{err}"
    );
}

#[test]
fn a_live_process_whose_group_leader_exited_is_not_killed() {
    // CI runners and launchers leave such groups: the leader (here a short `sleep`) exits, the job it
    // was grouped with runs on under its living parent (this test).
    use std::os::unix::process::CommandExt;
    let (m, dev) = machine();
    let mut leader = Command::new("sleep")
        .arg("0.2")
        .process_group(0)
        .spawn()
        .unwrap();
    let mut job = m
        .fakegpu()
        .args([
            "alloc",
            "--steps",
            "2GiB",
            "--hold-ms",
            "20000",
            "--say",
            "held",
        ])
        .arg("--open")
        .arg(&dev)
        .process_group(leader.id() as i32)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    common::line_of(&mut job);
    leader.wait().unwrap();
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    let h = holder(&v, job.id());
    assert_eq!(h["verdict"], "live", "{h:#}");
    assert!(h["reason"].as_str().unwrap().contains("is alive"), "{h:#}");
    assert_eq!(code, 0, "nothing to end: {err}");
    assert!(alive(job.id()), "a live job is never touched");
    job.kill().unwrap();
    job.wait().unwrap();
}

/// A Python program that holds 2 GiB, starts a thread, then ends its main thread alone (`pthread_exit`):
/// /proc shows the process as a zombie while the thread runs on, as when a C++ extension's `main` returns
/// through `pthread_exit` or a runtime exits its main thread and keeps workers.
const HEADLESS: &str = r#"import ctypes, os, subprocess, threading, time
subprocess.run([os.environ["FAKEGPU"], "set", "--pid", str(os.getpid()), "--bytes", "2GiB"], check=True)
threading.Thread(target=lambda: time.sleep(30)).start()
print(os.getpid(), flush=True)
ctypes.CDLL(None).pthread_exit(None)
"#;

/// The program above in a file of `m`'s.
fn headless(m: &Machine) -> PathBuf {
    let path = m.path("headless.py");
    std::fs::write(&path, HEADLESS).unwrap();
    path
}

/// Waits until /proc shows `pid` as a zombie (its main thread, or all of it, has exited).
fn until_zombie(pid: u32) {
    for _ in 0..200 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, s)| s.trim_start().starts_with('Z'))
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("pid {pid}'s main thread never exited");
}

#[test]
fn a_leftover_whose_main_thread_exited_is_listed_and_ended() {
    let (m, dev) = machine();
    let prog = headless(&m);
    let o = m.orphan(&format!("python3 {} >/dev/null", prog.display()), None);
    until_zombie(o);
    assert!(alive(o), "its thread runs on, and holds the memory");
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    let h = holder(&v, o);
    assert_eq!(h["verdict"], "orphan", "{h:#}");
    assert_eq!(h["gpu_bytes"], serde_json::json!([[0, 2 * GIB]]));
    assert!(
        h["cmdline"].as_str().unwrap().contains("headless.py"),
        "{h:#}"
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["ended"][0]["outcome"], "ended", "{v:#}");
    assert!(!alive(o));
}

#[test]
fn run_kill_orphans_ends_a_leftover_whose_main_thread_exited() {
    let m = Machine::h200s(1);
    let prog = headless(&m);
    let pidfile = m.path("pid");
    let script = format!(
        "python3 {} > {pid} & while [ ! -s {pid} ]; do sleep 0.02; done; sleep 0.3",
        prog.display(),
        pid = pidfile.display()
    );
    let (code, r, err) = m.run_sh(&["--kill-orphans"], &script);
    assert_eq!(code, 0, "{err}");
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let o = r["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid} not left running: {r:#}"));
    assert_eq!(o["ended"]["outcome"], "ended", "{o:#}");
    assert!(!alive(pid));
}

#[test]
fn a_process_whose_dead_leader_was_never_reaped_is_an_orphan() {
    // `setsid bash -c 'job & exit'` under a PID 1 that does not reap (many containers): the shell that
    // led the job's session and group stays a zombie. Here this test is the parent that never reaps it.
    use std::os::unix::process::CommandExt;
    let (m, dev) = machine();
    let mut shell = Command::new("bash");
    shell
        .args([
            "-c",
            r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 20000 --say held & echo $!; exit"#,
        ])
        .env("FAKE_NVML_STATE", m.state_path())
        .env("FAKEGPU", common::fakegpu())
        .stdout(Stdio::piped());
    unsafe {
        shell.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut shell = shell.spawn().unwrap();
    let job: u32 = common::line_of(&mut shell).trim().parse().unwrap();
    assert_eq!(common::line_of(&mut shell), "held\n");
    until_zombie(shell.id());
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    let h = holder(&v, job);
    assert_eq!(h["verdict"], "orphan", "{h:#}");
    assert_eq!(code, 0, "{err}");
    assert!(!alive(job));
    shell.wait().unwrap();
}

#[test]
fn a_run_detached_with_nohup_is_listed_and_ended_only_when_named() {
    // `nohup python train.py &`, then the shell that started it exited.
    let (m, dev) = machine();
    let o = m.orphan(
        r#"nohup "$FAKEGPU" alloc --steps 1GiB --hold-ms 20000"#,
        None,
    );
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    let h = holder(&v, o);
    assert_eq!(h["verdict"], "detached", "{h:#}");
    assert!(
        h["reason"].as_str().unwrap().contains("ignores SIGHUP"),
        "{h:#}"
    );
    assert_eq!(code, 0, "detached on purpose is not a leftover: {err}");
    assert_eq!(v["ended"][0]["outcome"], "skipped", "{v:#}");
    assert!(
        err.contains(&format!("not pid {o}: detached on purpose")) && err.contains("--detached"),
        "{err}"
    );
    assert!(alive(o), "never ended unless asked by name");

    let (code, v, err) = orphans(
        &m,
        &dev,
        &["--kill", "--yes", "--grace", "1s", "--detached"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["ended"][0]["outcome"], "ended", "{v:#}");
    assert!(!alive(o));
}

/// A job that leaves two processes holding memory: one it started with `nohup`, one it did not.
const NOHUP_AND_NOT: &str = r#"nohup "$FAKEGPU" alloc --steps 1GiB --hold-ms 20001 >/dev/null 2>&1 &
( "$FAKEGPU" alloc --steps 1GiB --hold-ms 20002 >/dev/null & ); sleep 0.3"#;

/// What `--kill-orphans` did to the leftover whose command line ends with `tail`.
fn ended_of<'a>(report: &'a Value, tail: &str) -> &'a Value {
    let o = report["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["cmdline"].as_str().unwrap().ends_with(tail))
        .unwrap_or_else(|| panic!("no leftover `{tail}`: {report:#}"));
    assert!(
        !alive(o["pid"].as_u64().unwrap() as u32) || o["ended"]["outcome"] == "skipped",
        "{o:#}"
    );
    &o["ended"]
}

#[test]
fn run_kill_orphans_spares_what_the_job_detached_with_nohup() {
    let m = Machine::h200s(1);
    let (code, r, err) = m.run_sh(&["--kill-orphans"], NOHUP_AND_NOT);
    assert_eq!(code, 0, "{err}");
    let spared = ended_of(&r, "20001");
    assert_eq!(spared["outcome"], "skipped", "{r:#}");
    assert!(
        spared["why"]
            .as_str()
            .unwrap()
            .contains("detached on purpose"),
        "{spared}"
    );
    assert_eq!(ended_of(&r, "20002")["outcome"], "ended", "{r:#}");
    for o in r["orphans"].as_array().unwrap() {
        unsafe { libc::kill(o["pid"].as_u64().unwrap() as i32, libc::SIGKILL) };
    }
}

#[test]
fn under_nohup_gpudoc_run_kill_orphans_ends_every_leftover() {
    // `nohup gpudoc run ...`: the job's processes may ignore SIGHUP because gpudoc was started so, which
    // says nothing of a process's own wish.
    use std::os::unix::process::CommandExt;
    let m = Machine::h200s(1);
    let json = m.path("report.json");
    let mut c = m.gpudoc();
    c.arg("run")
        .arg("--json")
        .arg(&json)
        .args(["--kill-orphans", "--", "sh", "-c", NOHUP_AND_NOT]);
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let out = c.output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let r = common::read_json(&json);
    assert_eq!(ended_of(&r, "20001")["outcome"], "ended", "{r:#}");
    assert_eq!(ended_of(&r, "20002")["outcome"], "ended", "{r:#}");
}

#[test]
fn what_a_run_in_a_script_left_is_known_and_ended_by_orphans_kill() {
    let (m, dev) = machine();
    let (mut script, r) = m.script_with_a_leftover("");
    let pid = r["orphans"][0]["pid"].as_u64().unwrap() as u32;
    assert!(alive(pid));
    // What the run's advice says to do.
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    let h = holder(&v, pid);
    assert_eq!(h["verdict"], "orphan", "{h:#}");
    let reason = h["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("left running by `gpudoc run sh -c ")
            && reason.contains("which ended at"),
        "{reason}"
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(v["ended"][0]["outcome"], "ended", "{v:#}");
    assert!(!alive(pid));
    script.kill().unwrap();
    script.wait().unwrap();
}

#[test]
fn run_kill_orphans_in_a_script_ends_the_leftovers() {
    let m = Machine::h200s(1);
    let (mut script, r) = m.script_with_a_leftover("--kill-orphans");
    let o = &r["orphans"][0];
    assert_eq!(o["ended"]["outcome"], "ended", "{r:#}");
    assert!(!alive(o["pid"].as_u64().unwrap() as u32));
    script.kill().unwrap();
    script.wait().unwrap();
}

#[test]
fn a_recorded_leftover_that_holds_no_gpu_is_ended_only_when_asked() {
    // A tmux server first started from a run: every session made on it later dies with it.
    let (m, dev) = machine();
    let json = m.path("report.json");
    let mut script = m
        .shell(&format!(
            r#""$GPUDOC" run -q --json {} -- sh -c 'sleep 30 & sleep 0.3'; echo ran; sleep 30"#,
            json.display()
        ))
        .process_group(0)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(common::line_of(&mut script), "ran\n");
    let r = common::read_json(&json);
    let pid = r["orphans"][0]["pid"].as_u64().unwrap() as u32;
    let (code, v, err) = orphans(&m, &dev, &["--kill", "--yes", "--grace", "1s"]);
    assert_eq!(holder(&v, pid)["verdict"], "orphan", "listed: {v:#}");
    let ended = &v["ended"][0];
    assert_eq!(
        (ended["pid"].as_u64(), &ended["outcome"]),
        (Some(u64::from(pid)), &"skipped".into()),
        "{v:#}"
    );
    assert!(
        ended["why"].as_str().unwrap().contains("--without-gpu"),
        "{v:#}"
    );
    assert!(
        err.contains(&format!("not pid {pid}: holds no GPU memory")),
        "{err}"
    );
    assert_eq!(code, 0, "not a leftover to end: {err}");
    assert!(alive(pid));
    let (code, v, err) = orphans(
        &m,
        &dev,
        &["--kill", "--yes", "--grace", "1s", "--without-gpu"],
    );
    assert_eq!(v["ended"][0]["outcome"], "ended", "{v:#}");
    assert_eq!(code, 0, "{err}");
    assert!(!alive(pid));
    script.kill().unwrap();
    script.wait().unwrap();
}
