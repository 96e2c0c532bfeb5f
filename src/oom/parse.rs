//! Parsing what a program prints when it runs out of GPU memory: PyTorch's caching allocator (every format
//! since 0.x, on CUDA and ROCm), CUDA runtime and driver errors, cuBLAS/cuDNN allocation failures, NCCL,
//! JAX/XLA (and its BFC and async allocators), TensorFlow, CuPy and PaddlePaddle; the inference engines'
//! texts are in [`engines`](super::engines). A message may span lines (a logger broke it, a terminal
//! wrapped it in the middle of a number): [`parse_line`] opens it, [`refine`] reads it again each time a
//! following line is joined on. A field that is not in the text stays `None` and the parse is marked
//! incomplete: a truncated or garbled text never yields a made-up number. Host memory that CUDA failed to
//! pin, and TensorFlow's CPU allocator, say "out of memory" too: they are no GPU OOM ([`open`] gives
//! `None`).

use super::engines;
pub use super::text::{Kind, OomText, Opened, TextProcess, Vendor, size_bytes};
use super::text::{
    cap_grouped, cap_size, cap_u32, cap_u64, cap_xla_size, empty, re, with_exception,
};
use regex::Regex;
use std::sync::LazyLock;

// PyTorch's caching allocator. Words may be joined without their space when a logger broke the message.
static TORCH: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:out of memory)\.\s*Tried to allocate(?:\s*SIZE)?|OutOfMemoryError: Tried to allocate(?:\s*SIZE)?",
    )
});
// A size past any GPU's (a garbled one: `Tried to allocate more than 1EB memory.`): PyTorch checks it
// before its allocator, and says only that it was at least 1 EiB, which stands as the size asked for.
static MORE_THAN_EB: LazyLock<Regex> =
    LazyLock::new(|| re(r"Tried to allocate more than 1EB memory"));
/// 1 EiB, PyTorch's `one_exa_bytes`.
pub const EIB: u64 = 1 << 60;
// The 2.1+ clause, read in parts so a cut-off text still gives what it has.
static GPU_HAS: LazyLock<Regex> = LazyLock::new(|| re(r"GPU (\d+) has a total"));
static TOTAL_OF: LazyLock<Regex> =
    LazyLock::new(|| re(r"has a total\s*(capacity|capacty)\s*of SIZE"));
static FREE_OF: LazyLock<Regex> = LazyLock::new(|| re(r"of which SIZE is free"));
// Intel's extension for PyTorch (IPEX) prints the same parenthesis without the free memory.
static OLD_PAREN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\(GPU\s*(\d+); SIZE total capacity; SIZE already allocated; (?:SIZE free; )?(?:SIZE allowed; )?SIZE (reserved in total by PyTorch|cached)\)",
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
// PyTorch's MPS allocator (Apple silicon): the allocator's heaps, the process's other Metal memory, and
// the high watermark it may not pass (PYTORCH_MPS_HIGH_WATERMARK_RATIO).
static MPS: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"MPS backend out of memory \(MPS allocated: SIZE, other allocations: SIZE, max allowed: SIZE\)\. Tried to allocate SIZE on \w+ pool",
    )
});
// PyTorch's cudaMallocAsync allocator (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`, ComfyUI's
// default): its figures follow, one a line. PyTorch printed the device number as a character, so device 1
// is `\x01`, and device 0 a NUL that ends the message there (`Allocation on device `, nothing after).
static TORCH_ASYNC: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Allocation on device ?(\d+|[\x01-\x1f])? ?would exceed allowed memory\.? \(out of memory\)",
    )
});
static ASYNC_ALLOCATED: LazyLock<Regex> = LazyLock::new(|| re(r"Currently allocated\s*:\s*SIZE"));
static ASYNC_REQUESTED: LazyLock<Regex> = LazyLock::new(|| re(r"Requested\s*:\s*SIZE"));
static ASYNC_TOTAL: LazyLock<Regex> = LazyLock::new(|| re(r"Device limit\s*:\s*SIZE"));
static ASYNC_FREE: LazyLock<Regex> = LazyLock::new(|| re(r"Free \(according to \w+\)\s*:\s*SIZE"));
static ASYNC_LIMIT: LazyLock<Regex> =
    LazyLock::new(|| re(r"PyTorch limit \(set by user-supplied memory fraction\)\s*:\s*SIZE"));
