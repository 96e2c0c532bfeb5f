//! What an OOM text says, as read: its kind, vendor and numbers ([`OomText`]), and the pieces every reader
//! of a wording shares (sizes with their units, captures, the exception class before the message). The
//! wordings themselves are read in [`parse`](super::parse) and [`engines`](super::engines).

use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

/// Which layer reported the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// PyTorch's caching allocator (`CUDA out of memory. Tried to allocate ...`).
    TorchAllocator,
    /// The CUDA runtime or driver (`CUDA error: out of memory`, `CUDA_ERROR_OUT_OF_MEMORY`, old PyTorch's
    /// `cuda runtime error (2)`), e.g. at context creation; and Intel's Level Zero driver, its counterpart.
    CudaRuntime,
    /// A CUDA library failing to allocate its workspace or handle (cuBLAS, cuDNN).
    CudaLibrary,
    /// NCCL (`Cuda failure 'out of memory'`, `Failed to CUDA calloc N bytes`).
    Nccl,
    /// JAX / XLA (`RESOURCE_EXHAUSTED: ...`, its BFC and async allocators).
    Xla,
    /// TensorFlow (`OOM when allocating tensor with shape[...]`, its BFC allocator).
    Tensorflow,
    /// CuPy's memory pool (`cupy.cuda.memory.OutOfMemoryError: out of memory to allocate N bytes`).
    Cupy,
    /// PaddlePaddle's allocator (`Out of memory error on GPU N. Cannot allocate X memory on GPU N, ...`).
    Paddle,
    /// llama.cpp / ggml allocating a buffer (`allocating X MiB on device N: cudaMalloc failed: out of
    /// memory`).
    LlamaCpp,
    /// vLLM finding no room for its KV cache in the share of the GPU it may use
    /// (`No available memory for the cache blocks`).
    Vllm,
    /// ONNX Runtime's CUDA execution provider.
    Onnxruntime,
    /// TensorRT's allocator.
    Tensorrt,
    /// MXNet's GPU storage manager.
    Mxnet,
    /// Elixir's EXLA (XLA), raised as an Elixir exception.
    Exla,
    /// SGLang finding no room for its KV cache in the share of the GPU `--mem-fraction-static` gives it
    /// (`Not enough memory. Please try to increase --mem-fraction-static`).
    Sglang,
    /// Hugging Face's text-generation-inference, whose warmup batch did not fit (`Not enough memory to
    /// handle N prefill tokens`).
    Tgi,
}

/// Whose GPU the text is about. NVML sees NVIDIA GPUs only.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Vendor {
    #[default]
    Nvidia,
    /// ROCm (PyTorch's `HIP out of memory`, llama.cpp's `ROCm0` buffers).
    Amd,
    /// Intel's GPUs through PyTorch's XPU backend (`XPU out of memory`).
    Intel,
    /// Apple silicon through PyTorch's MPS backend (`MPS backend out of memory`).
    Apple,
    /// Google's TPUs through XLA (JAX, PyTorch/XLA, TensorFlow): their memory is HBM (`(0x0x0_HBM0)`,
    /// `memory space hbm`).
    Google,
}

impl Vendor {
    /// Whether NVML can see the GPU: NVIDIA's only.
    pub fn nvml_sees(self) -> bool {
        self == Vendor::Nvidia
    }

    /// What the device is: a GPU, or Google's TPU.
    pub fn chip(self) -> &'static str {
        match self {
            Vendor::Google => "TPU",
            _ => "GPU",
        }
    }

    /// One such device, unnumbered: "an AMD GPU", "a Google TPU".
    pub fn one(self) -> String {
        let brand = self.names().0;
        let a = if brand.starts_with(['A', 'E', 'I', 'O', 'U']) {
            "an"
        } else {
            "a"
        };
        format!("{a} {brand} {}", self.chip())
    }

    /// Device `d` of this vendor, as its text numbers it: "AMD GPU 3".
    pub fn numbered(self, d: u32) -> String {
        format!("{} {} {d}", self.names().0, self.chip())
    }

    /// How messages name a GPU NVML cannot see: the vendor, and the platform PyTorch (or JAX) runs on it
    /// through.
    pub fn names(self) -> (&'static str, &'static str) {
        match self {
            Vendor::Nvidia => ("NVIDIA", "CUDA"),
            Vendor::Amd => ("AMD", "ROCm"),
            Vendor::Intel => ("Intel", "XPU"),
            Vendor::Apple => ("Apple", "MPS"),
            Vendor::Google => ("Google", "XLA"),
        }
    }
}

