//! What a row of the OOM formats table is ([`Format`]) and how one row reads a line: its needles, its
//! pattern, whose placeholders `{field:unit}` capture the text's figures into the fields of an
//! [`OomText`] in the unit the text writes them in, and the step a table cannot say ([`Then`]). The
//! rows themselves are in [`formats`](super::formats).

use super::text::{Kind, OomText, Opened, Vendor, empty, size_bytes, with_exception};
use crate::program::Program;
use regex::{Captures, Regex};
use std::sync::LazyLock;

/// What a text's failure means for the job that printed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Means {
    /// A framework's allocator had no room for a tensor or buffer (training or running a model).
    Allocator,
    /// An inference server's plan (weights, then its KV cache) did not fit the share of the GPU it is
    /// given: no single allocation failed.
    Server,
    /// An inference engine's own allocation or CUDA check failed while it built or ran a model.
    Engine,
    /// A GPU library's own pool or workspace had no room.
    Library,
    /// A CUDA (HIP, Level Zero) call returned its out-of-memory code, whichever program made it.
    Runtime,
}

impl Means {
    /// In words, for the reference.
    pub fn words(self) -> &'static str {
        match self {
            Means::Allocator => "a framework's allocator",
            Means::Server => "an inference server's plan",
            Means::Engine => "an inference engine",
            Means::Library => "a GPU library's pool",
            Means::Runtime => "a runtime call",
        }
    }
}

/// How the allocator that failed holds memory: what a cause may assume of its figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocator {
    /// PyTorch's caching allocator: requests served from segments it asks the device for.
    Caching,
    /// CUDA's stream-ordered pool (PyTorch's `cudaMallocAsync` backend).
    Async,
    /// A high watermark that bounds the process's whole memory, not the allocator's alone (MPS).
    Watermark,
    /// Anything else, or not known.
    Other,
}

/// What the lines after the opening one may add to a reading (the opening line is read so too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follows {
    /// Nothing: the text is whole on its line.
    Nothing,
    /// PyTorch's allocator's clauses (the GPU, its capacity, what is free, the cache's figures).
    Torch,
    /// The cudaMallocAsync allocator's figures, a line each.
    AsyncFigures,
    /// XLA's figures (`Free memory/Total memory`); complete with a GPU (`gpu`) and a total (`total`).
    Xla { gpu: bool, total: bool },
    /// TensorFlow's `[[Node: ...]]` line with the op's device; `sized`: complete only with a size.
    TfNode { sized: bool },
    /// ggml's exact buffer size (`failed to allocate CUDA0 buffer of size N`).
    GgmlSize,
    /// XGBoost's `- Free memory:` and `- Requested memory:` lines.
    XgboostFigures,
    /// ggml's `current device: N, in function ggml_...` line, or PyTorch's hint naming HIP's error.
    CurrentDevice,
}

impl Follows {
    /// In words, for the reference.
    pub fn words(self) -> &'static str {
        match self {
            Follows::Nothing => "nothing",
            Follows::Torch => "the allocator's clauses",
            Follows::AsyncFigures => "its figures, a line each",
            Follows::Xla { .. } => "`Free memory/Total memory`",
            Follows::TfNode { .. } => "the op's device (`[[Node:`)",
            Follows::GgmlSize => "the buffer's exact size",
            Follows::XgboostFigures => "`- Free memory:`, `- Requested memory:`",
            Follows::CurrentDevice => "ggml's device line; ROCm's hint",
        }
    }
}

/// A field of [`OomText`] a placeholder fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    Gpu,
    Requested,
    Total,
    Free,
    Allowed,
    Process,
    Allocated,
    Reserved,
    MaxModelLen,
    KvCacheTokens,
}

impl Field {
    const ALL: [(Field, &'static str); 10] = [
        (Field::Gpu, "gpu"),
        (Field::Requested, "requested"),
        (Field::Total, "total"),
        (Field::Free, "free"),
        (Field::Allowed, "allowed"),
        (Field::Process, "process"),
        (Field::Allocated, "allocated"),
        (Field::Reserved, "reserved"),
        (Field::MaxModelLen, "max_model_len"),
        (Field::KvCacheTokens, "kv_cache_tokens"),
    ];

    /// The placeholder's name, as the report's field is named (`requested` → `requested_bytes`).
    pub fn name(self) -> &'static str {
        Field::ALL.iter().find(|(f, _)| *f == self).unwrap().1
    }

    fn named(name: &str) -> Option<Field> {
        Field::ALL.iter().find(|(_, n)| *n == name).map(|(f, _)| *f)
    }

