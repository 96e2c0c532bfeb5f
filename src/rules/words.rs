//! gpudoc's words over what its code found, in files a user can read and replace:
//!
//! - `rules/words/oom-cause.toml`: an OOM's cause, templates like a rule's message over what
//!   `oom::cause::cause_of` found (`finding`: its kind and figures, an [`oom::cause::Found`]). They are
//!   filled in as a report is diagnosed, as the report's `oom.explanation`, which the summary says after
//!   the cause and the OOM rules quote.
//! - `rules/words/process-reason.toml`: why a process holding a GPU is judged as it is (`why`: its kind
//!   and figures, an [`orphans::Why`]), the `reason` of each holder `gpudoc orphans` and `gpudoc watch`
//!   list, which the `leftover-holder` rule quotes as `process.reason`.
//!
//! The deciding stays in `oom::cause` and `orphans::judge`; the wording is the files' alone.
//!
//! [`oom::cause::Found`]: crate::oom::cause::Found
//! [`orphans::Why`]: crate::orphans::Why

use super::RuleError;
use super::absent::Compiled;
use super::eval::{Lazy, compile, context, env};
use super::lines::{line_of, read_in_dir, value_line};
use super::template::{Piece, fill, holds, template};
use crate::oom::cause::Found;
use crate::orphans::{Holder, Why};
use cel::Env;
use serde::Deserialize;
use std::sync::{Arc, OnceLock};

/// A words file: where it is, the key of its cases, the name its templates read their value by, and what
/// joins `after` to the case said.
pub struct Kind {
    /// Where the bundled words are, as errors name them.
    pub file: &'static str,
    /// Where a user's rules folder (`--rules DIR`) has them: they replace the bundled ones.
    pub in_dir: &'static str,
    key: &'static str,
    var: &'static str,
    sep: &'static str,
    bundled: &'static str,
    /// One of every kind of value the words must say, as JSON.
    examples: fn() -> Vec<serde_json::Value>,
}

/// The words of an OOM's cause.
pub const OOM_CAUSE: Kind = Kind {
    file: "rules/words/oom-cause.toml",
    in_dir: "words/oom-cause.toml",
    key: "explanation",
    var: "finding",
    sep: " ",
    bundled: include_str!("../../rules/words/oom-cause.toml"),
    examples: || json_of(Found::examples()),
};

/// The words of why a process is judged as it is.
pub const PROCESS_REASON: Kind = Kind {
    file: "rules/words/process-reason.toml",
    in_dir: "words/process-reason.toml",
    key: "reason",
    var: "why",
    sep: "",
    bundled: include_str!("../../rules/words/process-reason.toml"),
    examples: || json_of(Why::examples()),
};

fn json_of<T: serde::Serialize>(v: Vec<T>) -> Vec<serde_json::Value> {
    v.iter()
        .map(|x| serde_json::to_value(x).expect("a finding serializes"))
        .collect()
}

/// A words file as written: its cases under its kind's key (`explanation` or `reason`; the other is
/// unknown), and `after`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WordsFile {
    #[serde(default)]
    explanation: Option<Vec<toml::Spanned<Case>>>,
    #[serde(default)]
    reason: Option<Vec<toml::Spanned<Case>>>,
    #[serde(default)]
    after: Option<toml::Spanned<String>>,
}

/// A case of the words: said where `when` holds and no case above it does.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    when: String,
    text: String,
}

/// A words file, compiled.
pub struct Words {
    cases: Vec<(Compiled, Vec<Piece>)>,
    after: Vec<Piece>,
    env: Arc<Env>,
    /// The file they were read from, as errors name them.
    file: String,
    kind: &'static Kind,
}

