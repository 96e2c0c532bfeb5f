//! The run so far: what the samplers have published, analyzed by the same pure stage as the end of the
//! run (`analysis::analyze_so_far`). The live verdicts and each `--metrics` scrape read it. The NVML
//! timeline is kept in a copy that each look brings up to date with the samples since the last one: no
//! look copies the whole timeline.

use crate::analysis::{self, Evidence};
use crate::gpu::NvmlStatus;
use crate::oom::scan::Scanner;
use crate::origin::Origin;
use crate::report::Report;
use crate::rules::RunRules;
use crate::sample::Rates;
use crate::timeline::Timeline;
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
    /// The looks' copy of the timeline.
    pub seen: Mutex<Timeline>,
}

impl Sources {
    /// The run so far, analyzed and diagnosed.
    pub fn report(&self) -> Report {
        let mut seen = self.seen.lock().unwrap();
        let nvml = (self.timeline)(&mut seen);
        let torch = self.torch.as_ref().map(|t| t.lock().unwrap().clone());
        let scanner = self.scanner.lock().unwrap().findings();
        let ev = Evidence {
            origin: self.origin.clone(),
            command: self.command.clone(),
            started_unix_s: self.started_unix_s,
            nvml: nvml.unwrap_or_default(),
            rates: self.rates,
            timeline: std::mem::take(&mut *seen),
            torch,
            scanner,
            ..Evidence::default()
        };
        let report = analysis::analyze_so_far(&ev, self.rules.get());
        *seen = ev.timeline;
        report
    }
}
