//! What inference engines and other runtimes print when the GPU has no room: llama.cpp (ggml), vLLM,
//! ONNX Runtime's CUDA provider, TensorRT, MXNet. Each opener reads one wording into an
//! [`OomText`](super::parse::OomText) of its engine's [`Kind`]; [`parse::open`](super::parse::open)
//! tries them among the others.

use super::text::{
    Kind, OomText, Opened, cap_size, cap_u32, cap_u64, empty, re, size_bytes, with_exception,
};
use regex::Regex;
use std::sync::LazyLock;

// ggml's CUDA backend (llama.cpp, ollama, whisper.cpp), also built for ROCm with the same words. The
// exact size follows on the next line: `failed to allocate CUDA0 buffer of size 151851674624`.
static LLAMA_CPP: LazyLock<Regex> = LazyLock::new(|| {
    re(r"allocating (\d+(?:\.\d+)?) MiB on device (\d+): cudaMalloc failed: out of memory")
});
static LLAMA_CPP_SIZE: LazyLock<Regex> =
    LazyLock::new(|| re(r"failed to allocate (?:CUDA|ROCm)(\d+) buffer of size (\d+)"));
// ggml's CUDA check as it was in 2023: `CUDA error 2 at .../ggml-cuda.cu:781: out of memory`.
static CUDA_CHECK_AT: LazyLock<Regex> =
    LazyLock::new(|| re(r"CUDA error \d+ at (\S+):\d+: out of memory"));
// Since: `CUDA error: out of memory`, then `  current device: 0, in function ggml_cuda_pool_malloc_vmm at
// ...ggml-cuda.cu:8583` (the device, numbered as the process saw them).
static CURRENT_DEVICE: LazyLock<Regex> =
    LazyLock::new(|| re(r"current device: (\d+), in function (\w+)"));
// vLLM: the memory its share of the GPU (gpu_memory_utilization) left for the KV cache holds no block,
// or fewer tokens than one request of max_model_len. The traceback's source line
// `raise ValueError("No available memory ...` quotes the same words: not a report.
static VLLM_BLOCKS: LazyLock<Regex> =
    LazyLock::new(|| re(r#"(?:^|[^"(])No available memory for the cache blocks"#));
static VLLM_MAX_LEN: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)",
    )
});
// vLLM's V1 engine: `To serve at least one request with the models's max seq len (131072), (16.00 GiB KV
// cache is needed, which is larger than the available KV cache memory (0.71 GiB).`
static VLLM_KV_NEEDED: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"max seq len \((\d+)\), \(SIZE KV cache is needed, which is larger than the available KV cache memory \(SIZE\)",
    )
});
// vLLM's start-up refusal: less of the GPU was free than its share (`gpu_memory_utilization` × total)
// before it loaded anything: `Free memory on device (7.34/139.72 GiB) on startup is less than desired
// GPU memory utilization (0.9, 125.75 GiB)` (later `on device cuda:0`).
static VLLM_STARTUP: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?i:free) memory on device(?: (?:\w+:)?(\d+))? \((\d+(?:\.\d+)?)/(\d+(?:\.\d+)?) ?(GiB|MiB|GB|MB)\) on startup is less than desired GPU memory utilization \([\d.]+, SIZE\)",
    )
});
// SGLang: the KV cache's share of the GPU (`--mem-fraction-static`) held no token after the weights
// (`Not enough memory to allocate KV cache.` since 2026).
static SGLANG: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Not enough memory(?:\. Please try to increase --mem-fraction-static| to allocate KV cache)",
    )
});
// text-generation-inference: its warmup's largest batch did not fit (`Not enough memory to handle 4096
// prefill tokens. You need to decrease `--max-batch-prefill-tokens``; before 1.0 `... 16000 total tokens
// with 2 prefill tokens`).
static TGI: LazyLock<Regex> = LazyLock::new(|| {
    re(r"Not enough memory to handle \d+ (?:total tokens with \d+ )?prefill tokens")
});
// TensorRT: `Error Code 1: Cuda Runtime (out of memory)` (8.4 and later), `Cuda Error in allocate: 2 (out
// of memory)` and `OutOfMemory Error in ...: 0` (7), `Error Code 2: OutOfMemory (Requested size was N
// bytes.)` (10) or `(no further information)`, whose size the warning beside it gives.
static TENSORRT: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"Cuda Runtime \(out of memory\)|Cuda Error in [\w:]+: 2 \(out of memory\)|OutOfMemory Error in \S+: \d+|Error Code 2: OutOfMemory \((?:Requested size was (\d+) bytes|no further information)",
    )
});
// TensorRT-LLM's CUDA check: `[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n,
// mCudaStream->get()): out of memory (.../tllmBuffers.h:118)`.
static TENSORRT_LLM: LazyLock<Regex> =
    LazyLock::new(|| re(r"\[TensorRT-LLM\]\[ERROR\] CUDA runtime error in .*?: out of memory"));
