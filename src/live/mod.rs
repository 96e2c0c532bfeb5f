//! What gpudoc does while a run goes on, all in one place: the status line on the terminal ([`line`]),
//! the looks at the run so far ([`so_far`]: the sampler's timeline taken into the looks' own copy, only
//! what is new since the last look, and analyzed by the same pure stage as the run's end), the rules'
//! verdicts told during the run ([`verdicts`], decided; [`telling`], the thread that looks and says them;
//! [`forecast`], when a GPU will be full), `--metrics` served while it runs ([`metrics`]), and a recorded
//! run's live verdicts judged again (`gpudoc report --live-verdicts`, [`replay`]).

pub mod forecast;
pub mod line;
pub mod metrics;
pub mod replay;
pub mod so_far;
pub mod telling;
pub mod verdicts;

pub use line::Live;
