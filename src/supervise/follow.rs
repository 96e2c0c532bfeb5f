//! Reading along a regular file the command writes itself (`> log 2>&1`). The command's bytes never pass
//! through gpudoc; gpudoc reads the file behind it through a descriptor of its own and shows the observer
//! what could matter to it.
//!
//! - A stretch of new bytes is first sieved ([`Sieve`]): only a 64 KiB chunk that holds one of the
//!   observer's words, or that it asks for ([`Observer::wants_next`]), is fed to it, from the start of the
//!   line it begins in. Everything else is read once, to be sieved, and never fed.
//! - While the command writes faster than [`Pace::firehose`] (a dump, a `cat` of a big file), gpudoc does
//!   not compete with it for the machine: it only notes how large the file was when, and reads the
//!   stretch once the command slows down or exits (or has written [`Pace::defer_max`] meanwhile), on
//!   several cores at once. Each stretch is fed with the time its bytes were written, not when they were
//!   read, so what the observer finds keeps its time.

use super::observe::{Observer, Sieve, Stream, Watching};
use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::RawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How gpudoc keeps pace with a file the command writes.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Bytes a second above which the command is left to write alone while gpudoc notes the times.
    pub firehose: u64,
    /// The most left unread while the command writes that fast.
    pub defer_max: u64,
    /// One read; the unit the sieve decides on.
    pub chunk: usize,
    /// At most this many threads (each with a description of the file of its own) sieve a stretch ...
    pub threads: usize,
    /// ... of at least this many bytes; a shorter one is sieved by the following thread alone.
    pub parallel_from: u64,
}

impl Pace {
    /// [`Pace::DEFAULT`] where the machine has cores to spare for sieving a stretch at once; on one with
    /// fewer than 4, gpudoc reads along whatever the pace (it would have to sieve a long stretch on the
    /// command's own cores, and waiting for that after the command exits costs more than reading along).
    pub fn for_this_machine() -> Pace {
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
        let threads = cores.min(Pace::DEFAULT.threads);
        match cores {
            ..4 => Pace {
                firehose: u64::MAX,
                threads,
                ..Pace::DEFAULT
            },
            _ => Pace {
                threads,
                ..Pace::DEFAULT
            },
        }
    }

    /// Far above any training log (tens of kilobytes a second), far below a command that writes as fast as
    /// the disk cache takes it (gigabytes a second). 256 MiB left unread stays in the page cache of any
    /// machine that trains on a GPU.
    pub const DEFAULT: Pace = Pace {
        firehose: 32 << 20,
        defer_max: 256 << 20,
        chunk: READ_BYTES,
        threads: 8,
        parallel_from: 4 << 20,
    };
}

/// One read of the file. Small enough that the buffer stays in the processor's cache between the read and
/// the sieve (256 KiB reads of a file being written ran at a third of the speed of 64 KiB ones).
const READ_BYTES: usize = 64 * 1024;
/// How often a followed file is looked at: soon after it last grew (so little is left to read when the
/// command exits), then less often while it stays the same.
const FOLLOW_SOON: Duration = Duration::from_millis(2);
const FOLLOW_EVERY: Duration = Duration::from_millis(50);
/// How often the file's size is noted while the command writes faster than [`Pace::firehose`] ...
const NOTE_EVERY: Duration = Duration::from_millis(5);
/// ... and how long it must stay the same size for gpudoc to read what was written meanwhile.
const STILL_WRITING: Duration = Duration::from_millis(20);
/// Notes kept of when the file reached which size; past that, every other one is forgotten.
const MAX_MARKS: usize = 8192;
/// The longest stretch before a chunk searched for the start of its line; a longer line is fed in part.
const LINE_BACK: u64 = 64 * 1024;

/// When the file reached each size: sizes (and times) increasing.
#[derive(Debug, Default)]
struct Written {
    marks: Vec<(u64, Instant)>,
}

impl Written {
    fn note(&mut self, size: u64, at: Instant) {
        if self.marks.last().is_some_and(|&(s, _)| s >= size) {
            return;
        }
        if self.marks.len() >= MAX_MARKS {
            let mut k = 0;
            self.marks.retain(|_| {
                k += 1;
                k % 2 == 0
            });
        }
        self.marks.push((size, at));
    }

