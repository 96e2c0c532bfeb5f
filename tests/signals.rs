//! Signals reach the job as they would without gpudoc: once, from every source (the guard's PID, the
//! process group, the terminal), with what the caller ignored still ignored; a stop or continue of
//! gpudoc is the job's; a job killed by a signal kills gpudoc with it. Each case is run bare too, so
//! the test says what "as without gpudoc" is.

mod common;

use common::Machine;
use common::term::Term;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn signals_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/signals.py")
}

/// The job under gpudoc (or bare), in a process group of its own as a shell's job is, stdout piped;
/// returns once it printed `ready`.
fn start_job(m: &Machine, under_gpudoc: bool, log: &Path, extra: &[&str]) -> Child {
    let mut c = if under_gpudoc {
        let mut c = m.gpudoc();
        c.args(["run", "-q", "--no-torch"]).args(extra).arg("--");
        c
    } else {
        Command::new("env")
    };
    c.arg("python3")
        .arg(signals_py())
        .arg(log)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    assert_eq!(common::line_of(&mut child), "ready\n");
    child
}

fn names(log: &Path) -> Vec<String> {
    let end = Instant::now() + Duration::from_secs(10);
    while !log.exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

/// What the job got when `send` signalled it (given the job's process, and whether it runs under gpudoc),
/// bare and under gpudoc.
fn got(m: &Machine, send: impl Fn(&Child)) -> (Vec<String>, Vec<String>) {
    let mut out = Vec::new();
    for under in [false, true] {
        let log = m.path(if under { "gpudoc.log" } else { "bare.log" });
        let _ = std::fs::remove_file(&log);
        let mut child = start_job(m, under, &log, &[]);
        send(&child);
        out.push(names(&log));
        child.wait().unwrap();
    }
    (out.remove(0), out.remove(0))
}

#[test]
fn a_signal_to_the_process_group_reaches_the_job_once() {
    let m = Machine::h200s(1);
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGUSR1,
        Signal::SIGHUP,
    ] {
        let (bare, wrapped) = got(&m, |c| killpg(Pid::from_raw(c.id() as i32), sig).unwrap());
        assert_eq!(bare, vec![sig.as_str().to_string()]);
        assert_eq!(wrapped, bare, "{sig}: kill -- -PGID");
    }
}

#[test]
fn a_signal_to_gpudocs_pid_reaches_the_job_once() {
    let m = Machine::h200s(1);
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGUSR2] {
        let (bare, wrapped) = got(&m, |c| kill(Pid::from_raw(c.id() as i32), sig).unwrap());
        assert_eq!(wrapped, bare, "{sig}: kill PID");
    }
}

#[test]
fn timeout_interrupting_gpudoc_interrupts_the_job_once() {
    // timeout signals its child, then its whole process group.
    let m = Machine::h200s(1);
    let log = m.path("t.log");
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--no-torch", "--", "python3"])
        .arg(signals_py())
        .arg(&log)
        .arg("20");
    let gpudoc = c.get_program().to_owned();
    let mut t = Command::new("timeout");
    // Long enough for the job's handlers to be in place on a busy machine (python's start, then gpudoc's).
    t.args(["-s", "INT", "3"]).arg(gpudoc).args(c.get_args());
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            t.env(k, v);
        }
    }
    let out = t.stdout(Stdio::null()).output().unwrap();
    assert_eq!(names(&log), vec!["SIGINT"]);
    // The job handled it and exited 0; timeout says it timed out.
    assert_eq!(out.status.code(), Some(124));
}

