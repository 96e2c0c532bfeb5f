//! Every exit code gpudoc uses, in one table, and the one failure type commands return. `gpudoc run`
//! otherwise exits with the command's code (or 128+N for death by signal N); its own codes are chosen, as
//! `env` chooses them, not to collide with ordinary command codes.

use std::fmt;

/// `gpudoc orphans`: leftovers were found and are still there.
pub const LEFTOVERS: u8 = 1;
/// Commands other than `run`: bad input (unknown flag, unreadable or corrupt file, broken rule file).
pub const USAGE: u8 = 2;
/// `gpudoc fit`: not even `--min` fits.
pub const FIT_NOTHING_FITS: u8 = 1;
/// `gpudoc fit`: the runs or the time budget were spent before the answer was verified.
pub const FIT_UNSETTLED: u8 = 3;
/// `gpudoc fit`: a run failed for a reason other than GPU memory (the fit cannot judge its value).
pub const FIT_RUN_FAILED: u8 = 4;
/// `gpudoc run`: the command succeeded but the memory gate failed.
pub const GATE_FAILED: u8 = 122;
/// `gpudoc run --stop-on`: gpudoc ended the job because a named rule was told during the run.
pub const STOPPED: u8 = 123;
/// `gpudoc run`: gpudoc itself failed (bad flag or value, an output it could not write, internal error).
pub const GPUDOC_FAILED: u8 = 125;
/// `gpudoc run`: the command was found but could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// `gpudoc run`: the command was not found.
pub const NOT_FOUND: u8 = 127;

/// The codes as the man page's EXIT STATUS lists them: which command, the code, what it means.
pub const TABLE: [(&str, &str, &str); 12] = [
    (
        "run",
        "the command's code",
        "the command exited normally (0 included)",
    ),
    (
        "run",
        "128+N",
        "the command died of signal N (137 for SIGKILL, 143 for SIGTERM)",
    ),
    (
        "run",
        "122",
        "the command succeeded but the memory gate failed",
    ),
    (
        "run",
        "123",
        "--stop-on: gpudoc ended the job because a named rule was told during the run (whatever the \
         command's own code after the SIGINT)",
    ),
    (
        "run",
        "125",
        "gpudoc itself failed: a bad flag or value, an unwritable --json/--trace path or --report-dir \
         folder, a broken rule file, a corrupt baseline, a --max-peak for a GPU that is not there (all before the command runs), an \
         internal error",
    ),
    (
        "run",
        "126",
        "the command was found but could not be executed",
    ),
    ("run", "127", "the command was not found"),
    ("orphans", "1", "leftovers were found and are still there"),
    ("fit", "1", "not even --min fits"),
    (
        "fit",
        "3",
        "the runs or the time budget were spent before the answer was verified",
    ),
    (
        "fit",
        "4",
        "a run failed for a reason other than GPU memory",
    ),
    (
        "others",
        "2",
        "bad input: an unknown flag, an unreadable or corrupt file, a broken rule file, reports of more than \
         one job given to `report` to merge",
    ),
];

/// A failure of gpudoc itself: the message `main` prints once, and the code it exits with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: u8,
    /// Empty for a failure that is not worth a word (the reader of stdout went away).
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }

    /// A quiet end: stdout's reader went away (`| head`), as ripgrep and cat end.
    pub fn broken_pipe() -> Failure {
        Failure::new(0, "")
    }

    /// An I/O error while printing a command's result: quiet on a broken pipe, else a failure with `code`.
    pub fn printing(e: std::io::Error, code: u8) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Failure::broken_pipe()
        } else {
            Failure::new(code, format!("cannot write the output: {e}"))
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_code_gpudoc_chooses() {
        let own = [
            ("orphans", LEFTOVERS),
            ("others", USAGE),
            ("fit", FIT_NOTHING_FITS),
            ("fit", FIT_UNSETTLED),
            ("fit", FIT_RUN_FAILED),
            ("run", GATE_FAILED),
            ("run", STOPPED),
            ("run", GPUDOC_FAILED),
            ("run", CANNOT_EXECUTE),
            ("run", NOT_FOUND),
        ];
        for (command, code) in own {
            assert!(
                TABLE
                    .iter()
                    .any(|&(c, k, _)| c == command && k == code.to_string()),
                "exit code {code} of {command} is not in TABLE"
            );
        }
    }
}
