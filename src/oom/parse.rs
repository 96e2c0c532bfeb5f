//! Parsing what a program prints when it runs out of GPU memory. The wordings are the rows of
//! [`formats`](super::formats), read by one engine; this module opens a text with them and reads what the
//! lines after it add (PyTorch's clauses, XLA's and TensorFlow's devices and totals; the inference
//! engines' in [`engines`](super::engines)). A message may span lines (a logger broke it, a terminal
//! wrapped it in the middle of a number): [`parse_line`] opens it, [`refine`] reads it again each time a
//! following line is joined on. A field that is not in the text stays `None` and the parse is marked
//! incomplete: a truncated or garbled text never yields a made-up number. Host memory that CUDA failed to
//! pin, and TensorFlow's CPU allocator, say "out of memory" too: they are no GPU OOM ([`open`] gives
//! `None`).

use super::engines;
use super::formats::{self, Follows};
pub use super::text::{Kind, OomText, Opened, TextProcess, Vendor, size_bytes};
use super::text::{cap_size, cap_u32, cap_u64, re};
use regex::Regex;
use std::sync::LazyLock;

// A size past any GPU's (a garbled one: `Tried to allocate more than 1EB memory.`): PyTorch checks it
// before its allocator, and says only that it was at least 1 EiB, which stands as the size asked for.
static MORE_THAN_EB: LazyLock<Regex> =
    LazyLock::new(|| re(r"Tried to allocate more than 1EB memory"));

/// The row of PyTorch's caching allocator, whose clauses [`continue_torch`] reads.
const TORCH: &str = "torch>=2.1";
/// 1 EiB, PyTorch's `one_exa_bytes`.
pub const EIB: u64 = 1 << 60;

// The 2.1+ clause, read in parts so a cut-off text still gives what it has.
static GPU_HAS: LazyLock<Regex> = LazyLock::new(|| re(r"GPU (\d+) has a total"));

static TOTAL_OF: LazyLock<Regex> =
    LazyLock::new(|| re(r"has a total\s*(capacity|capacty)\s*of SIZE"));

static FREE_OF: LazyLock<Regex> = LazyLock::new(|| re(r"of which SIZE is free"));

// Intel's extension for PyTorch (IPEX) prints the same parenthesis without the free memory. Its last
// clause is whole without the closing parenthesis, which a quote that stops at the clause leaves out.
static OLD_PAREN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\(GPU\s*(\d+); SIZE total capacity; SIZE already allocated; (?:SIZE free; )?(?:SIZE allowed; )?SIZE (reserved in total by PyTorch|cached)\)?",
    )
});

static PROCESS: LazyLock<Regex> = LazyLock::new(|| re(r"Process (\d+) has SIZE memory in use"));

static THIS_PROCESS: LazyLock<Regex> = LazyLock::new(|| re(r"this process has SIZE memory in use"));

static ALLOWED: LazyLock<Regex> = LazyLock::new(|| re(r"SIZE allowed;"));

static OF_ALLOCATED: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Of the allocated memory SIZE is allocated by PyTorch,\s*(?:with SIZE allocated in private pools \(e\.g\., \w+ Graphs\),\s*)?and SIZE is reserved by PyTorch but unallocated",
    )
});

static ASYNC_ALLOCATED: LazyLock<Regex> = LazyLock::new(|| re(r"Currently allocated\s*:\s*SIZE"));

static ASYNC_REQUESTED: LazyLock<Regex> = LazyLock::new(|| re(r"Requested\s*:\s*SIZE"));

static ASYNC_TOTAL: LazyLock<Regex> = LazyLock::new(|| re(r"Device limit\s*:\s*SIZE"));

static ASYNC_FREE: LazyLock<Regex> = LazyLock::new(|| re(r"Free \(according to \w+\)\s*:\s*SIZE"));

static ASYNC_LIMIT: LazyLock<Regex> =
    LazyLock::new(|| re(r"PyTorch limit \(set by user-supplied memory fraction\)\s*:\s*SIZE"));

static FREE_TOTAL: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i:Free memory/Total memory): (\d+)/(\d+)"));