static TENSORRT_REQUEST: LazyLock<Regex> =
    LazyLock::new(|| re(r"Requested amount of GPU memory \((\d+) bytes\) could not be allocated"));
// The CUDA call check ONNX Runtime took from CNTK: `CUDA failure 2: out of memory ; GPU=0 ; hostname=...`.
static CUDA_FAILURE: LazyLock<Regex> =
    LazyLock::new(|| re(r"CUDA failure 2: out of memory(?: ; GPU=(\d+))?"));
// ONNX Runtime's arena. The CPU provider's arena prints the same words: only a line that names the CUDA
// provider or its arena is a GPU's.
static ORT_ARENA: LazyLock<Regex> =
    LazyLock::new(|| re(r"Failed to allocate memory for requested buffer of size (\d+)"));
static ORT_CUDA: LazyLock<Regex> = LazyLock::new(|| {
    re(r"CUDAExecutionProvider|\bCudaCall\b|\bCUDA_CALL\b|CudaCaching|BFCArena for Cuda(?:[^\w]|$)")
});
static CUDA_MALLOC: LazyLock<Regex> =
    LazyLock::new(|| re(r"cudaMalloc(?: \w+)? failed: out of memory"));

/// The vLLM text that says its KV cache had no room.
pub fn open_vllm(line: &str) -> Option<Opened> {
    let mut t = empty(Kind::Vllm, "vllm");
    // Where the message starts: `ValueError: To serve at least one request with the model's max seq len
    // (N), ...`, `ValueError: The model's max seq len (N) is ...`, `ValueError: No available memory ...`.
    let from = |at: usize, word: &str| line[..at].rfind(word).unwrap_or(at);
    let start = if let Some(c) = VLLM_KV_NEEDED.captures(line) {
        t.format = "vllm-max-model-len".into();
        t.max_model_len = cap_u64(&c, 1);
        t.requested_bytes = cap_size(&c, 2);
        t.free_bytes = cap_size(&c, 4);
        from(c.get(0).unwrap().start(), "To serve")
    } else if let Some(c) = VLLM_STARTUP.captures(line) {
        t.format = "vllm-startup".into();
        t.gpu = cap_u32(&c, 1);
        t.free_bytes = size_bytes(&c[2], &c[4]);
        t.total_bytes = size_bytes(&c[3], &c[4]);
        t.requested_bytes = cap_size(&c, 5);
        c.get(0).unwrap().start()
    } else if let Some(c) = VLLM_MAX_LEN.captures(line) {
        t.format = "vllm-max-model-len".into();
        t.max_model_len = cap_u64(&c, 1);
        t.kv_cache_tokens = cap_u64(&c, 2);
        from(c.get(0).unwrap().start(), "The model")
    } else {
        let m = VLLM_BLOCKS.find(line)?;
        // The match may start with the character before "No".
        m.start() + line[m.start()..].find("No available").unwrap_or(0)
    };
    t.complete = true;
    Some(with_exception(t, line, start))
}

/// Whether the words at `at` are the engine's source quoted in a traceback (`raise RuntimeError("Not
/// enough memory ...`), not its message.
fn quoted_in_source(line: &str, at: usize) -> bool {
    line[..at].ends_with("(\"") && line[..at].contains("raise ")
}

