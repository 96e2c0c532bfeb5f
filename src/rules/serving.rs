//! Inference servers that take a fixed share of the GPU at start, on purpose: the model's weights and a
//! KV cache sized to fill what the share leaves. Their memory is flat by design and says nothing about
//! what requests need, as JAX's preallocation (recognised by its level, `jax-preallocation`). They are
//! recognised from the command lines of the job and its processes: the program (`vllm serve`,
//! `trtllm-serve`), the module (`python -m sglang.launch_server`), or the title a server gives its
//! processes (`VLLM::EngineCore`). A server started from a script of the user's (`LLM(...)` in Python)
//! shows none of these and is not recognised.

use crate::program::Program;

/// A server recognised, and its setting as the command line shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Server {
    pub program: Program,
    /// Its id (`vllm`, `sglang`, `tensorrt_llm`, `tgi`: [`Program::id`]).
    pub id: &'static str,
    /// As messages name it (`vLLM`: [`Program::label`]).
    pub label: &'static str,
    /// The flag that sets its share.
    pub flag: &'static str,
    /// The flag and its value as written (`--gpu-memory-utilization 0.8`); `None` when not given.
    pub setting: Option<String>,
    /// The share it takes: the value given, else its default where the server has a fixed one.
    pub fraction: Option<f64>,
}

struct Known {
    program: Program,
    /// Program names (the last part of a path).
    programs: &'static [&'static str],
    /// Prefixes of a module run with `python -m`, or of the title a server gives its processes.
    prefixes: &'static [&'static str],
    flag: &'static str,
    default: Option<f64>,
}

/// The servers known, with their flags and defaults (vLLM 0.11, SGLang 0.5, TensorRT-LLM 1.0, TGI 3).
/// SGLang's default share depends on the GPU and the parallelism: none is given.
const KNOWN: [Known; 4] = [
    Known {
        program: Program::Vllm,
        programs: &["vllm"],
        prefixes: &["vllm.", "VLLM::"],
        flag: "--gpu-memory-utilization",
        default: Some(0.9),
    },
    Known {
        program: Program::Sglang,
        programs: &["sglang"],
        prefixes: &["sglang.", "sglang::"],
        flag: "--mem-fraction-static",
        default: None,
    },
    Known {
        program: Program::TensorrtLlm,
        programs: &["trtllm-serve"],
        // Its server's module only: `tensorrt_llm.commands.build` builds an engine and holds no KV cache.
        prefixes: &["tensorrt_llm.commands.serve"],
        flag: "--kv_cache_free_gpu_memory_fraction",
        default: Some(0.9),
    },
    Known {
        program: Program::Tgi,
        programs: &["text-generation-launcher", "text-generation-server"],
        prefixes: &[],
        flag: "--cuda-memory-fraction",
        default: Some(1.0),
    },
];

/// The server among `cmdlines` (the job's command, then its processes'), if one is known; a command line
/// that gives the setting is preferred to one that only names the server.
pub fn recognise<'a>(cmdlines: impl IntoIterator<Item = &'a str>) -> Option<Server> {
    let mut found: Option<Server> = None;
    for line in cmdlines {
        let args: Vec<&str> = line.split_whitespace().collect();
        let Some(k) = KNOWN.iter().find(|k| names(k, &args)) else {
            continue;
        };
        let setting = setting(k.flag, &args);
        if found.is_none()
            || (setting.is_some() && found.as_ref().is_some_and(|f| f.setting.is_none()))
        {
            found = Some(Server {
                program: k.program,
                id: k.program.id(),
                label: k.program.label(),
                flag: k.flag,
                fraction: setting.as_ref().map(|s| s.1).or(k.default),
                setting: setting.map(|s| s.0),
            });
        }
    }
    found
}

/// Whether `args` run the server `k`: its program, or its module after `-m`, or its process title.
fn names(k: &Known, args: &[&str]) -> bool {
    let program = |a: &str| k.programs.contains(&a.rsplit('/').next().unwrap_or(a));
    let module = |a: &str| k.prefixes.iter().any(|p| a.starts_with(p));
    let first = args.first().copied().unwrap_or("");
    program(first)
        || module(first)
        || python_module(args).is_some_and(module)
        // `python /usr/bin/vllm serve`: a script run by its interpreter.
        || (first.rsplit('/').next().unwrap_or("").starts_with("python")
            && args.get(1).is_some_and(|a| program(a)))
}

/// The module a Python interpreter in `args` runs with its own `-m` (`env X=1 python3 -u -m vllm...`,
/// `conda run -n env python -m ...`): its options come before the script, and a `-m` after the script
/// (`python train.py -m vllm.cfg`) is the script's.
fn python_module<'a>(args: &[&'a str]) -> Option<&'a str> {
    let at = args
        .iter()
        .position(|a| a.rsplit('/').next().unwrap_or(a).starts_with("python"))?;
    let mut i = at + 1;
    while let Some(&a) = args.get(i) {
        match a {
            "-m" => return args.get(i + 1).copied(),
            // Options that take the next argument as their value.
            "-W" | "-X" | "-Q" => i += 2,
            _ if a.starts_with('-') => i += 1,
            _ => return None,
        }
    }
    None
}

