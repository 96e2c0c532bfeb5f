//! `gpudoc demo`: on a machine with a GPU and PyTorch, run a small example under gpudoc; elsewhere show
//! the diagnosis of the same example recorded on an H200 (embedded in the binary, so it works anywhere).

use crate::cli::{ClapCmd, Cli};
use crate::exit::{self, Failure};
use crate::paint::Paint;
use crate::settings::{Env, RunSettings, load_rules};
use crate::{output, rules, summary};
use clap::Parser;
use std::process::ExitCode;

/// The recorded run `gpudoc demo` shows where there is no GPU.
pub const DEMO_REPORT: &str = "fixtures/runs/cache_bloat.report.json";
const DEMO_TEXT: &str = include_str!("../../fixtures/runs/cache_bloat.report.json");
/// What `gpudoc demo` runs on a GPU machine, from the repository's folder.
pub const DEMO_SCRIPT: [&str; 3] = ["python3", "tests/gpu/scenarios.py", "cache_bloat"];

pub fn run(color: crate::cli::ColorWhen, env: Env) -> Result<ExitCode, Failure> {
    let here = std::path::Path::new(DEMO_SCRIPT[1]).exists();
    let gpu = gpu_and_torch(&env);
    if gpu && here {
        crate::sayln!(
            "gpudoc demo: running `{}` under gpudoc on this machine's GPU",
            DEMO_SCRIPT.join(" ")
        );
        let argv = ["gpudoc", "run", "--"].into_iter().chain(DEMO_SCRIPT);
        if let Ok(Cli {
            cmd: ClapCmd::Run(a),
            ..
        }) = Cli::try_parse_from(argv)
        {
            return crate::commands::run::run(RunSettings::resolve(*a, color, env)?);
        }
    }
    let mut report: crate::report::Report =
        serde_json::from_str(DEMO_TEXT).expect("the demo report is a report");
    let set = load_rules(&Default::default()).map_err(|e| Failure::new(exit::USAGE, e))?;
    rules::diagnose(&mut report, &set);
    let paint: Paint = env.paint(color, env.stdout_tty);
    let why = if gpu {
        "the example runs from a clone of gpudoc's repository (not from an installed gpudoc)"
    } else {
        "no GPU with PyTorch here"
    };
    let text = format!(
        "gpudoc demo: {why}, so this is the diagnosis of `{}` recorded on an NVIDIA H200 \
         ({DEMO_REPORT}); `gpudoc report FILE` does the same for any saved report.\n\n{}",
        DEMO_SCRIPT.join(" "),
        summary::render(&report, paint)
    );
    output::stdout(&text).map_err(|e| Failure::printing(e, exit::USAGE))?;
    Ok(ExitCode::SUCCESS)
}

fn gpu_and_torch(env: &Env) -> bool {
    let (nvml, _, gpus) = crate::gpu::open(&env.nvml_lib);
    drop(nvml);
    !gpus.is_empty()
        && std::process::Command::new("python3")
            .args([
                "-c",
                "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
            ])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}
