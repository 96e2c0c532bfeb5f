//! The rows of the table of OOM wordings gpudoc reads ([`FORMATS`]), apart from the engine that reads
//! them (`formats.rs`, `wording.rs`). A row names the format its reading carries, the program that
//! writes it, its vendor and what it means; its needles (cheap words one of which must be on the line
//! before its pattern is tried), its pattern, whose placeholders `{field:unit}` capture the text's
//! figures into the fields of an `OomText` in the unit the text writes them in, and what a following
//! line may add ([`Follows`]). Rows are tried in the table's order: the first that reads a line reads it.
//! Adding a wording is a row here and a real text in `fixtures/oom/real/`; `docs/oom.md`'s table of
//! formats is generated from this one.

use super::text::{Kind, Vendor};
use super::then::{
    device_as_character, exact_size_follows, free_of_total, library_name, metal_memory, tensor_size,
};
use super::wording::{Allocator, Field, Follows, Format, Means, ROW};
use crate::program::Program;

use Field::{Free, Gpu, Requested};

/// The CUDA runtime's and driver's names for an allocation that failed, as programs print them (not
/// PyTorch's hint "Search for `cudaErrorMemoryAllocation' in ..."; darknet's `CUDA Error: out of memory`);
/// RAPIDS' memory manager (RMM, under cuDF and cuML) throws `std::bad_alloc: out_of_memory` when cudaMalloc
/// fails. TensorFlow and XLA on ROCm name HIP's error `HIP_ERROR_OutOfMemory` where CUDA's driver says
/// `CUDA_ERROR_OUT_OF_MEMORY`. spconv's tensors (cumm's tensorview) check each call as `cuda failed with
/// error 2 out of memory` (`cuda execution failed with error 2` in spconv 1): error 2 is
/// cudaErrorMemoryAllocation. So it is in a glog check (Caffe's `Check failed: error == cudaSuccess (2 vs.
/// 0)  out of memory`, old Paddle's `(0 vs. 2) Cuda Error: out of memory`). OpenCV's CUDA module raises
/// `(-217:Gpu API call) out of memory in function 'allocate'` (2.4: `Gpu API call (out of memory)`),
/// OptiX `OPTIX_ERROR_DEVICE_OUT_OF_MEMORY`, Blender's Cycles `System is out of GPU [and shared host]
/// memory`; a check in a program's own source file (`CUDA error 2 at src/kernels.cu:12: out of memory`,
/// `Cuda error in func "cuda_init_device" at line 33: out of memory.`) and a bare `cudaMalloc failed: out
/// of memory`. Old HIP (ROCm 1 and 2) numbered the error `hipErrorMemoryAllocation = 1002`, which
/// TensorFlow's ROCm driver printed as `from device: hipError_t(1002)`.
const CUDA_WORDS: &str = r#"CUDA (?:driver )?(?i:error): ?out of memory|CUDA_ERROR_OUT_OF_MEMORY|HIP_ERROR_OutOfMemory|cuMemAlloc\w* failed: out of memory|\bcudaErrorMemoryAllocation:? out of memory|\bcuda (?:execution )?failed with error 2 out of memory|\((?:2 vs\. 0|0 vs\. 2)\)\s+(?:Cuda Error: )?out of memory|\(-217:Gpu API call\) out of memory|Gpu API call \(out of memory\)|OPTIX_ERROR_DEVICE_OUT_OF_MEMORY|System is out of GPU (?:and shared host )?memory|\bparallel_for failed: out of memory|std::bad_alloc: out of memory|std::bad_alloc: out_of_memory|RMM_ERROR_OUT_OF_MEMORY|CUDA error \d+ at \S+:\d+: out of memory|(?i:cuda) error in func "[^"]*" at line \d+: out of memory|\bhipError_t\(1002\)|cudaMalloc(?: \w+)? failed: out of memory"#;
const CUDA_NEEDLES: &[&str] = &[
    "out of memory",
    "OUT_OF_MEMORY",
    "HIP_ERROR_OutOfMemory",
    "out of GPU",
    "out_of_memory",
    "hipError_t(1002)",
];