/// Another process named in the text as holding memory on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TextProcess {
    pub pid: u32,
    pub bytes: u64,
}

/// What one OOM text says. Sizes are the text's figures in bytes (PyTorch prints two decimals, so a
/// figure is exact to half a unit of what it printed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OomText {
    pub kind: Kind,
    /// The text's layout: `torch>=2.1`, `torch-2.1`, `torch<2.1`, `torch<1.4` (`cached`), `thc`, or the
    /// kind's own (`xla`, `xla-bfc`, `xla-async`, `nccl`, `tensorflow`, ...).
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
    /// The GPU's vendor, as the text shows it (`HIP out of memory` is ROCm's).
    #[serde(default)]
    pub vendor: Vendor,
    /// vLLM: the longest request the engine must hold (`max_model_len`), in tokens.
    #[serde(default)]
    pub max_model_len: Option<u64>,
    /// vLLM: the tokens its KV cache could hold in the memory left for it.
    #[serde(default)]
    pub kv_cache_tokens: Option<u64>,
    /// A BFC allocator's `Stats:` (TensorFlow, XLA): the peak of what was in use (`MaxInUse`), the
    /// allocations it made (`NumAllocs`) and the largest (`MaxAllocSize`); absent where not printed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocations: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_alloc_bytes: Option<u64>,
}

const SIZE: &str = r"(\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b";
/// XLA's sizes: `129.50M`, `1.60G`, `0B` (binary units).
const XSIZE: &str = r"(\d+(?:\.\d+)?)([KMGT]?)B?\b";

/// A built-in pattern, `SIZE` standing for a size with its unit.
pub(super) fn re(s: &str) -> Regex {
    Regex::new(&s.replace("XSIZE", XSIZE).replace("SIZE", SIZE)).expect("a valid built-in pattern")
}

static EXCEPTION: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b([A-Za-z_][\w.]*(?:Error|Exception))\s*:(?:\s|$)"));

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

pub(super) fn cap_size(c: &regex::Captures, i: usize) -> Option<u64> {
    size_bytes(c.get(i)?.as_str(), c.get(i + 1)?.as_str())
}

pub(super) fn cap_u64(c: &regex::Captures, i: usize) -> Option<u64> {
    c.get(i)?.as_str().parse().ok()
}

pub(super) fn cap_u32(c: &regex::Captures, i: usize) -> Option<u32> {
    c.get(i)?.as_str().parse().ok()
}

pub(super) fn empty(kind: Kind, format: &str) -> OomText {
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
        vendor: Vendor::Nvidia,
        max_model_len: None,
        kv_cache_tokens: None,
        peak_allocated_bytes: None,
        allocations: None,
        largest_alloc_bytes: None,
    }
}

/// The exception class the message was raised as, and where it starts: the last one named on the line
/// before `at`, which is just before it (`torch.OutOfMemoryError: CUDA out of memory`) or before the
/// message's own first words (numba's `CudaAPIError: [2] Call to cuMemAlloc results in
/// CUDA_ERROR_OUT_OF_MEMORY`, TensorRT-LLM's `RuntimeError: Encountered an error in forwardAsync
/// function: [TensorRT-LLM][ERROR] ...`).
fn exception_before(line: &str, at: usize) -> Option<(String, usize)> {
    EXCEPTION
        .captures_iter(&line[..at])
        .last()
        .map(|c| (c[1].to_string(), c.get(1).unwrap().start()))
}

/// An OOM text opened on a line: what it says so far, and where the message proper starts (what comes
/// before is a prefix: a timestamp, a log level, a rank label).
pub struct Opened {
    pub text: OomText,
    pub start: usize,
}

pub(super) fn with_exception(mut t: OomText, line: &str, at: usize) -> Opened {
    let start = match exception_before(line, at) {
        Some((e, s)) => {
            t.exception = Some(e);
            s
        }
        None => at,
    };
    Opened { text: t, start }
}