// PyTorch's OutOfMemoryError raised with words no other pattern knows (its cudaMallocAsync text cut at
// the NUL above: `torch.OutOfMemoryError: Allocation on device `): the class alone says it ran out.
static TORCH_CLASS: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(torch\.(?:cuda\.)?OutOfMemoryError): *(\S.*)"));
// Old PyTorch (THC): no numbers at all.
static THC: LazyLock<Regex> = LazyLock::new(|| {
    re(r"cuda runtime error ?\(2\) ?: ?out of memory|THCudaCheck FAIL.*error=2 : out of memory")
});
// The CUDA runtime's and driver's names for an allocation that failed, as programs print them (not
// PyTorch's hint "Search for `cudaErrorMemoryAllocation' in ..."; darknet's `CUDA Error: out of memory`);
// RAPIDS' memory manager (RMM, under cuDF and cuML) throws `std::bad_alloc: out_of_memory` when cudaMalloc
// fails. TensorFlow and XLA on ROCm name HIP's error `HIP_ERROR_OutOfMemory` where CUDA's driver says
// `CUDA_ERROR_OUT_OF_MEMORY`. spconv's tensors (cumm's tensorview) check each call as `cuda failed with
// error 2 out of memory` (`cuda execution failed with error 2` in spconv 1): error 2 is
// cudaErrorMemoryAllocation. So it is in a glog check (Caffe's `Check failed: error == cudaSuccess (2 vs.
// 0)  out of memory`, old Paddle's `(0 vs. 2) Cuda Error: out of memory`). OpenCV's CUDA module raises
// `(-217:Gpu API call) out of memory in function 'allocate'` (2.4: `Gpu API call (out of memory)`),
// OptiX `OPTIX_ERROR_DEVICE_OUT_OF_MEMORY`, Blender's Cycles `System is out of GPU [and shared host]
// memory`.
static CUDA_RUNTIME: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"CUDA (?:driver )?(?i:error): ?out of memory|CUDA_ERROR_OUT_OF_MEMORY|HIP_ERROR_OutOfMemory|cuMemAlloc\w* failed: out of memory|\bcudaErrorMemoryAllocation:? out of memory|\bcuda (?:execution )?failed with error 2 out of memory|\((?:2 vs\. 0|0 vs\. 2)\)\s+(?:Cuda Error: )?out of memory|\(-217:Gpu API call\) out of memory|Gpu API call \(out of memory\)|OPTIX_ERROR_DEVICE_OUT_OF_MEMORY|System is out of GPU (?:and shared host )?memory|\bparallel_for failed: out of memory|std::bad_alloc: out of memory|(std::bad_alloc: out_of_memory|RMM_ERROR_OUT_OF_MEMORY)",
    )
});
// CuPy's memory pool: `out of memory to allocate N bytes` (before v7), `Out of memory allocating N bytes
// (allocated so far: M bytes[, limit set to: L bytes])` since (numbers with thousands separators; M is
// what the pool holds, L its limit: `set_limit`, CUPY_GPU_MEMORY_LIMIT).
static CUPY: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"OutOfMemoryError: (?:out of memory to allocate (\d+) bytes|Out of memory allocating ([\d,]+) bytes(?: \(allocated so far: ([\d,]+) bytes(?:, limit set to: ([\d,]+) bytes)?\))?)",
    )
});
// PaddlePaddle (raised as ResourceExhaustedError, on a line of its own before): what its allocator holds
// on that GPU ("has been allocated", since 2.0) and what the device had left.
static PADDLE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Out of memory error on GPU (\d+)\.\s*Cannot allocate SIZE(?: GPU)? memory(?: on GPU \d+)?, (?:SIZE memory has been allocated and )?available memory is(?: only)? SIZE",
    )
});
static BYTES_IN_PARENS: LazyLock<Regex> =
    LazyLock::new(|| re(r"failed to allocate [^(]*\((\d+) bytes\)"));
// Intel's Level Zero driver, through SYCL's unified runtime (`level_zero backend failed with error: 39
// (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)`) or directly: the device's own allocation failed.
static LEVEL_ZERO: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(?:UR|ZE)_RESULT_ERROR_OUT_OF_DEVICE_MEMORY\b"));
static CUDA_LIBRARY: LazyLock<Regex> =
    LazyLock::new(|| re(r"\b(CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT)_STATUS_ALLOC_FAILED\b"));
