//! The listing for people: a `ps`-style table, then why each process that is not live is judged so.

use super::{Listing, Verdict};
use crate::paint::Paint;
use crate::units::{fmt_bytes, fmt_secs, shorten};
use std::fmt::Write as _;

/// The table, `ps`-style, then one line of reasons per process that is not live.
pub fn render(l: &Listing, p: Paint) -> String {
    let mut o = String::new();
    let o = &mut o;
    if let Some(e) = &l.nvml_error {
        let _ = writeln!(
            o,
            "NVML unavailable ({e}): listing device files only, no memory figures"
        );
    }
    if l.holders.is_empty() {
        let _ = writeln!(o, "No process holds GPU memory or an NVIDIA device.");
    } else {
        let _ = writeln!(
            o,
            "{:>7} {:<10} {:<5} {:>11} {:>8} {:>7} {:<12} {:<8} COMMAND",
            "PID", "USER", "GPU", "MEMORY", "AGE", "PPID", "PARENT", "VERDICT"
        );
        for h in &l.holders {
            let gpus = if h.gpu_bytes.is_empty() {
                "-".into()
            } else {
                h.gpu_bytes
                    .iter()
                    .map(|(g, _)| g.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let verdict = format!("{:?}", h.verdict).to_lowercase();
            let verdict = if h.is_leftover() {
                p.bad(&verdict)
            } else {
                verdict
            };
            let _ = writeln!(
                o,
                "{:>7} {:<10} {:<5} {:>11} {:>8} {:>7} {:<12} {:<8} {}",
                h.pid,
                shorten(h.user.as_deref().unwrap_or("?"), 10),
                gpus,
                if h.gpu_bytes.is_empty() {
                    "-".into()
                } else {
                    fmt_bytes(h.total_bytes())
                },
                h.age_s.map(fmt_secs).unwrap_or_else(|| "?".into()),
                h.ppid.map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
                shorten(h.parent_cmd.as_deref().unwrap_or("?"), 12),
                verdict,
                shorten(&h.cmdline, 60)
            );
        }
        for h in l.holders.iter().filter(|h| h.verdict != Verdict::Live) {
            let _ = writeln!(o, "  pid {}: {}", h.pid, h.reason);
        }
    }
    if l.unreadable > 0 {
        let _ = writeln!(
            o,
            "{} process(es) of other users could not be inspected: run as root to see them",
            l.unreadable
        );
    }
    std::mem::take(o)
}