/// `flag` and its value in `args` (`--flag 0.8` or `--flag=0.8`; `-` and `_` alike, as the servers'
/// parsers take either): as written, and as a number.
fn setting(flag: &str, args: &[&str]) -> Option<(String, f64)> {
    let norm = |s: &str| s.replace('_', "-");
    let want = norm(flag);
    for (i, a) in args.iter().enumerate() {
        let (name, value): (&str, Option<&str>) = match a.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (a, args.get(i + 1).copied()),
        };
        if norm(name) != want {
            continue;
        }
        let v = value?;
        return Some((format!("{name} {v}"), v.parse().ok()?));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(lines: &[&str]) -> Option<(&'static str, Option<String>, Option<f64>)> {
        recognise(lines.iter().copied()).map(|s| (s.id, s.setting, s.fraction))
    }

    #[test]
    fn servers_and_their_settings_are_read_from_command_lines() {
        assert_eq!(
            of(&["vllm serve meta-llama/Llama-3.1-8B --gpu-memory-utilization 0.8"]),
            Some((
                "vllm",
                Some("--gpu-memory-utilization 0.8".into()),
                Some(0.8)
            ))
        );
        assert_eq!(
            of(&[
                "python3 -m vllm.entrypoints.openai.api_server --model m --gpu_memory_utilization=0.5"
            ]),
            Some((
                "vllm",
                Some("--gpu_memory_utilization 0.5".into()),
                Some(0.5)
            ))
        );
        // Not on the command line: the default, said as the default.
        assert_eq!(
            of(&["/opt/venv/bin/vllm serve m"]),
            Some(("vllm", None, Some(0.9)))
        );
        // The engine's process, titled by vLLM, and the job's command a wrapper script.
        assert_eq!(
            of(&["bash serve.sh", "VLLM::EngineCore_DP0"]),
            Some(("vllm", None, Some(0.9)))
        );
        assert_eq!(
            of(&["python -m sglang.launch_server --model-path m --mem-fraction-static 0.7"]),
            Some((
                "sglang",
                Some("--mem-fraction-static 0.7".into()),
                Some(0.7)
            ))
        );
        // SGLang's default depends on the GPU: none is made up.
        assert_eq!(
            of(&["python3 -m sglang.launch_server --model-path m"]),
            Some(("sglang", None, None))
        );
        assert_eq!(
            of(&["trtllm-serve m --kv_cache_free_gpu_memory_fraction 0.85"]),
            Some((
                "tensorrt_llm",
                Some("--kv_cache_free_gpu_memory_fraction 0.85".into()),
                Some(0.85)
            ))
        );
        assert_eq!(
            of(&["text-generation-launcher --model-id m --cuda-memory-fraction 0.6"]),
            Some(("tgi", Some("--cuda-memory-fraction 0.6".into()), Some(0.6)))
        );
        assert_eq!(
            of(&["python3 /usr/local/bin/vllm serve m --gpu-memory-utilization 0.3"]).map(|s| s.2),
            Some(Some(0.3))
        );
    }

    #[test]
    fn a_command_line_with_the_setting_wins_over_one_that_only_names_the_server() {
        assert_eq!(
            of(&[
                "VLLM::EngineCore_DP0",
                "vllm serve m --gpu-memory-utilization 0.6"
            ])
            .map(|s| s.2),
            Some(Some(0.6))
        );
    }

    #[test]
    fn a_module_run_by_an_interpreter_behind_options_or_a_launcher_is_recognised() {
        for line in [
            "env CUDA_VISIBLE_DEVICES=0 python3 -W ignore -u -m vllm.entrypoints.openai.api_server",
            "conda run -n serve python -m vllm.entrypoints.openai.api_server --model m",
            "/opt/venv/bin/python3.11 -X dev -m vllm.entrypoints.cli.main serve m",
        ] {
            assert_eq!(of(&[line]).map(|s| s.0), Some("vllm"), "{line}");
        }
        let trt =
            "python3 -m tensorrt_llm.commands.serve m --kv_cache_free_gpu_memory_fraction 0.8";
        assert_eq!(of(&[trt]).map(|s| s.0), Some("tensorrt_llm"));
    }

    #[test]
    fn look_alikes_are_no_server() {
        for line in [
            "python train.py --output-dir vllm_runs",
            "python /home/me/vllm/examples/offline.py",
            "python3 bench_vllm.py --gpu-memory-utilization 0.9",
            "python -m torch.distributed.run --nproc-per-node 2 train.py",
            "sglang_client.py",
            "python train.py -m vllm.cfg",
            "python3 -u bench.py -m sglang.launch_server",
            "python -m tensorrt_llm.commands.build --checkpoint_dir c --output_dir e",
        ] {
            assert_eq!(of(&[line]), None, "{line}");
        }
    }
}
