//! Parsing one line of a program's output that reports running out of GPU memory: PyTorch's caching
//! allocator (every format since 1.x), CUDA runtime and driver errors, cuBLAS/cuDNN allocation failures,
//! NCCL, JAX/XLA and TensorFlow. A field that is not in the text stays `None` and the parse is marked
//! incomplete: a truncated or garbled text never yields a made-up number.

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// Which layer reported the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// PyTorch's caching allocator (`CUDA out of memory. Tried to allocate ...`).
    TorchAllocator,
    /// The CUDA runtime or driver (`CUDA error: out of memory`), e.g. at context creation.
    CudaRuntime,
    /// A CUDA library failing to allocate its workspace or handle (cuBLAS, cuDNN).
    CudaLibrary,
    /// NCCL (`Cuda failure 'out of memory'`).
    Nccl,
    /// JAX / XLA (`RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...`).
    Xla,
    /// TensorFlow (`OOM when allocating tensor with shape[...]`).
    Tensorflow,
}

/// Another process named in the text as holding memory on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextProcess {
    pub pid: u32,
    pub bytes: u64,
}

/// What one OOM text says. Sizes are the text's figures in bytes (PyTorch prints two decimals, so a
/// figure is exact to half a unit of what it printed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomText {
    pub kind: Kind,
    /// The text's layout: `torch>=2.1`, `torch<2.1`, `torch<1.4` (`cached`), or the kind's name.
    pub format: String,
    /// The exception or error class the text was raised as (`torch.OutOfMemoryError`).
    pub exception: Option<String>,
    pub gpu: Option<u32>,
    pub requested_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// `X allowed;` (a memory fraction is set).
    pub allowed_bytes: Option<u64>,
    /// `this process has X memory in use`, non-PyTorch memory included.
    pub process_bytes: Option<u64>,
    /// Memory in live tensors (`allocated by PyTorch`, older `already allocated`).
    pub allocated_bytes: Option<u64>,
    /// Memory PyTorch's cache holds in all (older `reserved in total by PyTorch` / `cached`; newer texts:
    /// allocated + reserved-but-unallocated).
    pub reserved_bytes: Option<u64>,
    /// Cached by PyTorch but not in live tensors (newer texts; older: reserved − allocated).
    pub reserved_unallocated_bytes: Option<u64>,
    /// `with X allocated in private pools (e.g., CUDA Graphs)`.
    pub private_pools_bytes: Option<u64>,
    /// `Process N has X memory in use.` entries.
    pub other_processes: Vec<TextProcess>,
    /// TensorFlow: the tensor's shape and dtype.
    pub tensor: Option<String>,
    /// Every field this kind of text carries was found.
    pub complete: bool,
}

const SIZE: &str = r"(\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b";

fn re(s: &str) -> Regex {
    Regex::new(&s.replace("SIZE", SIZE)).expect("a valid built-in pattern")
}

static TORCH: LazyLock<Regex> = LazyLock::new(|| {
    re(r"(?i:out of memory)\. Tried to allocate SIZE|OutOfMemoryError: Tried to allocate SIZE")
});
static NEW_TOTAL: LazyLock<Regex> =
    LazyLock::new(|| re(r"GPU (\d+) has a total (capacity|capacty) of SIZE of which SIZE is free"));
static OLD_PAREN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\(GPU (\d+); SIZE total capacity; SIZE already allocated; SIZE free; (?:SIZE allowed; )?SIZE (reserved in total by PyTorch|cached)\)",
    )
});
static PROCESS: LazyLock<Regex> = LazyLock::new(|| re(r"Process (\d+) has SIZE memory in use"));
static THIS_PROCESS: LazyLock<Regex> = LazyLock::new(|| re(r"this process has SIZE memory in use"));
static ALLOWED: LazyLock<Regex> = LazyLock::new(|| re(r"SIZE allowed;"));
static OF_ALLOCATED: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Of the allocated memory SIZE is allocated by PyTorch, (?:with SIZE allocated in private pools \(e\.g\., CUDA Graphs\), )?and SIZE is reserved by PyTorch but unallocated",
    )
});
static CUDA_RUNTIME: LazyLock<Regex> =
    LazyLock::new(|| re(r"CUDA (?:driver )?error: out of memory|CUDA_ERROR_OUT_OF_MEMORY"));
