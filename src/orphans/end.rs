//! Ending processes safely: never PID 1, gpudoc or its ancestors; only the caller's own processes unless
//! root asks for `--all-users`; each process is pinned by a pidfd and checked by start time before any
//! signal, so a PID reused since the listing is never hit. SIGTERM, a grace period, then SIGKILL.

use super::Holder;
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What happened to one process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Ended {
    /// It exited after this signal.
    Ended { signal: String },
    /// It was already gone.
    Gone,
    /// Not signalled, and why.
    Skipped { why: String },
    /// Signalled but still there after SIGKILL (stuck in the kernel, e.g. in the driver).
    Stuck,
}

impl Ended {
    /// In words, for the terminal.
    pub fn describe(&self) -> String {
        match self {
            Ended::Ended { signal } => format!("ended ({signal})"),
            Ended::Gone => "already gone".into(),
            Ended::Skipped { why } => format!("not signalled: {why}"),
            Ended::Stuck => "still there after SIGKILL (stuck in the kernel or the driver)".into(),
        }
    }
}

/// One process's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct EndResult {
    pub pid: u32,
    #[serde(flatten)]
    pub result: Ended,
}

/// Who may be signalled.
#[derive(Debug, Clone)]
pub struct Policy {
    pub me: u32,
    pub ancestors: HashSet<u32>,
    pub uid: u32,
    pub all_users: bool,
}

impl Policy {
    /// The policy for this process: its ancestors, its user.
    pub fn here(all_users: bool) -> Policy {
        let me = std::process::id();
        let mut ancestors = HashSet::new();
        let mut cur = me;
        while let Some(p) = crate::procs::read(cur).map(|p| p.ppid) {
            if p == 0 || !ancestors.insert(p) {
                break;
            }
            cur = p;
        }
        Policy {
            me,
            ancestors,
            uid: nix::unistd::geteuid().as_raw(),
            all_users,
        }
    }

    /// Why `h` must not be signalled, if it must not.
    pub fn refuse(&self, h: &Holder) -> Option<String> {
        if h.pid <= 1 {
            return Some("PID 1 is never signalled".into());
        }
        if h.pid == self.me {
            return Some("this is gpudoc itself".into());
        }
        if self.ancestors.contains(&h.pid) {
            return Some("an ancestor of gpudoc (it would end this session)".into());
        }
        match h.uid {
            None => Some("its owner cannot be read".into()),
            Some(u) if u != self.uid && !(self.uid == 0 && self.all_users) => Some(format!(
                "another user's process ({}): left alone{}",
                h.user.clone().unwrap_or_else(|| format!("uid {u}")),
                if self.uid == 0 {
                    "; --all-users ends it"
                } else {
                    ""
                }
            )),
            _ => None,
        }
    }
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn pidfd_signal(fd: &OwnedFd, sig: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a pidfd we own; no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The process is gone (or a zombie, whose memory the driver has freed). A pidfd turns readable once every
/// thread has exited, not when the main one has.
fn exited(fd: &OwnedFd, pid: u32) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    if nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap_or(0) > 0 {
        return true;
    }
    !crate::procs::alive(pid)
}

/// Ends `targets`: SIGTERM, up to `grace` for them to exit, then SIGKILL.
pub fn end(targets: &[Holder], grace: Duration, policy: &Policy) -> Vec<EndResult> {
    let mut results = Vec::new();
    let mut pinned: Vec<(u32, OwnedFd)> = Vec::new();
    for h in targets {
        match terminate(h, policy) {
            Ok(fd) => pinned.push((h.pid, fd)),
            Err(r) => results.push(EndResult {
                pid: h.pid,
                result: r,
            }),
        }
    }
    wait_exits(&mut pinned, grace, "SIGTERM", &mut results);
    for (_, fd) in &pinned {
        let _ = pidfd_signal(fd, libc::SIGKILL);
    }
    wait_exits(&mut pinned, Duration::from_secs(3), "SIGKILL", &mut results);
    for (pid, _) in pinned {
        results.push(EndResult {
            pid,
            result: Ended::Stuck,
        });
    }
    results.sort_by_key(|r| r.pid);
    results
}

/// Sends SIGTERM to one target through a pidfd, after checking it may be ended and is still the process
/// listed; the pidfd, or why nothing was sent.
fn terminate(h: &Holder, policy: &Policy) -> Result<OwnedFd, Ended> {
    if let Some(why) = policy.refuse(h) {
        return Err(Ended::Skipped { why });
    }
    // Pin the process first, then check it is the one listed: the pidfd can't follow a reused PID.
    let fd = match pidfd_open(h.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Err(Ended::Gone),
        Err(e) => {
            return Err(Ended::Skipped {
                why: format!("cannot pin it with a pidfd: {e}"),
            });
        }
    };
    match crate::procs::read(h.pid).map(|p| p.start_ticks) {
        None => return Err(Ended::Gone),
        Some(now) if Some(now) != h.start_ticks => {
            return Err(Ended::Skipped {
                why: format!(
                    "PID {} is now another process (it started after the listing): not signalled",
                    h.pid
                ),
            });
        }
        Some(_) => {}
    }
    pidfd_signal(&fd, libc::SIGTERM).map_err(|e| Ended::Skipped {
        why: format!("SIGTERM failed: {e}"),
    })?;
    Ok(fd)
}

/// Waits up to `limit` for the pinned processes to exit; each that does is recorded as ended by `signal`
/// and let go.
fn wait_exits(
    pinned: &mut Vec<(u32, OwnedFd)>,
    limit: Duration,
    signal: &str,
    results: &mut Vec<EndResult>,
) {
    let until = Instant::now() + limit;
    loop {
        pinned.retain(|(pid, fd)| {
            let gone = exited(fd, *pid);
            if gone {
                results.push(EndResult {
                    pid: *pid,
                    result: Ended::Ended {
                        signal: signal.into(),
                    },
                });
            }
            !gone
        });
        if pinned.is_empty() || Instant::now() >= until {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
