//! What gpudoc reads of other processes from /proc: parents, start times, command lines. A process
//! belongs to the job when gpudoc is among its ancestors: gpudoc is a subreaper, so a descendant whose
//! parent died is re-parented to gpudoc and stays in the job.

use procfs::process::Process;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// The facts gpudoc keeps about a process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcInfo {
    pub pid: u32,
    pub ppid: u32,
    /// Start time in clock ticks since boot: with the PID, identifies a process across PID reuse.
    pub start_ticks: u64,
    pub uid: Option<u32>,
    pub cmdline: String,
    /// It has exited and waits for its parent to reap it.
    #[serde(default)]
    pub zombie: bool,
}

/// Reads one process; `None` when it is gone (or in another PID namespace).
pub fn read(pid: u32) -> Option<ProcInfo> {
    let p = Process::new(pid as i32).ok()?;
    let stat = p.stat().ok()?;
    Some(ProcInfo {
        pid,
        ppid: stat.ppid as u32,
        start_ticks: stat.starttime,
        uid: p.uid().ok(),
        cmdline: cmdline(pid, &stat.comm),
        zombie: exited(pid, stat.state),
    })
}

/// A process's command line, `[comm]` when it has none (a kernel thread). A process whose main thread
/// has exited shows an empty one (the kernel reads it through that thread's memory map, let go at its
/// exit): its other threads still show it.
pub fn cmdline(pid: u32, comm: &str) -> String {
    let read = |path: String| {
        let bytes = std::fs::read(path).ok()?;
        // Each argument ends with a NUL.
        let args: Vec<String> = bytes
            .strip_suffix(&[0])
            .unwrap_or(&bytes)
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        (!bytes.is_empty()).then(|| args.join(" "))
    };
    read(format!("/proc/{pid}/cmdline"))
        .or_else(|| {
            let tid = other_threads(pid).into_iter().next()?;
            read(format!("/proc/{pid}/task/{tid}/cmdline"))
        })
        .unwrap_or_else(|| format!("[{comm}]"))
}

/// The threads of `pid` other than its main one.
pub fn other_threads(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| tid != pid)
        .collect()
}

/// Whether a process in `state` has exited. /proc shows a process's main thread: when it exits while
/// other threads run on (`pthread_exit` in `main`), the kernel keeps it as a zombie until the last thread
/// has exited, and the process, its memory and its GPU contexts live on.
pub fn exited(pid: u32, state: char) -> bool {
    matches!(state, 'Z' | 'X' | 'x') && other_threads(pid).is_empty()
}

/// Whether `pid` ignores SIGHUP (`SigIgn` in /proc/PID/status): started with `nohup`, or under
/// `trap '' HUP`, to outlive the terminal or the shell it was started from.
pub fn ignores_hup(pid: u32) -> bool {
    Process::new(pid as i32)
        .and_then(|p| p.status())
        .is_ok_and(|s| s.sigign & (1 << (libc::SIGHUP - 1)) != 0)
}

/// Whether `pid` is a running process: it exists and has not exited (a dead one its parent has not reaped
/// stays a zombie, forever under a PID 1 that does not reap, as in many containers).
pub fn alive(pid: u32) -> bool {
    Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| !exited(pid, s.state))
}

fn parent(pid: u32) -> Option<u32> {
    Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()
        .map(|s| s.ppid as u32)
}

/// Whether `root` is an ancestor of `pid` (or `pid` itself).
pub fn descends_from(pid: u32, root: u32) -> bool {
    let mut cur = pid;
    // A chain deeper than this is a loop from a racing PID reuse, not a real tree.
    for _ in 0..256 {
        if cur == root {
            return true;
        }
        match parent(cur) {
            Some(p) if p != 0 && p != cur => cur = p,
            _ => return false,
        }
    }
    false
}

/// Every live descendant of `root` (not `root` itself, not those that have exited and wait to be reaped),
/// by PID. Read by walking down from `root` through the kernel's lists of each thread's children, which
/// costs the size of the job; where the kernel keeps none (built without `CONFIG_PROC_CHILDREN`), in one
/// pass over /proc, which costs the size of the machine.
pub fn descendants(root: u32) -> Vec<ProcInfo> {
    let mut out = walk_down(root).unwrap_or_else(|| scan_down(root));
    out.sort_by_key(|p| p.pid);
    out
}

