//! The scanner over the command's output: splits each stream into lines in bounded memory, parses OOM
//! reports, follows a PyTorch message a logger broke over several lines, and tags each report with the
//! rank that printed it (`[rank1]:` from torchrun, `rank=1` from vLLM-style prefixes). torchrun's closing
//! "Root Cause (first observed failure)" block says which rank failed first.

use super::parse::{self, Kind, OomText};
use crate::supervise::Stream;
use crate::timeline::Micros;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// The longest line kept; the rest of a longer line is skipped (an OOM report is one line of <2 KiB).
pub const MAX_LINE: usize = 64 * 1024;
/// Reports kept; later ones are only counted.
pub const MAX_EVENTS: usize = 32;
/// Lines after an incomplete PyTorch message that may continue it.
const CONTINUATION_LINES: u8 = 4;
/// Characters of the matched line kept in the report.
const KEEP_TEXT: usize = 2000;

/// One OOM report seen in the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomEvent {
    #[serde(flatten)]
    pub text: OomText,
    /// `stderr` or `stdout`.
    pub stream: String,
    /// Seconds since the run started, when the line arrived.
    pub at_s: f64,
    pub rank: Option<u32>,
    /// The line as printed (ANSI colours removed, at most 2000 characters).
    pub line: String,
}

/// torchrun's record of the first rank that failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FirstFailure {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub exitcode: Option<i32>,
    pub pid: Option<u32>,
}

#[derive(Debug, Default)]
struct LineBuf {
    buf: Vec<u8>,
    /// The current line passed MAX_LINE; skipping to its end.
    skipping: bool,
    /// Index of an incomplete PyTorch event and how many more lines may continue it.
    pending: Option<(usize, u8)>,
    /// Lines left in a torchrun root-cause block.
    root_cause: u8,
}

/// Scans both streams. Memory stays bounded whatever the input: one line buffer per stream of at most
/// [`MAX_LINE`] bytes and at most [`MAX_EVENTS`] events.
#[derive(Debug, Default)]
pub struct Scanner {
    streams: [LineBuf; 3],
    pub events: Vec<OomEvent>,
    /// Reports seen beyond [`MAX_EVENTS`].
    pub dropped: u64,
    pub first_failure: Option<FirstFailure>,
}

static ANSI: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"\x1b\[[0-9;?]*[ -/]*[@-~]").unwrap());
static RANK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*\[(?:rank|default)(\d+)\]:|\brank=(\d+) pid=\d+\)").unwrap());
static RC_RANK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)").unwrap());
static RC_EXIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)").unwrap());

impl Scanner {
    pub fn new() -> Scanner {
        Scanner::default()
    }