    fn slot(self, t: &mut OomText) -> &mut Option<u64> {
        match self {
            Field::Gpu => unreachable!("the GPU is a u32"),
            Field::Requested => &mut t.requested_bytes,
            Field::Total => &mut t.total_bytes,
            Field::Free => &mut t.free_bytes,
            Field::Allowed => &mut t.allowed_bytes,
            Field::Process => &mut t.process_bytes,
            Field::Allocated => &mut t.allocated_bytes,
            Field::Reserved => &mut t.reserved_bytes,
            Field::MaxModelLen => &mut t.max_model_len,
            Field::KvCacheTokens => &mut t.kv_cache_tokens,
        }
    }

    fn is_set(self, t: &OomText) -> bool {
        match self {
            Field::Gpu => t.gpu.is_some(),
            Field::Requested => t.requested_bytes.is_some(),
            Field::Total => t.total_bytes.is_some(),
            Field::Free => t.free_bytes.is_some(),
            Field::Allowed => t.allowed_bytes.is_some(),
            Field::Process => t.process_bytes.is_some(),
            Field::Allocated => t.allocated_bytes.is_some(),
            Field::Reserved => t.reserved_bytes.is_some(),
            Field::MaxModelLen => t.max_model_len.is_some(),
            Field::KvCacheTokens => t.kv_cache_tokens.is_some(),
        }
    }

    fn set(self, t: &mut OomText, v: u64, overwrite: bool) {
        match self {
            Field::Gpu => {
                if overwrite || t.gpu.is_none() {
                    t.gpu = u32::try_from(v).ok().or(t.gpu);
                }
            }
            f => {
                let s = f.slot(t);
                if overwrite || s.is_none() {
                    *s = Some(v);
                }
            }
        }
    }
}

/// How a placeholder's number is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `size`: a number and its unit as printed (`29.29 GiB`, `0 bytes`, `98.000244MB`).
    Size,
    /// `xla`: XLA's size, one letter for a binary unit (`129.50M`, `0B`).
    Xla,
    /// `B`: a count of bytes.
    Bytes,
    /// `grouped`: bytes with thousands separators (`1,073,741,824`).
    Grouped,
    /// `MiB`: a number of MiB without its unit (ggml's, CatBoost's `MB`).
    Mib,
    /// `n`: a count (a device, tokens).
    Count,
}

impl Unit {
    const ALL: [(Unit, &'static str, &'static str); 6] = [
        (
            Unit::Size,
            "size",
            r"(?P<N>\d+(?:\.\d+)?) ?(?P<Nu>bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b",
        ),
        (Unit::Xla, "xla", r"(?P<N>\d+(?:\.\d+)?)(?P<Nu>[KMGT]?)B?\b"),
        (Unit::Bytes, "B", r"(?P<N>\d+)"),
        (Unit::Grouped, "grouped", r"(?P<N>[\d,]+)"),
        (Unit::Mib, "MiB", r"(?P<N>\d+(?:\.\d+)?)"),
        (Unit::Count, "n", r"(?P<N>\d+)"),
    ];

    /// The placeholder's spelling of the unit.
    pub fn name(self) -> &'static str {
        Unit::ALL.iter().find(|(u, ..)| *u == self).unwrap().1
    }

    fn value(self, num: &str, unit: Option<&str>) -> Option<u64> {
        match self {
            Unit::Size => size_bytes(num, unit?),
            Unit::Xla => {
                let unit = match unit.unwrap_or("") {
                    "" => "B",
                    "K" => "KiB",
                    "M" => "MiB",
                    "G" => "GiB",
                    "T" => "TiB",
                    _ => return None,
                };
                size_bytes(num, unit)
            }
            Unit::Grouped => num.replace(',', "").parse().ok(),
            Unit::Mib => size_bytes(num, "MiB"),
            Unit::Bytes | Unit::Count => num.parse().ok(),
        }
    }
}

/// What a row's reading needs more than its pattern: a step a table cannot say. `None` rejects the line.
pub type Then = fn(&mut Opened, &Found, &str) -> Option<()>;