/// An engine's sentence that carries no figures: the report is that it was said.
fn open_sentence(line: &str, words: &Regex, kind: Kind, format: &str) -> Option<Opened> {
    let m = words
        .find(line)
        .filter(|m| !quoted_in_source(line, m.start()))?;
    let mut t = empty(kind, format);
    t.complete = true;
    Some(with_exception(t, line, m.start()))
}

/// SGLang's text that says its KV cache had no room.
pub fn open_sglang(line: &str) -> Option<Opened> {
    open_sentence(line, &SGLANG, Kind::Sglang, "sglang")
}

/// text-generation-inference's warmup that did not fit.
pub fn open_tgi(line: &str) -> Option<Opened> {
    open_sentence(line, &TGI, Kind::Tgi, "tgi")
}

pub fn open_llama_cpp(line: &str) -> Option<Opened> {
    let c = LLAMA_CPP.captures(line)?;
    let mut t = empty(Kind::LlamaCpp, "ggml");
    t.requested_bytes = size_bytes(&c[1], "MiB");
    t.gpu = cap_u32(&c, 2);
    refine_llama_cpp(&mut t, line);
    let start = line[..c.get(0).unwrap().start()]
        .rfind("ggml_")
        .unwrap_or(c.get(0).unwrap().start());
    Some(Opened { text: t, start })
}

