//! The rules of a run, compiled beside the command instead of before it. Compiling the bundled rules'
//! CEL is most of gpudoc's start (about 9 ms on the H200 host, more on a small machine), and a run needs
//! its rules only once the command has ended. Only what cannot fail is deferred: the bundled rules (the
//! tests compile each) less those `--disable-rule` names, checked at once against the bundled ids. A
//! folder's rules (`--rules DIR`) are loaded before the command starts, so their errors come first.

use super::{RuleError, RuleSet, bundled};
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

/// The rules in force for a run: loaded, or to be compiled on a thread of their own once [`start`]ed.
///
/// [`start`]: RunRules::start
pub struct RunRules {
    /// The ids of the rules judged during the run, known before they are compiled.
    live: Vec<String>,
    ready: OnceLock<Arc<RuleSet>>,
    pending: Mutex<Pending>,
}

impl std::fmt::Debug for RunRules {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.ready.get() {
            Some(set) => set.fmt(f),
            None => f.write_str("RunRules(compiled beside the command)"),
        }
    }
}

enum Pending {
    /// The bundled rules less these, not started yet.
    Bundled(Vec<String>),
    Compiling(JoinHandle<RuleSet>),
    Done,
}

impl RunRules {
    /// The bundled rules, a folder's on top, less the disabled ones; everything that can be wrong with
    /// them is reported here.
    pub fn load(dir: Option<&Path>, disabled: &[String]) -> Result<RunRules, RuleError> {
        if dir.is_some() {
            return Ok(RunRules::ready(RuleSet::load(dir, disabled)?));
        }
        let ids: Vec<&str> = bundled::RULES
            .iter()
            .map(|(name, _)| bundled_id(name))
            .collect();
        super::check_disabled(&ids, disabled)?;
        Ok(RunRules {
            live: bundled_live(disabled),
            ready: OnceLock::new(),
            pending: Mutex::new(Pending::Bundled(disabled.to_vec())),
        })
    }

    /// Rules already loaded.
    pub fn ready(set: RuleSet) -> RunRules {
        RunRules {
            live: set.live_ids(),
            ready: OnceLock::from(Arc::new(set)),
            pending: Mutex::new(Pending::Done),
        }
    }

    /// The ids of the rules judged during the run (`live = true`).
    pub fn live_ids(&self) -> &[String] {
        &self.live
    }

    /// Starts compiling the deferred rules on a thread of their own (once threads may start: after the
    /// guard has split off).
    pub fn start(&self) {
        let mut p = self.pending.lock().unwrap();
        if let Pending::Bundled(disabled) = &*p {
            let disabled = disabled.clone();
            // Without a thread to be had, they are compiled when first needed.
            if let Ok(t) = std::thread::Builder::new()
                .name("gpudoc-rules".into())
                .spawn(move || compile_bundled(&disabled))
            {
                *p = Pending::Compiling(t);
            }
        }
    }

    /// The rule set, waiting for its compilation if it is still running (compiling it here if it was
    /// never started).
    pub fn get(&self) -> &Arc<RuleSet> {
        self.ready.get_or_init(|| {
            let pending = std::mem::replace(&mut *self.pending.lock().unwrap(), Pending::Done);
            Arc::new(match pending {
                Pending::Bundled(disabled) => compile_bundled(&disabled),
                Pending::Compiling(t) => t
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                Pending::Done => unreachable!("a loaded rule set is set when it is made"),
            })
        })
    }
}

/// The ids of the bundled rules judged during the run (`live = true`), less `disabled`, read from their
/// files' `live` key without compiling them.
fn bundled_live(disabled: &[String]) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Live {
        #[serde(default)]
        live: bool,
    }
    bundled::RULES
        .iter()
        .filter(|(_, text)| toml::from_str::<Live>(text).is_ok_and(|l| l.live))
        .map(|(name, _)| bundled_id(name).to_string())
        .filter(|id| !disabled.contains(id))
        .collect()
}

/// A bundled rule's id: its file's name (a test holds them to it).
fn bundled_id(file: &str) -> &str {
    file.strip_suffix(".toml").unwrap_or(file)
}

fn compile_bundled(disabled: &[String]) -> RuleSet {
    // The bundled rules compile (a test checks each) and the disabled ids were checked at load.
    RuleSet::load(None, disabled).unwrap_or_else(|e| panic!("a bundled rule failed to load: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_rule_ids_are_their_file_names() {
        for (name, text) in bundled::RULES {
            let rule = super::super::Rule::parse(text, name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(rule.id, bundled_id(name), "{name}");
        }
    }

    #[test]
    fn deferred_rules_are_the_bundled_ones_less_the_disabled() {
        let deferred = RunRules::load(None, &["cache-bloat".into()]).unwrap();
        deferred.start();
        let now = RuleSet::load(None, &["cache-bloat".into()]).unwrap();
        let ids = |s: &RuleSet| s.rules.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(deferred.get()), ids(&now));
        assert!(!ids(&now).contains(&"cache-bloat".to_string()));
        // Never started: compiled when first needed.
        let lazy = RunRules::load(None, &[]).unwrap();
        assert_eq!(lazy.get().rules.len(), bundled::RULES.len());
    }

    #[test]
    fn live_rules_are_known_before_and_after_compiling() {
        let deferred = RunRules::load(None, &["near-capacity".into()]).unwrap();
        let before = deferred.live_ids().to_vec();
        assert!(before.contains(&"step-leak".to_string()), "{before:?}");
        assert!(!before.contains(&"near-capacity".to_string()));
        assert!(!before.contains(&"oom-cap".to_string()));
        deferred.get();
        assert_eq!(
            deferred.live_ids(),
            RunRules::ready(RuleSet::load(None, &["near-capacity".into()]).unwrap()).live_ids()
        );
    }

    #[test]
    fn an_unknown_disabled_rule_is_refused_at_once() {
        let e = RunRules::load(None, &["no-such-rule".into()])
            .err()
            .unwrap();
        assert!(e.to_string().contains("no rule `no-such-rule`"), "{e}");
        // A rule that became a variant of another names where it went.
        let e = RunRules::load(None, &["oom-training-step".into()])
            .err()
            .unwrap();
        assert!(
            e.to_string()
                .contains("`oom-training-step`: it is one of the variants of `oom-self-growth`"),
            "{e}"
        );
    }
}