static NCCL: LazyLock<Regex> = LazyLock::new(|| {
    re(r"Cuda failure (?:\d+ )?'out of memory'|Failed to CUDA calloc (?:async )?(\d+) bytes")
});
/// NCCL's `host:pid:tid [dev]` prefix names the CUDA device.
static NCCL_DEVICE: LazyLock<Regex> = LazyLock::new(|| re(r"[\w.\-]+:\d+:\d+ \[(\d+)\]"));
static XLA: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:resource[_ ]exhausted): Out of memory (?:while trying to allocate|allocating)(?:\s*(\d+) bytes|\s*SIZE)?",
    )
});
// Elixir's EXLA raises XLA's words as an Elixir exception, without the status's name.
static EXLA: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\*\* \((\w+)\) Out of memory while trying to allocate(?:\s*(\d+) bytes)?")
});
static XLA_REQUEST: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:resource[_ ]exhausted): Failed to allocate request for SIZE(?: \((\d+)B\))?(?: on device ordinal (\d+))?",
    )
});
static XLA_ASYNC: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?:gpu_async_(\d+) )?cuMemAllocAsync failed to allocate (\d+) bytes"));
// XLA on a TPU: a buffer its HBM had no room for (`Error allocating device buffer: Attempting to allocate
// 129.50M. That was not possible. There are 78.17M free.; (0x0x0_HBM0)`; PyTorch/XLA before: `Attempting
// to reserve X at the bottom of memory`), or a program larger than the HBM (`Ran out of memory in memory
// space hbm. Used 9.08G of 7.48G hbm.`). Sizes as XLA prints them: binary units, one letter.
static TPU_BUFFER: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:resource[_ ]exhausted): (?:Error allocating device buffer: )?Attempting to (?:allocate|reserve) XSIZE(?: at the bottom of memory)?\. That was not possible\. There are XSIZE free",
    )
});
static TPU_PROGRAM: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:resource[_ ]exhausted): Ran out of memory in memory space hbm\. Used XSIZE of XSIZE hbm",
    )
});
static FREE_TOTAL: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?i:Free memory/Total memory): (\d+)/(\d+)"));
static BFC: LazyLock<Regex> = LazyLock::new(|| {
    re(r"Allocator \(([\w]+)\) ran out of memory trying to allocate SIZE(?: \(rounded to (\d+)\))?")
});
static BFC_GPU: LazyLock<Regex> = LazyLock::new(|| re(r"GPU_(\d+)_bfc"));
static XLA_DEVICE: LazyLock<Regex> =
    LazyLock::new(|| re(r"on device (?:ordinal )?(\d+)|GPU_(\d+)_bfc"));
// TensorFlow's status without the tensor's words (`ResourceExhaustedError: failed to allocate memory
// [Op:AddV2]`): no size, no device. The CPU's allocator is another device's.
static TF_BARE: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?:Resource exhausted|RESOURCE_EXHAUSTED|ResourceExhaustedError): failed to allocate memory",
    )
});
static TF: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"OOM when allocating tensor (?:with|of) shape ?\[([\d,\s]*)\](?: and type (\w+))?(?: on (\S*))?(?: by allocator (\w+))?",
    )
});
/// TensorFlow's device as it names it: `/device:GPU:1` (1.5 and later), `/gpu:1` (before), or its
/// allocator's `GPU_1_bfc`.
static TF_GPU: LazyLock<Regex> =
    LazyLock::new(|| re(r"(?:device:GPU:|/gpu:)(\d+)|\bGPU_(\d+)_bfc\b"));
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

type Opener = fn(&str) -> Option<Opened>;

