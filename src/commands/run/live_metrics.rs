//! `gpudoc run --metrics`: each scrape analyzes the run so far (the same pure stage as the end of the run,
//! on copies of what the samplers published) into a [`View`]; at the end, the final report's view is
//! served for `--metrics-linger`.

use crate::analysis::{self, Evidence};
use crate::gpu::NvmlStatus;
use crate::metrics::View;
use crate::oom::scan::Scanner;
use crate::origin::Origin;
use crate::report::Report;
use crate::rules::RunRules;
use crate::sample::Rates;
use crate::serve::{Server, Source};
use crate::timeline::Timeline;
use crate::torch::TorchTimeline;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a scrape reads.
pub struct Sources {
    pub timeline: Box<dyn Fn() -> (Timeline, Option<NvmlStatus>) + Send + Sync>,
    pub torch: Option<Arc<Mutex<TorchTimeline>>>,
    pub scanner: Arc<Mutex<Scanner>>,
    pub rules: Arc<RunRules>,
    pub origin: Origin,
    pub command: Vec<String>,
    pub started_unix_s: f64,
    pub rates: Rates,
}

/// Diagnoses seen since the start, and the view of the finished run once there is one.
#[derive(Default)]
struct State {
    known: BTreeMap<(String, String), String>,
    last: Option<View>,
}

pub struct Metrics {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl Sources {
    /// The run so far, analyzed.
    fn view(&self) -> View {
        let (timeline, nvml) = (self.timeline)();
        let torch = self.torch.as_ref().map(|t| t.lock().unwrap().clone());
        let scanner = self.scanner.lock().unwrap().findings();
        let ev = Evidence {
            origin: self.origin.clone(),
            command: self.command.clone(),
            started_unix_s: self.started_unix_s,
            outcome: None,
            nvml: nvml.unwrap_or_default(),
            rates: self.rates,
            timeline,
            torch,
            scanner,
            host: Default::default(),
            leftovers: Vec::new(),
            ended: Vec::new(),
            notes: Vec::new(),
            self_usage: (0.0, 0),
        };
        let report = analysis::analyze(ev, self.rules.get());
        View::of_report(&report, &self.origin.host, self.origin.name.as_deref())
    }
}

impl Metrics {
    pub fn start(addr: SocketAddr, sources: Sources) -> Result<Metrics, String> {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let source: Source = Arc::new(move || {
            if let Some(v) = st.lock().unwrap().last.clone() {
                return v;
            }
            let mut v = sources.view();
            v.count_new(&mut st.lock().unwrap().known);
            v
        });
        Ok(Metrics {
            server: Server::start(addr, source)?,
            state,
        })
    }

    /// Serves the finished run's view for `linger` (less if gpudoc is asked to end), then stops.
    pub fn finish(self, report: &Report, linger: Duration) {
        {
            let mut st = self.state.lock().unwrap();
            let mut v = View::of_report(report, &report.origin.host, report.origin.name.as_deref());
            v.count_new(&mut st.known);
            st.last = Some(v);
        }
        crate::supervise::linger(linger);
        self.server.stop();
    }

    /// Stops at once (the command could not start).
    pub fn stop(self) {
        self.server.stop();
    }
}
