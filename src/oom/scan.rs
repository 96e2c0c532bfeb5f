//! The scanner over the command's output: finds OOM reports in any stream, in bounded memory, without
//! holding the output back. A multi-pattern search runs over each chunk as it passes ([`NEEDLES`], at
//! gigabytes a second); only the lines it hits, and the few lines after a report that may continue it, are
//! looked at closely. A report that spans lines (a logger broke it, a terminal wrapped it in the middle of
//! a number, a quote re-wrapped it at 72 columns, a log prefix on every line) is joined up again; each
//! report is tagged with the rank that printed it (`[rank1]:`, `[host:1]:`, `rank=1`, srun's `1: `);
//! torchrun's closing "Root Cause (first observed failure)" block says which rank failed first.

use super::bfc;
use super::engines;
use super::formats;
use super::parse::{self, OomText};
use crate::supervise::{Observer, Sieve, Stream};
use crate::timeline::Micros;
use aho_corasick::AhoCorasick;
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Instant;

/// The longest line kept; the rest of a longer line is skipped (an OOM report is one line of <2 KiB).
pub const MAX_LINE: usize = 64 * 1024;
/// Reports kept; later ones are only counted.
pub const MAX_EVENTS: usize = 32;
/// Non-empty lines after an incomplete report that may continue it.
const CONTINUATION_LINES: u8 = 6;
/// Characters of a report (its lines joined) kept, and read again as lines join on.
const KEEP_TEXT: usize = 4000;
/// Lines of torchrun's root-cause block.
const ROOT_CAUSE_LINES: u8 = 12;

/// Words that every OOM report the parser reads contains, as programs spell them. A line with none of
/// them is never parsed. Spelled out rather than matched case-insensitively, so the search runs on the
/// vectorized multi-pattern searcher (Teddy), at several gigabytes a second.
pub const NEEDLES: [&str; 22] = [
    "out of memory",
    "Out of memory",
    "OUT OF MEMORY",
    "Out Of Memory",
    "OutOfMemory",
    "OUT_OF_MEMORY",
    "ALLOC_FAILED",
    "RESOURCE_EXHAUSTED",
    "esource exhausted",
    "OOM when allocating",
    "ailed to allocate",
    "CUDA calloc",
    "Root Cause (first observed failure)",
    "cuMemAllocAsync",
    "out_of_memory",
    // vLLM's KV cache without room: each of its texts ends `Try increasing `gpu_memory_utilization``.
    "y_utilization",
    // TensorRT's warning that gives the size of what it could not allocate.
    "Requested amount of GPU",
    // `cudaMalloc fail` / `ed: out of memory`: a log that wrapped the word keeps half of it on each line.
    "Malloc fail",
    // SGLang's and text-generation-inference's KV cache and warmup without room.
    "Not enough memory",
    // Intel's Level Zero (`UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY`).
    "OUT_OF_DEVICE_MEMORY",
    // Blender's Cycles: `System is out of GPU memory`.
    "out of GPU",
    // vLLM's start-up refusal: `Free memory on device ... is less than desired GPU memory utilization`.
    "desired GPU memory",
];

/// The longest word of [`NEEDLES`] less one: how far a word can reach back over the start of a stretch.
pub const REACH: usize = 34;

/// Whether a stretch of output holds any word of [`NEEDLES`]: if not (and the scanner does not
/// [want](Scanner::wants_next) it), it need not be fed. Several threads may ask at once.
pub fn could_matter(bytes: &[u8]) -> bool {
    FINDER.is_match(bytes)
}

/// The vectorized searcher where the processor has it, an automaton elsewhere.
enum Finder {
    Packed(aho_corasick::packed::Searcher),
    Automaton(AhoCorasick),
}

impl Finder {
    fn hits<'a>(&'a self, b: &'a [u8]) -> Box<dyn Iterator<Item = usize> + 'a> {
        match self {
            Finder::Packed(s) => Box::new(s.find_iter(b).map(|m| m.start())),
            Finder::Automaton(a) => Box::new(a.find_iter(b).map(|m| m.start())),
        }
    }