/// ggml's CUDA check of 2023 (`CUDA error 2 at ggml-cuda.cu:781: out of memory`); the same words from
/// another program's source file are the CUDA runtime's.
pub fn open_cuda_check_at(line: &str) -> Option<Opened> {
    let c = CUDA_CHECK_AT.captures(line)?;
    let mut t = if c[1].contains("ggml") {
        empty(Kind::LlamaCpp, "ggml")
    } else {
        empty(Kind::CudaRuntime, "cuda")
    };
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

/// A bare `CUDA error: out of memory` that ggml printed names its device on the next line, and the ggml
/// function that failed: then it is llama.cpp's (or ollama's, whisper.cpp's).
pub fn refine_current_device(t: &mut OomText, text: &str) {
    // PyTorch's text (raised as an exception) is open only for ROCm's hint: ggml's line is not its.
    if let Some(c) = CURRENT_DEVICE.captures(text)
        && t.gpu.is_none()
        && t.exception.is_none()
    {
        t.gpu = cap_u32(&c, 1);
        if c[2].starts_with("ggml_") {
            t.kind = Kind::LlamaCpp;
            t.format = "ggml".into();
        }
    }
}

/// Reads the exact size of the buffer from the line that follows (the first line gives MiB with two
/// decimals). Returns whether it was found.
pub fn refine_llama_cpp(t: &mut OomText, text: &str) -> bool {
    if let Some(c) = LLAMA_CPP_SIZE.captures(text)
        && (t.gpu.is_none() || t.gpu == cap_u32(&c, 1))
    {
        t.gpu = cap_u32(&c, 1);
        t.requested_bytes = cap_u64(&c, 2);
        t.complete = true;
    }
    t.complete
}

pub fn open_tensorrt(line: &str) -> Option<Opened> {
    if let Some(m) = TENSORRT_LLM.find(line) {
        let mut t = empty(Kind::Tensorrt, "tensorrt-llm");
        t.complete = true;
        return Some(with_exception(t, line, m.start()));
    }
    let mut t = empty(Kind::Tensorrt, "tensorrt");
    let c = TENSORRT
        .captures(line)
        .or_else(|| TENSORRT_REQUEST.captures(line))?;
    t.requested_bytes = cap_u64(&c, 1);
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

/// TensorRT's warning that gives the size of an allocation it could not make; its error, before or
/// after, gives none (`Error Code 2: OutOfMemory (no further information)`).
pub fn is_tensorrt_request(line: &str) -> bool {
    TENSORRT_REQUEST.is_match(line)
}

pub fn open_cuda_failure(line: &str) -> Option<Opened> {
    let c = CUDA_FAILURE.captures(line)?;
    let ort = line.contains("onnxruntime") || line.contains("ONNXRuntime");
    let mut t = if ort {
        empty(Kind::Onnxruntime, "onnxruntime")
    } else {
        empty(Kind::CudaRuntime, "cuda-failure")
    };
    t.gpu = cap_u32(&c, 1);
    t.complete = t.gpu.is_some();
    let at = c.get(0).unwrap().start();
    // ONNX Runtime's status: `[ONNXRuntimeError] : 1 : FAIL : ...cuda_call.cc:121 onnxruntime::CudaCall
    // CUDA failure 2`: the message starts at its error's name.
    let start = line[..at].find("[ONNXRuntimeError]").unwrap_or(at);
    Some(Opened { text: t, start })
}

pub fn open_onnxruntime_arena(line: &str) -> Option<Opened> {
    let c = ORT_ARENA.captures(line)?;
    if !ORT_CUDA.is_match(line) {
        return None;
    }
    let mut t = empty(Kind::Onnxruntime, "onnxruntime-arena");
    t.requested_bytes = cap_u64(&c, 1);
    t.complete = true;
    let at = c.get(0).unwrap().start();
    let start = line[..at]
        .find("[ONNXRuntimeError]")
        .or_else(|| line[..at].find("Non-zero status"))
        .unwrap_or(at);
    Some(Opened { text: t, start })
}

/// MXNet's pooled storage manager (`src/storage/./pooled_storage_manager.h:157: cudaMalloc failed: out
/// of memory`), and any other program's bare `cudaMalloc failed: out of memory`.
pub fn open_mxnet(line: &str) -> Option<Opened> {
    let m = CUDA_MALLOC.find(line)?;
    let mxnet = line.contains("storage_manager") || line.contains("MXNetError");
    let t = if mxnet {
        empty(Kind::Mxnet, "mxnet")
    } else {
        empty(Kind::CudaRuntime, "cuda")
    };
    let mut opened = with_exception(t, line, m.start());
    opened.text.complete = true;
    if let Some(s) = line[..m.start()].find("mxnet.base.MXNetError") {
        opened.text.exception = Some("mxnet.base.MXNetError".into());
        opened.start = s;
    }
    Some(opened)
}

// A CUDA (or HIP) call's own check with the out-of-memory code beside the call's name, as GPU libraries
// print it: FAISS's `Failed to cudaMalloc N bytes on device D (error 2 out of memory` and `alloc fail ...
// dev D ... size N bytes (cudaMalloc error out of memory [2])`, its `CUDA error 2 out of memory`,
// MindSpore's `cudaStreamCreateWithFlags failed, ret[2], out of memory`. Error 2 is
// cudaErrorMemoryAllocation. The call may be one on pinned host memory (`cudaHostAlloc`): `parse::open`
// leaves those out.
static CUDA_CALL: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"(?:\b(?:cu|cuda|hip)[A-Z]\w*\b[^()\[\]]{0,60}?|\bCUDA error )(?:\(error 2 out of memory|2 out of memory|, ret\[2\], out of memory)|\b(?:cu|cuda|hip)[A-Z]\w* error out of memory \[2\]",
    )
});
static CALL_BYTES: LazyLock<Regex> = LazyLock::new(|| re(r"\b(\d+) bytes\b"));
static CALL_DEVICE: LazyLock<Regex> = LazyLock::new(|| re(r"\bon device (\d+)\b|\bdev (\d+)\b"));
// CatBoost's GPU memory pool (NCudaLib::TOutOfMemoryError): `Out of memory. Requested 8880 MB; Free
// 5902.061425 MB`, in MiB (its MB is 1024 * 1024); before 0.10 without the unit.
static CATBOOST: LazyLock<Regex> = LazyLock::new(|| {
    re(r"Out of memory\. Requested (\d+(?:\.\d+)?)(?: MB)?; Free (\d+(?:\.\d+)?)(?: MB)?")
});
// XGBoost's device allocator adds the device's free memory and the request on lines of their own after
// the allocator's error: `- Free memory: 8126464` (bytes) or `1.95398GB` (binary units). A number ends
// its line: one run on into the next line's digits (a log prefix joined as a terminal wraps) is not it.
static XGBOOST: LazyLock<Regex> = LazyLock::new(|| re(r"Memory allocation error on worker \d+:"));
static XGBOOST_FREE: LazyLock<Regex> =
    LazyLock::new(|| re(r"- Free memory: (\d+(?:\.\d+)?)(B|KB|MB|GB|TB)?(?:\s|$)"));
