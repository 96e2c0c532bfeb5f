//! `fakegpu`: a stand-in for a GPU program in gpudoc's tests. It edits the fake NVML state the way a real
//! program's allocations change what NVML reports.

use clap::{Parser, Subcommand};
use fake_nvml::state::{Injected, Proc, STATE_ENV, State, parse_size};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
struct Cli {
    /// The state file (default: $FAKE_NVML_STATE).
    #[arg(long, env = STATE_ENV)]
    state: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Hold memory on a GPU as this process: walk through --steps (each held --step-ms), hold the last for
    /// --hold-ms, then release it (unless --leak) and exit with --exit.
    Alloc {
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        /// Sizes to hold in turn, comma-separated (`1GiB,3GiB,2GiB`).
        #[arg(long, value_delimiter = ',', value_parser = parse_size, required = true)]
        steps: Vec<u64>,
        #[arg(long, default_value_t = 100)]
        step_ms: u64,
        #[arg(long, default_value_t = 0)]
        hold_ms: u64,
        /// Keep the entry after exit (it still disappears once the PID is gone, unless --ghost).
        #[arg(long)]
        leak: bool,
        /// Print this line to stdout once the memory is held.
        #[arg(long)]
        say: Option<String>,
        /// Keep this file open while holding the memory (a fake /dev/nvidia* device).
        #[arg(long)]
        open: Vec<std::path::PathBuf>,
        #[arg(long, default_value_t = 0)]
        exit: i32,
    },
    /// Set the memory of any PID (a foreign process, a ghost).
    Set {
        #[arg(long)]
        pid: u32,
        #[arg(long, default_value_t = 0)]
        gpu: u32,
        #[arg(long, value_parser = parse_size)]
        bytes: u64,
        #[arg(long)]
        ghost: bool,
    },
    /// Make FUNC return CODE (on one GPU, or all).
    Error {
        #[arg(long)]
        func: String,
        #[arg(long)]
        gpu: Option<u32>,
        #[arg(long)]
        code: i32,
    },
}

/// Records `bytes` for `pid` on `gpu`, replacing what it had there.
fn set(state: &std::path::Path, pid: u32, gpu: u32, bytes: u64, ghost: bool) {
    State::update(state, |s| {
        s.procs.retain(|p| !(p.pid == pid && p.gpu == gpu));
        s.procs.push(Proc {
            pid,
            gpu,
            bytes,
            graphics: false,
            ghost,
        });
    })
    .unwrap_or_else(|e| panic!("fakegpu: {e}"));
}

fn main() {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Alloc {
            gpu,
            steps,
            step_ms,
            hold_ms,
            leak,
            say,
            open,
            exit,
        } => {
            let _held: Vec<std::fs::File> = open
                .iter()
                .map(|p| {
                    std::fs::OpenOptions::new()
                        .read(true)
                        .open(p)
                        .unwrap_or_else(|e| panic!("fakegpu: {}: {e}", p.display()))
                })
                .collect();
            for (i, bytes) in steps.iter().enumerate() {
                set(&cli.state, std::process::id(), gpu, *bytes, false);
                if i + 1 < steps.len() {
                    std::thread::sleep(Duration::from_millis(step_ms));
                }
            }
            if let Some(line) = say {
                println!("{line}");
            }
            std::thread::sleep(Duration::from_millis(hold_ms));
            if !leak {
                let pid = std::process::id();
                State::update(&cli.state, |s| s.procs.retain(|p| p.pid != pid))
                    .unwrap_or_else(|e| panic!("fakegpu: {e}"));
            }
            std::process::exit(exit);
        }
        Cmd::Set {
            pid,
            gpu,
            bytes,
            ghost,
        } => set(&cli.state, pid, gpu, bytes, ghost),
        Cmd::Error { func, gpu, code } => {
            State::update(&cli.state, |s| s.errors.push(Injected { func, gpu, code }))
                .unwrap_or_else(|e| panic!("fakegpu: {e}"))
        }
    }
}
