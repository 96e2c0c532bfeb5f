//! `--tensorboard DIR`: the run's memory as TensorBoard scalars, in an event file of its own run
//! (`DIR/gpudoc/`), so it sits next to the program's own curves and never touches its files. The job's
//! memory per GPU over time (step: milliseconds since the start), and the framework's (PyTorch's, JAX's, ...:
//! the tag says whose) allocated, reserved and
//! per-step peaks keyed by optimizer step, so they line up with the training curves. The records are
//! TFRecord framing (length, masked CRC-32C) around `Event` protocol buffers (prost).

use crate::report::Report;
use crate::timeline::Timeline;
use prost::Message;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Points kept per time series (the largest of each slice of the run).
const POINTS: usize = 1000;
const GIB: f64 = (1u64 << 30) as f64;

#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, tag = "2")]
    simple_value: f32,
}

/// One scalar point: its tag, step, time since the start and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub tag: String,
    pub step: i64,
    pub at_s: f64,
    pub value: f64,
}

/// The points of a run: `timeline` (the run's own, at full resolution) when there is one, else the
/// report's per-GPU summary.
pub fn points(r: &Report, timeline: Option<&Timeline>) -> Vec<Point> {
    let mut out = Vec::new();
    for g in &r.gpus {
        if g.job_peak_bytes == 0 {
            continue;
        }
        let host = g
            .host
            .as_deref()
            .map(|h| format!("{h}/"))
            .unwrap_or_default();
        let tag = format!("gpudoc/{host}gpu{}/job_memory_GiB", g.index);
        let series: Vec<(f64, u64)> = match timeline.and_then(|t| {
            t.gpus
                .iter()
                .find(|x| x.info.index == g.index && g.host.is_none())
        }) {
            Some(t) => {
                let end = (r.duration_s * 1e6) as u64;
                let step = (end / POINTS as u64).max(1);
                t.job
                    .bucket_max(end, POINTS)
                    .into_iter()
                    .enumerate()
                    .map(|(k, v)| ((k as u64 * step) as f64 / 1e6, v))
                    .collect()
            }
            None => g.job_timeline.clone(),
        };
        for (t, v) in series {
            out.push(Point {
                tag: tag.clone(),
                step: (t * 1000.0).round() as i64,
                at_s: t,
                value: v as f64 / GIB,
            });
        }
    }
    for p in &r.torch.processes {
        let host = p
            .host
            .as_deref()
            .map(|h| format!("{h}/"))
            .unwrap_or_default();
        let who = match p
            .rank
            .as_ref()
            .and_then(|v| v.as_i64().or_else(|| v.as_str()?.parse().ok()))
        {
            Some(rank) => format!("rank{rank}"),
            None => format!("pid{}", p.pid),
        };
        // Tagged by whose allocator (`torch`, `jax`, ...); what it does not say (TensorFlow's reserved
        // memory) has no tag.
        let fw = p.framework.id();
        for s in &p.steps {
            for (name, v) in [
                ("allocated_GiB", Some(s.allocated_bytes)),
                ("reserved_GiB", s.reserved_bytes),
                ("step_peak_allocated_GiB", Some(s.peak_allocated_bytes)),
                ("step_peak_reserved_GiB", s.peak_reserved_bytes),
            ] {
                let Some(v) = v else { continue };
                out.push(Point {
                    tag: format!(
                        "gpudoc/{host}{fw}/{who}/gpu{}/{name}",
                        p.gpu.unwrap_or(p.device)
                    ),
                    step: s.step as i64,
                    at_s: s.at_s,
                    value: v as f64 / GIB,
                });
            }
        }
    }
    out
}

/// A TFRecord: length, its masked CRC, the data, the data's masked CRC.
fn record(data: &[u8]) -> Vec<u8> {
    let mask = |c: u32| (c.rotate_right(15)).wrapping_add(0xa282_ead8);
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&mask(crc32c::crc32c(&len)).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&mask(crc32c::crc32c(data)).to_le_bytes());
    out
}

/// The event file's bytes: the version event, then one event per point.
pub fn encode(points: &[Point], start_unix_s: f64) -> Vec<u8> {
    let mut out = record(
        &Event {
            wall_time: start_unix_s,
            step: 0,
            what: Some(What::FileVersion("brain.Event:2".into())),
        }
        .encode_to_vec(),
    );
    for p in points {
        let e = Event {
            wall_time: start_unix_s + p.at_s,
            step: p.step,
            what: Some(What::Summary(Summary {
                value: vec![SummaryValue {
                    tag: p.tag.clone(),
                    simple_value: p.value as f32,
                }],
            })),
        };
        out.extend(record(&e.encode_to_vec()));
    }
    out
}

/// Writes the run's event file into `dir/gpudoc/` (created); its path.
pub fn write(dir: &Path, r: &Report, timeline: Option<&Timeline>) -> std::io::Result<PathBuf> {
    let run = dir.join("gpudoc");
    std::fs::create_dir_all(&run)?;
    let host = if r.origin.host.is_empty() {
        "merged".to_string()
    } else {
        r.origin.host.replace(['/', '.'], "_")
    };
    let name = format!(
        "events.out.tfevents.{}.{host}.{}.gpudoc",
        r.started_unix_s as u64,
        std::process::id()
    );
    let path = run.join(name);
    let bytes = encode(&points(r, timeline), r.started_unix_s);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    f.write_all(&bytes)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the records back, checking both CRCs of each.
    fn records(mut b: &[u8]) -> Vec<Event> {
        let mask = |c: u32| (c.rotate_right(15)).wrapping_add(0xa282_ead8);
        let mut out = Vec::new();
        while !b.is_empty() {
            let len = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            let lcrc = u32::from_le_bytes(b[8..12].try_into().unwrap());
            assert_eq!(lcrc, mask(crc32c::crc32c(&b[..8])));
            let data = &b[12..12 + len];
            let dcrc = u32::from_le_bytes(b[12 + len..16 + len].try_into().unwrap());
            assert_eq!(dcrc, mask(crc32c::crc32c(data)));
            out.push(Event::decode(data).unwrap());
            b = &b[16 + len..];
        }
        out
    }

    #[test]
    fn events_round_trip_through_their_framing() {
        let p = Point {
            tag: "gpudoc/gpu0/job_memory_GiB".into(),
            step: 1500,
            at_s: 1.5,
            value: 2.5,
        };
        let ev = records(&encode(&[p], 1000.0));
        assert_eq!(ev.len(), 2);
        assert_eq!(ev[0].what, Some(What::FileVersion("brain.Event:2".into())));
        assert_eq!((ev[1].wall_time, ev[1].step), (1001.5, 1500));
        let Some(What::Summary(s)) = &ev[1].what else {
            panic!("{:?}", ev[1])
        };
        assert_eq!(s.value[0].tag, "gpudoc/gpu0/job_memory_GiB");
        assert_eq!(s.value[0].simple_value, 2.5);
    }
}
