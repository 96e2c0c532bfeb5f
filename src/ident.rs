//! Who and where, as typed values: a GPU ([`GpuRef`]) and a process ([`ProcRef`]), each on its host in a
//! report merged from several nodes. Code compares these, never the words a message names them by; their
//! `Display` is those words (`GPU 0 on node-a`, `pid 42 on node-a`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// A GPU: NVML's index on its host (`None`: the one machine of a run not merged from several).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuRef {
    pub host: Option<String>,
    pub index: u32,
}

impl GpuRef {
    pub fn new(host: Option<&str>, index: u32) -> GpuRef {
        GpuRef {
            host: host.map(String::from),
            index,
        }
    }

    /// A GPU from its label (`GPU 0`, `GPU 0 on node-a`); `None` for words that name no GPU NVML sees
    /// (`Intel GPU 0 (XPU)`, `an unknown GPU`).
    pub fn parse(label: &str) -> Option<GpuRef> {
        let rest = label.strip_prefix("GPU ")?;
        let (index, host) = match rest.split_once(" on ") {
            Some((i, h)) if !h.is_empty() => (i, Some(h)),
            Some(_) => return None,
            None => (rest, None),
        };
        let index = index.parse().ok()?;
        Some(GpuRef::new(host, index))
    }

    /// The label of a GPU that may be unknown: `an unknown GPU` for none.
    pub fn label(gpu: Option<&GpuRef>) -> String {
        gpu.map_or_else(|| "an unknown GPU".into(), GpuRef::to_string)
    }
}

/// How messages name a GPU: `GPU 0`, `GPU 0 on node-a` in a merged report.
impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(h) => write!(f, "GPU {} on {h}", self.index),
            None => write!(f, "GPU {}", self.index),
        }
    }
}

/// A process: its PID on its host (`None`: a run not merged from several).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcRef {
    pub host: Option<String>,
    pub pid: u32,
}

impl ProcRef {
    pub fn new(host: Option<&str>, pid: u32) -> ProcRef {
        ProcRef {
            host: host.map(String::from),
            pid,
        }
    }
}

/// How messages name a process: `pid 42`, `pid 42 on node-a` in a merged report.
impl fmt::Display for ProcRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Some(h) => write!(f, "pid {} on {h}", self.pid),
            None => write!(f, "pid {}", self.pid),
        }
    }
}

/// A GPU in a saved report is its label (`"GPU 0 on node-a"`), as reports before typed GPUs wrote it; a
/// label that names no GPU NVML sees reads as none.
pub mod gpu_label {
    use super::*;

    pub fn serialize<S: Serializer>(gpu: &Option<GpuRef>, s: S) -> Result<S::Ok, S::Error> {
        gpu.as_ref().map(GpuRef::to_string).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<GpuRef>, D::Error> {
        let label: Option<String> = Option::deserialize(d)?;
        Ok(label.as_deref().and_then(GpuRef::parse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_reads_back_from_the_words_that_name_it() {
        for g in [GpuRef::new(None, 0), GpuRef::new(Some("node-a"), 7)] {
            assert_eq!(GpuRef::parse(&g.to_string()), Some(g));
        }
        assert_eq!(
            GpuRef::new(Some("node-a"), 7).to_string(),
            "GPU 7 on node-a"
        );
        for words in [
            "Intel GPU 0 (XPU)",
            "an unknown GPU",
            "GPU x",
            "GPU 1 on ",
            "GPU -1",
        ] {
            assert_eq!(GpuRef::parse(words), None, "{words}");
        }
        assert_eq!(GpuRef::label(None), "an unknown GPU");
    }

    #[test]
    fn processes_are_named_with_their_host_only_in_merged_reports() {
        assert_eq!(ProcRef::new(None, 42).to_string(), "pid 42");
        assert_eq!(ProcRef::new(Some("n"), 42).to_string(), "pid 42 on n");
    }
}