/// The openers, most specific first.
const OPENERS: [Opener; 32] = [
    open_torch,
    open_torch_async,
    open_mps,
    open_cupy,
    open_paddle,
    engines::open_vllm,
    engines::open_sglang,
    engines::open_tgi,
    engines::open_llama_cpp,
    engines::open_cuda_check_at,
    engines::open_tensorrt,
    engines::open_cuda_failure,
    engines::open_onnxruntime_arena,
    engines::open_mxnet,
    engines::open_cuda_call,
    engines::open_catboost,
    engines::open_ft_check,
    engines::open_metal,
    open_tf_bare,
    open_exla,
    open_tpu,
    open_thc,
    open_xla,
    open_xla_request,
    open_xla_async,
    open_bfc,
    open_tf,
    open_nccl,
    open_library,
    open_cuda,
    open_level_zero,
    open_torch_class,
];

/// Parses a line that opens an OOM report; `None` for any other line.
pub fn parse_line(line: &str) -> Option<OomText> {
    open(line).map(|o| o.text)
}

/// [`parse_line`], with where the message starts. A line about host memory opens nothing.
pub fn open(line: &str) -> Option<Opened> {
    let mut opened = OPENERS.iter().find_map(|f| f(line))?;
    if HOST.is_match(line) {
        return None;
    }
    if let Some(v) = vendor_of(line) {
        opened.text.vendor = v;
    }
    Some(opened)
}

/// Reads `text` (the opening line with the lines that followed it joined on) again, filling what the
/// opening line lacked. Returns whether the message is over: nothing a following line could add.
pub fn refine(t: &mut OomText, text: &str) -> bool {
    if let Some(v) = vendor_of(text) {
        t.vendor = v;
    }
    match t.kind {
        Kind::TorchAllocator => continue_torch(t, text),
        Kind::Xla => {
            if t.requested_bytes.is_none()
                && let Some(c) = XLA.captures(text)
            {
                t.requested_bytes = cap_u64(&c, 1).or_else(|| cap_size(&c, 2));
            }
            if let Some(c) = FREE_TOTAL.captures(text) {
                t.free_bytes = t.free_bytes.or(cap_u64(&c, 1));
                t.total_bytes = t.total_bytes.or(cap_u64(&c, 2));
            }
            let asynchronous = t.format == "xla-async";
            let tpu = t.format == "xla-tpu";
            t.complete = t.requested_bytes.is_some()
                && (t.gpu.is_some() || asynchronous || tpu)
                && (!asynchronous || t.total_bytes.is_some());
            t.requested_bytes.is_some() && (!asynchronous || t.total_bytes.is_some())
        }
        Kind::Tensorflow => {
            if t.gpu.is_none()
                && let Some(c) = TF_NODE_DEVICE.captures(text)
            {
                t.gpu = cap_u32(&c, 1);
                t.complete = t.requested_bytes.is_some() || t.format == "tensorflow-status";
            }
            t.gpu.is_some()
        }
        Kind::LlamaCpp => engines::refine_llama_cpp(t, text),
        Kind::CudaRuntime if t.format == "xgboost" => engines::refine_xgboost(t, text),
        Kind::CudaRuntime => {
            engines::refine_current_device(t, text);
            true
        }
        _ => true,
    }
}

/// Whether a following line may still add to `t`.
pub fn open_ended(t: &OomText) -> bool {
    match t.kind {
        // The cudaMallocAsync text cut at device 0's NUL: nothing follows.
        Kind::TorchAllocator if t.format == "torch-async" && t.gpu.is_none() => false,
        Kind::TorchAllocator => !t.complete || t.format == "torch-async",
        Kind::Xla => {
            t.requested_bytes.is_none() || (t.format == "xla-async" && t.total_bytes.is_none())
        }
        Kind::Tensorflow => t.gpu.is_none(),
        Kind::LlamaCpp => !t.complete,
        // XGBoost's figures follow its error on lines of their own.
        Kind::CudaRuntime if t.format == "xgboost" => !t.complete,
        // A bare `CUDA error: out of memory`: ggml's next line names the device; PyTorch's on ROCm
        // (`torch.AcceleratorError`, the CUDA words) is followed by the hint that names HIP's error.
        Kind::CudaRuntime => t.format == "cuda" && t.vendor == Vendor::Nvidia && t.gpu.is_none(),
        _ => false,
    }
}

