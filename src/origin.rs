//! Where a run ran: the machine, the job's name, Slurm's ids, the launcher's id and the run's rank among
//! the launch's tasks. Read from the environment once (settings, through [`Launch::read`]), carried by the
//! trace's start row and the report, so reports of one job from many hosts can be merged.

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
    /// This run's rank among the tasks of its launch, as the innermost launcher that started gpudoc numbers
    /// them ([`TASKS`]): torchrun's `RANK`, PMIx's `PMIX_RANK`, Slurm's `SLURM_PROCID`.
    pub rank: Option<u64>,
    /// How many tasks that launcher started: `WORLD_SIZE`, `SLURM_NTASKS` (PMIx does not say).
    pub world_size: Option<u64>,
}

/// The environment variables that name one launch, the same on all of its nodes.
pub const LAUNCH_IDS: [&str; 2] = ["TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE"];

/// The launchers that start one gpudoc per task, innermost first (srun often starts torchrun, which starts
/// gpudoc; the rank is torchrun's then): the variable that says the launcher started this process, the one
/// that gives its rank, and the one that gives the number of tasks.
pub const TASKS: [(&str, &str, Option<&str>); 3] = [
    ("TORCHELASTIC_RUN_ID", "RANK", Some("WORLD_SIZE")),
    ("PMIX_NAMESPACE", "PMIX_RANK", None),
    ("SLURM_JOB_ID", "SLURM_PROCID", Some("SLURM_NTASKS")),
];

/// Slurm's ids, when the run was part of a Slurm job.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default)]
pub struct Slurm {
    pub job_id: Option<String>,
    pub step_id: Option<String>,
    pub node_id: Option<String>,
}

/// What the environment says of the launch that started gpudoc.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Launch {
    pub slurm: Slurm,
    /// [`Origin::launch`].
    pub id: Option<String>,
    /// [`Origin::rank`].
    pub rank: Option<u64>,
    /// [`Origin::world_size`].
    pub world_size: Option<u64>,
}

impl Launch {
    /// Reads the launch from the environment, `var` giving a variable's value (empty is unset).
    pub fn read(var: impl Fn(&str) -> Option<String>) -> Launch {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        let number = |name: &str| var(name)?.trim().parse::<u64>().ok();
        let task = TASKS.iter().find(|(by, _, _)| var(by).is_some());
        Launch {
            slurm: Slurm {
                job_id: var("SLURM_JOB_ID"),
                step_id: var("SLURM_STEP_ID"),
                node_id: var("SLURM_NODEID"),
            },
            id: LAUNCH_IDS
                .iter()
                .find_map(|name| Some(format!("{name}={}", var(name)?))),
            rank: task.and_then(|(_, rank, _)| number(rank)),
            world_size: task.and_then(|(_, _, size)| number((*size)?)),
        }
    }
}

impl Origin {
    /// The job's id, the same on every node of it: Slurm's `JOB.STEP` (as `sacct` writes it; `JOB` outside
    /// a step), unique on its cluster, else the launcher's id. The `job_id` label of the metrics, and the
    /// start of the name `--report-dir` gives a report.
    pub fn job_id(&self) -> Option<String> {
        if let Some(job) = &self.slurm.job_id {
            return Some(match &self.slurm.step_id {
                Some(step) => format!("{job}.{step}"),
                None => job.clone(),
            });
        }
        let launch = self.launch.as_deref()?;
        Some(launch.split_once('=').map_or(launch, |(_, id)| id).into())
    }

    /// The name, less its extension, `gpudoc run --report-dir` gives this run's report: its job, host and
    /// rank, as far as they are known (`4242.0-node7-rank3`), each in characters any file system takes.
    pub fn report_stem(&self) -> String {
        let safe = |s: &str| -> String {
            s.chars()
                .map(|c| match c {
                    'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' => c,
                    _ => '_',
                })
                .collect()
        };
        let host = if self.host.is_empty() {
            "host"
        } else {
            &self.host
        };
        let mut parts: Vec<String> = self.job_id().iter().map(|j| safe(j)).collect();
        parts.push(safe(host));
        if let Some(rank) = self.rank {
            parts.push(format!("rank{rank}"));
        }
        parts.join("-")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Launch {
        Launch::read(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn an_srun_task_is_its_job_step_and_procid() {
        let l = env(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_NODEID", "2"),
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
        ]);
        assert_eq!(l.slurm.job_id.as_deref(), Some("4242"));
        assert_eq!(l.slurm.node_id.as_deref(), Some("2"));
        assert_eq!((l.id, l.rank, l.world_size), (None, Some(3), Some(4)));
    }

    #[test]
    fn torchrun_under_srun_numbers_the_ranks_not_slurm() {
        // srun starts one torchrun per node (SLURM_PROCID is the node's), which starts a gpudoc per GPU.
        let l = env(&[
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("TORCHELASTIC_RUN_ID", "llama"),
            ("RANK", "13"),
            ("WORLD_SIZE", "16"),
        ]);
        assert_eq!(l.id.as_deref(), Some("TORCHELASTIC_RUN_ID=llama"));
        assert_eq!((l.rank, l.world_size), (Some(13), Some(16)));
    }

    #[test]
    fn a_rank_no_launcher_gave_is_not_taken() {
        // RANK alone is a user's variable (or one torchrun set for gpudoc's parent's parent), not a rank.
        let l = env(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("SLURM_PROCID", "")]);
        assert_eq!(l, Launch::default());
        // A launcher without a readable rank leaves it unknown, never zero.
        let l = env(&[("PMIX_NAMESPACE", "ns"), ("PMIX_RANK", "x")]);
        assert_eq!((l.rank, l.world_size), (None, None));
    }

    #[test]
    fn the_job_id_is_slurms_step_else_the_launchers() {
        let mut o = Origin {
            host: "node 7/a".into(),
            launch: Some("TORCHELASTIC_RUN_ID=run=1".into()),
            rank: Some(3),
            ..Default::default()
        };
        assert_eq!(o.job_id().as_deref(), Some("run=1"));
        assert_eq!(o.report_stem(), "run_1-node_7_a-rank3");
        o.slurm.job_id = Some("4242".into());
        assert_eq!(o.job_id().as_deref(), Some("4242"));
        o.slurm.step_id = Some("0".into());
        assert_eq!(o.report_stem(), "4242.0-node_7_a-rank3");
        let alone = Origin::default();
        assert_eq!((alone.job_id(), alone.report_stem()), (None, "host".into()));
    }
}