    fn is_match(&self, b: &[u8]) -> bool {
        self.hits(b).next().is_some()
    }
}

static FINDER: LazyLock<Finder> = LazyLock::new(|| {
    match aho_corasick::packed::Config::new()
        .builder()
        .extend(NEEDLES)
        .build()
    {
        Some(s) => Finder::Packed(s),
        None => Finder::Automaton(AhoCorasick::new(NEEDLES).expect("built-in patterns")),
    }
});

/// The scanner reading along with the command ([`Observer`]): times are counted from `start`.
pub struct Reading {
    pub scanner: Arc<Mutex<Scanner>>,
    pub start: Instant,
}

impl Observer for Reading {
    fn feed(&mut self, stream: Stream, bytes: &[u8], at: Instant) {
        let at = at.saturating_duration_since(self.start).as_micros() as Micros;
        self.scanner.lock().unwrap().feed(stream, bytes, at);
    }

    fn wants_next(&self, stream: Stream) -> bool {
        self.scanner.lock().unwrap().wants_next(stream)
    }

    fn skipped(&mut self, stream: Stream) {
        self.scanner.lock().unwrap().skipped(stream);
    }

    fn sieve(&self) -> Sieve {
        Sieve {
            could_matter,
            reach: REACH,
        }
    }
}

/// One OOM report seen in the output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OomEvent {
    #[serde(flatten)]
    pub text: OomText,
    /// `stderr`, `stdout`, or `stdout+stderr` when the two were one file.
    pub stream: String,
    /// Seconds since the run started, when the line arrived.
    pub at_s: f64,
    pub rank: Option<u32>,
    /// The report as printed (its lines joined, ANSI colours and repeated prefixes removed, at most 4000
    /// characters).
    pub line: String,
}

/// torchrun's record of the first rank that failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FirstFailure {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub exitcode: Option<i32>,
    pub pid: Option<u32>,
}

/// An incomplete report that the next lines may continue.
#[derive(Debug)]
struct Pending {
    index: usize,
    left: u8,
    /// The opening line's prefix, digits loosened (`2024-05-01 12:00:00,123 ERROR `): continuation
    /// lines that start with the same shape have it removed before they are joined.
    prefix: Option<Regex>,
    /// The opening line before the message: where the whole of it is no shape of the next lines (a
    /// logger's prefix, then a library's words before its error), the part they share is the prefix.
    head: String,
    /// The report as its opening line read.
    opened: OomText,
    /// The lines joined as a terminal wraps them (nothing between) and as a mail or forum quote
    /// re-wraps them (a space between).
    joined: Joined,
}

/// A report's lines joined both ways: a terminal breaks a line anywhere, a word or a number included,
/// and the two halves join with nothing between; text re-wrapped at 72 columns (a quoted e-mail, a
/// forum post) was broken at a space, which the break took.
#[derive(Debug, Clone)]
struct Joined {
    tight: String,
    spaced: String,
}

impl Joined {
    fn new(line: &str) -> Joined {
        let line: String = line.chars().take(KEEP_TEXT).collect();
        Joined {
            tight: line.clone(),
            spaced: line,
        }
    }

    fn push(&mut self, body: &str) {
        let space = needs_space(&self.spaced, body);
        for (s, sep) in [(&mut self.tight, false), (&mut self.spaced, space)] {
            let room = KEEP_TEXT.saturating_sub(s.chars().count() + sep as usize);
            if sep && room > 0 {
                s.push(' ');
            }
            s.extend(body.chars().take(room));
        }
    }

    /// `t` read from each join; the reading with more fields, the terminal's on a tie.
    fn read(&self, t: &OomText) -> (OomText, &str, bool) {
        let mut tight = t.clone();
        let tight_done = parse::refine(&mut tight, &self.tight);
        let mut spaced = t.clone();
        let spaced_done = parse::refine(&mut spaced, &self.spaced);
        if parse::fields_read(&spaced) > parse::fields_read(&tight) {
            (spaced, &self.spaced, spaced_done)
        } else {
            (tight, &self.tight, tight_done)
        }
    }
}

