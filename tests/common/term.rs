//! A pseudo-terminal for tests: a command started as the session leader of a new terminal, what it
//! prints read as it comes, keys typed into it.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

pub struct Term {
    master: std::fs::File,
    pub child: Child,
    out: mpsc::Receiver<Vec<u8>>,
    seen: Vec<u8>,
    stop: Arc<AtomicBool>,
    /// The terminal stops reading what is written to it (a stalled ssh connection).
    stalled: Arc<AtomicBool>,
    reading: std::thread::JoinHandle<()>,
}

impl Term {
    /// Starts `cmd` as the session leader of a new terminal.
    pub fn start(cmd: Command) -> Term {
        Term::start_keeping_stdin(cmd, false)
    }

    /// Starts `cmd` as the session leader of a new terminal, on its stdout and stderr and, unless
    /// `keep_stdin` (the command's own stdin stays as set), on its stdin.
    pub fn start_keeping_stdin(mut cmd: Command, keep_stdin: bool) -> Term {
        let pty = nix::pty::openpty(None, None).unwrap();
        // Only the command's standard fds: a master it inherited would keep the terminal from hanging up.
        unsafe { libc::fcntl(pty.master.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        let slave = pty.slave;
        let ctty = slave.as_raw_fd();
        if !keep_stdin {
            cmd.stdin(Stdio::from(slave.try_clone().unwrap()));
        }
        cmd.stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave.try_clone().unwrap()));
        unsafe {
            cmd.pre_exec(move || {
                libc::setsid();
                libc::ioctl(ctty, libc::TIOCSCTTY, 0);
                libc::close(ctty);
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        drop(cmd);
        drop(slave);
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let (tx, out) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let stalled = Arc::new(AtomicBool::new(false));
        let stall = stalled.clone();
        // Polls, so that a hang-up can close every descriptor of the master, this one included.
        let reading = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while !stopped.load(Ordering::SeqCst) {
                if stall.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let mut fds = [libc::pollfd {
                    fd: reader.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                if unsafe { libc::poll(fds.as_mut_ptr(), 1, 50) } <= 0 {
                    continue;
                }
                match reader.read(&mut buf) {
                    Ok(n) if n > 0 && tx.send(buf[..n].to_vec()).is_ok() => {}
                    _ => break,
                }
            }
        });
        Term {
            master,
            child,
            out,
            seen: Vec::new(),
            stop,
            stalled,
            reading,
        }
    }

    /// Reads until `needle` appears (or panics after 10 s).
    pub fn expect(&mut self, needle: &str) {
        self.expect_times(needle, 1);
    }

    /// Reads until `needle` has appeared `n` times (or panics after 10 s).
    pub fn expect_times(&mut self, needle: &str, n: usize) {
        let end = Instant::now() + Duration::from_secs(10);
        while String::from_utf8_lossy(&self.seen).matches(needle).count() < n {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(chunk) => self.seen.extend(chunk),
                Err(_) => panic!("no {needle:?} in {:?}", String::from_utf8_lossy(&self.seen)),
            }
        }
    }

    /// What was printed after the last `needle`.
    pub fn seen_after(&mut self, needle: &str) -> String {
        while let Ok(chunk) = self.out.try_recv() {
            self.seen.extend(chunk);
        }
        let s = String::from_utf8_lossy(&self.seen).into_owned();
        s.rfind(needle)
            .map(|i| s[i + needle.len()..].to_string())
            .unwrap_or_default()
    }

    /// Hangs the terminal up, as closing a window or a dropped ssh connection does: the kernel sends
    /// SIGHUP to the session leader. The command is left running.
    pub fn hang_up(self) -> Child {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.reading.join();
        drop(self.master);
        self.child
    }

    /// The terminal stops (`true`) or goes back to (`false`) reading what is written to it.
    pub fn stall(&self, stalled: bool) {
        self.stalled.store(stalled, Ordering::SeqCst);
    }

    /// The terminal's modes now (a pty master reads its terminal's).
    pub fn modes(&self) -> libc::termios {
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::tcgetattr(self.master.as_raw_fd(), &mut t) },
            0
        );
        t
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
