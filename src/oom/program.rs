//! Which program wrote an OOM text, as the formats' table says of the row that read it (its `source` and
//! `means`, `oom::formats`): an inference server or engine, whose own settings are the remedies that fit
//! it, or a framework's allocator, a library or a CUDA call that any program may make (a training loop's
//! among them). The one place that reads it: the rules read `oom.source`, `oom.engine`, `oom.at_start`
//! and `oom.alloc_options`, never a format's name.

use super::formats::FORMATS;
use super::text::{Kind, OomText};
use super::wording::{Format, Means};
use crate::program::Program;

/// The row of the formats' table that read `t`: the one of its kind that carries its format; a text
/// whose format a row's step named (a CUDA library's: `cublas`), the only row of its kind. `None` for a
/// format no row has (a report of an older gpudoc's).
pub fn row(t: &OomText) -> Option<&'static Format> {
    let of_kind = || FORMATS.iter().filter(|f| f.kind == t.kind);
    of_kind()
        .find(|f| f.carries(&t.format))
        .or_else(|| match of_kind().collect::<Vec<_>>()[..] {
            [only] => Some(only),
            _ => None,
        })
}

/// The program that wrote `t` (`oom.source`).
pub fn program(t: &OomText) -> Option<Program> {
    row(t).map(|f| f.source)
}

/// The inference server or engine that wrote `t` (`oom.engine`: vLLM, SGLang, TGI, TensorRT-LLM,
/// TensorRT, ONNX Runtime, llama.cpp, FasterTransformer, TurboMind: its row means a server's plan or an
/// engine's own allocation); `None` for a framework's allocator (PyTorch, JAX, TensorFlow, ...), a
/// library, or a CUDA call whose program the text does not name.
pub fn engine(t: &OomText) -> Option<Program> {
    row(t)
        .filter(|f| matches!(f.means, Means::Server | Means::Engine))
        .map(|f| f.source)
}

/// Whether `t` says the program found less of the GPU free at its start than it was to take, before it
/// loaded anything (vLLM's start-up check): the share is too large for what others left, not too small.
pub fn at_start(t: &OomText) -> bool {
    t.kind == Kind::Vllm && t.format == "vllm-startup"
}

/// The options of PyTorch's caching allocator (`PYTORCH_CUDA_ALLOC_CONF`) that the PyTorch which printed
/// `t` accepts, as its wording dates it (`oom.alloc_options`): `expandable_segments` came with 2.1, whose
/// wording is new; `max_split_size_mb` with 1.10, inside the 1.4-2.0 wording (`... reserved in total by
/// PyTorch)`; 2.0 stops a job whose setting names `expandable_segments`); neither before 1.4 (`...
/// cached)`), nor in Intel's extension (`ipex`), which reads no such setting. Both for a text whose wording
/// does not date it: it is then told as today's PyTorch is.
pub fn alloc_options(t: &OomText) -> &'static [&'static str] {
    const BOTH: &[&str] = &["expandable_segments", "max_split_size_mb"];
    if t.kind != Kind::TorchAllocator {
        return BOTH;
    }
    match t.format.as_str() {
        "torch<2.1" => &["max_split_size_mb"],
        "torch<1.4" | "ipex" => &[],
        _ => BOTH,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oom::parse::parse_line;

    fn read(path: &str) -> OomText {
        let text = std::fs::read_to_string(real().join(path)).unwrap();
        text.lines()
            .find_map(parse_line)
            .unwrap_or_else(|| panic!("{path}: no OOM read"))
    }

    fn real() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/oom/real")
    }

    #[test]
    fn inference_engines_are_told_from_their_texts_and_frameworks_are_none() {
        for (file, want) in [
            (
                "fastertransformer_multi_gpu_gpt.txt",
                Some(Program::Fastertransformer),
            ),
            ("turbomind_memory_utils.txt", Some(Program::Turbomind)),
            (
                "turbomind_allocator_terminate.txt",
                Some(Program::Turbomind),
            ),
            ("vllm_startup_multiproc.txt", Some(Program::Vllm)),
        ] {
            assert_eq!(engine(&read(file)), want, "{file}");
        }
        let torch =
            parse_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.");
        assert_eq!(engine(torch.as_ref().unwrap()), None);
        assert_eq!(program(&torch.unwrap()), Some(Program::Pytorch));
        assert!(at_start(&read("vllm_startup_multiproc.txt")));
        assert!(!at_start(&read("turbomind_memory_utils.txt")));
    }

    #[test]
    fn every_real_text_is_told_its_program_by_the_row_that_read_it() {
        let mut files: Vec<_> = std::fs::read_dir(real())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "txt"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let Some(t) = text.lines().find_map(parse_line) else {
                continue;
            };
            let row = row(&t).unwrap_or_else(|| panic!("{}: no row for {t:?}", path.display()));
            assert_eq!(row.kind, t.kind, "{}", path.display());
        }
    }

    #[test]
    fn a_kind_and_format_name_one_program() {
        // Two rows that may carry the same format of the same kind must name one program: else which
        // wrote a text would depend on the row's place in the table.
        for (i, a) in FORMATS.iter().enumerate() {
            for b in &FORMATS[i + 1..] {
                if a.kind == b.kind && (b.carries(a.format) || a.carries(b.format)) {
                    assert_eq!(
                        (a.source, a.means),
                        (b.source, b.means),
                        "{} {}",
                        a.id,
                        b.id
                    );
                }
            }
        }
    }
}