static CUDA_LIBRARY: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT)_STATUS_ALLOC_FAILED\b"));
static NCCL: LazyLock<Regex> = LazyLock::new(|| re(r"Cuda failure (?:\d+ )?'out of memory'"));
static XLA: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"RESOURCE_EXHAUSTED: Out of memory (?:while trying to allocate|allocating) (?:(\d+) bytes|SIZE)",
    )
});
static XLA_DEVICE: LazyLock<Regex> = LazyLock::new(|| re(r"on device (\d+)|GPU_(\d+)_bfc"));
static TF: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"OOM when allocating tensor with shape\[([\d,\s]*)\] and type (\w+) on [^\s]*?device:GPU:(\d+)",
    )
});
static EXCEPTION: LazyLock<Regex> =
    LazyLock::new(|| re(r"([A-Za-z_][\w.]*(?:Error|Exception))\s*:\s*$"));

/// `29.29`, `GiB` → bytes.
pub fn size_bytes(num: &str, unit: &str) -> Option<u64> {
    let n: f64 = num.parse().ok()?;
    let shift = match unit {
        "bytes" | "B" => 0,
        "KiB" | "KB" => 10,
        "MiB" | "MB" => 20,
        "GiB" | "GB" => 30,
        "TiB" | "TB" => 40,
        _ => return None,
    };
    let v = n * (1u64 << shift) as f64;
    (v.is_finite() && v >= 0.0 && v < u64::MAX as f64).then(|| v.round() as u64)
}

fn cap_size(c: &regex::Captures, i: usize) -> Option<u64> {
    size_bytes(c.get(i)?.as_str(), c.get(i + 1)?.as_str())
}

fn cap_u32(c: &regex::Captures, i: usize) -> Option<u32> {
    c.get(i)?.as_str().parse().ok()
}

fn empty(kind: Kind, format: &str) -> OomText {
    OomText {
        kind,
        format: format.into(),
        exception: None,
        gpu: None,
        requested_bytes: None,
        total_bytes: None,
        free_bytes: None,
        allowed_bytes: None,
        process_bytes: None,
        allocated_bytes: None,
        reserved_bytes: None,
        reserved_unallocated_bytes: None,
        private_pools_bytes: None,
        other_processes: Vec::new(),
        tensor: None,
        complete: false,
    }
}

/// The exception class named just before `at` on the line (`torch.OutOfMemoryError: ...`).
fn exception_before(line: &str, at: usize) -> Option<String> {
    EXCEPTION.captures(&line[..at]).map(|c| c[1].to_string())
}

