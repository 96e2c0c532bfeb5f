//! `gpudoc run` on a terminal: the command still sees one, Ctrl-C reaches it once, a third quick Ctrl-C it
//! did not answer kills the job, and the live line shows and goes away. gpudoc runs here in a session of its own with a
//! pseudo-terminal as its controlling terminal, as in an interactive shell.

mod common;

use common::Machine;
use common::term::Term;
use std::process::Command;

fn gpudoc_sh(m: &Machine, extra: &[&str], script: &str) -> Command {
    let mut c = m.gpudoc();
    c.arg("run").args(extra).args(["--", "sh", "-c", script]);
    c
}

#[test]
fn the_command_sees_a_terminal_and_ctrl_c_reaches_it_once() {
    let m = Machine::h200s(1);
    let script = r#"
        [ -t 1 ] && echo "stdout is a tty"; [ -t 2 ] && echo "stderr is a tty"
        n=0; trap 'n=$((n+1))' INT
        echo ready; i=0
        while [ $i -lt 30 ]; do sleep 0.02; i=$((i+1)); done
        echo "INT count $n"
    "#;
    let json = m.path("r.json");
    let mut t = Term::start(gpudoc_sh(&m, &["--json", json.to_str().unwrap()], script));
    t.expect("ready");
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("stdout is a tty") && out.contains("stderr is a tty"),
        "{out}"
    );
    assert!(
        out.contains("INT count 1"),
        "Ctrl-C must reach the command exactly once: {out}"
    );
    // Two deliveries close together could merge into one pending signal, so check the source too:
    // the terminal delivered it, gpudoc did not send it again.
    let r = common::read_json(&json);
    assert_eq!(
        r["exit"]["forwarded_signals"],
        serde_json::json!([]),
        "{out}"
    );
}

#[test]
fn three_quick_ctrl_c_the_job_does_not_answer_kill_it() {
    // A job stuck in a call (a hung collective) writes nothing when Ctrl-C'd: it gets every press, as
    // without gpudoc; the second unanswered one is told what a third does; the third ends it and
    // everything it started.
    let m = Machine::h200s(1);
    let json = m.path("r.json");
    let script = r#"trap 'n=$((n+1))' INT; echo ready; while :; do sleep 0.02; done"#;
    let mut t = Term::start(gpudoc_sh(&m, &["--json", json.to_str().unwrap()], script));
    t.expect("ready");
    t.type_bytes(b"\x03");
    // Keys read together are one press: the job had no time to answer between them.
    std::thread::sleep(std::time::Duration::from_millis(300));
    t.type_bytes(b"\x03");
    t.expect("one more within 3 s");
    t.type_bytes(b"\x03");
    let (code, out) = t.finish();
    assert_eq!(code, 128 + 9, "{out}");
    let r = common::read_json(&json);
    assert_eq!(r["exit"]["killed_by_gpudoc"], true);
    assert!(
        out.contains("killed by SIGKILL (gpudoc, after Ctrl-C presses it did not answer)"),
        "{out}"
    );
}

#[test]
fn a_job_that_answers_each_ctrl_c_gets_every_one() {
    // A REPL, pdb, a shell, a server asking "Shutdown?": each press is answered, none is the last.
    let m = Machine::h200s(1);
    let program = r#"
import time
n = 0
print("ready", flush=True)
while n < 4:
    try:
        time.sleep(30)
    except KeyboardInterrupt:
        n += 1
        print("caught", n, flush=True)
print("done after", n, flush=True)
"#;
    let mut c = m.gpudoc();
    c.args(["run", "--no-torch", "--", "python3", "-c", program]);
    let mut t = Term::start(c);
    t.expect("ready");
    for n in 1..=4 {
        // As a user types them: apart, each within a second of the last.
        std::thread::sleep(std::time::Duration::from_millis(300));
        t.type_bytes(b"\x03");
        t.expect(&format!("caught {n}"));
    }
    let (code, out) = t.finish();
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("done after 4"), "{out}");
    assert!(!out.contains("one more"), "{out}");
}

