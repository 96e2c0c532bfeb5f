//! What reads the command's output along with gpudoc (the OOM scanner): the [`Observer`] the pumps
//! ([`super::streams`]) and the file follower ([`super::follow`]) feed, the [`Sieve`] that tells it the
//! bytes that could matter, and which [`Stream`] a chunk came from. Below both, so neither imports the
//! other for them.

use std::sync::Mutex;
use std::time::Instant;

/// Which of the command's output streams a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// One channel for both (they were the same file).
    Both,
}

impl Stream {
    /// `stdout`, `stderr`, `stdout+stderr`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Both => "stdout+stderr",
        }
    }
}

/// Reads the command's output along with gpudoc (the OOM scanner). It sees every chunk that passes
/// through gpudoc, after it was passed on; of a file the command writes itself, the chunks that could
/// matter to it ([`Sieve`]) and those it asks for.
pub trait Observer: Send {
    /// The next bytes of `stream`, written at `at`.
    fn feed(&mut self, stream: Stream, bytes: &[u8], at: Instant);
    /// Whether the bytes that follow matter whatever they hold (it is in the middle of something).
    fn wants_next(&self, stream: Stream) -> bool;
    /// Bytes of `stream` went by unfed: what it kept of the line in progress is void; the next bytes fed
    /// start a line.
    fn skipped(&mut self, stream: Stream);
    /// How to tell bytes that could matter to it from bytes that cannot.
    fn sieve(&self) -> Sieve;
}

/// The observer, shared by the threads that watch the command's streams (none: nobody is watching).
pub type Watching = Mutex<Option<Box<dyn Observer>>>;

/// Tells bytes that could matter to an [`Observer`] from bytes that cannot; asked from several threads.
#[derive(Debug, Clone, Copy)]
pub struct Sieve {
    /// Whether the bytes hold one of the observer's words.
    pub could_matter: fn(&[u8]) -> bool,
    /// The longest word less one: a stretch is sieved with this many bytes before it.
    pub reach: usize,
}
