//! `gpudoc run --try REMEDY`: a change that needs no code, tried for real. Most are a setting of PyTorch's
//! caching allocator, given to the job through `PYTORCH_CUDA_ALLOC_CONF` merged into the user's own
//! value (their other keys are kept; the remedy's key takes the remedy's value); one is a smaller value
//! of a parameter the command marks (`--try '{}=48'` with `--batch-size {64}`: [`super::template`]).
//! [`suggestion`] names the remedy that fits an OOM's cause.

use crate::oom::{Cause, OomReport};
use std::ffi::OsString;

/// The environment variable PyTorch's CUDA caching allocator reads its settings from.
pub const ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";

/// A remedy.
#[derive(Debug, Clone, PartialEq)]
pub enum Remedy {
    /// `expandable_segments:True`: segments that grow in place, so freed memory is not stranded in
    /// blocks too small for the next request.
    ExpandableSegments,
    /// `max_split_size_mb:N`: blocks larger than N MiB are never split.
    MaxSplitSizeMb(u64),
    /// `garbage_collection_threshold:F`: the allocator frees cached blocks once F of its limit is used.
    GarbageCollectionThreshold(f64),
    /// `per_process_memory_fraction:F`: the process may use F of the GPU, leaving the rest to others
    /// (read by PyTorch 2.9 and later).
    Fraction(f64),
    /// `{}=N`: the parameter the command marks with its value as is (`{64}`) at N instead.
    Value(u64),
}

/// What `--try` accepts, for messages.
pub const ACCEPTED: &str = "expandable_segments, max_split_size_mb:N, garbage_collection_threshold:F (0 < F < 1), fraction:F (0 < F <= 1), {}=N (with the parameter marked in the command: --batch-size {64})";

impl Remedy {
    /// Reads `--try`'s value.
    pub fn parse(s: &str) -> Result<Remedy, String> {
        // `{}=48`, as `gpudoc fit` puts values where `{}` is; `{}:48` as the allocator's keys are written.
        if let Some(v) = s
            .trim()
            .strip_prefix("{}")
            .and_then(|r| r.strip_prefix('=').or_else(|| r.strip_prefix(':')))
        {
            return v
                .trim()
                .parse()
                .map(Remedy::Value)
                .map_err(|_| format!("{s}: {{}}=N takes a whole number (--try '{{}}=48')"));
        }
        let (key, value) = match s.split_once(':') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (s.trim(), None),
        };
        let fraction = |v: Option<&str>, low_open: bool, high_open: bool| -> Result<f64, String> {
            let f: f64 = v
                .ok_or_else(|| format!("{key} needs a value ({key}:0.8)"))?
                .parse()
                .map_err(|_| format!("{s}: not a number"))?;
            let ok = f.is_finite()
                && (if low_open { f > 0.0 } else { f >= 0.0 })
                && (if high_open { f < 1.0 } else { f <= 1.0 });
            ok.then_some(f).ok_or_else(|| format!("{s}: out of range"))
        };
        match key {
            "expandable_segments" if matches!(value, None | Some("True" | "true")) => {
                Ok(Remedy::ExpandableSegments)
            }
            "max_split_size_mb" => value
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&n| n > 20)
                .map(Remedy::MaxSplitSizeMb)
                .ok_or_else(|| format!("{s}: max_split_size_mb:N takes a number of MiB above 20")),
            "garbage_collection_threshold" => {
                fraction(value, true, true).map(Remedy::GarbageCollectionThreshold)
            }
            "fraction" | "per_process_memory_fraction" => {
                fraction(value, true, false).map(Remedy::Fraction)
            }
            _ => Err(format!("{s}: not a remedy gpudoc knows ({ACCEPTED})")),
        }
    }

    /// The allocator setting, as (key, value); `None` for a value of `{}`.
    pub fn setting(&self) -> Option<(&'static str, String)> {
        Some(match self {
            Remedy::ExpandableSegments => ("expandable_segments", "True".into()),
            Remedy::MaxSplitSizeMb(n) => ("max_split_size_mb", n.to_string()),
            Remedy::GarbageCollectionThreshold(f) => {
                ("garbage_collection_threshold", f.to_string())
            }
            Remedy::Fraction(f) => ("per_process_memory_fraction", f.to_string()),
            Remedy::Value(_) => return None,
        })
    }

    /// The remedy in full, as `--try` takes it: `expandable_segments:True`, `{}=48`.
    pub fn name(&self) -> String {
        match (self, self.setting()) {
            (_, Some((key, value))) => format!("{key}:{value}"),
            (Remedy::Value(v), None) => format!("{{}}={v}"),
            _ => unreachable!("every remedy but a value is a setting"),
        }
    }

    /// `PYTORCH_CUDA_ALLOC_CONF` for the job: the user's own value with this remedy's key set (replaced
    /// where the user had it; every other key kept, in order); `None` for a value of `{}`, which leaves
    /// the environment as it is.
    pub fn alloc_conf(&self, users: Option<&str>) -> Option<String> {
        let (key, value) = self.setting()?;
        let mut parts: Vec<String> = users
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .filter(|p| p.split(':').next().map(str::trim) != Some(key))
            .map(String::from)
            .collect();
        parts.push(format!("{key}:{value}"));
        Some(parts.join(","))
    }

    /// What the remedy adds to the job's environment.
    pub fn env(&self, users: Option<&str>) -> Vec<(String, OsString)> {
        self.alloc_conf(users)
            .map(|c| (ALLOC_CONF.to_string(), c.into()))
            .into_iter()
            .collect()
    }
}

