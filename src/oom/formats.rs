//! The OOM wordings gpudoc reads, as one table ([`FORMATS`], its rows in `rows.rs`) read by one engine
//! ([`open`], the reading of one row in `wording.rs`). Rows are tried in the table's order: the first
//! that reads a line reads it. Adding a wording is a row in `rows.rs` and a real text in
//! `fixtures/oom/real/`; `docs/oom.md`'s table of formats is generated from the table.

pub use super::rows::FORMATS;
use super::text::{OomText, Opened};
pub use super::wording::{Allocator, Field, Follows, Format, Found, Means, Then, Unit};
use super::wording::{Compiled, read};
use std::sync::LazyLock;

static COMPILED: LazyLock<Vec<Compiled>> =
    LazyLock::new(|| FORMATS.iter().map(Compiled::of).collect());

/// Opens an OOM text on `line` with the first row that reads it: the text so far and where the message
/// starts. What the same line may already add (a row's [`Follows`]) is the caller's to read.
pub fn open(line: &str) -> Option<(&'static Format, Opened)> {
    (0..FORMATS.len()).find_map(|i| read(&FORMATS[i], &COMPILED[i], line).map(|o| (&FORMATS[i], o)))
}

/// Every row that reads `line` on its own, in the table's order (the first is the one [`open`] uses).
pub fn rows_reading(line: &str) -> Vec<&'static Format> {
    (0..FORMATS.len())
        .filter(|&i| read(&FORMATS[i], &COMPILED[i], line).is_some())
        .map(|i| &FORMATS[i])
        .collect()
}

/// The row a reading came from, by its source and format (rows that share both agree on everything a
/// reading's later steps ask of them).
pub fn row_of(t: &OomText) -> Option<&'static Format> {
    FORMATS
        .iter()
        .find(|f| f.kind == t.kind && f.carries(&t.format))
}

/// Row `id`'s pattern found in `text`, whatever else the text says: its figures and where it starts.
pub fn find<'a>(id: &str, text: &'a str) -> Option<Found<'a>> {
    let i = FORMATS.iter().position(|f| f.id == id)?;
    COMPILED[i].find(text)
}

#[cfg(test)]
mod tests {
    use super::super::parse::parse_line;
    use super::super::text::{Kind, Vendor};
    use super::super::wording::ROW;
    use super::*;

    #[test]
    fn rows_are_named_once_and_rows_of_one_format_agree_on_what_follows() {
        for (i, f) in FORMATS.iter().enumerate() {
            assert!(!f.needles.is_empty(), "{}: no needles", f.id);
            assert!(
                FORMATS[..i].iter().all(|g| g.id != f.id),
                "{} named twice",
                f.id
            );
            for n in f.narrows {
                let later = FORMATS[i + 1..].iter().any(|g| g.id == *n);
                assert!(later, "{} narrows {n}, which is not a later row", f.id);
            }
            // A reading finds its row again by its source and format: the first such row must say
            // what every such row says of the later lines, the allocator and the warning.
            let first = row_of(&empty_of(f)).unwrap();
            assert_eq!(
                (first.follows, first.allocator, first.warning),
                (f.follows, f.allocator, f.warning),
                "{} and {}",
                first.id,
                f.id
            );
        }
    }

    fn empty_of(f: &Format) -> OomText {
        super::super::text::empty(f.kind, f.format)
    }

    #[test]
    fn a_rows_needles_never_hide_a_line_its_pattern_reads_in_any_fixture() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/oom");
        let mut lines = 0;
        for dir in ["real", "cases", "h200"] {
            for e in std::fs::read_dir(root.join(dir)).unwrap() {
                let path = e.unwrap().path();
                if !path
                    .extension()
                    .is_some_and(|x| x == "txt" || x == "stderr")
                {
                    continue;
                }
                let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
                for line in text.lines() {
                    lines += 1;
                    for (f, c) in FORMATS.iter().zip(COMPILED.iter()) {
                        if c.matches(f, line) {
                            assert!(
                                f.needles.iter().any(|n| line.contains(n)),
                                "{}: row {} reads {line:?} but its needles hide it",
                                path.display(),
                                f.id
                            );
                        }
                    }
                }
            }
        }
        assert!(lines > 500, "{lines} lines");
    }

    #[test]
    fn pytorchs_class_without_a_space_after_its_colon_is_still_read() {
        // Synthetic: the class's words run on without the space TORCH_CLASS never required.
        let t = parse_line("torch.OutOfMemoryError:Allocation on device ").unwrap();
        assert_eq!(t.format, "torch-async");
    }

    #[test]
    fn a_placeholder_reads_its_figure_in_the_unit_the_text_writes() {
        let c = Compiled::of(&Format {
            pattern: r"a {requested:size} b {free:xla} c {total:grouped} d {allowed:MiB} e {gpu:n}",
            ..ROW
        });
        let f = c.find("a 1.50 KiB b 2M c 1,024 d 3 e 7").unwrap();
        assert_eq!(
            ["requested", "free", "total", "allowed", "gpu"].map(|n| f.figure(n)),
            [
                Some(1536),
                Some(2 << 20),
                Some(1024),
                Some(3 << 20),
                Some(7)
            ]
        );
        // A field in two places: the later, more exact figure (XLA's rounded size, then its bytes).
        let c = Compiled::of(&Format {
            pattern: r"for {requested:size}(?: \({requested:B}B\))?",
            ..ROW
        });
        assert_eq!(
            c.find("for 2.99GiB (3206250496B)")
                .unwrap()
                .figure("requested"),
            Some(3206250496)
        );
    }

    #[test]
    fn cupys_message_reprinted_without_its_class_keeps_its_figures() {
        // cupy/cupy#2537: Chainer's trainer re-prints the pool's message.
        let t = parse_line("Exception in main training loop: Out of memory allocating 25,600,000 bytes (allocated so far: 3,635,267,072 bytes).").unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes, t.reserved_bytes, t.vendor),
            (
                Kind::Cupy,
                Some(25_600_000),
                Some(3_635_267_072),
                Vendor::Nvidia
            )
        );
        // Words that are not the pool's stay unread.
        assert!(parse_line("we ran out of memory to allocate 10 bytes").is_none());
    }

    #[test]
    fn tritons_cuda_error_is_an_oom_only_when_it_says_out_of_memory() {
        // Synthetic, in the words of Triton's launcher (`"Triton Error [CUDA]: "` and the driver's error
        // string, raised as a RuntimeError), which wtdcode/vllm-backport#18's title quotes (a fixture).
        let t = parse_line("RuntimeError: Triton Error [CUDA]: out of memory").unwrap();
        assert_eq!(
            (t.kind, t.format.as_str(), t.exception.as_deref()),
            (Kind::CudaRuntime, "triton", Some("RuntimeError"))
        );
        assert_eq!(
            (t.requested_bytes, t.gpu, t.vendor),
            (None, None, Vendor::Nvidia)
        );
        // vllm-project/vllm#18580.
        assert!(
            parse_line("RuntimeError: Triton Error [CUDA]: device kernel image is invalid")
                .is_none()
        );
    }
}