/// The op's placement in the `[[Node: ...]]` line that follows TensorFlow 1's error.
static TF_NODE_DEVICE: LazyLock<Regex> =
    LazyLock::new(|| re(r#"_device="[^"]*?(?:device:GPU:|/gpu:)(\d+)""#));

/// Host memory that failed: pinned (page-locked) allocations through CUDA or HIP, ONNX Runtime's pinned
/// arena, OpenCV's page-locked `HostMem` (`cuda_host_mem.cpp`). They say "CUDA_ERROR_OUT_OF_MEMORY" too,
/// but the GPU's memory was not what ran out.
static HOST: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"on host: |pinned host memory|of pinned memory|\b(?:cuMemHostAlloc|cuMemAllocHost|cudaHostAlloc|cudaMallocHost|hipHostMalloc)\b|CachingHostAllocator|CudaPinned|cuda_host_mem\.cpp",
    )
});

/// Words only ROCm's texts have.
static AMD: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\bHIP out of memory|\bhip(?:Malloc|Error)|HIP_ERROR_|\bROCm\d+ buffer|PYTORCH_HIP_ALLOC_CONF",
    )
});

/// Words only texts from Intel's GPUs have (PyTorch's XPU backend, Level Zero's error names).
static INTEL: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\bXPU out of memory|PYTORCH_XPU_ALLOC_CONF|_RESULT_ERROR_OUT_OF_DEVICE_MEMORY")
});

/// Words only texts from Apple's GPUs have (PyTorch's MPS backend).
static APPLE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\bMPS backend out of memory|PYTORCH_MPS_HIGH_WATERMARK_RATIO|\bMetal buffer of size|kIOGPUCommandBufferCallbackErrorOutOfMemory",
    )
});

/// The vendor whose words the text has, if not NVIDIA's.
fn vendor_of(text: &str) -> Option<Vendor> {
    // Intel's first: chipStar runs HIP on Level Zero (`hipErrorTbd (ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)`).
    [
        (&*INTEL, Vendor::Intel),
        (&*AMD, Vendor::Amd),
        (&*APPLE, Vendor::Apple),
    ]
    .into_iter()
    .find_map(|(words, v)| words.is_match(text).then_some(v))
}

/// How many of its fields a text gave: of two readings of the same lines, the one that read more is the
/// right one.
pub fn fields_read(t: &OomText) -> usize {
    let sizes = [
        t.gpu.map(u64::from),
        t.requested_bytes,
        t.total_bytes,
        t.free_bytes,
        t.allowed_bytes,
        t.process_bytes,
        t.allocated_bytes,
        t.reserved_bytes,
        t.reserved_unallocated_bytes,
        t.private_pools_bytes,
        t.max_model_len,
        t.kv_cache_tokens,
    ];
    sizes.iter().flatten().count() + t.other_processes.len()
}

/// [`parse_line`], with where the message starts: the first row of [`formats::FORMATS`] that reads the
/// line, and what the same line adds to it. A line about host memory opens nothing.
pub fn open(line: &str) -> Option<Opened> {
    let (_, mut opened) = formats::open(line)?;
    if HOST.is_match(line) {
        return None;
    }
    refine(&mut opened.text, line);
    Some(opened)
}

/// Parses a line that opens an OOM report; `None` for any other line.
pub fn parse_line(line: &str) -> Option<OomText> {
    open(line).map(|o| o.text)
}

/// What the lines after a reading's first may add to it, as its row says.
fn follows(t: &OomText) -> Follows {
    formats::row_of(t).map_or(Follows::Nothing, |f| f.follows)
}

/// Reads `text` (the opening line with the lines that followed it joined on) again, filling what the
/// opening line lacked. Returns whether the message is over: nothing a following line could add.
pub fn refine(t: &mut OomText, text: &str) -> bool {
    if let Some(v) = vendor_of(text) {
        t.vendor = v;
    }
    match follows(t) {
        Follows::Torch => continue_torch(t, text),
        Follows::AsyncFigures => read_async(t, text),
        Follows::Xla { gpu, total } => {
            if t.requested_bytes.is_none() {
                t.requested_bytes = formats::find("xla", text).and_then(|f| f.figure("requested"));
            }
            if let Some(c) = FREE_TOTAL.captures(text) {
                t.free_bytes = t.free_bytes.or(cap_u64(&c, 1));
                t.total_bytes = t.total_bytes.or(cap_u64(&c, 2));
            }
            let whole = t.requested_bytes.is_some() && (!total || t.total_bytes.is_some());
            t.complete = whole && (!gpu || t.gpu.is_some());
            whole
        }
        Follows::TfNode { sized } => {
            if t.gpu.is_none()
                && let Some(c) = TF_NODE_DEVICE.captures(text)
            {
                t.gpu = cap_u32(&c, 1);
                t.complete = t.requested_bytes.is_some() || !sized;
            }
            t.gpu.is_some()
        }
        Follows::GgmlSize => engines::refine_llama_cpp(t, text),
        Follows::XgboostFigures => engines::refine_xgboost(t, text),
        Follows::CurrentDevice => {
            engines::refine_current_device(t, text);
            true
        }
        Follows::Nothing => true,
    }
}

