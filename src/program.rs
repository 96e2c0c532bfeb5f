//! The programs gpudoc names: which framework, inference server, engine or library wrote an OOM text
//! (`oom.source`, `oom.engine`: the formats' table, `oom::formats`), or runs as the job (`run.server`,
//! `gpu.server`: `rules::serving`). One vocabulary: each program has one id (what facts and rules
//! compare: `oom.source == 'llama_cpp'`), one name for messages (`llama.cpp`), and the other names it
//! goes by (`ggml`), which [`Program::named`] reads too.

use std::fmt;

/// A program gpudoc knows by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Program {
    Pytorch,
    Tensorflow,
    /// JAX and the other programs that run on XLA (PyTorch/XLA).
    Xla,
    /// Elixir's EXLA.
    Exla,
    Paddle,
    Mxnet,
    Cntk,
    Cupy,
    Rapids,
    Xgboost,
    Catboost,
    Nccl,
    Triton,
    Vllm,
    Sglang,
    Tgi,
    TensorrtLlm,
    Tensorrt,
    Onnxruntime,
    LlamaCpp,
    Fastertransformer,
    Turbomind,
    /// A CUDA library's handle or workspace (cuBLAS, cuDNN), whichever program used it.
    CudaLibrary,
    /// A CUDA runtime or driver call, whichever program made it.
    Cuda,
    /// Intel's Level Zero driver, CUDA's counterpart on Intel GPUs.
    LevelZero,
}

/// Every program, in the order the reference lists them.
pub const ALL: [Program; 25] = [
    Program::Pytorch,
    Program::Tensorflow,
    Program::Xla,
    Program::Exla,
    Program::Paddle,
    Program::Mxnet,
    Program::Cntk,
    Program::Cupy,
    Program::Rapids,
    Program::Xgboost,
    Program::Catboost,
    Program::Nccl,
    Program::Triton,
    Program::Vllm,
    Program::Sglang,
    Program::Tgi,
    Program::TensorrtLlm,
    Program::Tensorrt,
    Program::Onnxruntime,
    Program::LlamaCpp,
    Program::Fastertransformer,
    Program::Turbomind,
    Program::CudaLibrary,
    Program::Cuda,
    Program::LevelZero,
];

impl Program {
    /// Its id, its name in messages and its other names.
    fn names(self) -> (&'static str, &'static str, &'static [&'static str]) {
        match self {
            Program::Pytorch => ("pytorch", "PyTorch", &["torch", "torch_allocator"]),
            Program::Tensorflow => ("tensorflow", "TensorFlow", &[]),
            Program::Xla => ("xla", "JAX/XLA", &["jax/xla", "jax"]),
            Program::Exla => ("exla", "EXLA", &[]),
            Program::Paddle => ("paddle", "PaddlePaddle", &["paddlepaddle"]),
            Program::Mxnet => ("mxnet", "MXNet", &[]),
            Program::Cntk => ("cntk", "CNTK", &[]),
            Program::Cupy => ("cupy", "CuPy", &[]),
            Program::Rapids => ("rapids", "RAPIDS (RMM)", &["rmm"]),
            Program::Xgboost => ("xgboost", "XGBoost", &[]),
            Program::Catboost => ("catboost", "CatBoost", &[]),
            Program::Nccl => ("nccl", "NCCL", &[]),
            Program::Triton => ("triton", "Triton", &[]),
            Program::Vllm => ("vllm", "vLLM", &[]),
            Program::Sglang => ("sglang", "SGLang", &[]),
            Program::Tgi => (
                "tgi",
                "Text Generation Inference",
                &["text-generation-inference"],
            ),
            Program::TensorrtLlm => ("tensorrt_llm", "TensorRT-LLM", &["tensorrt-llm", "trtllm"]),
            Program::Tensorrt => ("tensorrt", "TensorRT", &[]),
            Program::Onnxruntime => ("onnxruntime", "ONNX Runtime", &[]),
            Program::LlamaCpp => ("llama_cpp", "llama.cpp", &["ggml"]),
            Program::Fastertransformer => ("fastertransformer", "FasterTransformer", &[]),
            Program::Turbomind => ("turbomind", "TurboMind", &["lmdeploy"]),
            Program::CudaLibrary => ("cuda_library", "a CUDA library", &["cuda-library"]),
            Program::Cuda => ("cuda", "a CUDA call", &["cuda-call", "cuda_runtime"]),
            Program::LevelZero => ("level_zero", "Level Zero", &["level-zero"]),
        }
    }

    /// Its id, what facts hold and rules compare (`llama_cpp`).
    pub fn id(self) -> &'static str {
        self.names().0
    }

    /// Its name in messages (`llama.cpp`).
    pub fn label(self) -> &'static str {
        self.names().1
    }

    /// The other names it goes by (`ggml`).
    pub fn aliases(self) -> &'static [&'static str] {
        self.names().2
    }

    /// The program `name` names: its id, its name in messages or another of its names.
    pub fn named(name: &str) -> Option<Program> {
        ALL.into_iter().find(|p| {
            let (id, label, aliases) = p.names();
            id == name || label == name || aliases.contains(&name)
        })
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_names_one_program() {
        for (i, p) in ALL.into_iter().enumerate() {
            assert!(!ALL[..i].contains(&p), "{p:?} twice");
            for name in [p.id(), p.label()]
                .into_iter()
                .chain(p.aliases().iter().copied())
            {
                let named: Vec<Program> = ALL
                    .into_iter()
                    .filter(|q| q.id() == name || q.label() == name || q.aliases().contains(&name))
                    .collect();
                assert_eq!(named, [p], "{name}");
            }
        }
        assert_eq!(Program::named("ggml"), Some(Program::LlamaCpp));
        assert_eq!(
            Program::named("text-generation-inference"),
            Some(Program::Tgi)
        );
        assert_eq!(Program::named("no such program"), None);
        // An id is what a rule compares: lower case, no spaces.
        assert!(
            ALL.iter()
                .all(|p| p.id().chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        );
    }

    #[test]
    fn every_program_a_bundled_rule_compares_is_one_of_these() {
        // `oom.source == 'ggml'` would never hold: the fact holds the id.
        let compared = regex::Regex::new(
            r"(?:oom\.source|oom\.engine|run\.server|gpu\.server)\s*(?:==|!=|in)\s*\[?((?:\s*'[^']*'\s*,?)+)",
        )
        .unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("rules");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            // The rule files (rules/words/ holds the words of an OOM's cause, which compare no program).
            if path.extension().is_none_or(|x| x != "toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for c in compared.captures_iter(&text) {
                for name in c[1].split(',').map(|n| n.trim().trim_matches('\'')) {
                    seen += 1;
                    assert!(
                        name.is_empty() || ALL.iter().any(|p| p.id() == name),
                        "{}: `{name}` is no program's id",
                        path.display()
                    );
                }
            }
        }
        assert!(seen > 10, "the rules compare programs: {seen}");
    }
}
