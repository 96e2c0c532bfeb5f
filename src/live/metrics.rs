//! `gpudoc run --metrics`: each scrape analyzes the run so far ([`Sources`]) into a [`View`], with what
//! the live verdicts told and forecast; at the end, the final report's view is served for
//! `--metrics-linger`.

use super::so_far::Sources;
use super::verdicts::Verdicts;
use crate::metrics::View;
use crate::report::Report;
use crate::serve::{Server, Source};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Diagnoses seen since the start, and the view of the finished run once there is one.
#[derive(Default)]
struct State {
    known: crate::metrics::Episodes,
    last: Option<View>,
}

pub struct Metrics {
    server: Server,
    state: Arc<Mutex<State>>,
}

impl Metrics {
    /// Serves the run so far, with what the live verdicts have told.
    pub fn start(
        addr: SocketAddr,
        sources: Arc<Sources>,
        verdicts: Arc<Mutex<Verdicts>>,
    ) -> Result<Metrics, String> {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let source: Source = Arc::new(move || {
            if let Some(v) = st.lock().unwrap().last.clone() {
                return v;
            }
            let mut r = sources.report();
            verdicts.lock().unwrap().annotate(&mut r);
            let mut v = View::of_report(&r, &sources.origin.host, sources.origin.name.as_deref());
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