fn open_torch(line: &str) -> Option<Opened> {
    let c = TORCH.captures(line)?;
    let m = c.get(0).unwrap();
    let mut t = empty(Kind::TorchAllocator, "torch>=2.1");
    t.requested_bytes = cap_size(&c, 1).or_else(|| cap_size(&c, 3));
    // The exception precedes "CUDA out of memory." (`HIP`, `XPU`; or the bare "Tried to allocate").
    let at = platform_word_start(line, m.start());
    let mut opened = with_exception(t, line, at);
    if opened.text.exception.is_none() && m.as_str().starts_with("OutOfMemoryError") {
        let before = &line[..m.start() + "OutOfMemoryError".len()];
        let s = before
            .rfind(|ch: char| !(ch.is_alphanumeric() || ch == '.' || ch == '_'))
            .map_or(0, |s| s + 1);
        opened.text.exception = Some(before[s..].to_string());
        opened.start = s;
    }
    continue_torch(&mut opened.text, line);
    Some(opened)
}

/// Where the platform's name before `at` starts (`CUDA out of memory`, ROCm's `HIP`, Intel's `XPU`: a short
/// upper-case word and a space), else `at`.
fn platform_word_start(line: &str, at: usize) -> usize {
    let before = line[..at].trim_end_matches(' ');
    let word = before.len()
        - before
            .trim_end_matches(|c: char| c.is_ascii_uppercase())
            .len();
    let bounded = !before[..before.len() - word].ends_with(|c: char| c.is_alphanumeric());
    if (2..=5).contains(&word) && before.len() < at && bounded {
        before.len() - word
    } else {
        at
    }
}

