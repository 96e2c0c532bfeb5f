//! `gpudoc orphans [--kill]`: the `nvidia-smi` + `fuser -v /dev/nvidia*` + `ps` + `kill` workflow.

use crate::exit::{self, Failure};
use crate::orphans::end::{self, EndResult, Ended, Policy};
use crate::orphans::{self, Holder, Listing};
use crate::output::{self, Target};
use crate::settings::OrphansSettings;
use crate::units::{fmt_bytes, shorten};
use serde::Serialize;
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::process::ExitCode;

/// What `gpudoc orphans --json` writes.
#[derive(Serialize, schemars::JsonSchema)]
pub struct Output<'a> {
    schema: &'static str,
    #[serde(flatten)]
    listing: &'a Listing,
    ended: &'a [EndResult],
    /// Device memory that came back per GPU, `[gpu, bytes]`.
    freed: &'a [(u32, u64)],
}

pub fn run(s: OrphansSettings) -> Result<ExitCode, Failure> {
    let mut listing = orphans::list(&s.nvml_lib, &s.dev_prefix, &recorded(&s));
    // Why each is judged so, in the words the `leftover-holder` rule quotes too.
    if let Some(e) = crate::rules::words::reasons(&mut listing.holders, None) {
        crate::sayln!("gpudoc: {e}");
    }
    let json_on_stdout = s.json == Some(Target::Stdout);
    // The table goes to stdout, unless the JSON does.
    let emit = |text: &str| -> Result<(), Failure> {
        if json_on_stdout {
            crate::say!("{text}");
            Ok(())
        } else {
            output::stdout(text).map_err(|e| Failure::printing(e, exit::USAGE))
        }
    };
    emit(&orphans::table::render(&listing, s.paint))?;
    let targets: Vec<Holder> = listing
        .holders
        .iter()
        .filter(|h| h.is_target(s.widen))
        .cloned()
        .collect();
    let Killed { ended, freed } = if s.kill {
        kill(&s, &listing, &targets, &emit)?
    } else {
        Killed::default()
    };
    if let Some(t) = &s.json {
        let out = Output {
            schema: "gpudoc.orphans/1",
            listing: &listing,
            ended: &ended,
            freed: &freed,
        };
        let text = serde_json::to_string_pretty(&out).expect("a listing serializes") + "\n";
        output::write(t, text.as_bytes()).map_err(|e| match t {
            Target::Stdout => Failure::printing(e, exit::USAGE),
            Target::File(_) => Failure::new(exit::USAGE, format!("--json {}: {e}", t.display())),
        })?;
    }
    let remaining = targets
        .iter()
        .filter(|h| {
            !ended
                .iter()
                .any(|r| r.pid == h.pid && matches!(r.result, Ended::Ended { .. } | Ended::Gone))
        })
        .count();
    Ok(ExitCode::from(if remaining == 0 {
        0
    } else {
        exit::LEFTOVERS
    }))
}

/// The processes `gpudoc run` recorded it left that still run; none, said once, where the record can't be
/// read.
fn recorded(s: &OrphansSettings) -> Vec<orphans::record::Entry> {
    orphans::record::Record::living_here(s.leftovers.as_ref()).unwrap_or_else(|e| {
        crate::sayln!("gpudoc: what `gpudoc run` left running is not known: {e}");
        Vec::new()
    })
}

/// What `--kill` did.
#[derive(Default)]
struct Killed {
    /// What became of each process it named.
    ended: Vec<EndResult>,
    /// The memory that came back per GPU.
    freed: Vec<(u32, u64)>,
}

/// `--kill`: says what it would end and what it won't, asks, ends.
fn kill(
    s: &OrphansSettings,
    listing: &Listing,
    targets: &[Holder],
    emit: &dyn Fn(&str) -> Result<(), Failure>,
) -> Result<Killed, Failure> {
    let policy = Policy::here(s.all_users);
    let (allowed, refused): (Vec<&Holder>, Vec<&Holder>) =
        targets.iter().partition(|h| policy.refuse(h).is_none());
    // Detached on purpose, or holding no GPU, and not asked for by their flag: said, never signalled.
    let spared = listing
        .holders
        .iter()
        .filter_map(|h| Some((h.pid, h.spared(s.widen)?.to_string())));
    let mut ended: Vec<EndResult> = refused
        .iter()
        .map(|h| (h.pid, policy.refuse(h).unwrap_or_default()))
        .chain(spared)
        .map(|(pid, why)| EndResult {
            pid,
            result: Ended::Skipped { why },
        })
        .collect();
    if allowed.is_empty() && ended.is_empty() {
        return Ok(Killed::default());
    }
    emit(&plan(&allowed, &ended))?;
    let mut freed = Vec::new();
    if !allowed.is_empty() && confirmed(s) {
        let targets: Vec<Holder> = allowed.into_iter().cloned().collect();
        let done = end::end(&targets, s.grace, &policy);
        freed = orphans::memory_back(&s.nvml_lib, &listing.gpu_used);
        let mut o = String::new();
        for r in &done {
            let _ = writeln!(o, "  pid {}: {}", r.pid, r.result.describe());
        }
        for (gpu, bytes) in &freed {
            let _ = writeln!(o, "  GPU {gpu}: {} came back", fmt_bytes(*bytes));
        }
        emit(&o)?;
        ended.extend(done);
    }
    Ok(Killed { ended, freed })
}

/// What `--kill` would end, and what it won't and why.
fn plan(allowed: &[&Holder], skipped: &[EndResult]) -> String {
    let mut o = format!("\nWould end {} process(es):\n", allowed.len());
    for h in allowed {
        let _ = writeln!(
            o,
            "  pid {} ({}) holding {}",
            h.pid,
            shorten(&h.cmdline, 50),
            fmt_bytes(h.total_bytes())
        );
    }
    for r in skipped {
        if let Ended::Skipped { why } = &r.result {
            let _ = writeln!(o, "  not pid {}: {why}", r.pid);
        }
    }
    o
}

/// `--yes`, or a person who said yes on the terminal; never without a terminal to ask on.
fn confirmed(s: &OrphansSettings) -> bool {
    if s.yes {
        return true;
    }
    if !s.can_ask {
        crate::sayln!("gpudoc: not ending anything without --yes (no terminal to ask on)");
        return false;
    }
    crate::say!("End them? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}