/// Parses a line that opens an OOM report; `None` for any other line.
pub fn parse_line(line: &str) -> Option<OomText> {
    if let Some(c) = TORCH.captures(line) {
        let m = c.get(0).unwrap();
        let mut t = empty(Kind::TorchAllocator, "torch>=2.1");
        t.requested_bytes = cap_size(&c, 1).or_else(|| cap_size(&c, 3));
        // The exception precedes "CUDA out of memory." (or the bare "Tried to allocate").
        let start = line[..m.start()].rfind("CUDA ").unwrap_or(m.start());
        t.exception = exception_before(line, start).or_else(|| {
            m.as_str().starts_with("OutOfMemoryError").then(|| {
                let before = &line[..m.start() + "OutOfMemoryError".len()];
                let s = before.rfind(|ch: char| !(ch.is_alphanumeric() || ch == '.' || ch == '_'));
                before[s.map_or(0, |s| s + 1)..].to_string()
            })
        });
        continue_torch(&mut t, line);
        return Some(t);
    }
    if let Some(m) = CUDA_RUNTIME.find(line) {
        let mut t = empty(Kind::CudaRuntime, "cuda");
        t.exception = exception_before(line, m.start());
        t.complete = true;
        return Some(t);
    }
    if let Some(c) = CUDA_LIBRARY.captures(line) {
        let mut t = empty(Kind::CudaLibrary, &c[1].to_ascii_lowercase());
        t.exception = line
            .find("CUDA error:")
            .and_then(|i| exception_before(line, i))
            .or_else(|| exception_before(line, c.get(0).unwrap().start()));
        t.complete = true;
        return Some(t);
    }
    if NCCL.is_match(line) {
        let mut t = empty(Kind::Nccl, "nccl");
        t.complete = true;
        return Some(t);
    }
    if let Some(c) = XLA.captures(line) {
        let mut t = empty(Kind::Xla, "xla");
        t.requested_bytes = c
            .get(1)
            .and_then(|b| b.as_str().parse().ok())
            .or_else(|| cap_size(&c, 2));
        t.exception = exception_before(line, c.get(0).unwrap().start());
        t.gpu = XLA_DEVICE
            .captures(line)
            .and_then(|d| cap_u32(&d, 1).or_else(|| cap_u32(&d, 2)));
        t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
        return Some(t);
    }
    if let Some(c) = TF.captures(line) {
        let mut t = empty(Kind::Tensorflow, "tensorflow");
        let dims: Option<Vec<u64>> = c[1]
            .split(',')
            .map(|d| d.trim().parse::<u64>().ok())
            .collect();
        let elem = dtype_bytes(&c[2]);
        t.requested_bytes = dims
            .zip(elem)
            .and_then(|(d, e)| d.iter().try_fold(e, |acc, &x| acc.checked_mul(x)));
        t.tensor = Some(format!("{}[{}]", &c[2], c[1].trim()));
        t.exception = exception_before(line, c.get(0).unwrap().start());
        t.gpu = cap_u32(&c, 3);
        t.complete = t.requested_bytes.is_some();
        return Some(t);
    }
    None
}

