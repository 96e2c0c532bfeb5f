//! Which framework's allocator a record of the shim's is about: PyTorch's caching allocator, or, from
//! `_gpudoc_frameworks.py`, JAX's (XLA's), CuPy's pool, TensorFlow's BFC allocator or RAPIDS' memory
//! manager (RMM). Their records are of one kind (in use, reserved, peaks, steps), so every rule reads
//! them alike; what a framework cannot tell is absent (its records leave it out: TensorFlow's say nothing
//! of reserved memory, and the report's reserved figures are then absent, never 0).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A framework whose allocator the shim reads.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Framework {
    #[default]
    Torch,
    Jax,
    Cupy,
    Tensorflow,
    Rmm,
}

impl Framework {
    /// The framework a message is about: its `fw` field (PyTorch's part of the shim sends none).
    pub fn of(v: &serde_json::Value) -> Option<Framework> {
        match v.get("fw") {
            None => Some(Framework::Torch),
            // Its id (serde's name of it); an unknown one is no framework's.
            Some(fw) => Framework::deserialize(fw).ok(),
        }
    }

    /// Its id, as the report's `framework` and the metrics' `framework` label write it (serde's name of
    /// it: a test holds the two together).
    pub fn id(self) -> &'static str {
        match self {
            Framework::Torch => "torch",
            Framework::Jax => "jax",
            Framework::Cupy => "cupy",
            Framework::Tensorflow => "tensorflow",
            Framework::Rmm => "rmm",
        }
    }

    /// Its name as a user reads it.
    pub fn name(self) -> &'static str {
        match self {
            Framework::Torch => "PyTorch",
            Framework::Jax => "JAX",
            Framework::Cupy => "CuPy",
            Framework::Tensorflow => "TensorFlow",
            Framework::Rmm => "RMM",
        }
    }

    /// What its live memory is made of, as messages name it: `tensors` (PyTorch, TensorFlow), `arrays`
    /// (JAX, CuPy), `allocations` (RMM, whose callers' objects it does not know).
    pub fn noun(self) -> &'static str {
        match self {
            Framework::Torch | Framework::Tensorflow => "tensors",
            Framework::Jax | Framework::Cupy => "arrays",
            Framework::Rmm => "allocations",
        }
    }

    /// Whether its records are at its steps: CuPy's and RMM's are readings ten times a second (no step a
    /// hook could count), which stand for steps in its records, and the report counts no steps for them.
    pub fn counts_steps(self) -> bool {
        !matches!(self, Framework::Cupy | Framework::Rmm)
    }

    pub fn is_torch(&self) -> bool {
        *self == Framework::Torch
    }

    /// Whether its allocator took its pool whole at the start, with these settings in force (the
    /// environment the process had, and what the framework said of itself): JAX's preallocates
    /// `XLA_PYTHON_CLIENT_MEM_FRACTION` (75%) of the GPU unless `XLA_PYTHON_CLIENT_PREALLOCATE=false` or
    /// another allocator is chosen; TensorFlow's BFC allocator takes nearly all of the GPU's free memory
    /// unless memory growth is on (`TF_FORCE_GPU_ALLOW_GROWTH=true`, or `set_memory_growth` on every GPU,
    /// which the shim reads as `memory_growth`) or `TF_GPU_ALLOCATOR=cuda_malloc_async`.
    pub fn preallocates(self, settings: &BTreeMap<String, String>) -> bool {
        let set = |k: &str| settings.get(k).map(|v| v.trim().to_ascii_lowercase());
        match self {
            Framework::Jax => {
                !matches!(
                    set("XLA_PYTHON_CLIENT_PREALLOCATE").as_deref(),
                    Some("false" | "0")
                ) && matches!(
                    set("XLA_PYTHON_CLIENT_ALLOCATOR").as_deref(),
                    None | Some("default" | "bfc")
                )
            }
            Framework::Tensorflow => {
                !matches!(set("TF_FORCE_GPU_ALLOW_GROWTH").as_deref(), Some("true"))
                    && !matches!(set("memory_growth").as_deref(), Some("true"))
                    && !matches!(
                        set("TF_GPU_ALLOCATOR").as_deref(),
                        Some("cuda_malloc_async")
                    )
            }
            Framework::Torch | Framework::Cupy | Framework::Rmm => false,
        }
    }
}

/// What a framework's part of the shim said of itself at its first record: its version and the settings
/// of its allocator the process had in its environment (only those set).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Hello {
    pub version: String,
    pub settings: BTreeMap<String, String>,
}

impl Hello {
    pub fn from_message(v: &serde_json::Value) -> Hello {
        let settings = v
            .get("settings")
            .and_then(|s| s.as_object())
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        Hello {
            version: v
                .get("version")
                .and_then(|x| x.as_str())
                .unwrap_or("?")
                .to_string(),
            settings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frameworks_id_is_its_name_in_messages_and_reports() {
        use Framework::*;
        for fw in [Torch, Jax, Cupy, Tensorflow, Rmm] {
            assert_eq!(serde_json::to_value(fw).unwrap(), fw.id());
            assert_eq!(
                Framework::of(&serde_json::json!({ "fw": fw.id() })),
                Some(fw)
            );
        }
        assert_eq!(Framework::of(&serde_json::json!({})), Some(Torch));
        assert_eq!(Framework::of(&serde_json::json!({ "fw": "mxnet" })), None);
    }

    /// A framework's settings as its hello gives them.
    fn settings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn jax_preallocates_unless_told_not_to() {
        let with = |pairs: &[(&str, &str)]| Framework::Jax.preallocates(&settings(pairs));
        assert!(with(&[]));
        assert!(with(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", ".5")]));
        assert!(!with(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "false")]));
        assert!(!with(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "False")]));
        assert!(!with(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")]));
        assert!(!Framework::Cupy.preallocates(&BTreeMap::new()));
    }

    #[test]
    fn tensorflow_preallocates_unless_memory_grows_or_allocates_asynchronously() {
        let with = |pairs: &[(&str, &str)]| Framework::Tensorflow.preallocates(&settings(pairs));
        assert!(with(&[]));
        assert!(with(&[("TF_FORCE_GPU_ALLOW_GROWTH", "false")]));
        assert!(with(&[("memory_growth", "false")]));
        assert!(!with(&[("TF_FORCE_GPU_ALLOW_GROWTH", "true")]));
        assert!(!with(&[("memory_growth", "true")]));
        assert!(!with(&[("TF_GPU_ALLOCATOR", "cuda_malloc_async")]));
        assert!(!Framework::Rmm.preallocates(&BTreeMap::new()));
    }

    #[test]
    fn a_message_names_its_framework_and_an_unknown_one_is_none() {
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert_eq!(Framework::of(&v(r#"{"k":"step"}"#)), Some(Framework::Torch));
        assert_eq!(Framework::of(&v(r#"{"fw":"jax"}"#)), Some(Framework::Jax));
        assert_eq!(
            Framework::of(&v(r#"{"fw":"tensorflow"}"#)),
            Some(Framework::Tensorflow)
        );
        assert_eq!(Framework::of(&v(r#"{"fw":"rmm"}"#)), Some(Framework::Rmm));
        assert_eq!(Framework::of(&v(r#"{"fw":"mxnet"}"#)), None);
    }
}