    /// When the bytes before `offset` had all been written, as far as gpudoc saw: the first note of a size
    /// at or past it.
    fn by(&self, offset: u64) -> Instant {
        let i = self.marks.partition_point(|&(s, _)| s < offset);
        self.marks
            .get(i)
            .or(self.marks.last())
            .map_or_else(Instant::now, |&(_, at)| at)
    }

    /// Forgets notes no longer needed once everything before `offset` is read.
    fn read_to(&mut self, offset: u64) {
        let i = self.marks.partition_point(|&(s, _)| s < offset);
        self.marks.drain(..i);
    }
}

/// A file being read along: how far it is read, and how far the observer has seen it without a gap.
pub struct Reader<'a> {
    /// Descriptions of the file: the first reads along, each sieves a share of a long stretch.
    files: &'a [File],
    stream: Stream,
    pace: Pace,
    /// Read (sieved) up to here.
    pos: u64,
    /// Fed to the observer, without a gap, up to here.
    seen: u64,
    written: Written,
}

impl<'a> Reader<'a> {
    pub fn new(files: &'a [File], stream: Stream, from: u64, pace: Pace) -> Reader<'a> {
        Reader {
            files,
            stream,
            pace,
            pos: from,
            seen: from,
            written: Written::default(),
        }
    }

    /// Notes that the file had `size` bytes at `at`.
    pub fn note(&mut self, size: u64, at: Instant) {
        self.written.note(size, at);
    }

    /// Reads `pos..to`, feeding the observer what could matter to it, with the time it was written.
    pub fn read_to(&mut self, to: u64, observer: &Watching) {
        let Some(sieve) = observer.lock().unwrap().as_ref().map(|o| o.sieve()) else {
            self.pos = to;
            return;
        };
        let range = self.pos..to;
        let matters = self.sieve(sieve, range.clone());
        let chunk = self.pace.chunk as u64;
        let mut buf = vec![0u8; self.pace.chunk];
        for (k, hit) in matters.into_iter().enumerate() {
            let a = range.start + k as u64 * chunk;
            let b = (a + chunk).min(range.end);
            let mut guard = observer.lock().unwrap();
            let Some(obs) = guard.as_mut() else { return };
            if !hit && !obs.wants_next(self.stream) {
                if self.seen == a {
                    obs.skipped(self.stream);
                }
                continue;
            }
            let start = if self.seen == a {
                a
            } else {
                self.line_start(a)
            };
            let at = self.written.by(b);
            if !self.feed(start..b, obs.as_mut(), at, &mut buf) {
                break;
            }
            self.seen = b;
        }
        self.pos = to;
        self.written.read_to(to);
    }

    /// Whether each chunk of `range` holds one of the sieve's words (also one that begins up to
    /// [`Sieve::reach`] bytes before it): on several threads for a long stretch.
    fn sieve(&self, sieve: Sieve, range: Range<u64>) -> Vec<bool> {
        let chunk = self.pace.chunk as u64;
        let n = (range.end.saturating_sub(range.start)).div_ceil(chunk) as usize;
        let threads = if range.end - range.start < self.pace.parallel_from {
            1
        } else {
            self.pace.threads.min(self.files.len()).min(n).max(1)
        };
        let one = |t: usize, ks: Range<usize>| -> Vec<bool> {
            let file = &self.files[t];
            let mut buf = vec![0u8; self.pace.chunk + sieve.reach];
            ks.map(|k| {
                let a = range.start + k as u64 * chunk;
                let b = (a + chunk).min(range.end);
                let from = a.saturating_sub(sieve.reach as u64);
                let want = (b - from) as usize;
                match read_full(file, &mut buf[..want], from) {
                    // Unreadable (truncated meanwhile): fed, so the observer decides.
                    n if n < want => true,
                    _ => (sieve.could_matter)(&buf[..want]),
                }
            })
            .collect()
        };
        if threads == 1 {
            return one(0, 0..n);
        }
        let per = n.div_ceil(threads);
        let one = &one;
        std::thread::scope(|s| {
            let parts: Vec<_> = (0..threads)
                .map(|t| {
                    let ks = (t * per).min(n)..((t + 1) * per).min(n);
                    let spawned = std::thread::Builder::new().spawn_scoped(s, {
                        let ks = ks.clone();
                        move || one(t, ks)
                    });
                    (t, ks, spawned)
                })
                .collect();
            parts
                .into_iter()
                .flat_map(|(t, ks, p)| match p {
                    // A thread that failed leaves its chunks to the observer.
                    Ok(p) => p.join().unwrap_or_else(|_| vec![true; ks.len()]),
                    // No thread to be had: this one sieves the share itself.
                    Err(_) => one(t, ks),
                })
                .collect()
        })
    }

    /// Where the line that runs into `at` begins (at most [`LINE_BACK`] before it).
    fn line_start(&self, at: u64) -> u64 {
        let from = at.saturating_sub(LINE_BACK);
        let mut buf = vec![0u8; (at - from) as usize];
        let n = read_full(&self.files[0], &mut buf, from);
        match memchr::memrchr2(b'\n', b'\r', &buf[..n]) {
            Some(i) => from + i as u64 + 1,
            None => from,
        }
    }

    /// Feeds `range` in chunks; false when the file ended early (it was truncated).
    fn feed(&self, range: Range<u64>, obs: &mut dyn Observer, at: Instant, buf: &mut [u8]) -> bool {
        let mut p = range.start;
        while p < range.end {
            let want = ((range.end - p) as usize).min(buf.len());
            let n = read_full(&self.files[0], &mut buf[..want], p);
            if n > 0 {
                obs.feed(self.stream, &buf[..n], at);
            }
            if n < want {
                return false;
            }
            p += n as u64;
        }
        true
    }
}

/// The file behind gpudoc's fd `like`, opened for gpudoc's reading: `threads` descriptions of it, so
/// that each thread that sieves a share of a long stretch reads through its own (reads that jump about in
/// one description make the kernel keep the pages as often used, when a log is read once). At least the
/// first opens; an error if it cannot.
///
/// They are held open until gpudoc's work is done (by the `Child`): ext4 writes out a file that the shell
/// truncated at the first close of any descriptor of it, and that close must not be gpudoc's while the
/// command runs or while gpudoc ends.
pub(super) fn open(like: RawFd, threads: usize) -> io::Result<Vec<File>> {
    let first = open_to_read(like)?;
    let mut files = vec![first];
    files.extend((1..threads).map_while(|_| open_to_read(like).ok()));
    Ok(files)
}

/// Where the command's output begins in the file, and where it may end.
pub(super) struct Start {
    /// The offset its first byte goes to.
    pub at: u64,
    /// Where an earlier run's bytes lie past `at`, which the command writes over in place.
    in_place: Option<InPlace>,
}

/// A file the command writes over from its start without truncating it (`1<> log`, a file opened to read
/// and write): the earlier run's bytes past what the command has written so far are not this run's, and an
/// OOM text among them must not be read as this run's. The command writes through a description shared with
/// gpudoc's fd (it inherited it), whose offset says how far it has written.
struct InPlace {
    /// A duplicate of gpudoc's fd: the same description, so the same offset.
    fd: std::os::fd::OwnedFd,
    /// The file's size when the command started: where the earlier bytes end.
    old_end: u64,
}

impl InPlace {
    /// How much of the file's `size` bytes holds this run's: up to the command's offset while that is still
    /// inside the earlier bytes; all of them once it has written past them.
    fn written(&self, size: u64) -> u64 {
        // SAFETY: lseek on a descriptor we own; SEEK_CUR with 0 moves nothing.
        let cur =
            unsafe { libc::lseek(std::os::fd::AsRawFd::as_raw_fd(&self.fd), 0, libc::SEEK_CUR) };
        match u64::try_from(cur) {
            Ok(cur) if cur < self.old_end => cur.min(size),
            _ => size,
        }
    }
}

/// Where the command's output to gpudoc's fd `like` begins in the file: the descriptor's offset, or, when
/// it was opened for appending (`>> log`), the file's size now. An O_APPEND descriptor's offset moves to the
/// end only at its first write, so before that it still says 0, and what an earlier run left in the log
/// would be read as this run's. A process outside the job that appends to the same file while it runs
/// cannot be told apart: a file does not record who wrote what.
pub(super) fn output_start(like: RawFd) -> Start {
    // SAFETY: fcntl, lseek and fstat on gpudoc's own fd, which stays open.
    let appending = unsafe { libc::fcntl(like, libc::F_GETFL) } & libc::O_APPEND != 0;
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(like) };
    let size = nix::sys::stat::fstat(fd).map_or(0, |st| st.st_size.max(0) as u64);
    if appending {
        return Start {
            at: size,
            in_place: None,
        };
    }
    let at = (unsafe { libc::lseek(like, 0, libc::SEEK_CUR) }).max(0) as u64;
    let in_place = (size > at)
        .then(|| fd.try_clone_to_owned().ok())
        .flatten()
        .map(|fd| InPlace { fd, old_end: size });
    Start { at, in_place }
}