/// The children of every thread of `pid`; `None` when the kernel has no such list, an empty list for a
/// process that is gone.
fn children(pid: u32) -> Option<Vec<u32>> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Some(Vec::new());
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        match std::fs::read_to_string(task.path().join("children")) {
            Ok(list) => out.extend(
                list.split_ascii_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && task.path().exists() => {
                return None;
            }
            Err(_) => {}
        }
    }
    Some(out)
}

fn walk_down(root: u32) -> Option<Vec<ProcInfo>> {
    let mut out = Vec::new();
    let mut stack = children(root)?;
    while let Some(pid) = stack.pop() {
        stack.extend(children(pid).unwrap_or_default());
        if let Some(p) = read(pid).filter(|p| !p.zombie) {
            out.push(p);
        }
    }
    Some(out)
}

fn scan_down(root: u32) -> Vec<ProcInfo> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    let infos: Vec<ProcInfo> = all
        .filter_map(|p| p.ok())
        .filter_map(|p| read(p.pid as u32))
        .collect();
    let mut children: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, p) in infos.iter().enumerate() {
        children.entry(p.ppid).or_default().push(i);
    }
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for &i in children.get(&pid).into_iter().flatten() {
            stack.push(infos[i].pid);
            if !infos[i].zombie {
                out.push(infos[i].clone());
            }
        }
    }
    out
}

/// Remembers, per PID seen on a GPU, whether it is in the job and what it runs, so the hot loop reads
/// /proc only for PIDs it has not seen (or that went away and came back, possibly reused).
#[derive(Debug, Default)]
pub struct JobCache {
    root: u32,
    known: HashMap<u32, Known>,
}

/// What the cache knows of one PID.
#[derive(Debug, Clone)]
pub struct Known {
    pub in_job: bool,
    pub info: Option<ProcInfo>,
}

impl JobCache {
    pub fn new(root: u32) -> Self {
        JobCache {
            root,
            known: HashMap::new(),
        }
    }

    pub fn get(&mut self, pid: u32) -> &Known {
        let root = self.root;
        self.known.entry(pid).or_insert_with(|| {
            let info = read(pid);
            Known {
                in_job: info.is_some() && descends_from(pid, root),
                info,
            }
        })
    }

    /// Drops PIDs not in `present`, so a reused PID is looked at afresh.
    pub fn retain(&mut self, present: &[u32]) {
        self.known.retain(|pid, _| present.contains(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_walk_down_the_kernels_child_lists_finds_what_a_scan_of_proc_finds() {
        // A tree three deep, with a process whose parent exited (re-parented to its subreaper or init).
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & (sleep 5 &) ; sh -c 'sleep 5; true' & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let want = |p: &Vec<ProcInfo>| p.iter().filter(|p| p.cmdline == "sleep 5").count() >= 2;
        // The tree settles as the shells start their children: the two views must agree once it has.
        let (mut walked, mut scanned) = (Vec::new(), Vec::new());
        for _ in 0..200 {
            walked = walk_down(me).expect("this kernel keeps child lists");
            scanned = scan_down(me);
            walked.sort_by_key(|p| p.pid);
            scanned.sort_by_key(|p| p.pid);
            if want(&walked) && walked == scanned {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(want(&walked), "{walked:?}");
        assert_eq!(walked, scanned);
        for p in &walked {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        child.wait().unwrap();
    }

    #[test]
    fn a_child_descends_from_us() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Until it has exec'd, the child still shows our command line.
        for _ in 0..200 {
            if read(pid).is_some_and(|p| p.cmdline == "sleep 5") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(descends_from(pid, me));
        assert!(!descends_from(me, pid));
        assert!(
            descendants(me)
                .iter()
                .any(|p| p.pid == pid && p.cmdline == "sleep 5")
        );
        let info = read(pid).unwrap();
        assert_eq!(info.ppid, me);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(read(pid).is_none());
    }
}