/// Whether a re-wrapped line's break took a space: two words met. Never inside a number (a break there
/// is a terminal's), nor where either side already has one.
fn needs_space(before: &str, after: &str) -> bool {
    let (Some(a), Some(b)) = (before.chars().last(), after.chars().next()) else {
        return false;
    };
    let numeric = |c: char| c.is_ascii_digit() || c == '.' || c == ',';
    !(a.is_whitespace() || b.is_whitespace() || (numeric(a) && numeric(b)))
}

#[derive(Debug, Default)]
struct LineBuf {
    /// The current line, up to [`MAX_LINE`] bytes.
    partial: Vec<u8>,
    /// The current line passed MAX_LINE; skipping to its end.
    skipping: bool,
    /// The current line holds a word of [`NEEDLES`]: its end matters.
    partial_hit: bool,
    pending: Option<Pending>,
    /// A line with an OOM word that opened nothing: the next line may finish its phrase (a terminal
    /// wrapped "Resource exhausted: Out " / "of memory while trying to allocate N bytes").
    tentative: Option<String>,
    /// Lines left in a torchrun root-cause block.
    root_cause: u8,
    /// A BFC allocator's warning just opened (its event's index): the figures it prints after it may
    /// come in the next lines left ([`bfc::LINES`]).
    bfc: Option<(usize, u32)>,
}

impl LineBuf {
    /// Whether the next line matters whatever it says.
    fn expecting(&self) -> bool {
        self.pending.is_some()
            || self.tentative.is_some()
            || self.root_cause > 0
            || self.bfc.is_some()
    }

    /// Appends the middle of a long line, noting a word of [`NEEDLES`] in it (also one that began in
    /// what was kept before).
    fn append_noting(&mut self, bytes: &[u8]) {
        let from = self.partial.len().saturating_sub(REACH);
        self.append(bytes);
        self.partial_hit |= FINDER.is_match(&self.partial[from..]);
    }

    fn append(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        let room = MAX_LINE - self.partial.len();
        if bytes.len() > room {
            self.partial.extend_from_slice(&bytes[..room]);
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }
}

/// Scans the streams. Memory stays bounded whatever the input: one line buffer per stream of at most
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
static RANK: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\[(?:rank|default)(\d+)\]:|\[[A-Za-z][\w.\-]*:(\d+)\]:|\brank=(\d+)\b|^\s*(\d+): ")
        .unwrap()
});
static RC_RANK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)").unwrap());
static RC_EXIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)").unwrap());

fn line_end(b: &[u8]) -> Option<usize> {
    memchr::memchr2(b'\n', b'\r', b)
}

impl Scanner {
    pub fn new() -> Scanner {
        Scanner::default()
    }

    /// What it found so far, without its line buffers.
    pub fn findings(&self) -> Scanner {
        Scanner {
            events: self.events.clone(),
            dropped: self.dropped,
            first_failure: self.first_failure.clone(),
            ..Scanner::default()
        }
    }