/// gpudoc's fd `like` opened anew for reading, without moving the file's access time where the kernel
/// lets us (we own the file): reading along must leave no trace on the command's log.
fn open_to_read(like: RawFd) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = format!("/proc/self/fd/{like}");
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    match o.clone().custom_flags(libc::O_NOATIME).open(&path) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => o.open(&path),
        r => r,
    }
}

/// Reads `buf.len()` bytes at `at`, or fewer where the file ends; how many.
fn read_full(file: &File, buf: &mut [u8], at: u64) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    got
}

/// Reads what the command writes to a regular file, from `from` on, and shows the observer what could
/// matter to it. Stops once the command has exited and the file is read to its end (at most `drain_max`
/// after).
pub(super) fn follow(
    stream: Stream,
    files: &[File],
    start: Start,
    observer: &Watching,
    exited: &AtomicBool,
    (pace, drain_max): (Pace, Duration),
) {
    let (from, mut in_place) = (start.at, start.in_place);
    let mut r = Reader::new(files, stream, from, pace);
    let mut deadline: Option<Instant> = None;
    let mut wait = FOLLOW_EVERY;
    // The size last seen and when it last changed; when everything written was last read.
    let (mut seen_size, mut grew_at, mut read_at) = (from, Instant::now(), Instant::now());
    loop {
        let done = exited.load(Ordering::SeqCst);
        if done && *deadline.get_or_insert_with(|| Instant::now() + drain_max) < Instant::now() {
            return;
        }
        let Ok(mut size) = files[0].metadata().map(|m| m.len()) else {
            return;
        };
        let now = Instant::now();
        if size < r.pos {
            // Truncated: read on from its new end; the earlier run's bytes are gone.
            in_place = None;
            r = Reader::new(files, stream, size, r.pace);
            if let Some(obs) = observer.lock().unwrap().as_mut() {
                obs.skipped(stream);
            }
        }
        if let Some(p) = &in_place {
            size = p.written(size).max(r.pos);
        }
        if size != seen_size {
            (seen_size, grew_at) = (size, now);
        }
        r.note(size, now);
        let unread = size - r.pos;
        if unread == 0 {
            read_at = now;
        }
        // Written faster than the firehose since gpudoc last read everything, and still being written.
        let rate = unread as f64 / now.duration_since(read_at).as_secs_f64().max(1e-6);
        let fast = now.duration_since(grew_at) < STILL_WRITING && rate > r.pace.firehose as f64;
        if unread > 0 && (done || !fast || unread >= r.pace.defer_max) {
            r.read_to(size, observer);
            read_at = Instant::now();
            wait = FOLLOW_SOON;
            continue;
        }
        if done {
            return;
        }
        // Parked, so the command's exit wakes it at once.
        std::thread::park_timeout(if fast { NOTE_EVERY } else { wait });
        wait = (wait * 2).min(FOLLOW_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// Notes what it is fed, and looks for `OOM`.
    #[derive(Default)]
    struct Fed {
        bytes: Vec<u8>,
        oom_at: Option<Instant>,
        /// When the OOM's bytes were fed (read).
        oom_read: Option<Instant>,
    }

    struct Taker(Arc<Mutex<Fed>>);

    impl Observer for Taker {
        fn feed(&mut self, _: Stream, bytes: &[u8], at: Instant) {
            let mut f = self.0.lock().unwrap();
            f.bytes.extend_from_slice(bytes);
            if f.oom_at.is_none() && memchr::memmem::find(&f.bytes, b"OOM").is_some() {
                f.oom_at = Some(at);
                f.oom_read = Some(Instant::now());
            }
        }
        fn wants_next(&self, _: Stream) -> bool {
            false
        }
        fn skipped(&mut self, _: Stream) {}
        fn sieve(&self) -> Sieve {
            Sieve {
                could_matter: |b| memchr::memmem::find(b, b"OOM").is_some(),
                reach: 2,
            }
        }
    }

    fn taker() -> (Arc<Mutex<Fed>>, Watching) {
        let fed = Arc::new(Mutex::new(Fed::default()));
        let obs: Box<dyn Observer> = Box::new(Taker(fed.clone()));
        (fed, Mutex::new(Some(obs)))
    }

    fn lines(n: usize) -> Vec<u8> {
        b"step 1 loss 0.25\n".repeat(n / 17 + 1)
    }

    #[test]
    fn only_the_chunks_that_could_matter_are_fed_from_the_start_of_their_line() {
        let mut f = tempfile::tempfile().unwrap();
        let (head, tail) = (lines(1 << 20), lines(1 << 20));
        f.write_all(&head).unwrap();
        f.write_all(b"torch.OutOfMemoryError: CUDA OOM\n").unwrap();
        f.write_all(&tail).unwrap();
        let (fed, obs) = taker();
        let mut r = Reader::new(std::slice::from_ref(&f), Stream::Stderr, 0, Pace::DEFAULT);
        r.read_to(f.metadata().unwrap().len(), &obs);
        let fed = fed.lock().unwrap();
        assert!(
            fed.bytes.len() <= 2 * READ_BYTES,
            "{} bytes fed",
            fed.bytes.len()
        );
        let line = b"\ntorch.OutOfMemoryError: CUDA OOM\n";
        assert!(
            memchr::memmem::find(&fed.bytes, line).is_some() || fed.bytes.starts_with(&line[1..])
        );
    }

    #[test]
    fn a_report_amid_fast_output_keeps_the_time_it_was_written() {
        let path = tempfile::NamedTempFile::new().unwrap();
        let mut w = path.reopen().unwrap();
        let file = path.reopen().unwrap();
        let (fed, obs) = taker();
        let exited = AtomicBool::new(false);
        let block = lines(1 << 20);
        let written = std::thread::scope(|s| {
            s.spawn(|| {
                follow(
                    Stream::Stderr,
                    std::slice::from_ref(&file),
                    Start {
                        at: 0,
                        in_place: None,
                    },
                    &obs,
                    &exited,
                    (Pace::DEFAULT, Duration::from_secs(2)),
                )
            });
            for _ in 0..40 {
                w.write_all(&block).unwrap();
            }
            w.write_all(b"OOM\n").unwrap();
            let written = Instant::now();
            // Half a second more at 100 MB/s, in bursts.
            for _ in 0..50 {
                w.write_all(&block).unwrap();
                std::thread::sleep(Duration::from_millis(10));
            }
            exited.store(true, Ordering::SeqCst);
            written
        });
        let fed = fed.lock().unwrap();
        let at = fed.oom_at.expect("the report was fed");
        let read = fed.oom_read.unwrap().saturating_duration_since(written);
        // Dated within a few polls of its writing, though read only once the writing slowed down (half
        // a second later). A loaded 2-core machine can starve the follower's polls too: the date is then
        // still well before the reading.
        let late = at.saturating_duration_since(written);
        assert!(
            late < Duration::from_millis(250).max(read / 2),
            "dated {late:?} after it was written, read {read:?} after"
        );
    }

    #[test]
    fn bytes_are_dated_by_the_first_note_of_a_size_that_holds_them() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut w = Written::default();
        w.note(100, at(1));
        w.note(100, at(2));
        w.note(250, at(3));
        assert_eq!(w.by(1), at(1));
        assert_eq!(w.by(100), at(1));
        assert_eq!(w.by(101), at(3));
        // Past the last note: the last.
        assert_eq!(w.by(900), at(3));
        w.read_to(101);
        assert_eq!(w.marks, vec![(250, at(3))]);
    }

    #[test]
    fn notes_stay_bounded_and_in_order() {
        let t0 = Instant::now();
        let mut w = Written::default();
        for k in 0..(3 * MAX_MARKS as u64) {
            w.note(k + 1, t0 + Duration::from_micros(k));
        }
        assert!(w.marks.len() <= MAX_MARKS);
        assert!(
            w.marks
                .windows(2)
                .all(|p| p[0].0 < p[1].0 && p[0].1 < p[1].1)
        );
        // Bytes are never dated before they were written.
        assert!(w.by(5000) >= t0 + Duration::from_micros(4999));
    }
}