#[test]
fn the_live_line_shows_on_a_terminal_and_not_in_ci() {
    let m = Machine::h200s(1);
    let script = r#""$FAKEGPU" alloc --steps 2GiB --hold-ms 700 --say allocated & wait"#;
    let mut t = Term::start(gpudoc_sh(&m, &[], script));
    t.expect("allocated");
    t.expect("GPU0 job 2.00 GiB");
    let (code, out) = t.finish();
    assert_eq!(code, 0);
    assert!(out.contains("job peak 2.00 GiB"), "{out}");

    let mut c = gpudoc_sh(&m, &[], script);
    c.env("CI", "true");
    let t = Term::start(c);
    let (_, out) = t.finish();
    assert!(
        out.contains("allocated") && !out.contains("GPU0 job"),
        "{out}"
    );
}

/// Runs `sh -c script` in a fresh terminal, bare or under gpudoc (live line on); everything printed.
fn in_terminal(m: &Machine, script: &str, under_gpudoc: bool) -> String {
    let cmd = if under_gpudoc {
        gpudoc_sh(m, &[], script)
    } else {
        let mut c = Command::new("sh");
        c.args(["-c", script]);
        c
    };
    let (code, out) = Term::start(cmd).finish();
    assert_eq!(code, 0, "{out}");
    out
}

#[test]
fn progress_bars_and_partial_lines_reach_the_terminal_byte_for_byte() {
    let m = Machine::h200s(1);
    // A partial line left open for a while, then a tqdm-style bar redrawn with \r 21 times.
    let script = r#"
        printf 'Loading model... '; sleep 0.8; printf 'done\n'
        i=0; while [ $i -le 20 ]; do printf '\r%3d%%|%s|' $((i*5)) "$(printf '%*s' $i '' | tr ' ' '#')"; sleep 0.05; i=$((i+1)); done
        printf '\n'
    "#;
    let bare = in_terminal(&m, script, false);
    let wrapped = in_terminal(&m, script, true);
    let summary = wrapped.find("gpudoc:").expect("the summary");
    assert_eq!(
        &wrapped[..summary],
        bare,
        "the command's bytes, exactly, before the summary"
    );
    assert!(bare.contains("Loading model... done"), "{bare:?}");
    assert_eq!(
        bare.matches('\r').count(),
        21 + 2,
        "21 redraws and two line ends: {bare:?}"
    );
}

#[test]
fn the_live_line_sits_on_a_line_of_its_own_and_leaves_nothing_behind() {
    let m = Machine::h200s(1);
    let script = r#"echo first; sleep 1.2; echo second"#;
    let bare = in_terminal(&m, script, false);
    let wrapped = in_terminal(&m, script, true);
    let summary = wrapped.find("gpudoc:").expect("the summary");
    let shown = &wrapped[..summary];
    assert!(
        shown.contains("gpudoc sampling") || shown.contains("gpudoc GPU0"),
        "{shown:?}"
    );
    // The live line is drawn after "first\n" and cleared before "second": take it out and the
    // command's bytes are what they were.
    let mut stripped = String::new();
    let mut rest = shown;
    while let Some(i) = rest.find("\r\x1b[K") {
        stripped.push_str(&rest[..i]);
        rest = &rest[i + 4..];
        // What follows a clear up to the next clear or line end is the live line.
        let end = rest.find(['\r', '\n']).unwrap_or(rest.len());
        if rest[..end].contains("gpudoc") {
            rest = &rest[end..];
        }
    }
    stripped.push_str(rest);
    assert_eq!(stripped, bare);
}

#[test]
fn real_oom_texts_on_a_terminal_are_read() {
    let m = Machine::h200s(1);
    for common::RealText { name, file, want } in common::one_real_text_per_vendor() {
        let json = m.path("r.json");
        let script = format!("cat '{}'; exit 1", file.display());
        let t = Term::start(gpudoc_sh(
            &m,
            &["-q", "--json", json.to_str().unwrap()],
            &script,
        ));
        let (code, out) = t.finish();
        assert_eq!(code, 1, "{name}: {out}");
        let r = common::read_json(&json);
        if want["text"].is_null() {
            assert!(r["oom"].is_null(), "{name}");
        } else {
            assert_eq!(
                r["oom"]["stream"], "stdout+stderr",
                "one terminal for both: {name}"
            );
            assert_eq!(
                r["oom"]["requested_bytes"], want["text"]["requested_bytes"],
                "{name}"
            );
        }
    }
}

