//! `gpudoc orphans [--kill]`: the `nvidia-smi` + `fuser -v /dev/nvidia*` + `ps` + `kill` workflow.

use super::end::{self, EndResult, Ended, Policy};
use super::{Holder, Listing, Verdict};
use crate::summary::Paint;
use crate::units::{fmt_bytes, fmt_secs};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Exit code: no leftovers (or all of them ended).
pub const CLEAN: u8 = 0;
/// Exit code: leftovers found and still there.
pub const LEFTOVERS: u8 = 1;

#[derive(Debug, clap::Args)]
pub struct OrphansArgs {
    /// End the leftovers (orphans): SIGTERM, wait --grace, then SIGKILL.
    #[arg(long)]
    pub kill: bool,
    /// Don't ask before ending them.
    #[arg(short, long)]
    pub yes: bool,
    /// How long to wait after SIGTERM before SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// As root, also end other users' processes.
    #[arg(long)]
    pub all_users: bool,
    /// Write the listing (and what was ended) as JSON to FILE (`-` for stdout).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Output<'a> {
    schema: &'static str,
    #[serde(flatten)]
    listing: &'a Listing,
    ended: &'a [EndResult],
    /// Device memory that came back per GPU, `[gpu, bytes]`.
    freed: &'a [(u32, u64)],
}

pub fn run(args: OrphansArgs, paint: Paint) -> ExitCode {
    if args.all_users && !nix::unistd::geteuid().is_root() {
        eprintln!("gpudoc: --all-users needs root");
        return ExitCode::from(crate::exit::USAGE);
    }
    let listing = super::list();
    let to_stdout = args.json.as_deref() == Some(std::path::Path::new("-"));
    // The table goes to stdout, unless the JSON does.
    let mut human = String::new();
    table(&mut human, &listing, paint);
    let policy = Policy::here(args.all_users);
    let leftovers: Vec<Holder> = listing
        .holders
        .iter()
        .filter(|h| h.is_leftover())
        .cloned()
        .collect();
    let mut ended = Vec::new();
    let mut freed = Vec::new();
    if args.kill && !leftovers.is_empty() {
        let (allowed, refused): (Vec<_>, Vec<_>) =
            leftovers.iter().partition(|h| policy.refuse(h).is_none());
        let _ = writeln!(human, "\nWould end {} process(es):", allowed.len());
        for h in &allowed {
            let _ = writeln!(
                human,
                "  pid {} ({}) holding {}",
                h.pid,
                short(&h.cmdline, 50),
                fmt_bytes(h.total_bytes())
            );
        }
        for h in &refused {
            let why = policy.refuse(h).unwrap_or_default();
            let _ = writeln!(human, "  not pid {}: {why}", h.pid);
            ended.push(EndResult {
                pid: h.pid,
                result: Ended::Skipped { why },
            });
        }
        emit(&human, to_stdout);
        human.clear();
        let go = if args.yes {
            true
        } else if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
            eprint!("End them? [y/N] ");
            let _ = std::io::stderr().flush();
            let mut answer = String::new();
            let _ = std::io::stdin().lock().read_line(&mut answer);
            matches!(answer.trim(), "y" | "Y" | "yes")
        } else {
            eprintln!("gpudoc: not ending anything without --yes (no terminal to ask on)");
            false
        };
        if go && !allowed.is_empty() {
            let targets: Vec<Holder> = allowed.into_iter().cloned().collect();
            let before = listing.gpu_used.clone();
            ended.extend(end::end(&targets, args.grace, &policy));
            freed = memory_back(&before);
            for r in &ended {
                let _ = writeln!(human, "  pid {}: {}", r.pid, r.result.describe());
            }
            for (gpu, bytes) in &freed {
                let _ = writeln!(human, "  GPU {gpu}: {} came back", fmt_bytes(*bytes));
            }
        }
    }
    emit(&human, to_stdout);
    if let Some(path) = &args.json {
        let out = Output {
            schema: "gpudoc.orphans/1",
            listing: &listing,
            ended: &ended,
            freed: &freed,
        };
        let text = serde_json::to_string_pretty(&out).unwrap() + "\n";
        let res = if to_stdout {
            std::io::stdout().write_all(text.as_bytes())
        } else {
            std::fs::write(path, text)
        };
        if let Err(e) = res {
            eprintln!("gpudoc: --json {}: {e}", path.display());
            return ExitCode::from(crate::exit::USAGE);
        }
    }
    let remaining = leftovers
        .iter()
        .filter(|h| {
            !ended
                .iter()
                .any(|r| r.pid == h.pid && matches!(r.result, Ended::Ended { .. } | Ended::Gone))
        })
        .count();
    ExitCode::from(if remaining == 0 { CLEAN } else { LEFTOVERS })
}

fn emit(text: &str, json_on_stdout: bool) {
    if text.is_empty() {
        return;
    }
    if json_on_stdout {
        eprint!("{text}");
    } else {
        print!("{text}");
    }
}

/// Polls NVML until device memory stops falling (the driver frees a dead process's memory shortly after
/// it exits), up to 3 s; returns what came back per GPU.
fn memory_back(before: &[(u32, u64)]) -> Vec<(u32, u64)> {
    let until = Instant::now() + Duration::from_secs(3);
    let mut last: Vec<(u32, u64)> = Vec::new();
    loop {
        let now = super::nvml_memory().map(|(_, u)| u).unwrap_or_default();
        if now == last || Instant::now() >= until {
            last = now;
            break;
        }
        last = now;
        std::thread::sleep(Duration::from_millis(200));
    }
    before
        .iter()
        .filter_map(|&(g, b)| {
            let after = last.iter().find(|&&(x, _)| x == g)?.1;
            (b > after).then_some((g, b - after))
        })
        .collect()
}

fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        s.chars().take(n - 1).collect::<String>() + "…"
    }
}

/// The table, `ps`-style, then one line of reasons per process that is not live.
fn table(o: &mut String, l: &Listing, p: Paint) {
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
                short(h.user.as_deref().unwrap_or("?"), 10),
                gpus,
                if h.gpu_bytes.is_empty() {
                    "-".into()
                } else {
                    fmt_bytes(h.total_bytes())
                },
                h.age_s.map(fmt_secs).unwrap_or_else(|| "?".into()),
                h.ppid.map(|x| x.to_string()).unwrap_or_else(|| "?".into()),
                short(h.parent_cmd.as_deref().unwrap_or("?"), 12),
                verdict,
                short(&h.cmdline, 60)
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
}