fn open_mps(line: &str) -> Option<Opened> {
    let c = MPS.captures(line)?;
    let mut t = empty(Kind::TorchAllocator, "mps");
    t.vendor = Vendor::Apple;
    // "MPS allocated" is what the allocator's heaps hold; "other allocations" the process's other Metal
    // memory; the watermark bounds their sum.
    t.reserved_bytes = cap_size(&c, 1);
    t.process_bytes = t.reserved_bytes.zip(cap_size(&c, 3)).map(|(a, o)| a + o);
    t.allowed_bytes = cap_size(&c, 5);
    t.requested_bytes = cap_size(&c, 7);
    t.complete =
        t.process_bytes.is_some() && t.allowed_bytes.is_some() && t.requested_bytes.is_some();
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

fn open_torch_async(line: &str) -> Option<Opened> {
    let c = TORCH_ASYNC.captures(line)?;
    let mut t = empty(Kind::TorchAllocator, "torch-async");
    t.gpu = c.get(1).and_then(|d| match d.as_str().parse() {
        Ok(n) => Some(n),
        // The device printed as a character: its code is the number.
        Err(_) => d.as_str().chars().next().map(|ch| ch as u32),
    });
    read_async(&mut t, line);
    Some(with_exception(t, line, c.get(0).unwrap().start()))
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

/// `torch.OutOfMemoryError: ...` in words no other pattern reads: an OOM of PyTorch's, of unknown layout
/// (`torch`), or its cudaMallocAsync text cut short (`torch-async`). The lines that follow may still
/// carry a known wording.
fn open_torch_class(line: &str) -> Option<Opened> {
    let c = TORCH_CLASS.captures(line)?;
    let cut_async = c[2].starts_with("Allocation on device");
    let format = if cut_async { "torch-async" } else { "torch" };
    let mut t = empty(Kind::TorchAllocator, format);
    t.exception = Some(c[1].to_string());
    Some(Opened {
        text: t,
        start: c.get(1).unwrap().start(),
    })
}

fn open_thc(line: &str) -> Option<Opened> {
    let m = THC.find(line)?;
    let mut t = empty(Kind::CudaRuntime, "thc");
    t.complete = true;
    Some(with_exception(t, line, m.start()))
}

fn open_cuda(line: &str) -> Option<Opened> {
    let c = CUDA_RUNTIME.captures(line)?;
    let m = c.get(0).unwrap();
    let rmm = c.get(1).is_some();
    let mut t = empty(Kind::CudaRuntime, if rmm { "rmm" } else { "cuda" });
    // The driver's words through TensorFlow/JAX: `failed to allocate 1.00G (1073741824 bytes) from device`.
    if let Some(c) = BYTES_IN_PARENS.captures(line) {
        t.requested_bytes = cap_u64(&c, 1);
        t.format = "cuda-driver".into();
    }
    t.complete = true;
    if engines::is_xgboost(line) {
        t.format = "xgboost".into();
        engines::refine_xgboost(&mut t, line);
    }
    let at = BYTES_IN_PARENS
        .find(line)
        .map_or(m.start(), |b| b.start().min(m.start()));
    Some(with_exception(t, line, at))
}

fn open_tf_bare(line: &str) -> Option<Opened> {
    let m = TF_BARE.find(line)?;
    if line.contains("device:CPU") || line.contains("allocator cpu") {
        return None;
    }
    let mut t = empty(Kind::Tensorflow, "tensorflow-status");
    t.complete = true;
    Some(with_exception(t, line, m.start()))
}

fn open_level_zero(line: &str) -> Option<Opened> {
    let m = LEVEL_ZERO.find(line)?;
    let mut t = empty(Kind::CudaRuntime, "level-zero");
    t.vendor = Vendor::Intel;
    t.complete = true;
    Some(with_exception(t, line, m.start()))
}

fn open_cupy(line: &str) -> Option<Opened> {
    let c = CUPY.captures(line)?;
    let mut t = empty(Kind::Cupy, "cupy");
    t.requested_bytes = cap_u64(&c, 1).or(cap_grouped(&c, 2));
    t.reserved_bytes = cap_grouped(&c, 3);
    t.allowed_bytes = cap_grouped(&c, 4);
    t.complete = true;
    let at = c.get(0).unwrap().start() + "OutOfMemoryError".len();
    let mut opened = with_exception(t, line, at);
    if opened.text.exception.is_none() {
        let before = &line[..at];
        let s = before
            .rfind(|ch: char| !(ch.is_alphanumeric() || ch == '.' || ch == '_'))
            .map_or(0, |s| s + 1);
        opened.text.exception = Some(before[s..].to_string());
        opened.start = s;
    }
    Some(opened)
}

fn open_paddle(line: &str) -> Option<Opened> {
    let c = PADDLE.captures(line)?;
    let mut t = empty(Kind::Paddle, "paddle");
    t.gpu = cap_u32(&c, 1);
    t.requested_bytes = cap_size(&c, 2);
    t.reserved_bytes = cap_size(&c, 4);
    t.free_bytes = cap_size(&c, 6);
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

fn open_library(line: &str) -> Option<Opened> {
    let c = CUDA_LIBRARY.captures(line)?;
    let mut t = empty(Kind::CudaLibrary, &c[1].to_ascii_lowercase());
    t.complete = true;
    // `RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling ...`: the class precedes "CUDA".
    let at = line
        .find("CUDA error:")
        .unwrap_or(c.get(0).unwrap().start());
    Some(with_exception(t, line, at))
}

fn open_xla(line: &str) -> Option<Opened> {
    let c = XLA.captures(line)?;
    let mut t = empty(Kind::Xla, "xla");
    t.requested_bytes = cap_u64(&c, 1).or_else(|| cap_size(&c, 2));
    t.gpu = XLA_DEVICE
        .captures(line)
        .and_then(|d| cap_u32(&d, 1).or_else(|| cap_u32(&d, 2)));
    t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

/// XLA's TPU texts: what was asked for and what the HBM had free, or what the program needed of it.
fn open_tpu(line: &str) -> Option<Opened> {
    let mut t = empty(Kind::Xla, "xla-tpu");
    t.vendor = Vendor::Google;
    let c = match TPU_BUFFER.captures(line) {
        Some(c) => {
            t.requested_bytes = cap_xla_size(&c, 1);
            t.free_bytes = cap_xla_size(&c, 3);
            c
        }
        None => {
            let c = TPU_PROGRAM.captures(line)?;
            t.requested_bytes = cap_xla_size(&c, 1);
            t.total_bytes = cap_xla_size(&c, 3);
            c
        }
    };
    // A TPU chip is named by its coordinates, not by a number any GPU tool knows.
    t.complete = t.requested_bytes.is_some();
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

fn open_exla(line: &str) -> Option<Opened> {
    let c = EXLA.captures(line)?;
    let mut t = empty(Kind::Exla, "exla");
    t.exception = Some(c[1].to_string());
    t.requested_bytes = cap_u64(&c, 2);
    t.complete = t.requested_bytes.is_some();
    Some(Opened {
        text: t,
        start: c.get(0).unwrap().start(),
    })
}

fn open_xla_request(line: &str) -> Option<Opened> {
    let c = XLA_REQUEST.captures(line)?;
    let mut t = empty(Kind::Xla, "xla");
    // The exact bytes in parentheses, when printed, over the rounded figure.
    t.requested_bytes = cap_u64(&c, 3).or_else(|| cap_size(&c, 1));
    t.gpu = cap_u32(&c, 4);
    t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

fn open_xla_async(line: &str) -> Option<Opened> {
    let c = XLA_ASYNC.captures(line)?;
    let mut t = empty(Kind::Xla, "xla-async");
    t.gpu = cap_u32(&c, 1);
    t.requested_bytes = cap_u64(&c, 2);
    refine(&mut t, line);
    Some(Opened {
        text: t,
        start: c.get(0).unwrap().start(),
    })
}

fn open_bfc(line: &str) -> Option<Opened> {
    // TensorFlow's BFC allocator also says it when it will retry and go on: that is no failure.
    if line.contains("not a failure") {
        return None;
    }
    let c = BFC.captures(line)?;
    let tf = line.contains("TF_GPU_ALLOCATOR") || line.contains("tensorflow");
    let kind = if tf { Kind::Tensorflow } else { Kind::Xla };
    let mut t = empty(kind, "bfc");
    t.requested_bytes = cap_u64(&c, 4).or_else(|| cap_size(&c, 2));
    t.gpu = BFC_GPU.captures(&c[1]).and_then(|g| cap_u32(&g, 1));
    t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
    Some(Opened {
        text: t,
        start: c.get(0).unwrap().start(),
    })
}

fn open_tf(line: &str) -> Option<Opened> {
    let c = TF.captures(line)?;
    // `... on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu`: host memory.
    let on = c.get(3).map_or("", |m| m.as_str());
    let allocator = c.get(4).map_or("", |m| m.as_str());
    if on.contains("device:CPU:") || ["cpu", "mklcpu"].contains(&allocator) {
        return None;
    }
    let mut t = empty(Kind::Tensorflow, "tensorflow");
    let dims: Option<Vec<u64>> = c[1]
        .split(',')
        .map(|d| d.trim().parse::<u64>().ok())
        .collect();
    let dtype = c.get(2).map(|m| m.as_str());
    t.requested_bytes = dims
        .zip(dtype.and_then(dtype_bytes))
        .and_then(|(d, e)| d.iter().try_fold(e, |acc, &x| acc.checked_mul(x)));
    t.tensor = Some(match dtype {
        Some(d) => format!("{d}[{}]", c[1].trim()),
        None => format!("[{}]", c[1].trim()),
    });
    t.gpu = TF_GPU
        .captures(&line[c.get(0).unwrap().start()..])
        .and_then(|g| cap_u32(&g, 1).or_else(|| cap_u32(&g, 2)));
    t.complete = t.requested_bytes.is_some() && t.gpu.is_some();
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

fn open_nccl(line: &str) -> Option<Opened> {
    let c = NCCL.captures(line)?;
    let mut t = empty(Kind::Nccl, "nccl");
    t.requested_bytes = cap_u64(&c, 1);
    let device = NCCL_DEVICE.captures(line);
    t.gpu = device.as_ref().and_then(|d| cap_u32(d, 1));
    t.complete = true;
    let start = device.map_or(c.get(0).unwrap().start(), |d| d.get(0).unwrap().start());
    Some(Opened { text: t, start })
}

/// Fills the fields of a PyTorch allocator text from `text` (the opening line, or the opening line with
/// the lines that continue it joined on). Returns whether the text is now complete.
pub fn continue_torch(t: &mut OomText, text: &str) -> bool {
    if t.format == "torch-async" {
        return read_async(t, text);
    }
    if t.format == "torch"
        && let Some(m) = TORCH.find(text)
    {
        // A message of unknown words that went on in a known wording.
        t.format = "torch>=2.1".into();
        if let Some(v) = vendor_of(&text[m.start()..]) {
            t.vendor = v;
        }
    }
    if t.requested_bytes.is_none()
        && let Some(c) = TORCH.captures(text)
    {
        t.requested_bytes = cap_size(&c, 1).or_else(|| cap_size(&c, 3));
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