/// One wording.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    /// Names the row (in the reference and the tests): the format, or the format and its variant.
    pub id: &'static str,
    /// The `format` its reading carries.
    pub format: &'static str,
    /// Other formats its reading may settle on as it reads more (PyTorch's layouts by their clauses).
    pub layouts: &'static [&'static str],
    /// The report's `oom.source`: the kind of wording (the program is `source`).
    pub kind: Kind,
    /// The vendor the wording is only ever written for; `None`: NVIDIA's, unless the text has words only
    /// another vendor's texts have.
    pub vendor: Option<Vendor>,
    /// The program that writes it (`oom.source`).
    pub source: Program,
    pub means: Means,
    pub allocator: Allocator,
    /// One of these must be on the line before the pattern is tried.
    pub needles: &'static [&'static str],
    /// None of these may be on the line (they mark another device's memory, or no failure).
    pub unless: &'static [&'static str],
    /// The wording, `{field:unit}` where it gives a figure. Groups the engine reads by name: `exception`
    /// (the class the message was raised as), `class` (the class the message names itself, taken when
    /// none precedes it), `at`/`at2` (where the message starts, when the match starts before it); a
    /// row's [`Then`] may read any other.
    pub pattern: &'static str,
    /// A second pattern that must also be on the line (it may give figures too).
    pub requires: Option<&'static str>,
    /// Patterns read anywhere on the line for the figures the wording leaves to them (a device prefix).
    pub reads: &'static [&'static str],
    /// The fields the text is complete with; empty: complete as opened.
    pub complete: &'static [Field],
    /// Whether the exception class printed before the message is looked for.
    pub exception: bool,
    /// The words quoted from the program's source in a traceback (`raise X("...`) are no report.
    pub not_quoted: bool,
    pub follows: Follows,
    /// An allocator's warning that the framework's error follows: the two are one report.
    pub warning: bool,
    /// Later rows that read the same lines too, of which this row is the special case: where both read a
    /// line, this one does (a wording of its own inside the general words, or the general words with the
    /// program's name beside them).
    pub narrows: &'static [&'static str],
    pub then: Option<Then>,
}

impl Format {
    /// Whether a reading of this row may carry `format`.
    pub fn carries(&self, format: &str) -> bool {
        self.format == format || self.layouts.contains(&format)
    }

    /// The fields the pattern and its helpers can fill.
    pub fn fields(&self) -> Vec<Field> {
        let mut out: Vec<Field> = Vec::new();
        let named = std::iter::once(self.pattern)
            .chain(self.requires)
            .chain(self.reads.iter().copied())
            .flat_map(placeholders)
            .filter_map(|(name, _)| Field::named(name));
        for f in named {
            if !out.contains(&f) {
                out.push(f);
            }
        }
        out
    }
}

/// A row's defaults: a row names what differs.
pub(super) const ROW: Format = Format {
    id: "",
    format: "",
    layouts: &[],
    kind: Kind::CudaRuntime,
    vendor: None,
    source: Program::Cuda,
    means: Means::Runtime,
    allocator: Allocator::Other,
    needles: &[],
    unless: &[],
    pattern: "",
    requires: None,
    reads: &[],
    complete: &[],
    exception: true,
    not_quoted: false,
    follows: Follows::Nothing,
    warning: false,
    narrows: &[],
    then: None,
};

/// A placeholder of a pattern: its name and unit.
fn placeholders(pattern: &str) -> Vec<(&str, Unit)> {
    PLACEHOLDER
        .captures_iter(pattern)
        .filter_map(|c| {
            let unit = Unit::ALL.iter().find(|(_, n, _)| *n == &c[2])?.0;
            Some((c.get(1).unwrap().as_str(), unit))
        })
        .collect()
}

static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{([a-z_]+):(\w+)\}").expect("a valid pattern"));

/// A pattern's placeholder as compiled: the group of its number, and of its unit where printed.
#[derive(Debug)]
struct Slot {
    name: String,
    unit: Unit,
    number: usize,
    unit_group: Option<usize>,
}

/// A compiled pattern, with its placeholders.
#[derive(Debug)]
struct Pattern {
    re: Regex,
    slots: Vec<Slot>,
}

impl Pattern {
    /// Each `{name:unit}` becomes the unit's groups, named `name__i` (and `name__iu` for its unit), so a
    /// field may appear in several alternatives.
    fn compile(pattern: &str) -> Pattern {
        let mut i = 0;
        let source = PLACEHOLDER.replace_all(pattern, |c: &Captures| {
            let (_, _, re) = Unit::ALL
                .iter()
                .find(|(_, n, _)| *n == &c[2])
                .unwrap_or_else(|| panic!("unknown unit in {}", &c[0]));
            i += 1;
            re.replace("Nu>", &format!("{}__{i}u>", &c[1]))
                .replace("N>", &format!("{}__{i}>", &c[1]))
        });
        let re = Regex::new(&source).unwrap_or_else(|e| panic!("{pattern}: {e}"));
        let slots = re
            .capture_names()
            .enumerate()
            .filter_map(|(g, name)| {
                let (field, n) = name?.split_once("__")?;
                let n = n.parse::<usize>().ok()?;
                let unit = placeholders(pattern).get(n - 1)?.1;
                let unit_name = format!("{field}__{n}u");
                let unit_group = re.capture_names().position(|x| x == Some(&unit_name));
                Some(Slot {
                    name: field.to_string(),
                    unit,
                    number: g,
                    unit_group,
                })
            })
            .collect();
        Pattern { re, slots }
    }
}

/// A line's match of a row's pattern, for the step a row's [`Then`] adds.
pub struct Found<'a> {
    caps: Captures<'a>,
    pattern: &'a Pattern,
}