/// Whether a following line may still add to `t`.
pub fn open_ended(t: &OomText) -> bool {
    match follows(t) {
        Follows::Torch => !t.complete,
        // The cudaMallocAsync text cut at device 0's NUL: nothing follows.
        Follows::AsyncFigures => t.gpu.is_some(),
        Follows::Xla { total, .. } => {
            t.requested_bytes.is_none() || (total && t.total_bytes.is_none())
        }
        Follows::TfNode { .. } => t.gpu.is_none(),
        Follows::GgmlSize | Follows::XgboostFigures => !t.complete,
        // A bare `CUDA error: out of memory`: ggml's next line names the device; PyTorch's on ROCm
        // (`torch.AcceleratorError`, the CUDA words) is followed by the hint that names HIP's error.
        Follows::CurrentDevice => t.vendor == Vendor::Nvidia && t.gpu.is_none(),
        Follows::Nothing => false,
    }
}

/// Reads the figures of the cudaMallocAsync allocator's text; returns whether its last line, the limit,
/// was read. The limit is a cap only below the GPU's capacity (without a memory fraction PyTorch prints
/// its largest number, `17179869184.00 GiB`).
fn read_async(t: &mut OomText, text: &str) -> bool {
    let size = |r: &Regex| r.captures(text).and_then(|c| cap_size(&c, 1));
    t.allocated_bytes = t.allocated_bytes.or(size(&ASYNC_ALLOCATED));
    t.requested_bytes = t.requested_bytes.or(size(&ASYNC_REQUESTED));
    t.total_bytes = t.total_bytes.or(size(&ASYNC_TOTAL));
    t.free_bytes = t.free_bytes.or(size(&ASYNC_FREE));
    let limit = size(&ASYNC_LIMIT);
    if let (Some(l), Some(total)) = (limit, t.total_bytes)
        && l < total
    {
        t.allowed_bytes = Some(l);
    }
    t.complete = t.gpu.is_some()
        && t.allocated_bytes.is_some()
        && t.requested_bytes.is_some()
        && t.total_bytes.is_some()
        && t.free_bytes.is_some();
    limit.is_some()
}

