//! Where a run ran: the machine, the job's name, Slurm's ids. Read from the environment once (settings),
//! carried by the trace's start row and the report, so reports of one job from many hosts can be merged.

use serde::{Deserialize, Serialize};

/// Where a run ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Origin {
    /// The machine's name.
    pub host: String,
    /// `gpudoc run --name`.
    pub name: Option<String>,
    pub slurm: Slurm,
    /// `CUDA_VISIBLE_DEVICES` as the job was started: how its CUDA device ordinals map to GPUs.
    pub cuda_visible_devices: Option<String>,
    /// The id of the launch that started gpudoc, the same on every node of one job: torchrun's
    /// `TORCHELASTIC_RUN_ID` (`torchrun --no-python gpudoc run ...`) or PMIx's `PMIX_NAMESPACE` (`mpirun
    /// gpudoc run ...`), as `name=value`.
    pub launch: Option<String>,
}

/// The environment variables that name one launch, the same on all of its nodes.
pub const LAUNCH_IDS: [&str; 2] = ["TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE"];

/// Slurm's ids, when the run was part of a Slurm job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Slurm {
    pub job_id: Option<String>,
    pub step_id: Option<String>,
    pub node_id: Option<String>,
}
