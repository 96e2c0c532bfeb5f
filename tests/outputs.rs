//! The files a user asks for (`--json`, `--html`, `--trace`, a baseline): gpudoc writes what it was asked
//! to, where it was asked, and nothing else: a descriptor is written through, at its offset; a file written
//! over keeps its links and owner; a FIFO nobody reads blocks neither the job nor gpudoc.

mod common;

use common::{Machine, read_json};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ExitStatus, Stdio};
use std::time::Duration;

/// How long gpudoc may wait for a FIFO's reader at the end (docs/run.md), with room for a loaded machine.
const FIFO_WAIT: Duration = Duration::from_secs(5);
const SLACK: Duration = Duration::from_secs(5);

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
}

/// Waits up to `limit` for `c` to end; kills it (and fails) if it does not.
fn ends_within(c: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let mut status = None;
    if !common::within(limit, || {
        status = c.try_wait().unwrap();
        status.is_some()
    }) {
        let _ = c.kill();
        let _ = c.wait();
        panic!("{what}: gpudoc still running after {limit:?}");
    }
    status.unwrap()
}

#[test]
fn a_report_on_stderr_sent_to_a_file_comes_after_the_jobs_output() {
    // The issue's repro: the report on /dev/stderr, which the shell sent to err.log. Opening the path anew
    // (or replacing the file) wiped the job's traceback.
    let m = Machine::h200s(1);
    let err = m.path("err.log");
    let out = m
        .shell(&format!(
            r#""$GPUDOC" run -q --json /dev/stderr -- sh -c 'echo "Traceback (most recent call last):" >&2; exit 1' 2>{}"#,
            err.display()
        ))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = std::fs::read_to_string(&err).unwrap();
    let report = text
        .strip_prefix("Traceback (most recent call last):\n")
        .unwrap_or_else(|| panic!("the job's output comes first: {:.200}", text));
    let r: Value = serde_json::from_str(report).expect("then the report, whole");
    assert_eq!(r["exit"]["code"], 1);
}

#[test]
fn outputs_through_a_descriptor_keep_what_the_file_held() {
    // `--json /dev/fd/3 3>>log` (the help's own example, appending): what the log held stays.
    let m = Machine::h200s(1);
    let log = m.path("out.log");
    for (flag, starts) in [
        ("--json", "{"),
        ("--html", "<!doctype html>"),
        ("--trace", "timestamp, index"),
    ] {
        std::fs::write(&log, "earlier\n").unwrap();
        let out = m
            .shell(&format!(
                r#""$GPUDOC" run -q {flag} /dev/fd/3 -- echo job 3>>{}"#,
                log.display()
            ))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{flag}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "job\n", "{flag}");
        let text = std::fs::read_to_string(&log).unwrap();
        let rest = text
            .strip_prefix("earlier\n")
            .unwrap_or_else(|| panic!("{flag}: the log's content stays: {:.200}", text));
        assert!(
            rest.to_lowercase().starts_with(starts),
            "{flag}: then the output: {:.200}",
            rest
        );
    }
}

#[test]
fn a_file_written_over_keeps_its_hard_links_and_its_owner() {
    let m = Machine::h200s(1);
    let a = m.path("a.json");
    let b = m.path("b.json");
    std::fs::write(&a, "old").unwrap();
    std::fs::hard_link(&a, &b).unwrap();
    if is_root() {
        // Root writing a user's report must leave it the user's.
        nix::unistd::chown(&a, Some(65534.into()), Some(65534.into())).unwrap();
    }
    let st = m
        .gpudoc()
        .args(["run", "-q", "--json"])
        .arg(&a)
        .args(["--", "true"])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(
        read_json(&b)["schema"],
        "gpudoc.report/2",
        "one file, two names"
    );
    let (ma, mb) = (
        std::fs::metadata(&a).unwrap(),
        std::fs::metadata(&b).unwrap(),
    );
    assert_eq!((ma.ino(), ma.nlink()), (mb.ino(), 2));
    if is_root() {
        assert_eq!((ma.uid(), ma.gid()), (65534, 65534), "the owner stays");
    }
}