    /// Feeds a chunk of output that arrived at `at`. Lines end at `\n` or `\r` (progress bars end
    /// theirs with `\r`).
    pub fn feed(&mut self, stream: Stream, bytes: &[u8], at: Micros) {
        let i = stream as usize;
        let mut rest = bytes;
        // Finish the line the last chunk left open.
        if !self.streams[i].partial.is_empty() || self.streams[i].skipping {
            match line_end(rest) {
                Some(e) => {
                    self.streams[i].append(&rest[..e]);
                    self.end_line(stream, at);
                    rest = &rest[e + 1..];
                }
                None => {
                    self.streams[i].append_noting(rest);
                    return;
                }
            }
        }
        let mut hits = FINDER.hits(rest).peekable();
        let mut p = 0;
        loop {
            let start = if self.streams[i].expecting() {
                p
            } else {
                // Skip to the line of the next hit; nothing between matters.
                while hits.next_if(|&h| h < p).is_some() {}
                match hits.next() {
                    Some(h) => memchr::memrchr2(b'\n', b'\r', &rest[p..h]).map_or(p, |x| p + x + 1),
                    None => {
                        let tail =
                            memchr::memrchr2(b'\n', b'\r', &rest[p..]).map_or(p, |x| p + x + 1);
                        self.streams[i].append(&rest[tail..]);
                        self.streams[i].partial_hit = false;
                        return;
                    }
                }
            };
            match line_end(&rest[start..]) {
                Some(e) => {
                    self.line(stream, &rest[start..start + e], at);
                    p = start + e + 1;
                }
                None => {
                    self.streams[i].append(&rest[start..]);
                    self.streams[i].partial_hit = true;
                    return;
                }
            }
        }
    }

    /// Whether the next bytes of `stream` matter whatever they hold: a report is open, or the line in
    /// progress holds an OOM word. Otherwise bytes in which [`could_matter`] finds nothing can go
    /// unread ([`skipped`](Scanner::skipped)).
    pub fn wants_next(&self, stream: Stream) -> bool {
        let b = &self.streams[stream as usize];
        b.expecting() || b.partial_hit
    }

    /// Bytes of `stream` went by unread (nothing in them could matter, and [`wants_next`](Self::wants_next)
    /// said so): the line in progress is dropped; the next bytes fed start a line.
    pub fn skipped(&mut self, stream: Stream) {
        let b = &mut self.streams[stream as usize];
        b.partial.clear();
        b.skipping = false;
        b.partial_hit = false;
    }

    /// Ends the streams: a last line without a newline is scanned too.
    pub fn finish(&mut self, at: Micros) {
        for stream in [Stream::Stdout, Stream::Stderr, Stream::Both] {
            let b = &self.streams[stream as usize];
            if !b.partial.is_empty() || b.skipping {
                self.end_line(stream, at);
            }
        }
    }

    fn end_line(&mut self, stream: Stream, at: Micros) {
        let i = stream as usize;
        let raw = std::mem::take(&mut self.streams[i].partial);
        self.streams[i].skipping = false;
        self.streams[i].partial_hit = false;
        if self.streams[i].expecting() || FINDER.is_match(&raw) {
            self.line(stream, &raw, at);
        }
    }

    /// One line that matters: a hit, or one that an open report or block may go on with.
    fn line(&mut self, stream: Stream, raw: &[u8], at: Micros) {
        let text = String::from_utf8_lossy(raw);
        let line = if text.contains('\x1b') {
            ANSI.replace_all(&text, "").into_owned()
        } else {
            text.into_owned()
        };
        let i = stream as usize;
        if self.streams[i].root_cause > 0 {
            self.streams[i].root_cause -= 1;
            self.root_cause_line(&line);
        }
        if line.contains("Root Cause (first observed failure)") {
            self.streams[i].root_cause = ROOT_CAUSE_LINES;
            self.first_failure.get_or_insert_with(FirstFailure::default);
            return;
        }
        if let Some((index, left)) = self.streams[i].bfc {
            let done = bfc::read(&mut self.events[index].text, &line);
            self.streams[i].bfc = (!done && left > 1).then_some((index, left - 1));
            // The dump's window hands every line here for its figures; one that nothing else waits for
            // and that holds no OOM word is read no further, as it would not be outside the window.
            let b = &self.streams[i];
            if b.pending.is_none()
                && b.tentative.is_none()
                && b.root_cause == 0
                && !FINDER.is_match(line.as_bytes())
            {
                return;
            }
        }
        if line.trim().is_empty() {
            return;
        }
        let alone = parse::open(&line).map(|o| (line.clone(), o));
        let joined = self.streams[i]
            .tentative
            .take()
            .and_then(|first| finish_phrase(&first, &line));
        // The line with the one before it when that reads more (the line alone may already open a
        // report: `device: CUDA_ERROR_OUT_OF_MEMORY` without the size the line before gave).
        let best = match (alone, joined) {
            (Some(a), Some(j)) if parse::fields_read(&j.1.text) > parse::fields_read(&a.1.text) => {
                Some(j)
            }
            (Some(a), _) => Some(a),
            (None, j) => j,
        };
        if let Some((text, opened)) = best {
            self.streams[i].pending = None;
            self.open(stream, &text, opened, at);
            return;
        }
        if self.streams[i].pending.is_some() {
            self.continue_pending(i, &line);
        } else if FINDER.is_match(line.as_bytes()) {
            self.streams[i].tentative = Some(line.chars().take(KEEP_TEXT).collect());
        }
    }

