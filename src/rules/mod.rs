//! The rule set: diagnoses from facts. Rules are TOML files in `rules/` (one rule a file, embedded into
//! the binary), overridable from a folder (`--rules DIR`). A rule's condition and the expressions in its
//! message are CEL (the `cel` crate), evaluated over the [`facts`] of a run. A rule that does not parse,
//! names a fact that does not exist or compares the wrong types fails at load with its file and line.
//!
//! By what each part does: `rule` reads one rule file, `check` checks it at load, `eval` is the
//! expression evaluator (facts as CEL values, the context, the facts an expression reads), `template`
//! the messages' templates, `apply` the rules applied to a run's facts; this file loads the rule set.

mod absent;
mod apply;
pub mod bundled;
mod check;
mod deferred;
mod eval;
pub mod facts;
pub mod framework;
pub mod growth;
pub mod hunt_words;
pub mod inside_words;
mod lines;
mod names;
pub mod phase;
mod rule;
pub mod serving;
pub mod story;
mod template;
mod when;
pub mod words;

pub use apply::diagnose;
pub use deferred::RunRules;
pub use rule::{Advice, Rule, Variant};

use cel::Env;
use eval::env;
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::Arc;

/// What a rule is evaluated for: once per run, or once per GPU, process or PyTorch process (bound to the
/// variable `gpu`, `process` or `torch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    Run,
    Gpu,
    Process,
    Torch,
}

impl Scope {
    /// `run`, `gpu`, `process`, `torch`.
    pub fn name(&self) -> &'static str {
        self.var().unwrap_or("run")
    }

    pub(super) fn var(&self) -> Option<&'static str> {
        match self {
            Scope::Run => None,
            Scope::Gpu => Some("gpu"),
            Scope::Process => Some("process"),
            Scope::Torch => Some("torch"),
        }
    }
    pub(super) fn list(&self) -> &'static str {
        match self {
            Scope::Run => "",
            Scope::Gpu => "gpus",
            Scope::Process => "processes",
            Scope::Torch => "torch_processes",
        }
    }
}

/// A rule that can't be used, with where (`line` 0: the whole file, or a flag).
#[derive(Debug, Clone, PartialEq)]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub what: String,
}

impl std::fmt::Display for RuleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            0 => write!(f, "{}: {}", self.file, self.what),
            n => write!(f, "{}:{n}: {}", self.file, self.what),
        }
    }
}

impl std::error::Error for RuleError {}

/// The rules in force, and the words they read: of an OOM's cause (`oom.explanation`), of why a process
/// is judged as it is (`process.reason`) and of a hunt and of a look inside the model (`hunt_lines`, `inside_lines`), each a user's
/// (`words/oom-cause.toml`, `words/process-reason.toml`, `words/hunt.toml` in the `--rules` folder) or the
/// bundled ones (`None`).
pub struct RuleSet {
    pub rules: Vec<Rule>,
    pub(super) env: Arc<Env>,
    pub(super) words: Option<Arc<words::Words>>,
    pub(super) reasons: Option<Arc<words::Words>>,
    pub(super) hunt_words: Option<Arc<hunt_words::HuntWords>>,
}

impl std::fmt::Debug for RuleSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.rules).finish()
    }
}

/// Rules that became variants of another, by their old id: what a user's `--disable-rule` or
/// `gpudoc rules explain` of the old id is told.
const MERGED: [(&str, &str); 5] = [
    ("oom-near-capacity", "oom-self-growth"),
    ("oom-before-training", "oom-self-growth"),
    ("oom-training-step", "oom-self-growth"),
    ("oom-after-training", "oom-self-growth"),
    ("oom-serving", "oom-self-growth"),
];

/// What is said of an id that names no rule: where a rule of that id went, or where to find the ids.
pub fn no_rule(id: &str) -> String {
    match MERGED.iter().find(|(old, _)| *old == id) {
        Some((_, now)) => format!(
            "no rule `{id}`: it is one of the variants of `{now}` now (`gpudoc rules explain {now}`)"
        ),
        None => format!("no rule `{id}` (see `gpudoc rules list`)"),
    }
}