#[test]
fn signals_the_caller_ignored_stay_ignored_for_the_job() {
    // `nohup` ignores SIGHUP, a script's background job SIGINT and SIGQUIT: the job inherits that.
    let m = Machine::h200s(1);
    let ignored = |under: bool| {
        let mut c = if under {
            let mut c = m.gpudoc();
            c.args(["run", "-q", "--no-torch", "--"]);
            c
        } else {
            Command::new("env")
        };
        c.args(["sh", "-c", "grep SigIgn /proc/self/status"]);
        unsafe {
            c.pre_exec(|| {
                for s in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT] {
                    libc::signal(s, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    let bare = ignored(false);
    assert!(bare.starts_with("SigIgn:"), "{bare}");
    assert_eq!(ignored(true), bare);
}

#[test]
fn stopping_and_continuing_gpudoc_stops_and_continues_the_job() {
    let m = Machine::h200s(1);
    let count = Counter::new(&m);
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--no-torch", "--", "sh", "-c", &count.script()])
        .process_group(0)
        .stdout(Stdio::null());
    let mut child = c.spawn().unwrap();
    let pid = Pid::from_raw(child.id() as i32);
    count.started();
    assert!(count.advancing(), "the job runs");
    for stop in [Signal::SIGSTOP, Signal::SIGTSTP] {
        kill(pid, stop).unwrap();
        assert!(count.halted(), "{stop} to gpudoc's pid stops the job");
        kill(pid, Signal::SIGCONT).unwrap();
        assert!(count.advancing(), "SIGCONT after {stop} continues it");
    }
    kill(pid, Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGTERM));
}

#[test]
fn lingering_for_a_scraper_ends_when_gpudoc_is_asked_to() {
    let m = Machine::h200s(1);
    let out = m
        .gpudoc()
        .args([
            "run",
            "--metrics",
            "0",
            "--metrics-linger",
            "10000000h",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--metrics-linger"),
        "{out:?}"
    );
    let mut c = m.gpudoc();
    c.args([
        "run",
        "-q",
        "--metrics",
        "0",
        "--metrics-linger",
        "1h",
        "--",
        "true",
    ])
    .process_group(0)
    .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let asked = Instant::now();
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(asked.elapsed() < Duration::from_secs(3), "still lingering");
    assert_eq!(status.code(), Some(0), "the command's code, as at any end");
}

#[test]
fn what_the_job_leaves_running_keeps_writing_where_it_wrote() {
    // Without gpudoc the background loop writes into the pipe to `cat` until it is done.
    let m = Machine::h200s(1);
    let log = m.path("d.log");
    let script = format!(
        r#""$GPUDOC" run -q --no-torch -- sh -c '(for i in 1 2 3 4 5 6; do echo tick $i; echo alive $i >> {}; sleep .3; done) & echo main-done' | cat"#,
        log.display()
    );
    let out = m.shell(&script).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.contains("main-done") && printed.contains("tick 6"),
        "{printed}"
    );
    let alive = std::fs::read_to_string(&log).unwrap();
    assert_eq!(alive.lines().count(), 6, "{alive}");
}

/// A job that writes a growing count to a file every 50 ms: whether it runs or is stopped.
struct Counter(PathBuf);

impl Counter {
    fn new(m: &Machine) -> Counter {
        Counter(m.path("count"))
    }

    /// The job's script.
    fn script(&self) -> String {
        format!(
            "i=0; while :; do echo $i > '{}'; i=$((i+1)); sleep 0.05; done",
            self.0.display()
        )
    }

    fn read(&self) -> Option<u64> {
        std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    }

    /// Waits (at most 10 s) for the first count.
    fn started(&self) {
        let end = Instant::now() + Duration::from_secs(10);
        while self.read().is_none() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the count moves within 10 s: a running job's does in 50 ms, a loaded machine's stalls
    /// aside.
    fn advancing(&self) -> bool {
        let a = self.read();
        common::within(Duration::from_secs(10), || self.read() != a)
    }

    /// Whether the count holds still over 400 ms, once a stop has had 5 s to land: a job that runs moves
    /// it every 50 ms.
    fn halted(&self) -> bool {
        common::within(Duration::from_secs(5), || {
            let a = self.read();
            std::thread::sleep(Duration::from_millis(400));
            self.read() == a
        })
    }
}

/// `gpudoc run -- python3 -c program` as the session leader of a new terminal.
fn python_on_terminal(m: &Machine, program: &str) -> Term {
    let mut c = m.gpudoc();
    c.args(["run", "--no-torch", "--", "python3", "-c", program]);
    Term::start(c)
}

/// `gpudoc run -- sh -c script` as the session leader of a new terminal.
fn on_terminal(m: &Machine, script: &str) -> Term {
    let mut c = m.gpudoc();
    c.args(["run", "--no-torch", "--", "sh", "-c", script]);
    Term::start(c)
}

#[test]
fn a_terminal_hang_up_reaches_the_job_and_never_blocks_it() {
    // `tmux kill-session`, a dropped ssh: the kernel tells the session leader (gpudoc's guard).
    let m = Machine::h200s(1);
    for stdin_too in [true, false] {
        let log = m.path("hup.log");
        let count = m.path("count");
        let _ = std::fs::remove_file(&log);
        let script = format!(
            "trap 'echo got HUP >> {log}' HUP; i=0; while :; do echo tick $i; echo $i > {count}; i=$((i+1)); sleep 0.1; done",
            log = log.display(),
            count = count.display()
        );
        let mut c = m.gpudoc();
        c.args(["run", "--no-torch", "--", "sh", "-c", &script]);
        if !stdin_too {
            c.stdin(Stdio::null());
        }
        let mut t = Term::start_keeping_stdin(c, !stdin_too);
        t.expect("tick 3");
        let mut child = t.hang_up();
        let end = Instant::now() + Duration::from_secs(5);
        while !std::fs::read_to_string(&log).is_ok_and(|s| s.contains("got HUP")) {
            assert!(
                Instant::now() < end,
                "no SIGHUP reached the job (stdin on the terminal: {stdin_too})"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // It goes on writing to its dead terminal, as without gpudoc, and never blocks.
        let read = || std::fs::read_to_string(&count).unwrap_or_default();
        let before = read();
        std::thread::sleep(Duration::from_millis(600));
        assert_ne!(
            read(),
            before,
            "the job is blocked (stdin on the terminal: {stdin_too})"
        );
        kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
        child.wait().unwrap();
        assert_eq!(
            std::fs::read_to_string(&log)
                .unwrap()
                .matches("got HUP")
                .count(),
            1
        );
    }
}

#[test]
fn a_second_ctrl_c_never_cuts_a_checkpoint_short() {
    // The job catches the first Ctrl-C and saves for a second, ignoring SIGINT; a second press arrives
    // while it saves. Without gpudoc it saves all and exits 1.
    let m = Machine::h200s(1);
    let ckpt = m.path("ckpt");
    let program = format!(
        r#"
import signal, sys, time
try:
    print("ready", flush=True)
    time.sleep(30)
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print("saving", flush=True)
    with open("{}", "wb") as f:
        for i in range(10):
            f.write(b"x" * 2000); f.flush(); time.sleep(0.1)
    print("saved", flush=True)
    sys.exit(1)
"#,
        ckpt.display()
    );
    let mut t = python_on_terminal(&m, &program);
    t.expect("ready");
    t.type_bytes(b"\x03");
    t.expect("saving");
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("saved"), "{out}");
    assert_eq!(std::fs::metadata(&ckpt).unwrap().len(), 20_000);
}

#[test]
fn a_prompt_on_the_terminal_is_never_drawn_over() {
    // getpass, sudo and ssh write their prompt to /dev/tty and wait: the live line must not clear it.
    let m = Machine::h200s(1);
    let mut t = on_terminal(
        &m,
        r#"echo first; sleep 1.2; printf 'Password: ' > /dev/tty; read -r x < /dev/tty; echo "got $x""#,
    );
    t.expect("Password: ");
    std::thread::sleep(Duration::from_millis(1200));
    t.expect("Password: ");
    let after = t.seen_after("Password: ");
    assert!(
        !after.contains("\x1b[K"),
        "drawn over the prompt: {after:?}"
    );
    t.type_bytes(b"abc\r");
    t.expect("got abc");
    let (code, _) = t.finish();
    assert_eq!(code, 0);
}

#[test]
fn a_full_screen_program_gets_single_keys() {
    // curses sets cbreak on the terminal it writes to, then reads keys one at a time.
    let m = Machine::h200s(1);
    let program = "import os, sys, tty; tty.setcbreak(1); print('ready', flush=True); print('got', os.read(0, 1), flush=True)";
    let mut t = python_on_terminal(&m, program);
    t.expect("ready");
    t.type_bytes(b"x");
    t.expect("got b'x'");
    let (code, _) = t.finish();
    assert_eq!(code, 0);
}

#[test]
fn a_full_screen_program_gets_single_keys_with_stderr_in_a_file() {
    // `gpudoc run -- python tui.py 2> log`, `vim 2> err`: curses sets cbreak on the terminal it writes to
    // (fd 1) and reads keys from fd 0, which must be one terminal, as bare; stderr stays the job's file.
    let m = Machine::h200s(1);
    let tui = m.path("tui.py");
    std::fs::write(
        &tui,
        r#"import os, sys, tty
print("tty", os.isatty(0), os.isatty(1), os.isatty(2), flush=True)
tty.setcbreak(1)
sys.stderr.write("to the log\n"); sys.stderr.flush()
print("ready", flush=True)
for _ in range(2):
    print("got", os.read(0, 1), flush=True)
"#,
    )
    .unwrap();
    let log = m.path("err.log");
    let mut t = Term::start(m.shell(&format!(
        "exec \"$GPUDOC\" run --no-torch -- python3 {} 2> {}",
        tui.display(),
        log.display()
    )));
    t.expect("ready");
    t.type_bytes(b"x");
    t.expect("got b'x'");
    t.type_bytes(b"y");
    t.expect("got b'y'");
    let (code, out) = t.finish();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("tty True True False"), "as bare: {out}");
    let log = std::fs::read_to_string(&log).unwrap();
    // The job's own bytes first, untouched; gpudoc's summary after them, as lines of a file (no `\r\n` of
    // a raw terminal's, no live line's escapes).
    assert!(log.starts_with("to the log\ngpudoc: "), "{log:?}");
    assert!(!log.contains('\r') && !log.contains('\x1b'), "{log:?}");
}

#[test]
fn each_fd_is_a_terminal_and_gives_keys_where_it_does_bare() {
    // A program reads its keys where a terminal is: fd 0, or, with stdin elsewhere, fd 2 (`cat notes |
    // more`, `vim -`); it sets single-key mode on the terminal it writes to (curses: fd 1) or else on the
    // one it reads. Bare and under gpudoc, for each way the shell can wire the fds.
    let m = Machine::h200s(1);
    let probe = m.path("probe.py");
    std::fs::write(
        &probe,
        r#"import os, tty
print("tty", *(os.isatty(fd) for fd in (0, 1, 2)), flush=True)
keys = 0 if os.isatty(0) else 2
tty.setcbreak(1 if os.isatty(1) else keys)
print("ready", flush=True)
print("got", os.read(keys, 1), flush=True)
"#,
    )
    .unwrap();
    let err = m.path("err.log");
    let wirings = [
        ("2> err", format!("2> {}", err.display())),
        ("< /dev/null", "< /dev/null".to_string()),
        ("| cat", "| cat".to_string()),
        ("none", String::new()),
    ];
    for (name, wiring) in wirings {
        let mut seen = Vec::new();
        for gpudoc in ["", "\"$GPUDOC\" run -q --no-torch -- "] {
            let script = format!("{gpudoc}python3 {} {wiring}", probe.display());
            let mut t = Term::start(m.shell(&script));
            t.expect("ready");
            t.type_bytes(b"x");
            t.expect("got b'x'");
            let (code, out) = t.finish();
            assert_eq!(code, 0, "{name}: {out}");
            seen.push(out.lines().next().unwrap_or_default().to_string());
        }
        assert_eq!(seen[0], seen[1], "{name}: isatty(), bare then under gpudoc");
    }
}

#[test]
fn ctrl_z_in_a_shell_stops_the_job_and_fg_continues_it() {
    let m = Machine::h200s(1);
    let count = Counter::new(&m);
    let mut t = interactive_bash(&m);
    let script = m.path("count.sh");
    std::fs::write(&script, count.script()).unwrap();
    let cmd = format!("\"$GPUDOC\" run -q --no-torch -- sh {}\r", script.display());
    t.type_bytes(cmd.as_bytes());
    count.started();
    assert!(count.advancing());
    t.type_bytes(b"\x1a");
    t.expect("Stopped");
    assert!(count.halted(), "Ctrl-Z stops the job");
    t.type_bytes(b"fg\r");
    assert!(count.advancing(), "fg continues it");
    t.type_bytes(b"\x03");
    // The shell's third prompt (the first, the one after "Stopped", then the one once the job ended): the
    // second was there before the Ctrl-C, and waiting for it raced the job's end.
    t.expect_times("$ ", 3);
    assert!(count.halted(), "Ctrl-C ended it");
    t.type_bytes(b"exit\r");
    t.finish();
}

#[test]
fn ctrl_c_stops_a_script_that_loops_over_gpudoc_run() {
    // The user's terminal is raw while the command runs: the script's shell never saw the Ctrl-C, and
    // the loop went on to its next run. Without gpudoc the terminal signals its whole foreground group.
    let m = Machine::h200s(1);
    let script = m.path("sweep.sh");
    std::fs::write(
        &script,
        "for i in 1 2 3; do\n  \"$GPUDOC\" run -q --no-torch -- sh -c 'echo \"run $0\"; sleep 5' \"$i\"\ndone\necho loop-over\n",
    )
    .unwrap();
    let mut t = Term::start(m.shell(&format!("bash {}", script.display())));
    t.expect("run 1");
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert!(
        !out.contains("run 2") && !out.contains("loop-over"),
        "{out}"
    );
    assert_eq!(code, 130, "{out}");
}

/// A makefile named `name` whose one recipe is `recipe`, in `m`'s folder.
fn makefile(m: &Machine, name: &str, recipe: &str) -> PathBuf {
    let path = m.path(name);
    std::fs::write(&path, format!("all:\n\t{recipe}\n")).unwrap();
    path
}

/// The start of a recipe whose shell dies of Ctrl-C's SIGINT 0.2 s after it, as a program that cleans up
/// first does. A recipe that died at the moment make got the SIGINT itself lost GNU make 4.3 its own race:
/// the child reaped by make's main loop, its signal handler's wait found none (`make: *** wait: No child
/// processes.  Stop.`, exit 2, not by SIGINT), and the script went on: 4 bare runs in 40 with two cores
/// busy, none with this.
const DIES_AFTER_MAKE: &str = r#"trap "sleep 0.2; trap - INT; kill -INT $$$$" INT; "#;

#[test]
fn ctrl_c_ends_make_under_gpudoc_and_gpudoc_under_make_as_bare() {
    // make and bash stop on Ctrl-C by the WIFSIGNALED convention: make dies of SIGINT when it gets one
    // (a recipe that died of it is not enough: that is `make: *** Interrupt`, exit 2), and a script's bash
    // stops only when what it waited for died of SIGINT. A script running make, make running a recipe:
    // bare, gpudoc around make, gpudoc in its recipe; each must end the script by SIGINT.
    let m = Machine::h200s(1);
    let sleeps = format!("{DIES_AFTER_MAKE}echo recipe-$$((1+1)); sleep 5");
    let sleeps = sleeps.as_str();
    let sleeps_mk = makefile(&m, "sleeps.mk", sleeps);
    let runs_mk = makefile(
        &m,
        "runs.mk",
        &format!("\"$$GPUDOC\" run -q --no-torch -- sh -c '{sleeps}'"),
    );
    let wrapped = "\"$GPUDOC\" run -q --no-torch -- make";
    let cases = [
        ("bare", &sleeps_mk, "make"),
        ("around make", &sleeps_mk, wrapped),
        ("in the recipe", &runs_mk, "make"),
    ];
    for (case, file, make) in cases {
        let script = format!("{make} -f {}; echo after-$((2+2))", file.display());
        let mut t = Term::start(m.shell(&script));
        t.expect("recipe-2");
        std::thread::sleep(Duration::from_millis(300));
        t.type_bytes(b"\x03");
        let (code, out) = t.finish();
        assert!(
            !out.contains("after-4"),
            "{case}: the script went on: {out}"
        );
        assert_eq!(code, 128 + libc::SIGINT, "{case}: {out}");
    }
    // Without a terminal: SIGINT to the process group of `gpudoc run -- make`, as `kill -INT -PGID`.
    for under in [false, true] {
        let file = makefile(
            &m,
            "plain.mk",
            &format!("{DIES_AFTER_MAKE}echo recipe; sleep 5"),
        );
        let mut c = if under {
            m.gpudoc()
        } else {
            Command::new("env")
        };
        if under {
            c.args(["run", "-q", "--no-torch", "--"]);
        }
        let mut child = c
            .args(["make", "-s", "-f"])
            .arg(&file)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        assert_eq!(common::line_of(&mut child), "recipe\n");
        std::thread::sleep(Duration::from_millis(300));
        killpg(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGINT), "under gpudoc: {under}");
    }
}

#[test]
fn a_ctrl_c_never_waits_behind_output_a_stalled_terminal_does_not_take() {
    // An ssh connection that stops reading: gpudoc blocks writing the command's output to it, and a key
    // typed meanwhile reached the command only once the terminal read again.
    let m = Machine::h200s(1);
    let got = m.path("got");
    let program = format!(
        r#"
import signal, sys
def caught(*_):
    open({:?}, "w").close()
    sys.exit(0)
signal.signal(signal.SIGINT, caught)
print("ready", flush=True)
while True:
    print("x" * 200, flush=True)
"#,
        got.display().to_string()
    );
    let mut t = python_on_terminal(&m, &program);
    t.expect("ready");
    t.stall(true);
    // Every buffer between the command and the terminal fills.
    std::thread::sleep(Duration::from_millis(500));
    t.type_bytes(b"\x03");
    let reached = common::within(Duration::from_secs(3), || got.exists());
    t.stall(false);
    let _ = t.finish();
    assert!(reached, "the Ctrl-C waited for the terminal to read");
}

/// An interactive bash on a new terminal, with gpudoc's path in `$GPUDOC` and the fake GPUs.
fn interactive_bash(m: &Machine) -> Term {
    let mut bash = Command::new("bash");
    bash.args(["--norc", "--noprofile", "-i"])
        .env("PS1", "$ ")
        .env("GPUDOC", common::gpudoc_bin())
        .env("GPUDOC_NVML_LIB", common::fake_lib())
        .env("FAKE_NVML_STATE", m.state_path())
        .env("NO_COLOR", "1")
        .env_remove("CI");
    let mut t = Term::start(bash);
    t.expect("$ ");
    t
}

#[test]
fn a_job_sent_to_the_background_ends_as_done_not_stopped() {
    // Ctrl-Z, then `bg`: when the job ends, gpudoc is in the background; giving the terminal its modes
    // back from there stopped the guard (SIGTTOU), and `wait` never returned.
    let m = Machine::h200s(1);
    let mut t = interactive_bash(&m);
    t.type_bytes(b"\"$GPUDOC\" run -q --no-torch -- sh -c 'echo up-$((1+1)); sleep 1.5; echo done-$((2+2))'\r");
    // What the command prints, not the line typed (the shell echoes it).
    t.expect("up-2");
    // In its sleep: a stop key typed while `sh` forks may stop the new process alone.
    std::thread::sleep(Duration::from_millis(300));
    t.type_bytes(b"\x1a");
    t.expect("Stopped");
    t.type_bytes(b"bg\r");
    t.expect("done-4");
    // gpudoc leaves within a second of its command (it drains and reports).
    t.type_bytes(b"sleep 1.5; jobs; echo listed-$((3+3))\r");
    t.expect("listed-6");
    let after = t.seen_after("done-4");
    t.type_bytes(b"kill -9 %1 2>/dev/null\r");
    t.expect_times("$ ", 5);
    let _ = t.child.kill();
    let _ = t.finish();
    assert!(
        after.contains("Done") && !after.contains("Stopped"),
        "gpudoc stopped itself: {after}"
    );
}

/// The PIDs of processes whose command line is exactly `cmdline`.
fn pids_running(cmdline: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for p in procfs::process::all_processes().unwrap().flatten() {
        if p.cmdline().is_ok_and(|c| c.join(" ") == cmdline)
            && p.stat().is_ok_and(|s| s.state != 'Z')
        {
            out.push(p.pid);
        }
    }
    out
}

#[test]
fn killing_every_gpudoc_process_at_once_still_ends_the_job() {
    // `pkill -9 gpudoc`: the guard and gpudoc die together; what the job detached must not run on.
    let m = Machine::h200s(1);
    let (a, b) = ("sleep 311", "sleep 312");
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--no-torch", "--", "sh", "-c"])
        .arg(format!("{a} & setsid {b} & wait"))
        .process_group(0)
        .stderr(Stdio::null());
    let mut child = c.spawn().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while (pids_running(a).is_empty() || pids_running(b).is_empty()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Let the keeper note them (it looks every half second).
    std::thread::sleep(Duration::from_millis(1200));
    let guard = child.id() as i32;
    let gpudoc = common::gpudoc_under(guard as u32);
    kill(Pid::from_raw(gpudoc), Signal::SIGKILL).unwrap();
    kill(Pid::from_raw(guard), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !(pids_running(a).is_empty() && pids_running(b).is_empty()) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = pids_running(a).into_iter().chain(pids_running(b)).collect();
    for &p in &left {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    assert!(left.is_empty(), "still running: {left:?}");
}

#[test]
fn killing_every_gpudoc_process_at_once_gives_the_terminal_its_modes_back() {
    // Under a shell that does not repair the terminal (dash), a `pkill -9 gpudoc` left it raw: no echo,
    // no line editing. The keeper, which survives, gives back the modes gpudoc changed; also where gpudoc
    // reached the terminal through a descriptor of its own (stdin elsewhere: `< /dev/null`).
    let m = Machine::h200s(1);
    for stdin_too in [true, false] {
        let mut c = m.gpudoc();
        c.args([
            "run",
            "--no-torch",
            "--",
            "sh",
            "-c",
            "echo ready-$((1+1)); sleep 30",
        ]);
        if !stdin_too {
            c.stdin(Stdio::null());
        }
        let mut t = Term::start_keeping_stdin(c, !stdin_too);
        t.expect("ready-2");
        let cooked =
            |t: &Term| t.modes().c_lflag & (libc::ICANON | libc::ECHO) == libc::ICANON | libc::ECHO;
        assert!(
            !cooked(&t),
            "gpudoc puts the terminal in raw mode ({stdin_too})"
        );
        // Let the keeper note the job (it looks every half second).
        std::thread::sleep(Duration::from_millis(700));
        let guard = t.child.id() as i32;
        let gpudoc = common::gpudoc_under(guard as u32);
        kill(Pid::from_raw(gpudoc), Signal::SIGKILL).unwrap();
        kill(Pid::from_raw(guard), Signal::SIGKILL).unwrap();
        let back = common::within(Duration::from_secs(5), || cooked(&t));
        let _ = t.finish();
        assert!(back, "the terminal stays raw (stdin on it: {stdin_too})");
    }
}

#[test]
fn what_a_job_leaves_running_outlives_a_gpudoc_that_ends_as_it_should() {
    // Reported, not ended (that is --kill-orphans'): the keeper leaves with the guard, ending nothing.
    let m = Machine::h200s(1);
    let left = "sleep 313";
    let out = m
        .gpudoc()
        .args(["run", "-q", "--no-torch", "--", "sh", "-c"])
        .arg(format!("{left} > /dev/null 2>&1 &"))
        .output()
        .unwrap();
    assert!(out.status.success());
    std::thread::sleep(Duration::from_millis(1500));
    let pids = pids_running(left);
    for &p in &pids {
        let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
    }
    assert_eq!(pids.len(), 1, "the leftover was ended");
}