    fn open(&mut self, stream: Stream, line: &str, opened: parse::Opened, at: Micros) {
        if self.events.len() >= MAX_EVENTS {
            self.dropped += 1;
            return;
        }
        let rank = RANK.captures(line).and_then(|c| {
            (1..=4)
                .find_map(|k| c.get(k))
                .and_then(|m| m.as_str().parse().ok())
        });
        let open_ended = parse::open_ended(&opened.text);
        let mut text = opened.text;
        // A report that opens ends the figures of a BFC warning before it (its event may go below).
        self.streams[stream as usize].bfc = None;
        if self.absorb_tensorrt_request(stream, &mut text, line, at) {
            return;
        }
        self.absorb_allocator_warning(stream, &mut text, at);
        self.events.push(OomEvent {
            text: text.clone(),
            stream: stream.name().into(),
            at_s: at as f64 / 1e6,
            rank,
            line: line.chars().take(KEEP_TEXT).collect(),
        });
        if formats::row_of(&text).is_some_and(|f| f.warning && f.format == "bfc") {
            self.streams[stream as usize].bfc = Some((self.events.len() - 1, bfc::LINES));
        }
        if open_ended {
            let prefix = line[..opened.start].trim_end();
            self.streams[stream as usize].pending = Some(Pending {
                index: self.events.len() - 1,
                left: CONTINUATION_LINES,
                prefix: (!prefix.is_empty()).then(|| shape_of(prefix)).flatten(),
                head: prefix.to_string(),
                opened: text,
                joined: Joined::new(line),
            });
        }
    }

    /// TensorRT says the size of an allocation it could not make in a warning of its own (`Requested
    /// amount of GPU memory (N bytes) could not be allocated`), just before or just after the error that
    /// gives none (`Error Code 2: OutOfMemory (no further information)`): the two are one report. Returns
    /// whether `t` went into the report before it.
    fn absorb_tensorrt_request(
        &mut self,
        stream: Stream,
        t: &mut OomText,
        line: &str,
        at: Micros,
    ) -> bool {
        if t.kind != parse::Kind::Tensorrt {
            return false;
        }
        let Some(last) = self.events.last_mut() else {
            return false;
        };
        let near = last.text.kind == parse::Kind::Tensorrt
            && last.stream == stream.name()
            && (at as f64 / 1e6 - last.at_s) <= 5.0;
        if !near {
            return false;
        }
        let request = engines::is_tensorrt_request(line);
        let last_request = engines::is_tensorrt_request(&last.line);
        if request && !last_request && last.text.requested_bytes.is_none() {
            last.text.requested_bytes = t.requested_bytes;
            return true;
        }
        if !request && last_request {
            let warning = self.events.pop().unwrap().text;
            t.requested_bytes = t.requested_bytes.or(warning.requested_bytes);
        }
        false
    }