/// The halved value tried first after an OOM of the job's own growth.
fn halved(v: u64) -> Option<u64> {
    (v > 1).then_some(v / 2)
}

/// The `--try` worth running after this OOM, as a command line to copy (`None` when no remedy fits its
/// cause): expandable segments for a fragmentation OOM (memory cached by PyTorch but in pieces too small
/// for the request); half the batch, or the sequence, for a job whose own memory filled the GPU or that
/// asked for more than the GPU has at once, when its command names one ([`size_argument`]).
pub fn suggestion(oom: &OomReport, command: &[String]) -> Option<String> {
    let (word, command, then) = match oom.cause {
        // Only where the PyTorch that printed the text takes the setting (2.0 stops a job that names it).
        Cause::Fragmentation
            if crate::oom::program::alloc_options(&oom.event.text)
                .contains(&"expandable_segments") =>
        {
            (
                "expandable_segments".to_string(),
                command.to_vec(),
                "with the remedy".to_string(),
            )
        }
        Cause::SelfGrowth | Cause::TooBig => {
            let (i, marked, v) = size_argument(command)?;
            let half = halved(v)?;
            let mut c = command.to_vec();
            c[i] = marked;
            (Remedy::Value(half).name(), c, format!("at {half}"))
        }
        _ => return None,
    };
    Some(try_line(&word, &command, &then))
}

/// `--try expandable_segments` for `command`, which ran out of memory through fragmentation (a fit's
/// smallest value that ran out: it may fit with the remedy).
pub fn fragmentation_try(command: &[String]) -> String {
    try_line("expandable_segments", command, "with the remedy")
}

fn try_line(word: &str, command: &[String], then: &str) -> String {
    let cmd: Vec<String> = command.iter().map(|a| shell_word(a)).collect();
    format!(
        "try: gpudoc run --try {} -- {} (reruns it as is and {then}, and compares)",
        shell_word(word),
        cmd.join(" ")
    )
}

/// Words in a flag's name that say its value sizes the memory of a step: a batch, a sequence.
const SIZE_WORDS: [&str; 11] = [
    "batch",
    "bs",
    "bsz",
    "microbatch",
    "seq",
    "seqlen",
    "len",
    "length",
    "tokens",
    "ctx",
    "context",
];

/// The command's argument that sizes its memory, when one flag says so (`--batch-size 64`,
/// `--max_seq_len=2048`; a batch first when there are several): its index, the argument with the value
/// marked (`{64}`, `--max_seq_len={2048}`), the value.
pub fn size_argument(command: &[String]) -> Option<(usize, String, u64)> {
    let sizes = |flag: &str| -> Option<bool> {
        let name = flag.strip_prefix("--")?.to_ascii_lowercase();
        let words: Vec<&str> = name.split(['-', '_']).collect();
        let sized = words.iter().any(|w| SIZE_WORDS.contains(w));
        sized.then(|| {
            words
                .iter()
                .any(|w| w.contains("batch") || *w == "bs" || *w == "bsz")
        })
    };
    // Marked as `{v}`, the value must be one the template reads as a value as is.
    let number = |v: &str| -> Option<u64> {
        super::template::number(v.as_bytes())
            .then(|| v.parse().ok())
            .flatten()
    };
    let mut found: Vec<(bool, usize, String, u64)> = Vec::new();
    for (i, a) in command.iter().enumerate() {
        if let Some((flag, v)) = a.split_once('=') {
            if let (Some(batch), Some(n)) = (sizes(flag), number(v)) {
                found.push((batch, i, format!("{flag}={{{v}}}"), n));
            }
        } else if let (Some(batch), Some(v)) = (sizes(a), command.get(i + 1))
            && let Some(n) = number(v)
        {
            found.push((batch, i + 1, format!("{{{v}}}"), n));
        }
    }
    let batches = found.iter().filter(|f| f.0).count();
    let pick = match (batches, found.len()) {
        (1, _) => found.into_iter().find(|f| f.0),
        (0, 1) => found.pop(),
        _ => None,
    };
    pick.map(|(_, i, marked, n)| (i, marked, n))
}