impl Words {
    /// A words file's text, compiled; `file` names it in errors.
    pub fn parse(kind: &'static Kind, text: &str, file: &str) -> Result<Words, RuleError> {
        let env = env();
        let err = |line: usize, what: String| RuleError {
            file: file.into(),
            line,
            what,
        };
        let f: WordsFile = toml::from_str(text).map_err(|e| {
            err(
                e.span().map_or(1, |s| line_of(text, s.start)),
                e.message().into(),
            )
        })?;
        let (mine, other) = match kind.key {
            "explanation" => (f.explanation, f.reason.map(|_| "reason")),
            _ => (f.reason, f.explanation.map(|_| "explanation")),
        };
        if let Some(other) = other {
            return Err(err(
                1,
                format!("unknown field `{other}`, expected `{}`", kind.key),
            ));
        }
        let mine = mine.ok_or_else(|| err(1, format!("missing field `{}`", kind.key)))?;
        let mut cases = Vec::new();
        for c in mine {
            let line = value_line(text, c.span());
            let c = c.into_inner();
            cases.push((
                compile(&env, &c.when, file, line)?,
                template(&env, &c.text, file, line)?,
            ));
        }
        let after = match f.after {
            Some(a) => template(&env, a.get_ref(), file, value_line(text, a.span()))?,
            None => Vec::new(),
        };
        Ok(Words {
            cases,
            after,
            env,
            file: file.into(),
            kind,
        })
    }

    /// The bundled words of an OOM's cause (`rules/words/oom-cause.toml`), which the tests check.
    pub fn bundled() -> &'static Words {
        static WORDS: OnceLock<Words> = OnceLock::new();
        WORDS.get_or_init(|| Words::bundled_of(&OOM_CAUSE))
    }

    /// The bundled words of why a process is judged as it is (`rules/words/process-reason.toml`).
    pub fn bundled_reasons() -> &'static Words {
        static WORDS: OnceLock<Words> = OnceLock::new();
        WORDS.get_or_init(|| Words::bundled_of(&PROCESS_REASON))
    }

    fn bundled_of(kind: &'static Kind) -> Words {
        Words::parse(kind, kind.bundled, kind.file).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The words of `kind` of a user's rules folder (`--rules DIR`), which replace the bundled ones whole;
    /// `None` where it has none. An error names the user's file.
    pub fn of_dir(kind: &'static Kind, dir: &std::path::Path) -> Result<Option<Words>, RuleError> {
        let Some((text, file)) = read_in_dir(dir, kind.in_dir)? else {
            return Ok(None);
        };
        let words = Words::parse(kind, &text, &file)?;
        words.check(&file)?;
        Ok(Some(words))
    }

    /// Every kind of value has words in these (a user's file is checked at load as the bundled one is by
    /// the tests): one that has none is an error that names the file, not something said in no words.
    fn check(&self, file: &str) -> Result<(), RuleError> {
        for example in (self.kind.examples)() {
            if let Err(e) = self.say(&example) {
                let kind = example["kind"].as_str().unwrap_or_default();
                return Err(RuleError {
                    file: file.into(),
                    line: 0,
                    what: format!("{}: {} `{kind}`: {e}", self.kind.key, self.kind.var),
                });
            }
        }
        Ok(())
    }

    /// `found` in words: the first case that holds, and `after` where it gives anything.
    pub fn explain(&self, found: &Found) -> Result<String, String> {
        self.say(&serde_json::to_value(found).expect("a finding serializes"))
    }

    /// Why a process is judged as it is, in words.
    pub fn reason(&self, why: &Why) -> Result<String, String> {
        self.say(&serde_json::to_value(why).expect("a reason serializes"))
    }

    /// `value` in words, bound to the kind's name: the first case that holds, and `after` where it gives
    /// anything.
    fn say(&self, value: &serde_json::Value) -> Result<String, String> {
        let facts = serde_json::json!({ self.kind.var: value });
        let lazy = Lazy::new(&facts);
        let ctx = context(&self.env, &lazy);
        for (when, pieces) in &self.cases {
            if holds(Some(when), &ctx)? {
                let mut said = fill(pieces, &ctx)?;
                let after = fill(&self.after, &ctx)?;
                if !after.is_empty() {
                    said = format!("{said}{}{after}", self.kind.sep);
                }
                return Ok(said);
            }
        }
        Err("no case holds".into())
    }
}

/// The report's OOM explained in `words` (the bundled ones where `None`), where it has a finding (a
/// report from before findings were kept keeps its own explanation); what failed, for the report's
/// `rule_errors`, naming the words' file.
pub fn word(report: &mut crate::report::Report, words: Option<&Words>) -> Option<String> {
    let oom = report.oom.as_mut()?;
    let found = oom.finding.as_ref()?;
    let words = words.unwrap_or_else(|| Words::bundled());
    match words.explain(found) {
        Ok(said) => {
            oom.explanation = said;
            None
        }
        Err(e) => Some(format!("{}: {e}", words.file)),
    }
}

