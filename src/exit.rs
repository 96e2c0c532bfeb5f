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