/// Fills the fields of a PyTorch allocator text from `text` (the opening line, or the opening line with
/// the lines that continue it joined on). Returns whether the text is now complete.
pub fn continue_torch(t: &mut OomText, text: &str) -> bool {
    let known = formats::find(TORCH, text);
    if t.format == "torch"
        && let Some(m) = &known
    {
        // A message of unknown words that went on in a known wording.
        t.format = TORCH.into();
        if let Some(v) = vendor_of(&text[m.start()..]) {
            t.vendor = v;
        }
    }
    if t.requested_bytes.is_none() {
        t.requested_bytes = known.and_then(|m| m.figure("requested"));
    }
    if t.requested_bytes.is_none() && MORE_THAN_EB.is_match(text) {
        t.requested_bytes = Some(EIB);
    }
    if let Some(c) = GPU_HAS.captures(text) {
        t.gpu = t.gpu.or(cap_u32(&c, 1));
    }
    if let Some(c) = TOTAL_OF.captures(text) {
        if &c[1] == "capacty" {
            t.format = "torch-2.1".into();
        }
        t.total_bytes = t.total_bytes.or(cap_size(&c, 2));
    }
    if let Some(c) = FREE_OF.captures(text) {
        t.free_bytes = t.free_bytes.or(cap_size(&c, 1));
    }
    if let Some(c) = OLD_PAREN.captures(text) {
        read_old_paren(t, &c);
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
        && (t.free_bytes.is_some() || t.format == "ipex")
        && t.allocated_bytes.is_some()
        && t.reserved_bytes.is_some();
    t.complete
}

/// `(GPU 0; 15.78 GiB total capacity; ... reserved in total by PyTorch)`, 1.4 to 2.0 (`cached` before;
/// without `F free;` in IPEX's).
fn read_old_paren(t: &mut OomText, c: &regex::Captures) {
    let cached = &c[12] == "cached";
    t.format = match (cached, c.get(6).is_some()) {
        (true, _) => "torch<1.4",
        (false, true) => "torch<2.1",
        // No free memory in it: Intel's extension for PyTorch.
        (false, false) => "ipex",
    }
    .into();
    t.gpu = t.gpu.or(cap_u32(c, 1));
    t.total_bytes = t.total_bytes.or(cap_size(c, 2));
    t.allocated_bytes = t.allocated_bytes.or(cap_size(c, 4));
    t.free_bytes = t.free_bytes.or(cap_size(c, 6));
    t.allowed_bytes = t.allowed_bytes.or(cap_size(c, 8));
    let last = cap_size(c, 10);
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

#[cfg(test)]
mod tests {
    use super::super::text::empty;
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
            "failed to allocate a seat on the bus",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn truncated_text_is_partial_and_invents_nothing() {
        let t = parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 60.00 GiB. GPU 0 has a total capac").unwrap();
        assert_eq!(t.requested_bytes, Some(60 << 30));
        // "GPU 0 has a total" is there; its capacity is cut off.
        assert_eq!((t.gpu, t.total_bytes, t.free_bytes), (Some(0), None, None));
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
        let t = parse_line(
            "ResourceExhaustedError: OOM when allocating tensor with shape[48,8,8,2080]",
        )
        .unwrap();
        assert_eq!((t.requested_bytes, t.gpu), (None, None), "no type: no size");
        assert_eq!(t.tensor.as_deref(), Some("[48,8,8,2080]"));
        let t =
            parse_line("OOM when allocating tensor of shape [3,3,256,512] and type float").unwrap();
        assert_eq!(t.requested_bytes, Some(3 * 3 * 256 * 512 * 4));
    }

    #[test]
    fn paddle_wordings_carry_their_fields() {
        let t = parse_line("Out of memory error on GPU 1. Cannot allocate 98.000244MB memory on GPU 1, 6.000000GB memory has been allocated and available memory is only 0.000000B.").unwrap();
        assert_eq!(
            (t.kind, t.gpu, t.reserved_bytes, t.free_bytes),
            (Kind::Paddle, Some(1), Some(6 << 30), Some(0))
        );
        assert_eq!(t.requested_bytes, size_bytes("98.000244", "MB"));
        // Paddle 1.6's wording.
        let t = parse_line("Out of memory error on GPU 0. Cannot allocate 145.468994MB GPU memory, available memory is 72.312500MB.").unwrap();
        assert_eq!(
            (t.gpu, t.free_bytes),
            (Some(0), size_bytes("72.3125", "MB"))
        );
    }

    #[test]
    fn cupy_and_rapids_wordings_carry_their_fields() {
        let t = parse_line("cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 1,073,741,824 bytes (allocated so far: 3,221,225,472 bytes, limit set to: 4,000,000,000 bytes).").unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes, t.reserved_bytes, t.allowed_bytes),
            (
                Kind::Cupy,
                Some(1 << 30),
                Some(3 << 30),
                Some(4_000_000_000)
            )
        );
        assert_eq!(
            t.exception.as_deref(),
            Some("cupy.cuda.memory.OutOfMemoryError")
        );
        let t = parse_line(
            "cupy.cuda.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory",
        )
        .unwrap();
        assert_eq!((t.kind, t.format.as_str()), (Kind::CudaRuntime, "cuda"));
        let t = parse_line("RuntimeError: RMM error encountered at: memory_manager.cpp:232: 4 RMM_ERROR_OUT_OF_MEMORY").unwrap();
        assert_eq!(t.format, "rmm");
        // PyTorch's pointer to the CUDA documentation is not a second report.
        assert!(parse_line("Search for `cudaErrorMemoryAllocation' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.").is_none());
    }

    #[test]
    fn host_memory_that_cuda_could_not_pin_is_no_gpu_oom() {
        for line in [
            // tensorflow/tensorflow's stream executor (talmolab/sleap#2001).
            "2024-10-22 09:22:17.233972: E tensorflow/stream_executor/cuda/cuda_driver.cc:802] failed to alloc 34359738368 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            // heterodb/pg-strom#215.
            "ERROR:  failed on cuMemAllocHost: CUDA_ERROR_OUT_OF_MEMORY - out of memory",
            // PyTorch's pinned-memory allocator (pin_memory=True).
            "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingHostAllocator.cpp:265",
            // Synthetic, from ggml's format string: llama.cpp's warning before it falls back to pageable
            // memory.
            "ggml_cuda_host_malloc: failed to allocate 512.00 MiB of pinned memory: out of memory",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn tensorflow_reads_its_gpu_from_any_of_its_names_and_its_cpu_allocator_is_no_gpu_oom() {
        // Synthetic: the device clause lost, the allocator's name left.
        let t = parse_line("ResourceExhaustedError: OOM when allocating tensor with shape[64,2016,9,9] and type float by allocator GPU_1_bfc").unwrap();
        assert_eq!(
            (t.gpu, t.requested_bytes),
            (Some(1), Some(64 * 2016 * 81 * 4))
        );
        // Synthetic: TensorFlow before 1.5 named the device `/gpu:1` (tensorflow#13591 in its `[[Node:`
        // line, a fixture).
        let t = parse_line("OOM when allocating tensor with shape[3,3] and type float on /job:localhost/replica:0/task:0/gpu:1 by allocator gpu_bfc").unwrap();
        assert_eq!(t.gpu, Some(1));
        // Keras-VGG16-places365#19: host memory.
        assert!(parse_line("OOM when allocating tensor with shape[25088,4096] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu [Op:Add]").is_none());
    }

    #[test]
    fn a_platform_named_before_out_of_memory_leaves_the_exception_and_names_the_vendor() {
        // TheRock#2118 (ROCm): the exception was lost behind "HIP", and "HIP Graphs" hid the pools.
        let t = parse_line("FAILED [0.0005s] test_autograd.py::test_x - torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 255.98 GiB of which 244.65 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is reserved by PyTorch but unallocated.").unwrap();
        assert_eq!(
            (t.exception.as_deref(), t.vendor, t.complete),
            (Some("torch.OutOfMemoryError"), Vendor::Amd, true)
        );
        assert_eq!(t.private_pools_bytes, Some(17 << 20));
        let t = parse_line("torch.OutOfMemoryError: XPU out of memory. Tried to allocate 4.66 GiB. GPU 0 has a total capacity of 5.65 GiB of which 5.65 GiB is free. Of the allocated memory 195.50 KiB is allocated by PyTorch, and 1.81 MiB is reserved by PyTorch but unallocated.").unwrap();
        assert_eq!(
            (t.exception.as_deref(), t.vendor),
            (Some("torch.OutOfMemoryError"), Vendor::Intel)
        );
        // Intel's extension for PyTorch prints no free memory: complete without it.
        let t = parse_line("RuntimeError: XPU out of memory. Tried to allocate 1.71 GiB (GPU 0; 15.56 GiB total capacity; 176.00 MiB already allocated; 176.00 MiB reserved in total by PyTorch)").unwrap();
        assert_eq!(
            (
                t.format.as_str(),
                t.free_bytes,
                t.reserved_bytes,
                t.complete
            ),
            ("ipex", None, Some(176 << 20), true)
        );
    }

    #[test]
    fn the_cuda_malloc_async_allocators_text_gives_its_figures_line_by_line() {
        // Synthetic: device 1 printed as the character \x01, as PyTorch did; a memory fraction set.
        let mut t = parse_line(
            "torch.OutOfMemoryError: Allocation on device \x01 would exceed allowed memory. (out of memory)",
        )
        .unwrap();
        assert_eq!(
            (t.format.as_str(), t.gpu, t.complete),
            ("torch-async", Some(1), false)
        );
        assert!(open_ended(&t));
        let text = "Currently allocated     : 6.89 GiB Requested               : 320.00 MiB Device limit            : 23.69 GiB Free (according to CUDA): 2.94 MiB";
        assert!(!refine(&mut t, text), "the limit's line is still to come");
        assert_eq!(
            (t.allocated_bytes, t.requested_bytes, t.complete),
            (size_bytes("6.89", "GiB"), Some(320 << 20), true)
        );
        let limit =
            format!("{text} PyTorch limit (set by user-supplied memory fraction) : 12.00 GiB");
        assert!(refine(&mut t, &limit));
        assert_eq!(t.allowed_bytes, Some(12 << 30));
        // Without a fraction the limit is PyTorch's largest number: no cap.
        let mut t = parse_line("Allocation on device 0 would exceed allowed memory. (out of memory) Currently allocated : 12.20 GiB Requested : 1.88 GiB Device limit : 16.00 GiB Free (according to CUDA): 0 bytes PyTorch limit (set by user-supplied memory fraction) : 17179869184.00 GiB").unwrap();
        assert!(refine(&mut t, "") || t.allowed_bytes.is_none());
        assert_eq!((t.gpu, t.allowed_bytes, t.complete), (Some(0), None, true));
    }

    #[test]
    fn pytorchs_oom_class_is_an_oom_in_any_words_and_no_other_class_is() {
        // ComfyUI#4934: device 0's NUL ended the message.
        let t = parse_line("torch.OutOfMemoryError: Allocation on device ").unwrap();
        assert_eq!(
            (t.kind, t.format.as_str()),
            (Kind::TorchAllocator, "torch-async")
        );
        assert!(!open_ended(&t), "nothing follows the NUL");
        let t =
            parse_line("torch.cuda.OutOfMemoryError: the words of a PyTorch yet to come").unwrap();
        assert_eq!((t.format.as_str(), t.requested_bytes), ("torch", None));
        for line in [
            "java.lang.OutOfMemoryError: Java heap space",
            "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
            "    except torch.cuda.OutOfMemoryError:",
        ] {
            assert_eq!(parse_line(line), None, "{line}");
        }
    }

    #[test]
    fn mps_counts_the_processs_other_metal_memory_under_its_watermark() {
        let t = parse_line("RuntimeError: MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: 17.35 GiB, max allowed: 27.20 GiB). Tried to allocate 292.50 MiB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations (may cause system failure).").unwrap();
        assert_eq!((t.format.as_str(), t.vendor), ("mps", Vendor::Apple));
        assert_eq!(
            (t.reserved_bytes, t.process_bytes, t.allowed_bytes),
            (
                size_bytes("9.57", "GiB"),
                size_bytes("9.57", "GiB")
                    .zip(size_bytes("17.35", "GiB"))
                    .map(|(a, b)| a + b),
                size_bytes("27.20", "GiB")
            )
        );
    }

    #[test]
    fn the_exception_is_found_before_a_message_that_leads_with_its_own_words() {
        let t = parse_line("numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY").unwrap();
        assert_eq!(
            t.exception.as_deref(),
            Some("numba.cuda.cudadrv.driver.CudaAPIError")
        );
        // Intel's driver: its own error names, not CUDA's.
        let t = parse_line("RuntimeError: level_zero backend failed with error: 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)").unwrap();
        assert_eq!(
            (t.format.as_str(), t.vendor, t.exception.as_deref()),
            ("level-zero", Vendor::Intel, Some("RuntimeError"))
        );
        // darknet's capital E.
        let t = parse_line("   29 CUDA Error: out of memory").unwrap();
        assert_eq!((t.kind, t.exception), (Kind::CudaRuntime, None));
        // A request past any GPU's: PyTorch says only that it was at least 1 EiB.
        let t = parse_line("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate more than 1EB memory").unwrap();
        assert_eq!(t.requested_bytes, Some(EIB));
    }

    #[test]
    fn other_wordings_carry_their_fields() {
        let t = parse_line("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0").unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes, t.gpu),
            (Kind::Xla, Some(3206250496), Some(0))
        );
        let t = parse_line("2023-01-01 W external/xla/xla/service/gpu/bfc_allocator.cc: Allocator (GPU_3_bfc) ran out of memory trying to allocate 1.25TiB (rounded to 1374389534720)requested by op").unwrap();
        assert_eq!((t.requested_bytes, t.gpu), (Some(1374389534720), Some(3)));
        let t = parse_line("E tensorflow/stream_executor/cuda/cuda_driver.cc:936] failed to allocate 1.00G (1073741824 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory").unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes),
            (Kind::CudaRuntime, Some(1073741824))
        );
        let t = parse_line("gpu-node-1:28717:28717 [3] include/alloc.h:48 NCCL WARN Failed to CUDA calloc 10485760 bytes").unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes, t.gpu),
            (Kind::Nccl, Some(10485760), Some(3))
        );
        let t = parse_line("RuntimeError: cuda runtime error (2) : out of memory at /opt/conda/conda-bld/pytorch_1501969512886/work/pytorch-0.1.12/torch/lib/THC/generic/THCStorage.cu:66").unwrap();
        assert_eq!((t.kind, t.format.as_str()), (Kind::CudaRuntime, "thc"));
        assert_eq!(t.exception.as_deref(), Some("RuntimeError"));
    }
}