/// Each id given to `--disable-rule` must name a rule.
fn check_disabled(ids: &[&str], disabled: &[String]) -> Result<(), RuleError> {
    match disabled.iter().find(|d| !ids.contains(&d.as_str())) {
        Some(id) => Err(RuleError {
            file: "--disable-rule".into(),
            line: 0,
            what: no_rule(id),
        }),
        None => Ok(()),
    }
}

impl RuleSet {
    /// The bundled rules, those of `dir` on top (a rule with the same id replaces the bundled one), less
    /// the disabled ones (each must name a rule); the words of `dir`'s `words/oom-cause.toml` and
    /// `words/process-reason.toml` where it has them, else the bundled words.
    pub fn load(dir: Option<&Path>, disabled: &[String]) -> Result<RuleSet, RuleError> {
        let mut rules: Vec<Rule> = Vec::new();
        for (name, text) in bundled::RULES {
            rules.push(Rule::parse_trusted(text, &format!("bundled:{name}"))?);
        }
        let (mut words, mut reasons, mut hunt_words) = (None, None, None);
        if let Some(dir) = dir {
            words = words::Words::of_dir(&words::OOM_CAUSE, dir)?.map(Arc::new);
            reasons = words::Words::of_dir(&words::PROCESS_REASON, dir)?.map(Arc::new);
            hunt_words = hunt_words::HuntWords::of_dir(dir)?.map(Arc::new);
            let io = |what: String| RuleError {
                file: dir.display().to_string(),
                line: 0,
                what,
            };
            let mut files: Vec<_> = std::fs::read_dir(dir)
                .map_err(|e| io(format!("cannot read the rules folder: {e}")))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            files.sort();
            for path in files {
                let file = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|e| RuleError {
                    file: file.clone(),
                    line: 0,
                    what: e.to_string(),
                })?;
                let rule = Rule::parse_with(&text, &file, hunt_words.as_ref())?;
                rules.retain(|r| r.id != rule.id);
                rules.push(rule);
            }
        }
        let ids: Vec<&str> = rules.iter().map(|r| r.id.as_str()).collect();
        check_disabled(&ids, disabled)?;
        rules.retain(|r| !disabled.contains(&r.id));
        rules.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(RuleSet {
            rules,
            env: env(),
            words,
            reasons,
            hunt_words,
        })
    }

    /// The ids of the rules judged during the run too (`live = true`).
    pub fn live_ids(&self) -> Vec<String> {
        self.rules
            .iter()
            .filter(|r| r.live)
            .map(|r| r.id.clone())
            .collect()
    }

    /// The rules judged on a look at the machine (`look = true`), the others left out: `gpudoc watch`
    /// evaluates only these, every interval.
    pub fn looks(self) -> RuleSet {
        RuleSet {
            rules: self.rules.into_iter().filter(|r| r.look).collect(),
            env: self.env,
            words: self.words,
            reasons: self.reasons,
            hunt_words: self.hunt_words,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ident::GpuRef;
    use facts::Facts;

    #[test]
    fn bundled_rules_load_and_pass_every_check() {
        let set = RuleSet::load(None, &[]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(set.rules.len(), bundled::RULES.len());
        for (name, text) in bundled::RULES {
            Rule::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn parse(text: &str) -> Result<Rule, RuleError> {
        Rule::parse(text, "r.toml")
    }

    const GOOD: &str = "id = \"x\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"gpu\"\nwhen = \"gpu.total_bytes > 1\"\nmessage = \"GPU {gpu.index}\"\n";

    #[test]
    fn errors_name_the_line_and_what_is_wrong() {
        assert!(parse(GOOD).is_ok());
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.total_bytes >")).unwrap_err();
        assert_eq!(
            (e.line, e.what.starts_with("CEL syntax error")),
            (5, true),
            "{e}"
        );
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.totl_bytes > 1")).unwrap_err();
        assert_eq!(e.line, 5);
        assert!(e.what.contains("unknown fact `gpu.totl_bytes`"), "{e}");
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.name > 1")).unwrap_err();
        assert!(e.what.starts_with("when:"), "wrong type: {e}");
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpu.total_bytes")).unwrap_err();
        assert!(e.what.contains("true or false"), "{e}");
        let e = parse(&GOOD.replace("{gpu.index}", "{gpu.nope}")).unwrap_err();
        assert_eq!(e.line, 6);
        assert!(e.what.contains("unknown fact `gpu.nope`"), "{e}");
        let e = parse(&GOOD.replace("severity = \"warn\"", "severity = \"bad\"")).unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        let e = parse(&format!("{GOOD}colour = 1\n")).unwrap_err();
        assert!(e.what.contains("colour"), "{e}");
        // The mark: `at` gives seconds, `gpu` a label, from known facts.
        assert!(
            parse(&format!(
                "{GOOD}at = \"gpu.spike_at_s\"\ngpu = \"gpu.label\"\n"
            ))
            .is_ok()
        );
        let e = parse(&format!("{GOOD}at = \"gpu.label\"\n")).unwrap_err();
        assert_eq!(e.line, 7, "{e}");
        assert!(e.what.starts_with("at: must give seconds"), "{e}");
        let e = parse(&format!("{GOOD}gpu = \"gpu.index\"\n")).unwrap_err();
        assert!(e.what.starts_with("gpu: must give a GPU's label"), "{e}");
        let e = parse(&format!("{GOOD}at = \"gpu.when\"\n")).unwrap_err();
        assert!(e.what.contains("unknown fact `gpu.when`"), "{e}");
        // Facts inside a macro are checked through the list's elements.
        assert!(
            parse(&GOOD.replace(
                "gpu.total_bytes > 1",
                "gpus.exists(g, g.job_peak_bytes > 0)"
            ))
            .is_ok()
        );
        let e = parse(&GOOD.replace("gpu.total_bytes > 1", "gpus.exists(g, g.jobpeak > 0)"))
            .unwrap_err();
        assert!(e.what.contains("gpus[].jobpeak"), "{e}");
    }

    #[test]
    fn a_guard_is_checked_for_types_not_values_at_load() {
        // The example facts have one GPU: `gpus[1]` is out of bounds there, and the guard says so.
        let guarded = GOOD
            .replace("each = \"gpu\"", "each = \"run\"")
            .replace(
                "gpu.total_bytes > 1",
                "size(gpus) > 1 && gpus[1].job_peak_bytes > 0",
            )
            .replace("{gpu.index}", "{gpus[1].job_peak_bytes}");
        assert!(parse(&guarded).is_ok(), "{:?}", parse(&guarded).err());
        // A type mistake behind the index is still found.
        let wrong = guarded.replace("gpus[1].job_peak_bytes > 0", "gpus[1].name > 0");
        assert!(parse(&wrong).unwrap_err().what.starts_with("when:"));
        let unknown = guarded.replace("gpus[1].job_peak_bytes > 0", "gpus[1].nope > 0");
        assert!(parse(&unknown).unwrap_err().what.contains("gpus[].nope"));
    }

    #[test]
    fn a_rule_that_fails_at_run_time_is_said_not_skipped() {
        let text = "id = \"ratio\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"run.job_peak_max_bytes / run.job_gpus > 0\"\nmessage = \"m\"\n";
        let rule = Rule::parse(text, "ratio.toml").unwrap();
        let set = RuleSet {
            rules: vec![rule],
            env: env(),
            words: None,
            reasons: None,
            hunt_words: None,
        };
        let (found, failed) = set.evaluate(&Facts::default());
        assert!(found.is_empty());
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0].starts_with("rule ratio:") && failed[0].contains("zero"),
            "{failed:?}"
        );
    }

    #[test]
    fn a_rules_gpu_is_a_gpu_nvml_sees_never_words_for_none() {
        let text = "id = \"g\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\ngpu = \"oom.label\"\nwhen = \"true\"\nmessage = \"m\"\n";
        let set = RuleSet {
            rules: vec![Rule::parse(text, "g.toml").unwrap()],
            env: env(),
            words: None,
            reasons: None,
            hunt_words: None,
        };
        let gpu_of = |oom: facts::OomFacts| {
            let f = Facts {
                oom,
                ..Facts::default()
            };
            set.evaluate(&f).0[0].gpu.clone()
        };
        // An OOM on no GPU that NVML sees (`an unknown GPU`, `Intel GPU 0 (XPU)`) marks none.
        assert_eq!(gpu_of(facts::OomFacts::absent()), None);
        let intel = facts::OomFacts {
            label: "Intel GPU 0 (XPU)".into(),
            ..facts::OomFacts::absent()
        };
        assert_eq!(gpu_of(intel), None);
        let merged = facts::OomFacts {
            label: "GPU 1 on node-b".into(),
            ..facts::OomFacts::absent()
        };
        assert_eq!(gpu_of(merged), Some(GpuRef::new(Some("node-b"), 1)));
    }

    #[test]
    fn a_figure_the_oom_text_did_not_give_is_unknown_never_a_number() {
        // An OOM text that named no request, no free memory and no GPU.
        let f = Facts {
            oom: facts::OomFacts::absent(),
            ..Facts::default()
        };
        let rule = |when: &str, message: &str| {
            let text = format!(
                "id = \"x\"\nseverity = \"warn\"\ntitle = \"t\"\neach = \"run\"\nwhen = \"{when}\"\nmessage = \"{message}\"\n"
            );
            let set = RuleSet {
                rules: vec![Rule::parse(&text, "x.toml").unwrap()],
                env: env(),
                words: None,
                reasons: None,
                hunt_words: None,
            };
            let (found, failed) = set.evaluate(&f);
            assert!(failed.is_empty(), "{failed:?}");
            found.first().map(|d| d.message.clone())
        };
        // A condition on an absent figure does not hold, whichever way it asks.
        assert_eq!(rule("oom.requested_bytes >= 0", "m"), None);
        assert_eq!(rule("oom.requested_bytes < 0", "m"), None);
        assert_eq!(rule("oom.gpu * 2 > oom.free_bytes", "m"), None);
        // A template says it is unknown.
        let said = rule(
            "oom.requested_bytes == null",
            "asked {oom.requested_bytes} ({fmt_bytes(oom.free_bytes)} free) on GPU {oom.gpu}",
        );
        assert_eq!(
            said.as_deref(),
            Some("asked unknown (an unknown amount free) on GPU unknown")
        );
    }

    /// A process of the job with what it held on each GPU (its own first).
    fn holding(pid: i64, held: &[(i64, i64)]) -> facts::ProcFacts {
        facts::ProcFacts {
            pid,
            cmdline: "python3 train.py".into(),
            in_job: true,
            main_gpu: Some(held[0].0),
            main_label: format!("GPU {}", held[0].0),
            main_bytes: held[0].1,
            peak_bytes: held.iter().map(|h| h.1).sum(),
            per_gpu: held
                .iter()
                .map(|&(index, bytes)| facts::OnGpu {
                    index,
                    label: format!("GPU {index}"),
                    bytes,
                })
                .collect(),
            ..Default::default()
        }
    }

    /// The bundled rule set with `id`'s file rewritten by `edit`, as a user's `--rules` folder gives it.
    fn with_edited(id: &str, edit: impl Fn(&str) -> String) -> RuleSet {
        let dir = tempfile::tempdir().unwrap();
        let (_, text) = bundled::RULES
            .iter()
            .find(|(name, _)| *name == format!("{id}.toml"))
            .unwrap();
        std::fs::write(dir.path().join(format!("{id}.toml")), edit(text)).unwrap();
        RuleSet::load(Some(dir.path()), &[]).unwrap()
    }

    fn fires(set: &RuleSet, f: &Facts, id: &str) -> Option<String> {
        let (found, failed) = set.evaluate(f);
        assert!(failed.is_empty(), "{failed:?}");
        found.into_iter().find(|d| d.rule == id).map(|d| d.message)
    }

    #[test]
    fn a_rules_folder_with_words_replaces_the_bundled_words_of_an_ooms_cause() {
        use crate::oom::cause::{Figures, Finding, Found, Holders};
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("words")).unwrap();
        let words = dir.path().join("words").join("oom-cause.toml");
        let write = |text: &str| std::fs::write(&words, text).unwrap();
        write(
            "explanation = [\n  { when = \"finding.kind == 'self_growth'\", text = \"it grew to {fmt_bytes(finding.held)}\" },\n  { when = \"true\", text = \"it ran out\" },\n]\n",
        );
        let mut r: crate::report::Report = serde_json::from_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fixtures/oom/h200/grow_oom.report.json"
        )))
        .unwrap();
        let grew = Finding::SelfGrowth {
            requested: 1 << 30,
            held: 2 << 30,
        };
        r.oom.as_mut().unwrap().finding =
            Some(Found::of(grew, &Figures::default(), &Holders::default()));
        let mut bundled = r.clone();
        apply::diagnose(&mut bundled, &RuleSet::load(None, &[]).unwrap());
        let set = RuleSet::load(Some(dir.path()), &[]).unwrap();
        apply::diagnose(&mut r, &set);
        let oom = r.oom.as_ref().unwrap();
        assert_eq!(oom.explanation, "it grew to 2.00 GiB");
        assert_ne!(bundled.oom.unwrap().explanation, oom.explanation);
        let told = r.diagnoses.iter().find(|d| d.rule == "oom-self-growth");
        assert!(
            told.unwrap().message.contains("it grew to 2.00 GiB"),
            "{told:?}"
        );
        // A words file that does not compile, or leaves a kind of finding unworded, fails at load and
        // names the user's file.
        write("explanation = [\n  { when = \"true\", text = \"{finding.\" },\n]\n");
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line),
            (words.to_str().unwrap(), 2),
            "{e}"
        );
        write("explanation = [{ when = \"finding.kind == 'fits'\", text = \"it fitted\" }]\n");
        let e = RuleSet::load(Some(dir.path()), &[]).unwrap_err();
        assert_eq!(e.file, words.to_str().unwrap(), "{e}");
        assert!(e.what.contains("finding `kv_short`"), "{e}");
    }

    #[test]
    fn a_stray_context_is_the_rules_to_tell_by_its_own_bar() {
        const GIB: i64 = 1 << 30;
        let mut f = Facts::example();
        // No rank: 3 GiB on GPU 1 beside 20 GiB on its own is more than a context (2 GiB, or a tenth).
        f.processes = vec![holding(7, &[(0, 20 * GIB), (1, 3 * GIB)])];
        let bundled = RuleSet::load(None, &[]).unwrap();
        assert_eq!(fires(&bundled, &f, "stray-context"), None);
        // The bar is the rule's: raised to 4 GiB, it tells it.
        let raised = with_edited("stray-context", |t| {
            t.replace(
                "stray_context_max_bytes = 2147483648",
                "stray_context_max_bytes = 4294967296",
            )
        });
        let tenth = with_edited("stray-context", |t| {
            t.replace("stray_context_max_pct = 10", "stray_context_max_pct = 15")
        });
        assert!(fires(&tenth, &f, "stray-context").is_some());
        assert!(
            fires(&raised, &f, "stray-context")
                .unwrap()
                .contains("also holds 3.00 GiB on GPU 1")
        );
        // A rank's own GPU is its LOCAL_RANK's device: all it holds elsewhere is stray, whatever its size.
        f.processes[0].main_by_rank = true;
        f.processes[0].rank = Some(0);
        let said = fires(&bundled, &f, "stray-context").unwrap();
        assert!(
            said.starts_with(
                "pid 7 (rank 0) works on GPU 0 (20.00 GiB) but also holds 3.00 GiB on GPU 1"
            ),
            "{said}"
        );
    }

    #[test]
    fn a_worker_holding_a_context_is_the_rules_to_tell_by_its_own_bar() {
        const MIB: i64 = 1 << 20;
        let mut f = Facts::example();
        let worker = |pid: i64, bytes: i64, cmd: &str| {
            let mut p = holding(pid, &[(0, bytes)]);
            (p.parent_pid, p.parent_holds, p.cmdline) = (Some(1), true, cmd.into());
            p
        };
        let spawned = "python3 -c from multiprocessing.spawn import spawn_main; spawn_main(fd=9)";
        f.processes = vec![
            holding(1, &[(0, 20 << 30)]),
            worker(2, 522 * MIB, spawned),
            worker(3, 1500 * MIB, "python3 worker.py"),
        ];
        let bundled = RuleSet::load(None, &[]).unwrap();
        assert_eq!(
            fires(&bundled, &f, "worker-contexts").unwrap(),
            "1 process(es) started by the job's own GPU process held a CUDA context of their own, 522.00 MiB in all: pid 2 (a multiprocessing child) 522.00 MiB on GPU 0. DataLoader workers (or other helpers) that touched CUDA each pay for a context the main process already has."
        );
        // A rank of its own (torchrun's) is no helper, nor is a child of a parent holding nothing.
        f.processes[1].rank = Some(1);
        f.processes[2].parent_holds = false;
        assert_eq!(fires(&bundled, &f, "worker-contexts"), None);
        // The bar is the rule's: raised to 2 GiB, the 1.5 GiB child of a holding parent is a helper too.
        f.processes[2].parent_holds = true;
        let raised = with_edited("worker-contexts", |t| {
            t.replace(
                "helper_max_bytes = 1073741824",
                "helper_max_bytes = 2147483648",
            )
        });
        let said = fires(&raised, &f, "worker-contexts").unwrap();
        assert!(
            said.starts_with("1 process(es)")
                && said.contains("pid 3 (python3 worker.py) 1.46 GiB on GPU 0"),
            "{said}"
        );
    }

    #[test]
    fn a_stray_context_without_a_rank_is_named_by_its_command_not_rank_minus_one() {
        let set = RuleSet::load(None, &[]).unwrap();
        let said = |rank: Option<i64>| {
            let mut f = Facts::example();
            f.processes = vec![facts::ProcFacts {
                pid: 7,
                cmdline: "python3 train.py".into(),
                in_job: true,
                rank,
                main_gpu: Some(0),
                main_bytes: 4 << 30,
                per_gpu: [(0, 4 << 30), (1, 500 << 20)]
                    .map(|(index, bytes)| facts::OnGpu {
                        index,
                        label: format!("GPU {index}"),
                        bytes,
                    })
                    .into(),
                ..Default::default()
            }];
            let (found, _) = set.evaluate(&f);
            let d = found.iter().find(|d| d.rule == "stray-context").unwrap();
            d.message.clone()
        };
        assert!(
            said(None).starts_with("pid 7 (python3 train.py) works on GPU 0"),
            "{}",
            said(None)
        );
        assert!(
            said(Some(3)).starts_with("pid 7 (rank 3) works on GPU 0"),
            "{}",
            said(Some(3))
        );
    }

    #[test]
    fn thousands_of_processes_are_each_diagnosed_without_error() {
        // Each of the per-process rules evaluated once per process entry. How the cost grows with the
        // entries (100,000 took hours when every item re-serialized every fact) is a benchmark's to say:
        // `cargo bench --bench diagnose` prints it up to 100,000 (25 s of this suite when run here).
        let set = RuleSet::load(None, &[]).unwrap();
        let mut f = Facts::example();
        f.processes = (0..2_000)
            .map(|pid| facts::ProcFacts {
                pid,
                in_job: true,
                ..Default::default()
            })
            .collect();
        let (found, failed) = set.evaluate(&f);
        assert!(failed.is_empty(), "{failed:?}");
        assert!(found.iter().all(|d| d.rule != "stray-context"));
    }

    #[test]
    fn every_fact_is_documented_and_every_documented_fact_exists() {
        // The facts' paths; a documented fact that is an object is a record (`process.why`,
        // `torch.leak_hunt`), one fact: its fields are the record's (`facts::records`).
        fn paths(
            v: &serde_json::Value,
            prefix: &str,
            documented: &[String],
            out: &mut Vec<String>,
        ) {
            match v {
                serde_json::Value::Object(o) => {
                    for (k, x) in o {
                        let p = if prefix.is_empty() {
                            k.clone()
                        } else {
                            format!("{prefix}.{k}")
                        };
                        if x.is_object() && !documented.contains(&p) {
                            paths(x, &p, documented, out)
                        } else {
                            out.push(p)
                        }
                    }
                }
                _ => out.push(prefix.to_string()),
            }
        }
        let documented: Vec<String> = facts::documented().into_iter().map(|d| d.0).collect();
        let ex = serde_json::to_value(Facts::example()).unwrap();
        let mut have = Vec::new();
        for (name, alias) in [("run", "run"), ("oom", "oom")] {
            paths(&ex[name], alias, &documented, &mut have);
        }
        for (list, alias) in [
            ("gpus", "gpu"),
            ("processes", "process"),
            ("torch_processes", "torch"),
        ] {
            paths(&ex[list][0], alias, &documented, &mut have);
        }
        for p in &have {
            assert!(
                documented.contains(p),
                "fact {p} has no doc comment in rules/facts/"
            );
        }
        for d in &documented {
            assert!(
                have.iter().any(|p| p == d),
                "rules/facts/ documents {d}, which rules cannot read"
            );
        }
    }

    #[test]
    fn a_frameworks_live_memory_is_named_by_its_noun_and_readings_are_not_steps() {
        use crate::torch::framework::Framework;
        const GIB: i64 = 1 << 30;
        let set = RuleSet::load(None, &[]).unwrap();
        let said = |fw: Framework| {
            let mut f = Facts::example();
            f.run.server = None;
            let t = &mut f.torch_processes[0];
            (t.framework, t.noun) = (fw.name().into(), fw.noun().into());
            (t.counts_steps, t.preallocated) = (fw.counts_steps(), false);
            (t.steady_reserved_bytes, t.steady_peak_allocated_bytes) = (Some(8 * GIB), GIB);
            t.allocated_peak_bytes = GIB;
            let (found, failed) = set.evaluate(&f);
            assert!(failed.is_empty(), "{failed:?}");
            found
                .into_iter()
                .find(|d| d.rule == "cache-bloat")
                .unwrap()
                .message
        };
        let live = |fw| {
            said(fw)
                .split(" reserved while ")
                .nth(1)
                .unwrap()
                .to_string()
        };
        let says = |fw, words: &str| {
            let s = live(fw);
            assert!(s.starts_with(words), "{fw:?}: {s}");
        };
        says(
            Framework::Cupy,
            "live arrays peaked at 1.00 GiB in its readings",
        );
        says(
            Framework::Rmm,
            "live allocations peaked at 1.00 GiB in its readings",
        );
        says(Framework::Torch, "live tensors peaked at 1.00 GiB per step");
        // TensorFlow's are tensors, as jax-preallocation and step-leak call them.
        says(
            Framework::Tensorflow,
            "live tensors peaked at 1.00 GiB per step",
        );
    }

    #[test]
    fn a_holder_is_a_pid_host_who_and_bytes_and_no_gpu_no_list_gives() {
        let e = parse(&GOOD.replace(
            "GPU {gpu.index}",
            "{gpu.others_list.map(p, p.gpu).join(', ')}",
        ))
        .unwrap_err();
        assert!(
            e.what.contains("unknown fact `gpu.others_list[].gpu`"),
            "{e}"
        );
        let h = serde_json::to_value(&Facts::example().gpus[0].others_list[0]).unwrap();
        let fields: Vec<&str> = h.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(fields, ["bytes", "host", "pid", "who"]);
    }

    #[test]
    fn every_rule_file_is_bundled() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/rules");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".toml"))
            .collect();
        files.sort();
        let bundled: Vec<String> = bundled::RULES.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            files, bundled,
            "src/rules/bundled.rs must list every file in rules/"
        );
    }
}