    /// Feeds a chunk of output that arrived at `at`.
    pub fn feed(&mut self, stream: Stream, bytes: &[u8], at: Micros) {
        let i = stream as usize;
        let mut rest = bytes;
        while !rest.is_empty() {
            // Progress bars end their lines with \r: a line ends at either.
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.append(i, &rest[..end]);
                    self.end_line(stream, at);
                    rest = &rest[end + 1..];
                }
                None => {
                    self.append(i, rest);
                    rest = &[];
                }
            }
        }
    }

    /// Ends the streams: a last line without a newline is scanned too.
    pub fn finish(&mut self, at: Micros) {
        for stream in [Stream::Stdout, Stream::Stderr, Stream::Both] {
            let b = &self.streams[stream as usize];
            if !b.buf.is_empty() || b.skipping {
                self.end_line(stream, at);
            }
        }
    }

    fn append(&mut self, i: usize, bytes: &[u8]) {
        let b = &mut self.streams[i];
        if b.skipping {
            return;
        }
        let room = MAX_LINE - b.buf.len();
        if bytes.len() > room {
            b.buf.extend_from_slice(&bytes[..room]);
            b.skipping = true;
        } else {
            b.buf.extend_from_slice(bytes);
        }
    }

    fn end_line(&mut self, stream: Stream, at: Micros) {
        let i = stream as usize;
        let raw = std::mem::take(&mut self.streams[i].buf);
        self.streams[i].skipping = false;
        if raw.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&raw);
        let line = if text.contains('\x1b') {
            ANSI.replace_all(&text, "").into_owned()
        } else {
            text.into_owned()
        };
        self.scan_line(stream, &line, at);
    }

    fn scan_line(&mut self, stream: Stream, line: &str, at: Micros) {
        let i = stream as usize;
        if self.streams[i].root_cause > 0 {
            self.streams[i].root_cause -= 1;
            self.root_cause_line(line);
        }
        if line.contains("Root Cause (first observed failure)") {
            self.streams[i].root_cause = 12;
            self.first_failure.get_or_insert_with(FirstFailure::default);
            return;
        }
        if let Some(text) = parse::parse_line(line) {
            self.streams[i].pending = None;
            let incomplete_torch = text.kind == Kind::TorchAllocator && !text.complete;
            if self.events.len() >= MAX_EVENTS {
                self.dropped += 1;
                return;
            }
            let rank = RANK
                .captures(line)
                .and_then(|c| c.get(1).or(c.get(2)).and_then(|m| m.as_str().parse().ok()));
            self.events.push(OomEvent {
                text,
                stream: stream.name().into(),
                at_s: at as f64 / 1e6,
                rank,
                line: line.chars().take(KEEP_TEXT).collect(),
            });
            if incomplete_torch {
                self.streams[i].pending = Some((self.events.len() - 1, CONTINUATION_LINES));
            }
            return;
        }
        if let Some((idx, left)) = self.streams[i].pending {
            let done = parse::continue_torch(&mut self.events[idx].text, line);
            self.streams[i].pending = (!done && left > 1).then_some((idx, left - 1));
        }
    }

    fn root_cause_line(&mut self, line: &str) {
        let Some(ff) = self.first_failure.as_mut() else {
            return;
        };
        if let Some(c) = RC_RANK.captures(line) {
            ff.rank = c[1].parse().ok();
            ff.local_rank = c[2].parse().ok();
        }
        if let Some(c) = RC_EXIT.captures(line) {
            ff.exitcode = c[1].parse().ok();
            ff.pid = c[2].parse().ok();
        }
    }

    /// Bytes held by the line buffers (bounded by 2 × [`MAX_LINE`] whatever the input).
    pub fn held_bytes(&self) -> usize {
        self.streams.iter().map(|s| s.buf.capacity()).sum()
    }

    /// The report that names the failure: the first one with a size asked for, else the first.
    pub fn first(&self) -> Option<&OomEvent> {
        self.events
            .iter()
            .find(|e| e.text.requested_bytes.is_some())
            .or(self.events.first())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_split_across_chunks_and_lines_is_found() {
        let mut s = Scanner::new();
        let text = b"step 1\r\x1b[31mtorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 has a total capacity of 79.
15 GiB of which 1.00 GiB is free. ";
        for chunk in text.chunks(7) {
            s.feed(Stream::Stderr, chunk, 1_500_000);
        }
        s.feed(Stream::Stderr, b"\n", 1_500_000);
        // A logger that broke the message: the next lines continue it.
        s.feed(Stream::Stderr, b"Including non-PyTorch memory, this process has 78.00 GiB memory in use.\nOf the allocated memory 70.00 GiB is allocated by PyTorch, and 7.50 GiB is reserved by PyTorch but unallocated.\n", 1_600_000);
        assert_eq!(s.events.len(), 1);
        let e = &s.events[0];
        assert_eq!(e.text.exception.as_deref(), Some("torch.OutOfMemoryError"));
        assert_eq!(e.text.gpu, None, "the clause naming the GPU was broken too");
        assert_eq!(e.text.requested_bytes, Some(2 << 30));
        assert_eq!(e.text.total_bytes, None, "`79.\\n15 GiB` is not a size");
        assert_eq!(e.text.process_bytes, Some(78 << 30));
        assert_eq!(
            e.text.reserved_unallocated_bytes,
            Some(7 * (1 << 30) + (1 << 29))
        );
        assert!(!e.text.complete);
        assert_eq!(e.at_s, 1.5);
    }

    #[test]
    fn ranks_and_torchrun_root_cause() {
        let mut s = Scanner::new();
        let out = "[rank1]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 1 has a total capacity of 139.80 GiB of which 100.00 MiB is free.\n\
[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 100.00 MiB is free.\n\
Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-29_16:00:00\n  host      : h200\n  rank      : 1 (local_rank: 1)\n  exitcode  : 1 (pid: 4242)\n  error_file: <N/A>\n";
        s.feed(Stream::Stderr, out.as_bytes(), 0);
        assert_eq!(
            s.events.iter().map(|e| e.rank).collect::<Vec<_>>(),
            vec![Some(1), Some(0)]
        );
        assert_eq!(
            s.first_failure,
            Some(FirstFailure {
                rank: Some(1),
                local_rank: Some(1),
                exitcode: Some(1),
                pid: Some(4242)
            })
        );
    }

    #[test]
    fn memory_is_bounded_on_endless_lines_and_floods() {
        let mut s = Scanner::new();
        let junk = vec![b'x'; 1 << 20];
        for _ in 0..100 {
            s.feed(Stream::Stdout, &junk, 0);
        }
        assert!(s.streams[0].buf.capacity() <= 2 * MAX_LINE);
        let line = b"RuntimeError: CUDA error: out of memory\n";
        for _ in 0..1000 {
            s.feed(Stream::Stderr, line, 0);
        }
        s.feed(Stream::Stdout, b"\n", 0);
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.dropped, 1000 - MAX_EVENTS as u64);
    }
}