    /// A BFC allocator's "ran out of memory" warning is followed by the error that reports the same
    /// failure (TensorFlow's ResourceExhaustedError, XLA's RESOURCE_EXHAUSTED): the two are one report,
    /// the error's, with what only the warning said (the GPU, the exact size).
    fn absorb_allocator_warning(&mut self, stream: Stream, t: &mut OomText, at: Micros) {
        let warning = |t: &OomText| formats::row_of(t).is_some_and(|f| f.warning);
        if !matches!(t.kind, parse::Kind::Xla | parse::Kind::Tensorflow) || warning(t) {
            return;
        }
        let Some(last) = self.events.last() else {
            return;
        };
        let recent = (at as f64 / 1e6 - last.at_s) <= 5.0;
        if warning(&last.text) && last.stream == stream.name() && recent {
            let warning = self.events.pop().unwrap().text;
            t.gpu = t.gpu.or(warning.gpu);
            t.requested_bytes = t.requested_bytes.or(warning.requested_bytes);
            // The figures the allocator printed after its warning (its `Stats:`).
            t.allowed_bytes = t.allowed_bytes.or(warning.allowed_bytes);
            t.allocated_bytes = t.allocated_bytes.or(warning.allocated_bytes);
            t.reserved_bytes = t.reserved_bytes.or(warning.reserved_bytes);
            t.peak_allocated_bytes = t.peak_allocated_bytes.or(warning.peak_allocated_bytes);
            t.allocations = t.allocations.or(warning.allocations);
            t.largest_alloc_bytes = t.largest_alloc_bytes.or(warning.largest_alloc_bytes);
        }
    }

