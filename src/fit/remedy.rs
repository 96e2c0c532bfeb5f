//! `gpudoc run --try REMEDY`: a change that needs no code, tried for real. Each is a setting of PyTorch's
//! caching allocator, given to the job through `PYTORCH_CUDA_ALLOC_CONF` merged into the user's own
//! value (their other keys are kept; the remedy's key takes the remedy's value). [`suggest`] names the
//! remedy that fits an OOM's cause.

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
}

/// What `--try` accepts, for messages.
pub const ACCEPTED: &str = "expandable_segments, max_split_size_mb:N, garbage_collection_threshold:F (0 < F < 1), fraction:F (0 < F <= 1)";

impl Remedy {
    /// Reads `--try`'s value.
    pub fn parse(s: &str) -> Result<Remedy, String> {
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

    /// The allocator setting, as `key:value`.
    pub fn setting(&self) -> (&'static str, String) {
        match self {
            Remedy::ExpandableSegments => ("expandable_segments", "True".into()),
            Remedy::MaxSplitSizeMb(n) => ("max_split_size_mb", n.to_string()),
            Remedy::GarbageCollectionThreshold(f) => {
                ("garbage_collection_threshold", f.to_string())
            }
            Remedy::Fraction(f) => ("per_process_memory_fraction", f.to_string()),
        }
    }

    /// `PYTORCH_CUDA_ALLOC_CONF` for the job: the user's own value with this remedy's key set (replaced
    /// where the user had it; every other key kept, in order).
    pub fn alloc_conf(&self, users: Option<&str>) -> String {
        let (key, value) = self.setting();
        let mut parts: Vec<String> = users
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .filter(|p| p.split(':').next().map(str::trim) != Some(key))
            .map(String::from)
            .collect();
        parts.push(format!("{key}:{value}"));
        parts.join(",")
    }

    /// The environment the job gets.
    pub fn env(&self, users: Option<&str>) -> Vec<(String, OsString)> {
        vec![(ALLOC_CONF.into(), self.alloc_conf(users).into())]
    }
}

/// The remedy worth trying after an OOM, where one fits its cause: a fragmentation OOM (memory cached by
/// PyTorch but in pieces too small for the request) is what expandable segments are for.
pub fn suggest(oom: &OomReport) -> Option<Remedy> {
    (oom.cause == Cause::Fragmentation).then_some(Remedy::ExpandableSegments)
}

/// The `--try` worth running after this OOM, as a command line to copy (`None` when no remedy fits its
/// cause).
pub fn suggestion(oom: &OomReport, command: &[String]) -> Option<String> {
    let (key, value) = suggest(oom)?.setting();
    let remedy = if value == "True" {
        key.to_string()
    } else {
        format!("{key}:{value}")
    };
    let cmd: Vec<String> = command.iter().map(|a| shell_word(a)).collect();
    Some(format!(
        "try: gpudoc run --try {remedy} -- {} (reruns it as is and with the remedy, and compares)",
        cmd.join(" ")
    ))
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
        .map(|p| p.peak_inactive_split_bytes)
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

/// What `--try` prints first: the runs and the time it may take.
pub fn render_plan(r: &Remedy, conf: &str, budget: &str) -> String {
    let (key, value) = r.setting();
    format!(
        "gpudoc run --try {key}:{value}: 2 runs, the command as is, then with {ALLOC_CONF}={conf} (to its \
         end, or 5 optimizer steps past where the first ran out), within {budget}\n"
    )
}

/// One side of the comparison, in a line.
pub fn render_side(label: &str, p: &super::Probe, fragmented: Option<u64>) -> String {
    use crate::units::fmt_bytes;
    let what = match p.outcome {
        super::Outcome::Fits => "fits".to_string(),
        super::Outcome::Oom => match p.oom_cause {
            Some(c) => format!("out of memory ({})", c.words()),
            None => "out of memory".into(),
        },
        super::Outcome::Failed => format!(
            "failed (exit {}) without a GPU out-of-memory error",
            p.exit_code.map_or("?".into(), |c| c.to_string())
        ),
        super::Outcome::Cut => "cut short: the time budget ran out".into(),
        super::Outcome::Interrupted => "interrupted".into(),
    };
    let opt = |b: Option<u64>| b.map_or("?".into(), fmt_bytes);
    format!(
        "  {label:<10} {what}: {} steps, peak {}, fragmentation {}\n",
        p.steps,
        opt(p.peak_bytes),
        opt(fragmented)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remedy_is_merged_into_the_users_own_allocator_settings() {
        let r = Remedy::ExpandableSegments;
        assert_eq!(r.alloc_conf(None), "expandable_segments:True");
        assert_eq!(
            r.alloc_conf(Some("max_split_size_mb:128,roundup_power2_divisions:4")),
            "max_split_size_mb:128,roundup_power2_divisions:4,expandable_segments:True"
        );
        assert_eq!(
            r.alloc_conf(Some(
                "expandable_segments:False, garbage_collection_threshold:0.6"
            )),
            "garbage_collection_threshold:0.6,expandable_segments:True"
        );
        assert_eq!(
            Remedy::MaxSplitSizeMb(256).alloc_conf(Some("max_split_size_mb:64")),
            "max_split_size_mb:256"
        );
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
        for bad in [
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