/// Every wording gpudoc reads, most specific first: the first row that reads a line reads it.
pub static FORMATS: [Format; 43] = [
    // PyTorch's caching allocator, every layout since 0.x; words may be joined without their space when a
    // logger broke the message. The exception precedes the platform's word (`CUDA`, ROCm's `HIP`,
    // Intel's `XPU`), or the class alone precedes "Tried to allocate".
    Format {
        id: "torch>=2.1",
        format: "torch>=2.1",
        layouts: &["torch-2.1", "torch<2.1", "torch<1.4", "ipex"],
        kind: Kind::TorchAllocator,
        source: Program::Pytorch,
        means: Means::Allocator,
        allocator: Allocator::Caching,
        needles: &["Tried to allocate"],
        pattern: r"(?:\b(?P<at>)[A-Z]{2,5} +)?(?i:out of memory)\.\s*Tried to allocate(?:\s*{requested:size})?|(?P<class>[\w.]*OutOfMemoryError): Tried to allocate(?:\s*{requested:size})?",
        follows: Follows::Torch,
        narrows: &["torch"],
        ..ROW
    },
    // The cudaMallocAsync allocator (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`, ComfyUI's
    // default): its figures follow, one a line. PyTorch printed the device number as a character, so
    // device 1 is `\x01`, and device 0 a NUL that ends the message there.
    Format {
        id: "torch-async",
        format: "torch-async",
        kind: Kind::TorchAllocator,
        source: Program::Pytorch,
        means: Means::Allocator,
        allocator: Allocator::Async,
        needles: &["would exceed allowed memory"],
        pattern: r"Allocation on device ?(?P<device>\d+|[\x01-\x1f])? ?would exceed allowed memory\.? \(out of memory\)",
        follows: Follows::AsyncFigures,
        then: Some(device_as_character),
        narrows: &["torch-async-cut", "torch"],
        ..ROW
    },
    // The MPS allocator (Apple silicon): its heaps, the process's other Metal memory, and the high
    // watermark their sum may not pass (PYTORCH_MPS_HIGH_WATERMARK_RATIO).
    Format {
        id: "mps",
        format: "mps",
        kind: Kind::TorchAllocator,
        vendor: Some(Vendor::Apple),
        source: Program::Pytorch,
        means: Means::Allocator,
        allocator: Allocator::Watermark,
        needles: &["MPS backend out of memory"],
        pattern: r"MPS backend out of memory \(MPS allocated: {reserved:size}, other allocations: {other:size}, max allowed: {allowed:size}\)\. Tried to allocate {requested:size} on \w+ pool",
        complete: &[Field::Process, Field::Allowed, Requested],
        then: Some(metal_memory),
        ..ROW
    },
    // CuPy's memory pool: `out of memory to allocate N bytes` (before v7), `Out of memory allocating N
    // bytes (allocated so far: M bytes[, limit set to: L bytes])` since (M is what the pool holds, L its
    // limit: `set_limit`, CUPY_GPU_MEMORY_LIMIT).
    Format {
        id: "cupy",
        format: "cupy",
        kind: Kind::Cupy,
        source: Program::Cupy,
        means: Means::Library,
        needles: &["OutOfMemoryError: "],
        pattern: r"(?P<class>[\w.]*OutOfMemoryError): (?:out of memory to allocate {requested:B} bytes|Out of memory allocating {requested:grouped} bytes(?: \(allocated so far: {reserved:grouped} bytes(?:, limit set to: {allowed:grouped} bytes)?\))?)",
        narrows: &["cupy-reprinted"],
        ..ROW
    },
    // CuPy's pool's message re-printed by a wrapper without its exception class (Chainer's `Exception in
    // main training loop: Out of memory allocating 25,600,000 bytes (allocated so far: 3,635,267,072
    // bytes).`): the pool's parenthesis tells it from other programs' words.
    Format {
        id: "cupy-reprinted",
        format: "cupy",
        kind: Kind::Cupy,
        source: Program::Cupy,
        means: Means::Library,
        needles: &["Out of memory allocating", "out of memory to allocate"],
        pattern: r"Out of memory allocating {requested:grouped} bytes \(allocated so far: {reserved:grouped} bytes(?:, limit set to: {allowed:grouped} bytes)?\)|out of memory to allocate {requested:B} bytes \(total \d+ bytes\)",
        ..ROW
    },
    // PaddlePaddle (raised as ResourceExhaustedError, on a line of its own before): what its allocator
    // holds on that GPU ("has been allocated", since 2.0) and what the device had left.
    Format {
        id: "paddle",
        format: "paddle",
        kind: Kind::Paddle,
        source: Program::Paddle,
        means: Means::Allocator,
        needles: &["Out of memory error on GPU"],
        pattern: r"Out of memory error on GPU {gpu:n}\.\s*Cannot allocate {requested:size}(?: GPU)? memory(?: on GPU \d+)?, (?:{reserved:size} memory has been allocated and )?available memory is(?: only)? {free:size}",
        ..ROW
    },
    // vLLM: the KV cache one request of max_model_len needs is larger than what its share of the GPU
    // (gpu_memory_utilization) left (V1: `To serve at least one request with the models's max seq len
    // (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (0.71
    // GiB).`), or holds fewer tokens than one such request.
    Format {
        id: "vllm-max-model-len",
        format: "vllm-max-model-len",
        kind: Kind::Vllm,
        source: Program::Vllm,
        means: Means::Server,
        needles: &["max seq len ("],
        pattern: r"(?:(?P<at>)To serve.*?)?max seq len \({max_model_len:n}\), \({requested:size} KV cache is needed, which is larger than the available KV cache memory \({free:size}\)|(?:(?P<at2>)The model.*?)?max seq len \({max_model_len:n}\) is larger than the maximum number of tokens that can be stored in KV cache \({kv_cache_tokens:n}\)",
        ..ROW
    },
    // vLLM's start-up refusal: less of the GPU was free than its share (`gpu_memory_utilization` ×
    // total) before it loaded anything: `Free memory on device (7.34/139.72 GiB) on startup is less than
    // desired GPU memory utilization (0.9, 125.75 GiB)` (later `on device cuda:0`).
    Format {
        id: "vllm-startup",
        format: "vllm-startup",
        kind: Kind::Vllm,
        source: Program::Vllm,
        means: Means::Server,
        needles: &["on startup is less than desired GPU memory"],
        pattern: r"(?i:free) memory on device(?: (?:\w+:)?{gpu:n})? \((?P<free>\d+(?:\.\d+)?)/(?P<total>\d+(?:\.\d+)?) ?(?P<unit>GiB|MiB|GB|MB)\) on startup is less than desired GPU memory utilization \([\d.]+, {requested:size}\)",
        then: Some(free_of_total),
        ..ROW
    },
    // vLLM: the memory its share of the GPU left for the KV cache holds no block. The traceback's
    // source line `raise ValueError("No available memory ...` quotes the same words: not a report.
    Format {
        id: "vllm",
        format: "vllm",
        kind: Kind::Vllm,
        source: Program::Vllm,
        means: Means::Server,
        needles: &["No available memory for the cache blocks"],
        pattern: r#"(?:^|[^"(])(?P<at>)No available memory for the cache blocks"#,
        ..ROW
    },
    // SGLang: the KV cache's share of the GPU (`--mem-fraction-static`) held no token after the weights
    // (`Not enough memory to allocate KV cache.` since 2026).
    Format {
        id: "sglang",
        format: "sglang",
        kind: Kind::Sglang,
        source: Program::Sglang,
        means: Means::Server,
        needles: &["Not enough memory"],
        pattern: r"Not enough memory(?:\. Please try to increase --mem-fraction-static| to allocate KV cache)",
        not_quoted: true,
        ..ROW
    },
    // text-generation-inference: its warmup's largest batch did not fit (`Not enough memory to handle
    // 4096 prefill tokens. You need to decrease `--max-batch-prefill-tokens``; before 1.0 `... 16000 total
    // tokens with 2 prefill tokens`).
    Format {
        id: "tgi",
        format: "tgi",
        kind: Kind::Tgi,
        source: Program::Tgi,
        means: Means::Server,
        needles: &["Not enough memory to handle"],
        pattern: r"Not enough memory to handle \d+ (?:total tokens with \d+ )?prefill tokens",
        not_quoted: true,
        ..ROW
    },
    // ggml's CUDA backend (llama.cpp, ollama, whisper.cpp), also built for ROCm with the same words. The
    // exact size follows on the next line: `failed to allocate CUDA0 buffer of size 151851674624`.
    Format {
        id: "ggml",
        format: "ggml",
        kind: Kind::LlamaCpp,
        source: Program::LlamaCpp,
        means: Means::Engine,
        needles: &["cudaMalloc failed: out of memory"],
        pattern: r"(?:(?P<at>)ggml_\S*\s+)?allocating {requested:MiB} MiB on device {gpu:n}: cudaMalloc failed: out of memory",
        exception: false,
        follows: Follows::GgmlSize,
        then: Some(exact_size_follows),
        narrows: &["cuda"],
        ..ROW
    },
    // ggml's CUDA check as it was in 2023: `CUDA error 2 at .../ggml-cuda.cu:781: out of memory`.
    Format {
        id: "ggml-check",
        format: "ggml",
        kind: Kind::LlamaCpp,
        source: Program::LlamaCpp,
        means: Means::Engine,
        needles: &["out of memory"],
        pattern: r"CUDA error \d+ at \S*ggml\S*:\d+: out of memory",
        follows: Follows::GgmlSize,
        narrows: &["cuda"],
        ..ROW
    },
    // TensorRT-LLM's CUDA check: `[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n,
    // mCudaStream->get()): out of memory (.../tllmBuffers.h:118)`.
    Format {
        id: "tensorrt-llm",
        format: "tensorrt-llm",
        kind: Kind::Tensorrt,
        source: Program::TensorrtLlm,
        means: Means::Engine,
        needles: &["[TensorRT-LLM][ERROR] CUDA runtime error in"],
        pattern: r"\[TensorRT-LLM\]\[ERROR\] CUDA runtime error in .*?: out of memory",
        ..ROW
    },
    // TensorRT: `Error Code 1: Cuda Runtime (out of memory)` (8.4 and later), `Cuda Error in allocate: 2
    // (out of memory)` and `OutOfMemory Error in ...: 0` (7), `Error Code 2: OutOfMemory (Requested size
    // was N bytes.)` (10) or `(no further information)`, whose size the warning beside it gives.
    Format {
        id: "tensorrt",
        format: "tensorrt",
        kind: Kind::Tensorrt,
        source: Program::Tensorrt,
        means: Means::Engine,
        needles: &[
            "Cuda Runtime (out of memory)",
            "(out of memory)",
            "OutOfMemory",
            "Requested amount of GPU memory",
        ],
        pattern: r"Cuda Runtime \(out of memory\)|Cuda Error in [\w:]+: 2 \(out of memory\)|OutOfMemory Error in \S+: \d+|Error Code 2: OutOfMemory \((?:Requested size was {requested:B} bytes|no further information)|Requested amount of GPU memory \({requested:B} bytes\) could not be allocated",
        ..ROW
    },
    // The CUDA call check ONNX Runtime took from CNTK: `[ONNXRuntimeError] : 1 : FAIL : ...cuda_call.cc:121
    // onnxruntime::CudaCall CUDA failure 2: out of memory ; GPU=0 ; hostname=...`: the message starts at
    // its error's name.
    Format {
        id: "onnxruntime",
        format: "onnxruntime",
        kind: Kind::Onnxruntime,
        source: Program::Onnxruntime,
        means: Means::Engine,
        needles: &["CUDA failure 2: out of memory"],
        pattern: r"(?:(?P<at>)\[ONNXRuntimeError\].*?)?CUDA failure 2: out of memory(?: ; GPU={gpu:n})?",
        requires: Some(r"onnxruntime|ONNXRuntime"),
        complete: &[Gpu],
        exception: false,
        narrows: &["cuda-failure"],
        ..ROW
    },
    // The same check in CNTK and elsewhere.
    Format {
        id: "cuda-failure",
        format: "cuda-failure",
        source: Program::Cntk,
        needles: &["CUDA failure 2: out of memory"],
        pattern: r"CUDA failure 2: out of memory(?: ; GPU={gpu:n})?",
        complete: &[Gpu],
        exception: false,
        ..ROW
    },
    // ONNX Runtime's arena. The CPU provider's arena prints the same words: only a line that names the
    // CUDA provider or its arena is a GPU's.
    Format {
        id: "onnxruntime-arena",
        format: "onnxruntime-arena",
        kind: Kind::Onnxruntime,
        source: Program::Onnxruntime,
        means: Means::Engine,
        needles: &["Failed to allocate memory for requested buffer of size"],
        pattern: r"(?:(?P<at>)(?:\[ONNXRuntimeError\]|Non-zero status).*?)?Failed to allocate memory for requested buffer of size {requested:B}",
        requires: Some(
            r"CUDAExecutionProvider|\bCudaCall\b|\bCUDA_CALL\b|CudaCaching|BFCArena for Cuda(?:[^\w]|$)",
        ),
        exception: false,
        ..ROW
    },
    // MXNet's pooled storage manager (`src/storage/./pooled_storage_manager.h:157: cudaMalloc failed: out
    // of memory`).
    Format {
        id: "mxnet",
        format: "mxnet",
        kind: Kind::Mxnet,
        source: Program::Mxnet,
        means: Means::Allocator,
        needles: &["failed: out of memory"],
        pattern: r"(?:(?P<exception>mxnet\.base\.MXNetError).*?)?cudaMalloc(?: \w+)? failed: out of memory",
        requires: Some(r"storage_manager|MXNetError"),
        narrows: &["cuda"],
        ..ROW
    },
    // A CUDA (or HIP) call's own check with the out-of-memory code beside the call's name, as GPU
    // libraries print it: FAISS's `Failed to cudaMalloc N bytes on device D (error 2 out of memory` and
    // `alloc fail ... dev D ... size N bytes (cudaMalloc error out of memory [2])`, its `CUDA error 2 out
    // of memory`, MindSpore's `cudaStreamCreateWithFlags failed, ret[2], out of memory`. Error 2 is
    // cudaErrorMemoryAllocation. The call may be one on pinned host memory (`cudaHostAlloc`): those are
    // no GPU OOM.
    Format {
        id: "cuda-call",
        format: "cuda-call",
        source: Program::Cuda,
        means: Means::Library,
        needles: &[
            "2 out of memory",
            "ret[2], out of memory",
            "out of memory [2]",
        ],
        pattern: r"(?:\b(?:cu|cuda|hip)[A-Z]\w*\b[^()\[\]]{0,60}?|\bCUDA error )(?:\(error 2 out of memory|2 out of memory|, ret\[2\], out of memory)|\b(?:cu|cuda|hip)[A-Z]\w* error out of memory \[2\]",
        reads: &[
            r"\b{requested:B} bytes\b",
            r"\bon device {gpu:n}\b|\bdev {gpu:n}\b",
        ],
        ..ROW
    },
    // CatBoost's GPU memory pool (NCudaLib::TOutOfMemoryError): `Out of memory. Requested 8880 MB; Free
    // 5902.061425 MB`, in MiB (its MB is 1024 * 1024); before 0.10 without the unit.
    Format {
        id: "catboost",
        format: "catboost",
        source: Program::Catboost,
        means: Means::Library,
        needles: &["Out of memory. Requested"],
        pattern: r"Out of memory\. Requested {requested:MiB}(?: MB)?; Free {free:MiB}(?: MB)?",
        ..ROW
    },
    // FasterTransformer's CUDA check: `[FT][ERROR] CUDA runtime error: out of memory
    // /path/memory_utils.cu:32`: no size, no device.
    Format {
        id: "fastertransformer",
        format: "fastertransformer",
        source: Program::Fastertransformer,
        means: Means::Engine,
        needles: &["[FT][ERROR] CUDA runtime error: out of memory"],
        pattern: r"\[FT\]\[ERROR\] CUDA runtime error: out of memory",
        ..ROW
    },
    // TurboMind's (lmdeploy), FasterTransformer's heir.
    Format {
        id: "turbomind",
        format: "turbomind",
        source: Program::Turbomind,
        means: Means::Engine,
        needles: &["[TM][ERROR] CUDA runtime error: out of memory"],
        pattern: r"\[TM\]\[ERROR\] CUDA runtime error: out of memory",
        ..ROW
    },
    // ggml's Metal backend (llama.cpp, ollama on Apple): a buffer Metal could not allocate
    // (`ggml_gallocr_reserve_n: failed to allocate Metal buffer of size 34681522080`), or a command buffer
    // that ran out (`Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)`).
    Format {
        id: "ggml-metal",
        format: "ggml-metal",
        kind: Kind::LlamaCpp,
        vendor: Some(Vendor::Apple),
        source: Program::LlamaCpp,
        means: Means::Engine,
        needles: &[
            "failed to allocate Metal buffer",
            "kIOGPUCommandBufferCallbackErrorOutOfMemory",
        ],
        pattern: r"failed to allocate Metal buffer of size {requested:B}|kIOGPUCommandBufferCallbackErrorOutOfMemory",
        ..ROW
    },
    // TensorFlow's status without the tensor's words (`ResourceExhaustedError: failed to allocate memory
    // [Op:AddV2]`): no size, no device. The CPU's allocator is another device's.
    Format {
        id: "tensorflow-status",
        format: "tensorflow-status",
        kind: Kind::Tensorflow,
        source: Program::Tensorflow,
        means: Means::Allocator,
        needles: &["failed to allocate memory"],
        unless: &["device:CPU", "allocator cpu"],
        pattern: r"(?:Resource exhausted|RESOURCE_EXHAUSTED|ResourceExhaustedError): failed to allocate memory",
        follows: Follows::TfNode { sized: false },
        ..ROW
    },
    // Elixir's EXLA raises XLA's words as an Elixir exception, without the status's name.
    Format {
        id: "exla",
        format: "exla",
        kind: Kind::Exla,
        source: Program::Exla,
        means: Means::Allocator,
        needles: &["Out of memory while trying to allocate"],
        pattern: r"(?P<at>)\*\* \((?P<exception>\w+)\) Out of memory while trying to allocate(?:\s*{requested:B} bytes)?",
        complete: &[Requested],
        ..ROW
    },
    // XLA on a TPU: a buffer its HBM had no room for (`Error allocating device buffer: Attempting to
    // allocate 129.50M. That was not possible. There are 78.17M free.; (0x0x0_HBM0)`; PyTorch/XLA before:
    // `Attempting to reserve X at the bottom of memory`), or a program larger than the HBM (`Ran out of
    // memory in memory space hbm. Used 9.08G of 7.48G hbm.`). A TPU chip is named by its coordinates, not
    // by a number any GPU tool knows.
    Format {
        id: "xla-tpu",
        format: "xla-tpu",
        kind: Kind::Xla,
        vendor: Some(Vendor::Google),
        source: Program::Xla,
        means: Means::Allocator,
        needles: &["That was not possible", "memory space hbm"],
        pattern: r"(?i:resource[_ ]exhausted): (?:(?:Error allocating device buffer: )?Attempting to (?:allocate|reserve) {requested:xla}(?: at the bottom of memory)?\. That was not possible\. There are {free:xla} free|Ran out of memory in memory space hbm\. Used {requested:xla} of {total:xla} hbm)",
        follows: Follows::Xla {
            gpu: false,
            total: false,
        },
        ..ROW
    },
    // Old PyTorch (THC): no numbers at all.
    Format {
        id: "thc",
        format: "thc",
        source: Program::Pytorch,
        means: Means::Runtime,
        needles: &["out of memory"],
        pattern: r"cuda runtime error ?\(2\) ?: ?out of memory|THCudaCheck FAIL.*error=2 : out of memory",
        ..ROW
    },
    // JAX/XLA: `RESOURCE_EXHAUSTED: Out of memory while trying to allocate N bytes`, its request's
    // `Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0` (the exact bytes over
    // the rounded figure).
    Format {
        id: "xla",
        format: "xla",
        kind: Kind::Xla,
        source: Program::Xla,
        means: Means::Allocator,
        needles: &["Out of memory ", "Failed to allocate request for"],
        pattern: r"(?i:resource[_ ]exhausted): (?:Out of memory (?:while trying to allocate|allocating)(?:\s*{requested:size})?|Failed to allocate request for {requested:size}(?: \({requested:B}B\))?(?: on device ordinal {gpu:n})?)",
        reads: &[r"on device (?:ordinal )?{gpu:n}|GPU_{gpu:n}_bfc"],
        follows: Follows::Xla {
            gpu: true,
            total: false,
        },
        ..ROW
    },
    // XLA's asynchronous allocator: the GPU's total follows in its `Free memory/Total memory` line.
    Format {
        id: "xla-async",
        format: "xla-async",
        kind: Kind::Xla,
        source: Program::Xla,
        means: Means::Allocator,
        needles: &["cuMemAllocAsync failed to allocate"],
        pattern: r"(?:gpu_async_{gpu:n} )?cuMemAllocAsync failed to allocate {requested:B} bytes",
        exception: false,
        follows: Follows::Xla {
            gpu: false,
            total: true,
        },
        narrows: &["cuda"],
        ..ROW
    },
    // TensorFlow's BFC allocator (`Allocator (GPU_0_bfc) ran out of memory trying to allocate 34.10MiB
    // (rounded to 35758080)`): a warning its error follows. It also says so when it will retry and go
    // on: that is no failure.
    Format {
        id: "bfc-tensorflow",
        format: "bfc",
        kind: Kind::Tensorflow,
        source: Program::Tensorflow,
        means: Means::Allocator,
        needles: &["ran out of memory trying to allocate"],
        unless: &["not a failure"],
        pattern: r"Allocator \((?:GPU_{gpu:n}_bfc|\w+)\) ran out of memory trying to allocate {requested:size}(?: \(rounded to {requested:B}\))?",
        requires: Some(r"TF_GPU_ALLOCATOR|tensorflow"),
        complete: &[Requested, Gpu],
        exception: false,
        follows: Follows::TfNode { sized: true },
        warning: true,
        ..ROW
    },
    // XLA's BFC allocator, the same words.
    Format {
        id: "bfc-xla",
        format: "bfc",
        kind: Kind::Xla,
        source: Program::Xla,
        means: Means::Allocator,
        needles: &["ran out of memory trying to allocate"],
        unless: &["not a failure"],
        pattern: r"Allocator \((?:GPU_{gpu:n}_bfc|\w+)\) ran out of memory trying to allocate {requested:size}(?: \(rounded to {requested:B}\))?",
        complete: &[Requested, Gpu],
        exception: false,
        follows: Follows::Xla {
            gpu: true,
            total: false,
        },
        warning: true,
        ..ROW
    },
    // TensorFlow: the tensor's shape and type give the size; its device is `/device:GPU:1` (1.5 and
    // later), `/gpu:1` (before), or its allocator's `GPU_1_bfc`; the `[[Node: ...]]` line after may name
    // it. A tensor on the CPU is host memory.
    Format {
        id: "tensorflow",
        format: "tensorflow",
        kind: Kind::Tensorflow,
        source: Program::Tensorflow,
        means: Means::Allocator,
        needles: &["OOM when allocating tensor"],
        pattern: r"OOM when allocating tensor (?:with|of) shape ?\[(?P<dims>[\d,\s]*)\](?: and type (?P<dtype>\w+))?(?: on (?P<on>\S*))?(?: by allocator (?P<allocator>\w+))?",
        reads: &[r"(?:device:GPU:|/gpu:){gpu:n}|\bGPU_{gpu:n}_bfc\b"],
        complete: &[Requested, Gpu],
        follows: Follows::TfNode { sized: true },
        then: Some(tensor_size),
        ..ROW
    },
    // NCCL: its `host:pid:tid [dev]` prefix names the CUDA device.
    Format {
        id: "nccl",
        format: "nccl",
        kind: Kind::Nccl,
        source: Program::Nccl,
        means: Means::Library,
        needles: &["'out of memory'", "Failed to CUDA calloc"],
        pattern: r"(?:[\w.\-]+:\d+:\d+ \[{gpu:n}\].*?)?(?:Cuda failure (?:\d+ )?'out of memory'|Failed to CUDA calloc (?:async )?{requested:B} bytes)",
        exception: false,
        ..ROW
    },
    // A CUDA library failing to allocate its workspace or handle: `RuntimeError: CUDA error:
    // CUBLAS_STATUS_ALLOC_FAILED when calling ...`: the class precedes "CUDA". CNTK names the device after
    // it (`cuDNN failure 2: CUDNN_STATUS_ALLOC_FAILED ; GPU=0 ; hostname=...`).
    Format {
        id: "cuda-library",
        format: "cublas",
        layouts: &["cudnn", "cusolver", "cusparse", "cufft"],
        kind: Kind::CudaLibrary,
        source: Program::CudaLibrary,
        means: Means::Library,
        needles: &["_STATUS_ALLOC_FAILED"],
        pattern: r"(?:(?P<at>)CUDA error:.*?)?\b(?P<library>CUBLAS|CUDNN|CUSOLVER|CUSPARSE|CUFFT)_STATUS_ALLOC_FAILED\b(?: ; GPU={gpu:n})?",
        then: Some(library_name),
        ..ROW
    },
    // XGBoost's device allocator: its figures follow its error on lines of their own.
    Format {
        id: "xgboost",
        format: "xgboost",
        source: Program::Xgboost,
        means: Means::Library,
        needles: CUDA_NEEDLES,
        pattern: CUDA_WORDS,
        requires: Some(r"Memory allocation error on worker \d+:"),
        complete: &[Free, Requested],
        follows: Follows::XgboostFigures,
        narrows: &["rmm", "cuda"],
        ..ROW
    },
    // The driver's words through TensorFlow and JAX, `failed to allocate 1.00G (1073741824 bytes) from
    // device`: the first of its 0.9× retries names the size.
    Format {
        id: "cuda-driver",
        format: "cuda-driver",
        source: Program::Tensorflow,
        needles: CUDA_NEEDLES,
        pattern: r"failed to allocate [^(]*\({requested:B} bytes\)",
        requires: Some(CUDA_WORDS),
        narrows: &["cuda"],
        ..ROW
    },
    // Triton's launcher checks each CUDA driver call it makes (loading a compiled kernel, launching it) and
    // raises the driver's words: `RuntimeError: Triton Error [CUDA]: out of memory`, often inside a
    // vLLM or SGLang worker whose KV cache left no room for one more kernel. No size, no device.
    Format {
        id: "triton",
        format: "triton",
        source: Program::Triton,
        needles: &["Triton Error [CUDA]: out of memory"],
        pattern: r"Triton Error \[CUDA\]: out of memory",
        ..ROW
    },
    // RAPIDS' memory manager (RMM, under cuDF and cuML).
    Format {
        id: "rmm",
        format: "rmm",
        source: Program::Rapids,
        means: Means::Library,
        needles: &["out_of_memory", "RMM_ERROR_OUT_OF_MEMORY"],
        pattern: r"std::bad_alloc: out_of_memory|RMM_ERROR_OUT_OF_MEMORY",
        narrows: &["cuda"],
        ..ROW
    },
    // Every other program's CUDA (HIP) runtime or driver error.
    Format {
        id: "cuda",
        format: "cuda",
        source: Program::Cuda,
        needles: CUDA_NEEDLES,
        pattern: CUDA_WORDS,
        follows: Follows::CurrentDevice,
        ..ROW
    },
    // Intel's Level Zero driver, through SYCL's unified runtime (`level_zero backend failed with error:
    // 39 (UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)`) or directly: the device's own allocation failed.
    Format {
        id: "level-zero",
        format: "level-zero",
        vendor: Some(Vendor::Intel),
        source: Program::LevelZero,
        needles: &["_RESULT_ERROR_OUT_OF_DEVICE_MEMORY"],
        pattern: r"\b(?:UR|ZE)_RESULT_ERROR_OUT_OF_DEVICE_MEMORY\b",
        ..ROW
    },
    // PyTorch's OutOfMemoryError raised with words no other row knows: an OOM of PyTorch's, of unknown
    // layout; its cudaMallocAsync text cut at device 0's NUL (`torch.OutOfMemoryError: Allocation on
    // device `). The lines that follow may still carry a known wording.
    Format {
        id: "torch-async-cut",
        format: "torch-async",
        kind: Kind::TorchAllocator,
        source: Program::Pytorch,
        means: Means::Allocator,
        allocator: Allocator::Async,
        needles: &["OutOfMemoryError:"],
        pattern: r"\b(?P<exception>torch\.(?:cuda\.)?OutOfMemoryError): *Allocation on device",
        follows: Follows::AsyncFigures,
        narrows: &["torch"],
        ..ROW
    },
    Format {
        id: "torch",
        format: "torch",
        kind: Kind::TorchAllocator,
        source: Program::Pytorch,
        means: Means::Allocator,
        needles: &["OutOfMemoryError:"],
        pattern: r"\b(?P<exception>torch\.(?:cuda\.)?OutOfMemoryError): *\S",
        follows: Follows::Torch,
        ..ROW
    },
];
