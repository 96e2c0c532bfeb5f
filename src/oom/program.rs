//! Which program wrote an OOM text, as its reader tells (the kind and format it read the text as): an
//! inference server or engine, whose own settings are the remedies that fit it, or a framework's
//! allocator or a CUDA call that any program may make (a training loop's among them). The one place that
//! knows it: the rules read `oom.engine` and `oom.at_start`, never a format's name. (The formats' table
//! of issue 46 says the same of each row, as its `means` and `source`; this reads it from there once it
//! lands.)

use super::text::{Kind, OomText};

/// Inference engines known by their format alone: their text is a CUDA check's (`Kind::CudaRuntime`).
const ENGINE_FORMATS: [(&str, &str); 2] = [
    ("fastertransformer", "fastertransformer"),
    ("turbomind", "turbomind"),
];

/// The inference server or engine that wrote `t` (`vllm`, `sglang`, `tgi`, `tensorrt_llm`, `tensorrt`,
/// `onnxruntime`, `llama_cpp`, `fastertransformer`, `turbomind`); `None` for a framework's allocator
/// (PyTorch, JAX, TensorFlow, ...) or a CUDA call whose program the text does not name.
pub fn engine(t: &OomText) -> Option<&'static str> {
    match t.kind {
        Kind::Vllm => Some("vllm"),
        Kind::Sglang => Some("sglang"),
        Kind::Tgi => Some("tgi"),
        Kind::LlamaCpp => Some("llama_cpp"),
        Kind::Onnxruntime => Some("onnxruntime"),
        Kind::Tensorrt if t.format == "tensorrt-llm" => Some("tensorrt_llm"),
        Kind::Tensorrt => Some("tensorrt"),
        _ => ENGINE_FORMATS
            .iter()
            .find(|(format, _)| t.format == *format)
            .map(|(_, engine)| *engine),
    }
}

/// Whether `t` says the program found less of the GPU free at its start than it was to take, before it
/// loaded anything (vLLM's start-up check): the share is too large for what others left, not too small.
pub fn at_start(t: &OomText) -> bool {
    t.kind == Kind::Vllm && t.format == "vllm-startup"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oom::parse::parse_line;

    fn read(path: &str) -> OomText {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("fixtures/oom/real")
                .join(path),
        )
        .unwrap();
        text.lines()
            .find_map(parse_line)
            .unwrap_or_else(|| panic!("{path}: no OOM read"))
    }

    #[test]
    fn inference_engines_are_told_from_their_texts_and_frameworks_are_none() {
        for (file, want) in [
            (
                "fastertransformer_multi_gpu_gpt.txt",
                Some("fastertransformer"),
            ),
            ("turbomind_memory_utils.txt", Some("turbomind")),
            ("turbomind_allocator_terminate.txt", Some("turbomind")),
            ("vllm_startup_multiproc.txt", Some("vllm")),
        ] {
            assert_eq!(engine(&read(file)), want, "{file}");
        }
        let torch =
            parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.");
        assert_eq!(engine(&torch.unwrap()), None);
        assert!(at_start(&read("vllm_startup_multiproc.txt")));
        assert!(!at_start(&read("turbomind_memory_utils.txt")));
    }
}