impl Found<'_> {
    /// The figure of placeholder `name`, in bytes (or a count): the last one of that name the text gave.
    pub fn figure(&self, name: &str) -> Option<u64> {
        self.pattern
            .slots
            .iter()
            .rev()
            .filter(|s| s.name == name)
            .find_map(|s| {
                let num = self.caps.get(s.number)?.as_str();
                let unit = s
                    .unit_group
                    .and_then(|u| self.caps.get(u))
                    .map(|m| m.as_str());
                s.unit.value(num, unit)
            })
    }

    /// The text of the pattern's group `name`.
    pub fn group(&self, name: &str) -> Option<&str> {
        self.caps.name(name).map(|m| m.as_str())
    }

    /// Where the match starts on the line.
    pub fn start(&self) -> usize {
        self.caps.get(0).unwrap().start()
    }

    /// Fills the fields the placeholders captured: the last figure of each (a more exact one printed
    /// after a rounded one), over what `t` has when `overwrite`.
    fn fill(&self, t: &mut OomText, overwrite: bool) {
        for (field, name) in Field::ALL {
            if let Some(v) = self.figure(name) {
                field.set(t, v, overwrite);
            }
        }
    }
}

/// A row's patterns, compiled.
pub(super) struct Compiled {
    pattern: Pattern,
    requires: Option<Pattern>,
    reads: Vec<Pattern>,
}

impl Compiled {
    pub(super) fn of(f: &Format) -> Compiled {
        Compiled {
            pattern: Pattern::compile(f.pattern),
            requires: f.requires.map(Pattern::compile),
            reads: f.reads.iter().map(|p| Pattern::compile(p)).collect(),
        }
    }

    /// Whether row `f`'s words are on `line`, its needles aside: its pattern and what it requires, and
    /// none of the words it must not have.
    #[cfg(test)]
    pub(super) fn matches(&self, f: &Format, line: &str) -> bool {
        self.pattern.re.is_match(line)
            && self.requires.as_ref().is_none_or(|r| r.re.is_match(line))
            && !f.unless.iter().any(|n| line.contains(n))
    }

    /// The row's own pattern found in `text`.
    pub(super) fn find<'a>(&'a self, text: &'a str) -> Option<Found<'a>> {
        Some(Found {
            caps: self.pattern.re.captures(text)?,
            pattern: &self.pattern,
        })
    }
}

/// Whether the words at `at` are the program's source quoted in a traceback (`raise RuntimeError("Not
/// enough memory ...`), not its message.
fn quoted_in_source(line: &str, at: usize) -> bool {
    line[..at].ends_with("(\"") && line[..at].contains("raise ")
}

/// Where the message starts on `line` and the exception it was raised as: the pattern's `exception`,
/// else the class printed before the message (when the row looks for one), else the `class` it names.
fn started(mut t: OomText, found: &Found, look_back: bool, line: &str) -> Opened {
    let at = ["at", "at2"]
        .iter()
        .find_map(|g| found.caps.name(g))
        .map_or(found.start(), |m| m.start());
    let mut opened = match (found.caps.name("exception"), look_back) {
        (Some(e), _) => {
            t.exception = Some(e.as_str().to_string());
            Opened {
                text: t,
                start: at.min(e.start()),
            }
        }
        (None, true) => with_exception(t, line, at),
        (None, false) => Opened { text: t, start: at },
    };
    if let Some(class) = found.caps.name("class")
        && opened.text.exception.is_none()
    {
        opened.text.exception = Some(class.as_str().to_string());
        opened.start = class.start();
    }
    opened
}

/// Reads `line` with row `f` (compiled as `c`), if its words are there.
pub(super) fn read(f: &Format, c: &Compiled, line: &str) -> Option<Opened> {
    if !f.needles.iter().any(|n| line.contains(n)) || f.unless.iter().any(|n| line.contains(n)) {
        return None;
    }
    let found = Found {
        caps: c.pattern.re.captures(line)?,
        pattern: &c.pattern,
    };
    if f.not_quoted && quoted_in_source(line, found.start()) {
        return None;
    }
    let required = match &c.requires {
        Some(p) => Some(Found {
            caps: p.re.captures(line)?,
            pattern: p,
        }),
        None => None,
    };
    let mut t = empty(f.kind, f.format);
    t.vendor = f.vendor.unwrap_or_default();
    found.fill(&mut t, true);
    let helpers = c
        .reads
        .iter()
        .filter_map(|p| p.re.captures(line).map(|caps| Found { caps, pattern: p }));
    for more in required.into_iter().chain(helpers) {
        more.fill(&mut t, false);
    }
    let mut opened = started(t, &found, f.exception, line);
    opened.text.complete = f.complete.iter().all(|field| field.is_set(&opened.text));
    if let Some(then) = f.then {
        then(&mut opened, &found, line)?;
    }
    Some(opened)
}