#[test]
fn an_oom_in_a_stderr_log_is_read_while_the_command_has_the_terminal() {
    // `gpudoc run -- python train.py 2> log` on a terminal: stdin and stdout are the command's own
    // terminal, stderr its own file, which gpudoc reads along; the file gets the command's bytes as they
    // were written, and only this run's OOM is taken.
    let m = Machine::h200s(1);
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/oom/real/accelerate_slurm_label.txt");
    let want: serde_json::Value =
        serde_json::from_slice(&std::fs::read(text.with_extension("expected.json")).unwrap())
            .unwrap();
    let (json, log) = (m.path("r.json"), m.path("err.log"));
    let script = format!(
        "exec \"$GPUDOC\" run -q --no-torch --json {} -- sh -c '[ -t 0 ] && [ -t 1 ] && echo on-its-terminal; cat {} >&2; exit 1' 2> {}",
        json.display(),
        text.display(),
        log.display()
    );
    let (code, out) = Term::start(m.shell(&script)).finish();
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("on-its-terminal"), "{out}");
    let r = common::read_json(&json);
    assert_eq!(r["oom"]["stream"], "stderr");
    assert_eq!(r["oom"]["requested_bytes"], want["text"]["requested_bytes"]);
    assert_eq!(std::fs::read(&log).unwrap(), std::fs::read(&text).unwrap());
}

#[test]
fn a_terminal_left_non_blocking_still_gets_every_byte() {
    // Programs that crash can leave the terminal O_NONBLOCK; a slow terminal then fills and says EAGAIN.
    use std::io::Read;
    let m = Machine::h200s(1);
    let pty = nix::pty::openpty(None, None).unwrap();
    common::set_nonblocking(&pty.slave);
    let mut cmd = gpudoc_sh(&m, &[], "head -c 2000000 /dev/zero | tr '\\0' '~'");
    cmd.stdout(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
        .stderr(std::process::Stdio::from(pty.slave));
    let mut child = cmd.spawn().unwrap();
    drop(cmd);
    std::thread::sleep(std::time::Duration::from_millis(500));
    // Non-blocking, so a gpudoc that hangs fails the test instead of stalling it.
    common::set_nonblocking(&pty.master);
    let mut master = std::fs::File::from(pty.master);
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    let _ = child.kill();
                    panic!("gpudoc still runs after 30 s, {} bytes passed", got.len());
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            // EIO once every holder of the other side has closed it.
            Err(_) => break,
        }
    }
    assert!(child.wait().unwrap().success());
    // Every byte of the command's, then gpudoc's summary.
    let run = got.iter().take_while(|&&c| c == b'~').count();
    assert_eq!(run, 2_000_000, "{}", String::from_utf8_lossy(&got[run..]));
}

#[test]
fn gpudocs_words_start_on_a_line_of_their_own() {
    // The command left its last line unfinished (a prompt, a progress bar, a Ctrl-C's `^C`).
    let m = Machine::h200s(1);
    let (code, out) = Term::start(gpudoc_sh(&m, &[], "printf 'partial'; exit 3")).finish();
    assert_eq!(code, 3);
    let at = out.find("gpudoc:").expect("the summary");
    assert!(out[..at].ends_with("partial\r\n"), "{:?}", &out[..at]);
}

#[test]
fn a_trace_written_to_the_terminal_keeps_its_lines_apart() {
    // `--trace /dev/stderr` on a terminal gpudoc has put in raw mode: each row starts at the left
    // margin, as the terminal's own output processing would have put it, not a staircase.
    let m = Machine::h200s(1);
    let script = "echo ready; sleep 1.5; echo done";
    let (code, out) = Term::start(gpudoc_sh(&m, &["--trace", "/dev/stderr"], script)).finish();
    assert_eq!(code, 0, "{out}");
    // nvidia-smi's CSV: `2026/12/01 15:12:54.626, 0, 0, 143771, , , `
    let rows: Vec<&str> = out
        .split_inclusive('\n')
        .filter(|l| l.contains(", 0, "))
        .collect();
    assert!(!rows.is_empty(), "{out:?}");
    for row in rows {
        assert!(row.ends_with("\r\n"), "{row:?} in {out:?}");
    }
}