/// Each holder's `reason`: its `why` in `words` (the bundled ones where `None`); a holder from before
/// reasons were kept as data keeps its own. What failed, for the report's `rule_errors`, naming the
/// words' file (once, however many holders it failed on).
pub fn reasons(holders: &mut [Holder], words: Option<&Words>) -> Option<String> {
    let words = words.unwrap_or_else(|| Words::bundled_reasons());
    let mut failed = None;
    for h in holders {
        let Some(why) = &h.why else { continue };
        match words.reason(why) {
            Ok(said) => h.reason = said,
            Err(e) => failed = Some(format!("{}: {e}", words.file)),
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oom::cause::{Cause, Figures, Holders, KvCache, holders};
    use crate::oom::parse::Vendor;
    use crate::orphans::{LeftBy, Lineage, Verdict, judge};
    use std::collections::HashSet;

    /// The cause found and its words, as the report gives them.
    fn cause_of(f: &Figures) -> (Cause, String) {
        let found = crate::oom::cause::cause_of(f);
        let said = Words::bundled()
            .explain(&Found::of(found, f, &Holders::default()))
            .unwrap();
        (found.cause(), said)
    }

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn every_kind_of_finding_has_its_words() {
        for found in Found::examples() {
            let said = Words::bundled()
                .explain(&found)
                .unwrap_or_else(|e| panic!("{found:?}: {e}"));
            assert!(
                !said.is_empty() && !said.contains("unknown"),
                "{found:?}: {said}"
            );
        }
    }

    /// A process under init whose group and session are as given: what `gpudoc orphans` judges.
    fn lineage(pgid: u32, sid: u32, pgid_alive: bool, sid_alive: bool) -> Lineage {
        Lineage {
            pid: 40,
            ppid: 1,
            pgid,
            sid,
            state: 'S',
            comm: "python3".into(),
            parent_comm: "bash".into(),
            init_comm: "bash".into(),
            pgid_alive,
            sid_alive,
            ..Default::default()
        }
    }

    /// What `gpudoc orphans` says of it: its verdict and the reason its table and JSON give.
    fn judged(l: &Lineage) -> (Verdict, String) {
        let (v, why) = judge(l);
        (v, Words::bundled_reasons().reason(&why).unwrap())
    }

    #[test]
    fn every_reason_reads_as_gpudoc_orphans_says_it() {
        for why in Why::examples() {
            let said = Words::bundled_reasons()
                .reason(&why)
                .unwrap_or_else(|e| panic!("{why:?}: {e}"));
            assert!(!said.contains("unknown"), "{why:?}: {said}");
        }
        let group = lineage(33, 20, false, true);
        assert_eq!(
            judged(&group),
            (
                Verdict::Orphan,
                "its parent died: it was re-parented to init (pid 1), and its job's leader (process group 33) is gone".into()
            )
        );
        let mut nohup = lineage(40, 20, true, false);
        assert_eq!(
            judged(&nohup).1,
            "its parent died: it was re-parented to init (pid 1), and the session it was started in (pid 20) is gone"
        );
        nohup.ignores_hup = true;
        assert_eq!(
            judged(&nohup),
            (
                Verdict::Detached,
                "its parent died: it was re-parented to init (pid 1), and the session it was started in (pid 20) is gone; but it ignores SIGHUP (started with nohup, or under `trap '' HUP`): detached on purpose, ended only with --detached".into()
            )
        );
        assert_eq!(
            judged(&lineage(1, 1, true, true)).1,
            "a child of PID 1 (bash) that nothing shows was re-parented (PID 1 may have started it: a container's entrypoint, a service): not judged a leftover"
        );
        let mut adopted = group.clone();
        (adopted.ppid, adopted.parent_comm) = (700, "systemd".into());
        assert_eq!(
            judged(&adopted).1,
            "its job's leader (process group 33) is gone; now a child of pid 700 (systemd), which adopts orphans"
        );
        adopted.parent_comm = "bash".into();
        assert_eq!(
            judged(&adopted).1,
            "its job's leader (process group 33) is gone, but its parent pid 700 (bash) is alive: not judged a leftover"
        );
        adopted.pgid_alive = true;
        assert_eq!(
            judged(&adopted).1,
            "part of a running job: parent pid 700 (bash)"
        );
        let mut zombie = group.clone();
        zombie.state = 'Z';
        assert_eq!(
            judged(&zombie).1,
            "exited; the driver frees its memory once its parent (pid 1) reaps it: end or fix the parent"
        );
        zombie.other_threads = 2;
        assert_eq!(
            judged(&zombie).1,
            "its parent died: it was re-parented to init (pid 1), and its job's leader (process group 33) is gone; its main thread has exited, 2 other thread(s) run on"
        );
        let mut service = group.clone();
        service.comm = "nvidia-persistenced\n".into();
        assert_eq!(
            judged(&service).1,
            "nvidia-persistenced\\n holds the devices by design"
        );
        let mut left = group.clone();
        left.left_by = Some(LeftBy {
            run: "`gpudoc run sh -c x`, which ended at 2026-01-02T03:04:05Z (5s ago)".into(),
            hup_inherited: true,
        });
        left.ignores_hup = true;
        assert_eq!(
            judged(&left),
            (
                Verdict::Orphan,
                "left running by `gpudoc run sh -c x`, which ended at 2026-01-02T03:04:05Z (5s ago)".into()
            )
        );
        assert_eq!(
            Words::bundled_reasons().reason(&Why::default()).unwrap(),
            "NVML lists this PID but /proc does not have it: a process in another PID namespace (a container) or memory the driver still holds for a dead process; gpudoc cannot signal it (look on the host, or ask an administrator)"
        );
    }

    #[test]
    fn a_words_file_that_does_not_compile_says_where() {
        let e = Words::parse(
            &OOM_CAUSE,
            "explanation = [\n  { when = \"true\", text = \"{finding.\" },\n]\n",
            "w.toml",
        )
        .err()
        .unwrap();
        assert_eq!((e.file.as_str(), e.line), ("w.toml", 2), "{e}");
        let e = Words::parse(&OOM_CAUSE, "explanation = []\nwords = 1\n", "w.toml")
            .err()
            .unwrap();
        assert!(e.what.contains("unknown field"), "{e}");
    }

    #[test]
    fn one_allocation_larger_than_a_tpu_says_tpu() {
        let f = Figures {
            requested: Some(10 * GIB),
            total: Some(8 * GIB),
            vendor: Vendor::Google,
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::TooBig);
        assert!(
            why.ends_with("is larger than the whole TPU (8.00 GiB)"),
            "{why}"
        );
    }

    #[test]
    fn a_cap_is_named_when_the_gpu_had_room() {
        let f = Figures {
            requested: Some(2 * GIB),
            total: Some(140 * GIB),
            free: Some(115 * GIB),
            allowed: Some(35 * GIB),
            reserved: Some(34 * GIB),
            allocated: Some(34 * GIB),
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(
            why.contains("35.00 GiB") && why.contains("115.00 GiB free"),
            "{why}"
        );
    }

    #[test]
    fn a_pool_limit_checked_before_the_device_is_a_cap_without_free_memory() {
        // CuPy: `Out of memory allocating 1 GiB (allocated so far: 3 GiB, limit set to: 3.5 GiB)`.
        let f = Figures {
            requested: Some(GIB),
            allowed: Some(7 * GIB / 2),
            reserved: Some(3 * GIB),
            allowed_by: "CuPy's memory pool limit",
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(
            why.contains("CuPy's memory pool limit") && !why.contains("free"),
            "{why}"
        );
        // Within the limit, the limit explains nothing.
        let within = Figures {
            reserved: Some(GIB),
            ..f
        };
        assert_ne!(cause_of(&within).0, Cause::Cap);
    }

    #[test]
    fn the_jobs_own_child_named_by_the_text_is_the_jobs() {
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 9.29 GiB is free. Process 4242 has 110.51 GiB memory in use. Including non-PyTorch memory, this process has 20.00 GiB memory in use. Of the allocated memory 19.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.").unwrap();
        let job: HashSet<u32> = [4242].into();
        let h = holders(&t, &job);
        assert_eq!((h.others, h.job), (0, t.other_processes[0].bytes));
        let (c, why) = cause_of(&Figures::of(&t, &h, 0, None, None));
        assert_eq!(c, Cause::SelfGrowth, "{why}");
        assert!(why.contains("its other processes 110.51 GiB"), "{why}");
        let h = holders(&t, &HashSet::new());
        assert_eq!(
            cause_of(&Figures::of(&t, &h, 0, None, None)).0,
            Cause::Others
        );
    }

    #[test]
    fn a_guessed_failing_process_is_said_to_be_a_guess() {
        // Inside a container: no "this process", two entries that could each be it.
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which 9.29 GiB is free. Process 4242 has 60.00 GiB memory in use. Process 4343 has 70.00 GiB memory in use. Of the allocated memory 19.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated.").unwrap();
        let h = holders(&t, &HashSet::new());
        assert!(h.guessed, "{h:?}");
        let f = Figures::of(&t, &h, 0, None, None);
        let found = Found::of(crate::oom::cause::cause_of(&f), &f, &h);
        let why = Words::bundled().explain(&found).unwrap();
        assert!(
            why.ends_with(
                " (the text names no \"this process\": pid 4242 is taken to be the failing process, a guess)"
            ),
            "{why}"
        );
    }

    #[test]
    fn a_small_request_near_a_cap_says_the_segment_pytorch_asks_for() {
        // TheRock#2118: 2 MiB asked, 1072 MiB held, 1.05 GiB allowed: the 20 MiB segment does not fit.
        let t = crate::oom::parse::parse_line("torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated.").unwrap();
        let f = Figures::of(&t, &Holders::default(), 0, None, None);
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(why.contains("20.00 MiB segment"), "{why}");
    }

    #[test]
    fn mps_watermark_counts_the_processs_whole_metal_memory() {
        let t = crate::oom::parse::parse_line("MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: 17.35 GiB, max allowed: 27.20 GiB). Tried to allocate 292.50 MiB on private pool.").unwrap();
        let (c, why) = cause_of(&Figures::of(&t, &Holders::default(), 0, None, None));
        assert_eq!(c, Cause::Cap, "{why}");
        assert!(
            why.contains("26.92 GiB") && why.contains("PYTORCH_MPS_HIGH_WATERMARK_RATIO"),
            "{why}"
        );
    }

    #[test]
    fn memory_outside_cuda_malloc_async_figures_is_nobodys_without_nvml() {
        // ComfyUI-ChatTTS#9: 6.89 GiB live of 23.69 GiB, 2.94 MiB free.
        let f = Figures {
            requested: Some(320 * MIB),
            total: Some(23 * GIB + 706 * MIB),
            free: Some(3 * MIB),
            allocated: Some(6 * GIB + 911 * MIB),
            async_pool: true,
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Unknown, "{why}");
        assert!(why.contains("cudaMallocAsync's pool"), "{why}");
        // NVML saw other processes holding it: theirs.
        let seen = Figures {
            others: 16 * GIB,
            ..f
        };
        assert_eq!(cause_of(&seen).0, Cause::Others);
    }

    #[test]
    fn vllm_refusing_to_start_blames_what_held_the_gpu_before_it() {
        let kv = KvCache {
            engine: "vLLM",
            share: "gpu_memory_utilization",
            needed: Some(125 * GIB),
            left: Some(7 * GIB),
            ..Default::default()
        };
        let mut f = Figures {
            total: Some(139 * GIB),
            kv_cache: Some(kv),
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Cap);
        assert_eq!(
            why,
            "vLLM's share of the GPU (gpu_memory_utilization) is 125.00 GiB, more than the 7.00 GiB of 139.00 GiB free when it started: the rest was in use before it loaded anything, by whom the text does not say"
        );
        f.others = 130 * GIB;
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Others);
        assert!(why.ends_with(": other processes held 130.00 GiB"), "{why}");
    }

    #[test]
    fn a_request_above_what_was_free_says_so_without_naming_a_holder() {
        let f = Figures {
            requested: Some(8 * GIB),
            free: Some(5 * GIB),
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Unknown);
        assert_eq!(
            why,
            "asked for 8.00 GiB with 5.00 GiB free: the text does not say what held the rest of the GPU"
        );
    }

    #[test]
    fn unknown_numbers_are_never_zero() {
        let f = Figures {
            total: Some(140 * GIB),
            device_used: Some(139 * GIB),
            others: 110 * GIB,
            ..Default::default()
        };
        let (c, why) = cause_of(&f);
        assert_eq!(c, Cause::Others);
        assert!(!why.contains("0 B"), "{why}");
    }
}
