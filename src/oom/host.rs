//! Host-RAM OOM kills: the kernel's OOM killer leaves two traces gpudoc can read without privileges in
//! most setups: the `oom_kill` counter in the cgroup's `memory.events` (cgroup v2) and, where readable,
//! the kernel log (`/dev/kmsg`).

use std::fs;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The cgroup v2 folder of this process (`/sys/fs/cgroup` + the path in /proc/self/cgroup).
pub fn own_cgroup() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/')))
}

/// The `oom_kill` count in `<cgroup>/memory.events`, if there is one.
pub fn oom_kills(cgroup: &Path) -> Option<u64> {
    let text = fs::read_to_string(cgroup.join("memory.events")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// Kernel log records that say the OOM killer ended one of `pids`. Empty when the log is not readable.
pub fn kernel_log_kills(pids: &[u32]) -> Vec<String> {
    let Ok(mut f) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    // Each read returns one record; EAGAIN at the end of the buffer.
    for _ in 0..100_000 {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let rec = String::from_utf8_lossy(&buf[..n]);
                let msg = rec.split_once(';').map_or(&*rec, |(_, m)| m).trim_end();
                if names_kill(msg, pids) && out.len() < 16 {
                    out.push(msg.to_string());
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
    out
}

/// `Out of memory: Killed process 1234 (python)` or `oom-kill:...,pid=1234,...` for a pid in `pids`.
pub fn names_kill(msg: &str, pids: &[u32]) -> bool {
    let pid = if let Some(rest) = msg.split("Killed process ").nth(1) {
        rest.split(|c: char| !c.is_ascii_digit()).next()
    } else if msg.starts_with("oom-kill:") {
        msg.split(",pid=").nth(1).and_then(|r| r.split(',').next())
    } else {
        None
    };
    pid.and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| pids.contains(&p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_oom_kill_counter() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("memory.events"),
            "low 0\nhigh 0\nmax 4\noom 2\noom_kill 2\noom_group_kill 0\n",
        )
        .unwrap();
        assert_eq!(oom_kills(dir.path()), Some(2));
        assert_eq!(oom_kills(&dir.path().join("missing")), None);
    }

    #[test]
    fn kernel_log_lines_for_job_pids() {
        let pids = [4242, 17];
        assert!(names_kill(
            "Out of memory: Killed process 4242 (python3) total-vm:1000kB, anon-rss:900kB",
            &pids
        ));
        assert!(names_kill(
            "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job,task=python3,pid=17,uid=0",
            &pids
        ));
        assert!(!names_kill(
            "Out of memory: Killed process 999 (bash)",
            &pids
        ));
        assert!(!names_kill("usb 1-1: new device", &pids));
    }
}
