//! A pseudo-terminal for tests: a command started as the session leader of a new terminal, what it
//! prints read as it comes, keys typed into it.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Term {
    master: std::fs::File,
    pub child: Child,
    out: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
}

impl Term {
    /// Starts `cmd` as the session leader of a new terminal.
    pub fn start(mut cmd: Command) -> Term {
        let pty = nix::pty::openpty(None, None).unwrap();
        let slave = pty.slave;
        cmd.stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                libc::ioctl(0, libc::TIOCSCTTY, 0);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop(cmd);
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let (tx, out) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Term {
            master,
            child,
            out,
            seen: Vec::new(),
        }
    }

    /// Reads until `needle` appears (or panics after 10 s).
    pub fn expect(&mut self, needle: &str) {
        let end = Instant::now() + Duration::from_secs(10);
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(chunk) => self.seen.extend(chunk),
                Err(_) => panic!("no {needle:?} in {:?}", String::from_utf8_lossy(&self.seen)),
            }
        }
    }

    pub fn type_bytes(&mut self, b: &[u8]) {
        self.master.write_all(b).unwrap();
    }

    /// Waits (at most 10 s) until no process of the terminal's session has `sig` pending, so that a key
    /// typed next sends a signal of its own: the kernel keeps one pending standard signal per process,
    /// and one sent before the last was taken would merge with it (a loaded machine may not run a
    /// process for a while).
    pub fn delivered(&self, sig: i32) {
        let session = self.child.id() as i32;
        let bit = 1u64 << (sig - 1);
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end {
            let pending = procfs::process::all_processes()
                .into_iter()
                .flatten()
                .flatten()
                .filter(|p| p.stat().is_ok_and(|s| s.session == session))
                .any(|p| {
                    p.status()
                        .is_ok_and(|st| (st.shdpnd | st.sigpnd) & bit != 0)
                });
            if !pending {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits for exit (at most a minute: a command that hangs fails the test rather than stalling the
    /// suite) and returns (code, everything printed).
    pub fn finish(mut self) -> (i32, String) {
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            while let Ok(chunk) = self.out.try_recv() {
                self.seen.extend(chunk);
            }
            if Instant::now() > end {
                // What every process and thread of the terminal's session was doing, for the report.
                let session = self.child.id().to_string();
                let ps = Command::new("ps")
                    .args([
                        "-L",
                        "-o",
                        "pid,tid,ppid,pgid,sid,stat,wchan:32,comm,args",
                        "-s",
                    ])
                    .arg(&session)
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                    .unwrap_or_default();
                let _ = self.child.kill();
                panic!(
                    "still running after a minute; printed: {:?}\nthe session's threads:\n{ps}",
                    String::from_utf8_lossy(&self.seen)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(chunk) = self.out.recv_timeout(Duration::from_millis(300)) {
            self.seen.extend(chunk);
        }
        use std::os::unix::process::ExitStatusExt;
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap());
        (code, String::from_utf8_lossy(&self.seen).into_owned())
    }
}