/// Fills the fields of a PyTorch allocator text from `text` (the opening line, or a continuation line
/// when a logger broke the message over several lines). Returns whether the text is now complete.
pub fn continue_torch(t: &mut OomText, text: &str) -> bool {
    if let Some(c) = NEW_TOTAL.captures(text) {
        t.gpu = t.gpu.or(cap_u32(&c, 1));
        if &c[2] == "capacty" {
            t.format = "torch-2.1".into();
        }
        t.total_bytes = t.total_bytes.or(cap_size(&c, 3));
        t.free_bytes = t.free_bytes.or(cap_size(&c, 5));
    }
    if let Some(c) = OLD_PAREN.captures(text) {
        let cached = &c[12] == "cached";
        t.format = if cached { "torch<1.4" } else { "torch<2.1" }.into();
        t.gpu = t.gpu.or(cap_u32(&c, 1));
        t.total_bytes = t.total_bytes.or(cap_size(&c, 2));
        t.allocated_bytes = t.allocated_bytes.or(cap_size(&c, 4));
        t.free_bytes = t.free_bytes.or(cap_size(&c, 6));
        t.allowed_bytes = t.allowed_bytes.or(cap_size(&c, 8));
        let last = cap_size(&c, 10);
        if cached {
            // Before 1.4, "cached" was the cache beyond live tensors ("8.94 GiB already allocated; ...
            // 0 bytes cached").
            t.reserved_unallocated_bytes = t.reserved_unallocated_bytes.or(last);
            t.reserved_bytes = t.allocated_bytes.zip(last).map(|(a, c)| a + c);
        } else {
            t.reserved_bytes = t.reserved_bytes.or(last);
            t.reserved_unallocated_bytes = t
                .reserved_bytes
                .zip(t.allocated_bytes)
                .map(|(r, a)| r.saturating_sub(a));
        }
    }
    for c in PROCESS.captures_iter(text) {
        if let (Some(pid), Some(bytes)) = (cap_u32(&c, 1), cap_size(&c, 2))
            && !t.other_processes.iter().any(|p| p.pid == pid)
        {
            t.other_processes.push(TextProcess { pid, bytes });
        }
    }
    if let Some(c) = THIS_PROCESS.captures(text) {
        t.process_bytes = t.process_bytes.or(cap_size(&c, 1));
    }
    if t.format != "torch<2.1"
        && t.format != "torch<1.4"
        && let Some(c) = ALLOWED.captures(text)
    {
        t.allowed_bytes = t.allowed_bytes.or(cap_size(&c, 1));
    }
    if let Some(c) = OF_ALLOCATED.captures(text) {
        t.allocated_bytes = t.allocated_bytes.or(cap_size(&c, 1));
        t.private_pools_bytes = t.private_pools_bytes.or(cap_size(&c, 3));
        t.reserved_unallocated_bytes = t.reserved_unallocated_bytes.or(cap_size(&c, 5));
        if let (Some(a), Some(u)) = (t.allocated_bytes, t.reserved_unallocated_bytes) {
            t.reserved_bytes = Some(a + u);
        }
    }
    t.complete = t.requested_bytes.is_some()
        && t.gpu.is_some()
        && t.total_bytes.is_some()
        && t.free_bytes.is_some()
        && t.allocated_bytes.is_some()
        && t.reserved_bytes.is_some();
    t.complete
}

fn dtype_bytes(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "float" | "float32" | "int32" | "uint32" => 4,
        "double" | "float64" | "int64" | "uint64" | "complex64" => 8,
        "half" | "float16" | "bfloat16" | "int16" | "uint16" => 2,
        "int8" | "uint8" | "bool" | "qint8" | "quint8" => 1,
        "complex128" => 16,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_as_pytorch_prints_them() {
        assert_eq!(size_bytes("0", "bytes"), Some(0));
        assert_eq!(size_bytes("1024", "bytes"), Some(1024));
        assert_eq!(size_bytes("1.50", "KiB"), Some(1536));
        assert_eq!(size_bytes("60.00", "GiB"), Some(60 << 30));
        assert_eq!(size_bytes("29.29", "GiB"), Some(31_449_898_025));
        assert_eq!(size_bytes("1", "parsecs"), None);
    }

    #[test]
    fn ordinary_lines_are_not_ooms() {
        for line in [
            "epoch 3: loss 0.12",
            "Traceback (most recent call last):",
            "we may run out of memory. Tried to be careful",
            "torch.cuda.OutOfMemoryError is caught below",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn truncated_text_is_partial_and_invents_nothing() {
        let t = parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 60.00 GiB. GPU 0 has a total capac").unwrap();
        assert_eq!(t.requested_bytes, Some(60 << 30));
        assert_eq!((t.gpu, t.total_bytes, t.free_bytes), (None, None, None));
        assert!(!t.complete);
        let t = parse_line("CUDA out of memory. Tried to allocate 60.0")
            .unwrap_or_else(|| empty(Kind::TorchAllocator, ""));
        assert_eq!(
            t.requested_bytes, None,
            "a number without its unit is not a size"
        );
    }

    #[test]
    fn tensorflow_size_from_shape() {
        let t = parse_line("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[1024,1024,64] and type float on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc").unwrap();
        assert_eq!(t.kind, Kind::Tensorflow);
        assert_eq!(t.requested_bytes, Some(1024 * 1024 * 64 * 4));
        assert_eq!(t.gpu, Some(1));
        assert_eq!(t.tensor.as_deref(), Some("float[1024,1024,64]"));
    }
}