    /// Joins `line` onto the open report (its repeated prefix removed) and reads it again, the lines
    /// joined as a terminal wraps them and as a quote re-wraps them ([`Joined`]).
    fn continue_pending(&mut self, i: usize, line: &str) {
        let Some(p) = self.streams[i].pending.as_mut() else {
            return;
        };
        let body = match p.prefix.as_ref().and_then(|r| r.find(line)) {
            Some(m) if m.start() == 0 => line[m.end()..].trim_start(),
            _ => match shared_prefix(&p.head, line) {
                0 => line,
                n => line[n..].trim_start(),
            },
        };
        p.joined.push(body);
        let (text, line, done) = p.joined.read(&p.opened);
        let e = &mut self.events[p.index];
        e.text = text;
        e.line = line.to_string();
        p.left -= 1;
        if done || p.left == 0 {
            self.streams[i].pending = None;
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

    /// Bytes held by the line buffers (bounded by 3 × [`MAX_LINE`] whatever the input).
    pub fn held_bytes(&self) -> usize {
        self.streams.iter().map(|s| s.partial.capacity()).sum()
    }

    /// The report that names the failure: the first one with a size asked for, else the first that
    /// names its GPU (TensorFlow 1 logs the failure as a warning, then raises it with the op's device),
    /// else the first.
    pub fn first(&self) -> Option<&OomEvent> {
        self.events
            .iter()
            .find(|e| e.text.requested_bytes.is_some())
            .or_else(|| self.events.iter().find(|e| e.text.gpu.is_some()))
            .or(self.events.first())
    }
}

/// `first`, a line with an OOM word that opened nothing, finished by `line`: a terminal wrapped it
/// ("Resource exhausted: Out " / "of memory while trying to allocate N bytes", "cudaMalloc fail" /
/// "ed: out of memory"), or a quote re-wrapped it at a space.
fn finish_phrase(first: &str, line: &str) -> Option<(String, parse::Opened)> {
    let mut joined = Joined::new(first);
    joined.push(&line[shared_prefix(first, line)..]);
    [joined.tight, joined.spaced]
        .into_iter()
        .find_map(|text| parse::open(&text).map(|o| (text, o)))
}

/// How much of `next` repeats the start of `first` as a log prefix would (the same characters, any
/// digits): up to the last separator they share, so no word of the message itself is cut.
fn shared_prefix(first: &str, next: &str) -> usize {
    let mut end = 0;
    for ((i, a), b) in next.char_indices().zip(first.chars()) {
        let same = a == b || (a.is_ascii_digit() && b.is_ascii_digit());
        if !same {
            break;
        }
        if matches!(a, ' ' | ']' | ':' | '|' | ')') {
            end = i + a.len_utf8();
        }
    }
    if end >= 3 { end } else { 0 }
}

/// A prefix as a pattern of its shape: digits loosened, the rest literal, anchored at the start.
fn shape_of(prefix: &str) -> Option<Regex> {
    let mut pattern = String::from("^\\s*");
    let mut digits = false;
    for c in prefix.trim_start().chars() {
        if c.is_ascii_digit() {
            if !digits {
                pattern.push_str(r"\d+");
            }
            digits = true;
        } else {
            digits = false;
            pattern.push_str(&regex::escape(&c.to_string()));
        }
    }
    Regex::new(&pattern).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sieve_reaches_back_far_enough_for_the_longest_word() {
        let longest = NEEDLES.iter().map(|n| n.len()).max().unwrap();
        assert_eq!(REACH, longest - 1);
    }

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
        // A terminal wrapped it in the middle of a number: joined up, every field is read.
        assert_eq!(e.text.gpu, Some(1));
        assert_eq!(e.text.requested_bytes, Some(2 << 30));
        assert_eq!(e.text.total_bytes, parse::size_bytes("79.15", "GiB"));
        assert_eq!(e.text.process_bytes, Some(78 << 30));
        assert_eq!(
            e.text.reserved_unallocated_bytes,
            Some(7 * (1 << 30) + (1 << 29))
        );
        assert!(e.text.complete);
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

    /// Synthetic: real texts (pytorch#16417, afm_cvpr2019#8) re-wrapped at 72 columns as a mail client
    /// or a forum quote does; no such real paste was found.
    #[test]
    fn lines_re_wrapped_at_72_columns_are_joined_with_the_space_the_wrap_took() {
        let new = "> torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate
> 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB
> is free. Including non-PyTorch memory, this process has 23.60 GiB
> memory in use. Of the allocated memory 22.90 GiB is allocated by
> PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated. If
";
        let old = "RuntimeError: CUDA out of memory. Tried to allocate 25.00 MiB (GPU 0;
3.94 GiB total capacity; 3.14 GiB already allocated; 21.56 MiB free;
634.00 KiB cached)
";
        for text in [new, old] {
            let mut s = Scanner::new();
            s.feed(Stream::Stderr, text.as_bytes(), 0);
            s.finish(0);
            let t = &s.events[0].text;
            assert!(t.complete, "{text}: {t:?}");
            assert!(
                t.total_bytes.is_some() && t.allocated_bytes.is_some(),
                "{t:?}"
            );
            assert!(
                s.events[0].line.contains(" total capacity"),
                "{}",
                s.events[0].line
            );
        }
    }

    #[test]
    fn a_tensorrt_error_and_the_warning_with_its_size_are_one_report() {
        let mut s = Scanner::new();
        s.feed(Stream::Stderr, b"[E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)\n[W] Requested amount of GPU memory (17179869184 bytes) could not be allocated. There may not be enough free memory for allocation to succeed.\n", 0);
        s.finish(0);
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].text.requested_bytes, Some(16 << 30));
        // The warning first, then the error: the same.
        let mut s = Scanner::new();
        s.feed(Stream::Stderr, b"[W] Requested amount of GPU memory (17179869184 bytes) could not be allocated.\n[E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)\n", 0);
        s.finish(0);
        assert_eq!(s.events.len(), 1);
        assert!(s.events[0].line.contains("Error Code 2"));
        assert_eq!(s.events[0].text.requested_bytes, Some(16 << 30));
    }

    #[test]
    fn memory_is_bounded_on_endless_lines_and_floods() {
        let mut s = Scanner::new();
        let junk = vec![b'x'; 1 << 20];
        for _ in 0..100 {
            s.feed(Stream::Stdout, &junk, 0);
        }
        assert!(s.streams[0].partial.capacity() <= 2 * MAX_LINE);
        let line = b"RuntimeError: CUDA error: out of memory\n";
        for _ in 0..1000 {
            s.feed(Stream::Stderr, line, 0);
        }
        s.feed(Stream::Stdout, b"\n", 0);
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.dropped, 1000 - MAX_EVENTS as u64);
    }
}