#[test]
fn existing_writable_files_in_a_read_only_folder_are_written() {
    // Root writes anywhere: the folder is read-only for the user gpudoc runs as (nobody, when root).
    let m = Machine::h200s(1);
    let top = tempfile::tempdir().unwrap();
    let dir = top.path().join("ro");
    std::fs::create_dir(&dir).unwrap();
    let (report, base) = (dir.join("r.json"), dir.join("base.json"));
    std::fs::write(&report, "old").unwrap();
    std::fs::write(&base, r#"{"schema": "gpudoc.baseline/1", "jobs": {}}"#).unwrap();
    let as_nobody = is_root();
    if as_nobody {
        for p in [top.path(), &dir, &report, &base] {
            nix::unistd::chown(p, Some(65534.into()), Some(65534.into())).unwrap();
        }
    }
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o555)).unwrap();
    let mut c = m.gpudoc();
    c.args(["run", "-q", "--allow-no-gpu", "--json"])
        .arg(&report)
        .arg("--baseline")
        .arg(&base)
        .args(["--name", "x", "--update-baseline", "--", "true"]);
    if as_nobody {
        // SAFETY: setgid and setuid between fork and exec.
        unsafe {
            c.pre_exec(|| {
                libc::setgid(65534);
                libc::setuid(65534);
                Ok(())
            });
        }
    }
    let out = c.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read_json(&report)["schema"], "gpudoc.report/2");
    assert!(read_json(&base)["jobs"]["x"].is_object());
}

#[test]
fn a_fifo_nobody_reads_blocks_neither_the_job_nor_gpudoc() {
    let m = Machine::h200s(1);
    // Two runs side by side, each giving up on its FIFO after FIFO_WAIT: the test waits that once.
    // A trace is written as the job runs: the job starts at once, and gpudoc gives up on the FIFO at the
    // end, saying so in the report.
    let fifo = m.path("t.csv");
    mkfifo(&fifo);
    let (ran, json) = (m.path("ran"), m.path("r.json"));
    let mut traced = m
        .gpudoc()
        .args(["run", "-q", "--json"])
        .arg(&json)
        .arg("--trace")
        .arg(&fifo)
        .args(["--", "touch"])
        .arg(&ran)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A report is written at the end: gpudoc says nobody read it, and the exit code shows it.
    let fifo = m.path("r.fifo");
    mkfifo(&fifo);
    let mut reported = m
        .gpudoc()
        .args(["run", "-q", "--json"])
        .arg(&fifo)
        .args(["--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if !common::within(Duration::from_secs(3), || ran.exists()) {
        for c in [&mut traced, &mut reported] {
            let _ = c.kill();
            let _ = c.wait();
        }
        panic!("the command did not start: gpudoc waited for the FIFO's reader");
    }
    let st = ends_within(&mut traced, FIFO_WAIT + SLACK, "--trace FIFO");
    assert_eq!(st.code(), Some(0), "a trace's failure is a note, as always");
    let notes = read_json(&json)["notes"].to_string();
    assert!(notes.contains("nobody opened it for reading"), "{notes}");
    let st = ends_within(&mut reported, FIFO_WAIT + SLACK, "--json FIFO");
    assert_eq!(st.code(), Some(125));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut reported.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("--json") && err.contains("nobody opened it for reading"),
        "{err}"
    );
}

#[test]
fn a_fifos_reader_that_comes_late_gets_the_whole_trace() {
    let m = Machine::h200s(1);
    let fifo = m.path("t.jsonl");
    mkfifo(&fifo);
    let mut c = m
        .gpudoc()
        .args(["run", "-q", "--trace"])
        .arg(&fifo)
        .args(["--", "sh", "-c"])
        .arg(r#""$FAKEGPU" alloc --steps 1GiB --hold-ms 600"#)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let got = std::fs::read(&fifo).unwrap();
    let st = ends_within(&mut c, SLACK, "--trace FIFO with a reader");
    assert!(st.success());
    let copy = m.path("copy.jsonl");
    std::fs::write(&copy, &got).unwrap();
    let r = common::report(&copy, &[]);
    assert_eq!(r["exit"]["code"], 0, "the end row came through");
    assert_eq!(r["gpus"][0]["job_peak_bytes"], 1u64 << 30);
}