static XGBOOST_REQUESTED: LazyLock<Regex> =
    LazyLock::new(|| re(r"- Requested memory: (\d+(?:\.\d+)?)(B|KB|MB|GB|TB)?(?:\s|$)"));
// FasterTransformer's and TurboMind's (lmdeploy) CUDA check: `[FT][ERROR] CUDA runtime error: out of
// memory /path/memory_utils.cu:32`: no size, no device.
static FT_CHECK: LazyLock<Regex> =
    LazyLock::new(|| re(r"\[(FT|TM)\]\[ERROR\] CUDA runtime error: out of memory"));
// ggml's Metal backend (llama.cpp, ollama on Apple): a buffer Metal could not allocate
// (`ggml_gallocr_reserve_n: failed to allocate Metal buffer of size 34681522080`), or a command buffer
// that ran out (`Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)`).
static METAL: LazyLock<Regex> = LazyLock::new(|| {
    re(r"failed to allocate Metal buffer of size (\d+)|kIOGPUCommandBufferCallbackErrorOutOfMemory")
});

/// A CUDA call's check that names the out-of-memory code: the size and device the same text gives.
pub fn open_cuda_call(line: &str) -> Option<Opened> {
    let m = CUDA_CALL.find(line)?;
    let mut t = empty(Kind::CudaRuntime, "cuda-call");
    t.requested_bytes = CALL_BYTES.captures(line).and_then(|c| cap_u64(&c, 1));
    t.gpu = CALL_DEVICE
        .captures(line)
        .and_then(|c| cap_u32(&c, 1).or_else(|| cap_u32(&c, 2)));
    t.complete = true;
    Some(with_exception(t, line, m.start()))
}

