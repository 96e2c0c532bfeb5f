//! The run so far: what the samplers have published, analyzed by the same pure stage as the end of the
//! run (`analysis::analyze_so_far`). The live verdicts and each `--metrics` scrape read it. The looks
//! keep their own copy of the NVML timeline and of the framework view, which each look brings up to date
//! with what is new since the last one, and what the analysis has read of them ([`Running`]): no look
//! copies the whole timeline. One figure is read again from a process's start: its longest stretch high
//! (`high_s`), whose bar is half-way to its peak, when that peak rose since the last look (in a leak,
//! nearly every look: 1.1-1.4 ms a look on a 3-day trace, bench/README.md).

use crate::analysis::{self, Evidence};
use crate::gpu::NvmlStatus;
use crate::oom::scan::Scanner;
use crate::origin::Origin;
use crate::report::Report;
use crate::rules::{RuleSet, RunRules};
use crate::sample::Rates;
use crate::timeline::Timeline;
use crate::timeline::running::Running;
use crate::torch::TorchTimeline;
use std::sync::{Arc, Mutex};

/// Brings a copy of the timeline up to date ([`Timeline::catch_up`]); gives NVML's status.
pub type CatchUp = Box<dyn Fn(&mut Timeline) -> Option<NvmlStatus> + Send + Sync>;

/// What a look at the run so far reads.
pub struct Sources {
    pub timeline: CatchUp,
    pub torch: Option<Arc<Mutex<TorchTimeline>>>,
    pub scanner: Arc<Mutex<Scanner>>,
    pub rules: Arc<RunRules>,
    pub origin: Origin,
    pub command: Vec<String>,
    pub started_unix_s: f64,
    pub rates: Rates,
    /// What the looks keep between them.
    pub seen: Mutex<Looks>,
}

/// What the looks at a run in progress keep between them: their copy of the timeline and of the
/// framework view, and what the analysis has read of them.
#[derive(Default)]
pub struct Looks {
    pub timeline: Timeline,
    pub torch: TorchTimeline,
    pub read: Running,
}

impl Sources {
    /// The run so far, analyzed and diagnosed.
    pub fn report(&self) -> Report {
        let mut seen = self.seen.lock().unwrap();
        let seen = &mut *seen;
        let nvml = (self.timeline)(&mut seen.timeline);
        if let Some(t) = &self.torch {
            seen.torch.catch_up(&t.lock().unwrap());
        }
        let scanner = self.scanner.lock().unwrap().findings();
        seen.analyze(
            |timeline, torch| Evidence {
                origin: self.origin.clone(),
                command: self.command.clone(),
                started_unix_s: self.started_unix_s,
                nvml: nvml.unwrap_or_default(),
                rates: self.rates,
                timeline,
                torch: self.torch.is_some().then_some(torch),
                scanner,
                ..Evidence::default()
            },
            self.rules.get(),
        )
    }
}

impl Looks {
    /// One look: the evidence `evidence` makes of the looks' copies (lent to it, then kept again),
    /// analyzed from where the last look's reading stopped.
    pub fn analyze(
        &mut self,
        evidence: impl FnOnce(Timeline, TorchTimeline) -> Evidence,
        rules: &RuleSet,
    ) -> Report {
        let ev = evidence(
            std::mem::take(&mut self.timeline),
            std::mem::take(&mut self.torch),
        );
        let report = analysis::analyze_so_far(&ev, &mut self.read, rules);
        self.timeline = ev.timeline;
        self.torch = ev.torch.unwrap_or_default();
        report
    }
}
