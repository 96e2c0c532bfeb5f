//! `gpudoc schema NAME`: the JSON Schema of a file gpudoc writes, generated from the types that write it.
//! The same schemas are in docs/schema/ (checked against these by the tests).

use crate::cli::SchemaName;
use crate::exit::{self, Failure};
use clap::ValueEnum;
use schemars::schema_for;
use serde_json::Value;
use std::process::ExitCode;

/// The schema of `name`.
pub fn of(name: SchemaName) -> Value {
    match name {
        SchemaName::Report => schema_for!(crate::report::Report),
        SchemaName::TraceRow => schema_for!(
            crate::trace::Row<crate::analysis::EndRow, crate::torch::message::Message>
        ),
        SchemaName::Baseline => schema_for!(crate::gate::BaselineFile),
        SchemaName::Compare => schema_for!(crate::compare::Comparison),
        SchemaName::Orphans => schema_for!(super::orphans::Output<'static>),
        SchemaName::Fit => schema_for!(crate::fit::FitReport),
        SchemaName::ShimMessage => schema_for!(crate::torch::message::Message),
    }
    .to_value()
}

/// `report`, `trace-row`, ...: the name on the command line and of the file in docs/schema/.
pub fn file_stem(name: SchemaName) -> String {
    name.to_possible_value()
        .expect("every schema has a name")
        .get_name()
        .to_string()
}

pub fn run(name: SchemaName) -> Result<ExitCode, Failure> {
    let text = serde_json::to_string_pretty(&of(name)).expect("a schema serializes") + "\n";
    crate::output::stdout(&text).map_err(|e| Failure::printing(e, exit::USAGE))?;
    Ok(ExitCode::SUCCESS)
}
