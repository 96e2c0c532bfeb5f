//! `gpudoc compare OLD NEW`: what changed between two runs.

use crate::compare::{compare, render};
use crate::exit::{self, Failure};
use crate::output::{self, Target};
use crate::replay;
use crate::report::Report;
use crate::settings::CompareSettings;
use std::path::Path;
use std::process::ExitCode;

pub fn run(s: CompareSettings) -> Result<ExitCode, Failure> {
    let load = |p: &Path| -> Result<Report, Failure> {
        replay::load(p, None, &s.rules).map_err(|e| Failure::new(exit::USAGE, e))
    };
    let (old, new) = (load(&s.old)?, load(&s.new)?);
    let c = compare(
        &old,
        &new,
        &s.old.display().to_string(),
        &s.new.display().to_string(),
    );
    let json = serde_json::to_string_pretty(&c).expect("a comparison serializes") + "\n";
    let printing = |e| Failure::printing(e, exit::USAGE);
    match &s.json {
        Some(Target::Stdout) => output::stdout(&json).map_err(printing)?,
        Some(t) => {
            output::stdout(&render(&c, s.paint)).map_err(printing)?;
            output::write(t, json.as_bytes())
                .map_err(|e| Failure::new(exit::USAGE, format!("--json {}: {e}", t.display())))?;
        }
        None => output::stdout(&render(&c, s.paint)).map_err(printing)?,
    }
    Ok(ExitCode::SUCCESS)
}
