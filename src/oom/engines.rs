//! What the lines after an inference engine's or a library's OOM text add to it: ggml's exact buffer size
//! and device, XGBoost's figures, TensorRT's warning with the size its error leaves out. The wordings
//! themselves are rows of [`formats`](super::formats).

use super::text::{Kind, OomText, cap_u32, cap_u64, re, size_bytes};
use regex::Regex;
use std::sync::LazyLock;

// ggml's exact buffer size, on the line after its `allocating X MiB on device N` (`ROCm0` on AMD).
static LLAMA_CPP_SIZE: LazyLock<Regex> =
    LazyLock::new(|| re(r"failed to allocate (?:CUDA|ROCm)(\d+) buffer of size (\d+)"));

// Since: `CUDA error: out of memory`, then `  current device: 0, in function ggml_cuda_pool_malloc_vmm at
// ...ggml-cuda.cu:8583` (the device, numbered as the process saw them).
static CURRENT_DEVICE: LazyLock<Regex> =
    LazyLock::new(|| re(r"current device: (\d+), in function (\w+)"));

static TENSORRT_REQUEST: LazyLock<Regex> =
    LazyLock::new(|| re(r"Requested amount of GPU memory \((\d+) bytes\) could not be allocated"));

static XGBOOST_FREE: LazyLock<Regex> =
    LazyLock::new(|| re(r"- Free memory: (\d+(?:\.\d+)?)(B|KB|MB|GB|TB)?(?:\s|$)"));

static XGBOOST_REQUESTED: LazyLock<Regex> =
    LazyLock::new(|| re(r"- Requested memory: (\d+(?:\.\d+)?)(B|KB|MB|GB|TB)?(?:\s|$)"));

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

/// TensorRT's warning that gives the size of an allocation it could not make; its error, before or
/// after, gives none (`Error Code 2: OutOfMemory (no further information)`).
pub fn is_tensorrt_request(line: &str) -> bool {
    TENSORRT_REQUEST.is_match(line)
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
