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
    let cmdline = p
        .cmdline()
        .ok()
        .filter(|c| !c.is_empty())
        .map(|c| c.join(" "))
        .unwrap_or_else(|| format!("[{}]", stat.comm));
    Some(ProcInfo {
        pid,
        ppid: stat.ppid as u32,
        start_ticks: stat.starttime,
        uid: p.uid().ok(),
        cmdline,
        zombie: matches!(stat.state, 'Z' | 'X' | 'x'),
    })
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
/// read in one pass over /proc.
pub fn descendants(root: u32) -> Vec<ProcInfo> {
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
    out.sort_by_key(|p| p.pid);
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