/// `a` as one word for a POSIX shell: as is when it needs no quoting, else in single quotes.
fn shell_word(a: &str) -> String {
    let plain = !a.is_empty()
        && a.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// Fragmentation in a run: PyTorch's peak memory in split blocks not in use (the shim's reading), else
/// what the OOM text says was reserved but unallocated.
pub fn fragmentation(r: &crate::report::Report) -> Option<u64> {
    let torch = r
        .torch
        .processes
        .iter()
        .filter_map(|p| p.peak_inactive_split_bytes)
        .max();
    let text = r
        .oom
        .as_ref()
        .and_then(|o| o.event.text.reserved_unallocated_bytes);
    match (torch, text) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Optimizer steps the remedy's run goes past where the first run ran out before it counts as fitting.
pub const TRY_PAST: u64 = 5;

/// What `--try` prints first: the runs and the time it may take. `conf`: the remedy's run's
/// `PYTORCH_CUDA_ALLOC_CONF`; `as_is`: the marked parameter's value as is (a value of `{}`).
pub fn render_plan(r: &Remedy, conf: Option<&str>, as_is: Option<u64>, budget: &str) -> String {
    let runs = match (r, conf, as_is) {
        (Remedy::Value(v), _, Some(a)) => format!("the command as is (at {a}), then at {v}"),
        (_, Some(conf), _) => format!("the command as is, then with {ALLOC_CONF}={conf}"),
        _ => "the command as is, then with the remedy".into(),
    };
    format!(
        "gpudoc run --try {}: 2 runs, {runs} (to its end, or {TRY_PAST} optimizer steps past where the \
         first ran out), within {budget}\n",
        r.name()
    )
}

/// Where the first of `--try`'s runs (the command as is) writes a file the user named, so that the
/// remedy's run, written to the name given, does not overwrite it: `.as-is` before the name's extensions
/// (`run.trace.jsonl` → `run.as-is.trace.jsonl`, which `gpudoc report` still takes for a trace; a leading
/// dot is part of the name, not an extension).
pub fn as_is_path(p: &std::path::Path) -> std::path::PathBuf {
    let Some(name) = p.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return p.join("as-is");
    };
    let cut = name[1..].find('.').map_or(name.len(), |i| i + 1);
    p.with_file_name(format!("{}.as-is{}", &name[..cut], &name[cut..]))
}

/// One side of the comparison, in a line.
pub fn render_side(label: &str, p: &super::Probe, fragmented: Option<u64>) -> String {
    use crate::units::fmt_bytes;
    let opt = |b: Option<u64>| b.map_or("?".into(), fmt_bytes);
    format!(
        "  {label:<10} {}: {} steps, peak {}, fragmentation {}\n",
        p.words(),
        p.steps,
        opt(p.peak_bytes),
        opt(fragmented)
    )
}

/// `--try`'s exit code, from its last run: 0 it fits, 1 it still runs out of memory, 3 the budget ran
/// out first, 4 it failed otherwise; a run ended by a signal from elsewhere leaves as 128+N (gpudoc dies
/// of the signal itself where it can).
pub fn exit_code(last: &super::Probe) -> u8 {
    use super::Outcome;
    match last.outcome {
        Outcome::Fits => 0,
        Outcome::Oom => crate::exit::FIT_NOTHING_FITS,
        Outcome::Cut => crate::exit::FIT_UNSETTLED,
        Outcome::Failed => crate::exit::FIT_RUN_FAILED,
        Outcome::Interrupted => last
            .exit_code
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(130),
    }
}

/// One run of `--try`, for the report.
pub fn tried_run(
    p: &super::Probe,
    fragmentation: Option<u64>,
    command: Vec<String>,
) -> crate::report::TriedRun {
    crate::report::TriedRun {
        command,
        outcome: p.outcome,
        oom_cause: p.oom_cause,
        steps: p.steps,
        peak_bytes: p.peak_bytes,
        fragmentation_bytes: fragmentation,
        exit_code: p.exit_code,
        classification: p.classification,
        duration_s: p.duration_s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_runs_files_are_named_as_is_before_their_extensions() {
        use std::path::{Path, PathBuf};
        let as_is = |p: &str| as_is_path(Path::new(p));
        assert_eq!(
            as_is("out/run.trace.jsonl"),
            PathBuf::from("out/run.as-is.trace.jsonl")
        );
        assert_eq!(as_is("report.json"), PathBuf::from("report.as-is.json"));
        assert_eq!(as_is("snapshot"), PathBuf::from("snapshot.as-is"));
        assert_eq!(as_is(".hidden.html"), PathBuf::from(".hidden.as-is.html"));
        assert_eq!(as_is("/"), PathBuf::from("/as-is"));
    }

    #[test]
    fn the_remedy_is_merged_into_the_users_own_allocator_settings() {
        let r = Remedy::ExpandableSegments;
        let conf = |r: &Remedy, users| r.alloc_conf(users).unwrap();
        assert_eq!(conf(&r, None), "expandable_segments:True");
        assert_eq!(
            conf(&r, Some("max_split_size_mb:128,roundup_power2_divisions:4")),
            "max_split_size_mb:128,roundup_power2_divisions:4,expandable_segments:True"
        );
        assert_eq!(
            conf(
                &r,
                Some("expandable_segments:False, garbage_collection_threshold:0.6")
            ),
            "garbage_collection_threshold:0.6,expandable_segments:True"
        );
        assert_eq!(
            conf(&Remedy::MaxSplitSizeMb(256), Some("max_split_size_mb:64")),
            "max_split_size_mb:256"
        );
        // A smaller value leaves the allocator as the user set it.
        assert_eq!(
            Remedy::Value(48).alloc_conf(Some("max_split_size_mb:64")),
            None
        );
        assert!(Remedy::Value(48).env(None).is_empty());
    }

    #[test]
    fn a_flag_that_sizes_a_step_is_the_one_a_suggestion_halves() {
        let cmd = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            size_argument(&cmd(&[
                "python",
                "train.py",
                "--epochs",
                "10",
                "--batch-size",
                "64"
            ])),
            Some((5, "{64}".into(), 64))
        );
        assert_eq!(
            size_argument(&cmd(&["train.py", "--max_seq_len=2048", "--lr", "3"])),
            Some((1, "--max_seq_len={2048}".into(), 2048))
        );
        // A batch and a sequence: the batch, as people halve it first.
        assert_eq!(
            size_argument(&cmd(&[
                "t.py",
                "--seq-len",
                "4096",
                "--per_device_train_batch_size",
                "8"
            ])),
            Some((4, "{8}".into(), 8))
        );
        for nothing in [
            &["train.py", "--epochs", "10", "--hidden-size", "4096"][..],
            &["train.py", "--batch-size", "auto"],
            &["train.py", "--batch-size", "8", "--eval-batch-size", "16"],
            &["train.py", "--seq-len", "8", "--context", "16"],
        ] {
            assert_eq!(size_argument(&cmd(nothing)), None, "{nothing:?}");
        }
    }

    #[test]
    fn a_suggested_command_can_be_pasted_into_a_shell() {
        assert_eq!(shell_word("train.py"), "train.py");
        assert_eq!(shell_word("--lr=1e-3"), "--lr=1e-3");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn remedies_are_read_and_nonsense_is_refused() {
        assert_eq!(
            Remedy::parse("expandable_segments"),
            Ok(Remedy::ExpandableSegments)
        );
        assert_eq!(
            Remedy::parse("max_split_size_mb:512"),
            Ok(Remedy::MaxSplitSizeMb(512))
        );
        assert_eq!(
            Remedy::parse("garbage_collection_threshold:0.6"),
            Ok(Remedy::GarbageCollectionThreshold(0.6))
        );
        assert_eq!(Remedy::parse("fraction:0.5"), Ok(Remedy::Fraction(0.5)));
        assert_eq!(Remedy::parse("{}=48"), Ok(Remedy::Value(48)));
        assert_eq!(Remedy::parse("{}:48"), Ok(Remedy::Value(48)));
        assert_eq!(Remedy::Value(48).name(), "{}=48");
        assert_eq!(
            Remedy::ExpandableSegments.name(),
            "expandable_segments:True"
        );
        for bad in [
            "{}=",
            "{}=-1",
            "{}=4.5",
            "{}48",
            "expandable_segments:False",
            "max_split_size_mb",
            "max_split_size_mb:10",
            "garbage_collection_threshold:1.5",
            "fraction:0",
            "fraction:nan",
            "cudaMallocAsync",
        ] {
            assert!(Remedy::parse(bad).is_err(), "{bad}");
        }
    }
}