/// CatBoost's pool: what it asked for and what the pool had free.
pub fn open_catboost(line: &str) -> Option<Opened> {
    let c = CATBOOST.captures(line)?;
    let mut t = empty(Kind::CudaRuntime, "catboost");
    t.requested_bytes = size_bytes(&c[1], "MiB");
    t.free_bytes = size_bytes(&c[2], "MiB");
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

/// Whether a CUDA runtime text is XGBoost's, whose figures follow on lines of their own.
pub fn is_xgboost(line: &str) -> bool {
    XGBOOST.is_match(line)
}

/// Reads XGBoost's `- Free memory:` and `- Requested memory:` lines; whether both were read.
pub fn refine_xgboost(t: &mut OomText, text: &str) -> bool {
    let size = |r: &Regex| {
        let c = r.captures(text)?;
        size_bytes(&c[1], c.get(2).map_or("B", |u| u.as_str()))
    };
    t.free_bytes = t.free_bytes.or_else(|| size(&XGBOOST_FREE));
    t.requested_bytes = t.requested_bytes.or_else(|| size(&XGBOOST_REQUESTED));
    t.complete = t.free_bytes.is_some() && t.requested_bytes.is_some();
    t.complete
}

/// FasterTransformer's or TurboMind's CUDA check.
pub fn open_ft_check(line: &str) -> Option<Opened> {
    let c = FT_CHECK.captures(line)?;
    let format = if &c[1] == "FT" {
        "fastertransformer"
    } else {
        "turbomind"
    };
    let mut t = empty(Kind::CudaRuntime, format);
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

/// ggml's Metal backend out of memory: Apple's GPU, the buffer's size when it says it.
pub fn open_metal(line: &str) -> Option<Opened> {
    let c = METAL.captures(line)?;
    let mut t = empty(Kind::LlamaCpp, "ggml-metal");
    t.vendor = super::text::Vendor::Apple;
    t.requested_bytes = cap_u64(&c, 1);
    t.complete = true;
    Some(with_exception(t, line, c.get(0).unwrap().start()))
}

#[cfg(test)]
mod tests {
    use super::super::parse::{Vendor, parse_line};
    use super::*;

    #[test]
    fn tensorrt_wordings_are_tensorrt_reports() {
        for line in [
            "[E] Error[1]: [defaultAllocator.cpp::allocate::31] Error Code 1: Cuda Runtime (out of memory)",
            "[E] [TRT] ../rtSafe/safeRuntime.cpp (25) - Cuda Error in allocate: 2 (out of memory)",
            "[E] [TRT] C:\\source\\rtSafe\\safeRuntime.cpp (25) - Cuda Error in nvinfer1::internal::DefaultAllocator::allocate: 2 (out of memory)",
            "[E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: OutOfMemory (no further information)",
        ] {
            let t = parse_line(line).unwrap();
            assert_eq!(
                (t.kind, t.format.as_str(), t.requested_bytes),
                (Kind::Tensorrt, "tensorrt", None),
                "{line}"
            );
        }
        let t = parse_line("[E] [virtualMemoryBuffer.cpp::resizePhysical::154] Error Code 2: OutOfMemory (Requested size was 16581132288 bytes.)").unwrap();
        assert_eq!(t.requested_bytes, Some(16581132288));
        assert!(parse_line("[E] [defaultAllocator.cpp::deallocate::42] Error Code 1: Cuda Runtime (invalid argument)").is_none());
    }

    #[test]
    fn vllm_kv_cache_texts_are_no_allocation_of_a_size() {
        let t = parse_line("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.").unwrap();
        assert_eq!((t.kind, t.requested_bytes), (Kind::Vllm, None));
        assert_eq!(t.exception.as_deref(), Some("ValueError"));
        // The traceback quotes the words in vLLM's source: no second report.
        assert!(
            parse_line(r#"    raise ValueError("No available memory for the cache blocks. ""#)
                .is_none()
        );
        // vLLM V1's wording, as a TPU run printed it (tpu-inference#223): the KV cache one request of
        // max_model_len needs, and what vLLM's share of the device had left for it.
        let t = parse_line("ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache is needed, which is larger than the available KV cache memory (0.71 GiB). Based on the available memory, the estimated maximum model length is 5632. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.").unwrap();
        assert_eq!(
            (t.format.as_str(), t.max_model_len, t.requested_bytes),
            ("vllm-max-model-len", Some(131072), Some(16 << 30))
        );
        assert_eq!(t.free_bytes, size_bytes("0.71", "GiB"));
        assert_eq!(t.exception.as_deref(), Some("ValueError"));
    }

    #[test]
    fn an_onnxruntime_arena_failure_is_a_gpu_oom_only_where_the_cuda_provider_is_named() {
        // Synthetic: no real text found names the provider on the arena's line (ONNX Runtime prints it
        // so under a progress bar that lists its providers, as Deep-Live-Cam#584 shows for CUDA calls).
        let cuda = "Processing: 4%| 12/300 [00:04, execution_providers=['CUDAExecutionProvider']] Non-zero status code returned while running Conv node. Name:'Conv_0' Status Message: bfc_arena.cc:376 onnxruntime::BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size 643840";
        let t = parse_line(cuda).unwrap();
        assert_eq!(
            (t.kind, t.requested_bytes),
            (Kind::Onnxruntime, Some(643840))
        );
        let cpu = &cuda[cuda.find("Non-zero").unwrap()..];
        assert!(parse_line(cpu).is_none(), "the CPU arena's same words");
        let pinned = "Extending BFCArena for CudaPinned. Failed to allocate memory for requested buffer of size 643840";
        assert!(parse_line(pinned).is_none(), "pinned host memory");
    }

    #[test]
    fn ggmls_cuda_checks_are_llama_cpps_with_their_device() {
        // llama-cpp-python#229: the 2023 check.
        let t = parse_line("CUDA error 2 at /tmp/llama-cpp-python/vendor/llama.cpp/ggml-cuda.cu:781: out of memory").unwrap();
        assert_eq!((t.kind, t.format.as_str()), (Kind::LlamaCpp, "ggml"));
        let t = parse_line("CUDA error 2 at src/kernels.cu:12: out of memory").unwrap();
        assert_eq!(t.kind, Kind::CudaRuntime, "another program's source file");
        // ollama#3237: the next line names the device and the ggml function.
        let mut t = parse_line("CUDA error: out of memory").unwrap();
        assert!(super::super::parse::open_ended(&t));
        super::super::parse::refine(
            &mut t,
            "CUDA error: out of memory  current device: 2, in function ggml_cuda_pool_malloc_vmm at ggml-cuda.cu:8583",
        );
        assert_eq!((t.kind, t.gpu), (Kind::LlamaCpp, Some(2)));
        // PyTorch's own, with its exception, reads the next line only for ROCm's hint (sdnext#4801).
        let mut t = parse_line("RuntimeError: CUDA error: out of memory").unwrap();
        super::super::parse::refine(
            &mut t,
            "RuntimeError: CUDA error: out of memory  current device: 2, in function ggml_cuda_pool_malloc_vmm at ggml-cuda.cu:8583",
        );
        assert_eq!((t.kind, t.gpu), (Kind::CudaRuntime, None));
        let mut t = parse_line("torch.AcceleratorError: CUDA error: out of memory").unwrap();
        assert!(super::super::parse::open_ended(&t));
        super::super::parse::refine(
            &mut t,
            "torch.AcceleratorError: CUDA error: out of memory Search for `hipErrorOutOfMemory' in https://rocm.docs.amd.com/projects/HIP/en/latest/index.html for more information.",
        );
        assert_eq!(t.vendor, super::super::text::Vendor::Amd);
    }

    #[test]
    fn tensorrt_llms_cuda_check_is_tensorrts() {
        let t = parse_line("RuntimeError: [TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, mCudaStream->get()): out of memory (/app/tensorrt_llm/cpp/tensorrt_llm/runtime/tllmBuffers.h:118)").unwrap();
        assert_eq!(
            (t.kind, t.format.as_str(), t.exception.as_deref()),
            (Kind::Tensorrt, "tensorrt-llm", Some("RuntimeError"))
        );
        assert!(parse_line("[TensorRT-LLM][ERROR] CUDA runtime error in cudaSetDevice(device): invalid device ordinal").is_none());
    }

    #[test]
    fn serving_engines_without_room_are_read_but_host_memory_and_source_quotes_are_not() {
        let t = parse_line("[2025-03-29 18:18:34 TP0] RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.").unwrap();
        assert_eq!(
            (t.kind, t.exception.as_deref()),
            (Kind::Sglang, Some("RuntimeError"))
        );
        let t = parse_line("Error: Warmup(Generation(\"Not enough memory to handle 16000 total tokens with 2 prefill tokens. You need to decrease `--max-batch-total-tokens` or `--max-batch-prefill-tokens`\"))").unwrap();
        assert_eq!(t.kind, Kind::Tgi);
        for line in [
            // hnswlib#354: host RAM.
            "RuntimeError: Not enough memory",
            "RuntimeError: [enforce fail at alloc_cpu.cpp:81] data. DefaultCPUAllocator: not enough memory: you tried to allocate 1073741824 bytes.",
            r#"    raise RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")"#,
        ] {
            assert!(parse_line(line).is_none(), "{line}");
        }
    }

    #[test]
    fn llama_cpp_on_rocm_is_amd() {
        let mut t = parse_line("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 14136.04 MiB on device 0: cudaMalloc failed: out of memory").unwrap();
        assert_eq!(
            (t.kind, t.gpu, t.vendor, t.complete),
            (Kind::LlamaCpp, Some(0), Vendor::Nvidia, false)
        );
        super::super::parse::refine(
            &mut t,
            "ggml_gallocr_reserve_n: failed to allocate ROCm0 buffer of size 14822711296",
        );
        assert_eq!(
            (t.requested_bytes, t.vendor, t.complete),
            (Some(14822711296), Vendor::Amd, true)
        );
    }
}
