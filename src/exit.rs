//! Exit codes of gpudoc itself. `gpudoc run` otherwise exits with the child's code (or 128+N for death by
//! signal N); these are chosen, as `env` chooses them, not to collide with ordinary child codes.

/// gpudoc failed before or while starting the command (bad flag, unusable option, internal error).
pub const GPUDOC_FAILED: u8 = 125;
/// The command was found but could not be executed (permission denied, not an executable).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// Commands other than `run`: bad input (unknown flag, unreadable or corrupt file).
pub const USAGE: u8 = 2;
