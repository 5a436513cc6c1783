//! The settings of `pipeline`, and the schedules it orders micro-batches by.

use std::fmt;
use std::ops::Range;
use std::time::Duration;

use super::ConfigError;
use crate::data::ShardPolicy;
use crate::model::even_ranges;
use crate::world::Mesh;

/// Configuration of [`Pipeline`](crate::strategy::Pipeline).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PipelineConfig {
    /// Pipeline stages `p`: the world is `dp × p` ranks. At most the model's blocks.
    pub stages: usize,
    /// Blocks of each stage, first to last, adding up to the model's blocks; `None` cuts them
    /// as evenly as they go, the longer stages first. Uneven stages make room on a first stage
    /// that also holds the embeddings, or a last one that holds the head and the loss.
    pub stage_blocks: Option<Vec<usize>>,
    /// Micro-batches `m` per flush; each replica's shard is cut into this many.
    pub micro_batches: usize,
    /// The order of forwards and backwards.
    pub schedule: Schedule,
    /// Flushes per optimizer step (gradient accumulation).
    pub grad_accumulation: usize,
    /// Largest gradient bucket of the `dp` all-reduce, in MiB.
    pub bucket_cap_mb: f64,
    /// How a global batch that does not divide by the replicas is sharded.
    pub shard_policy: ShardPolicy,
    /// Seconds any collective call may wait before failing.
    pub collective_timeout_s: f64,
    /// Intra-op threads per rank; `None` shares the cores evenly among the ranks.
    pub threads_per_rank: Option<usize>,
    /// Activation checkpointing at stage granularity: keep only each micro-batch's stage
    /// input between its forward and backward, and recompute the forward in the backward.
    /// Saves the stage's inner activations for one extra forward per micro-batch.
    pub recompute: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            stages: 2,
            stage_blocks: None,
            micro_batches: 4,
            schedule: Schedule::OneFOneB,
            grad_accumulation: 1,
            bucket_cap_mb: 25.0,
            shard_policy: ShardPolicy::Uneven,
            collective_timeout_s: 300.0,
            threads_per_rank: None,
            recompute: false,
        }
    }
}

impl PipelineConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.stages == 0 {
            return Err(ConfigError::ZeroStages);
        }
        if self.micro_batches == 0 {
            return Err(ConfigError::ZeroMicroBatches);
        }
        if let Some(blocks) = &self.stage_blocks {
            if blocks.len() != self.stages {
                return Err(ConfigError::StageBlocksCount {
                    blocks: blocks.clone(),
                    stages: self.stages,
                });
            }
            if let Some(stage) = blocks.iter().position(|&b| b == 0) {
                return Err(ConfigError::EmptyStage {
                    stage,
                    blocks: blocks.clone(),
                });
            }
        }
        super::error::check_shared_settings(
            self.grad_accumulation,
            self.bucket_cap_mb,
            self.collective_timeout_s,
            self.threads_per_rank,
        )
    }

    /// The blocks of each stage of a model of `blocks` blocks: `stage_blocks` where given,
    /// otherwise [`even_ranges`].
    ///
    /// # Errors
    /// [`ConfigError::StageBlocksSum`] when `stage_blocks` do not add up to `blocks`.
    pub fn ranges(&self, blocks: usize) -> Result<Vec<Range<usize>>, ConfigError> {
        let Some(counts) = &self.stage_blocks else {
            return Ok(even_ranges(blocks, self.stages));
        };
        // Summed wide: counts from a command line can overflow a usize.
        let sum: u128 = counts.iter().map(|&n| n as u128).sum();
        if sum != blocks as u128 {
            return Err(ConfigError::StageBlocksSum {
                blocks: counts.clone(),
                model_blocks: blocks,
            });
        }
        let mut start = 0;
        Ok(counts
            .iter()
            .map(|&n| {
                start += n;
                start - n..start
            })
            .collect())
    }

    pub(crate) fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.collective_timeout_s)
    }

    /// Checks that a global batch of `batch` samples over `replicas` replicas gives each
    /// replica's shard at least one sample per micro-batch: asked by the plan before a run
    /// starts, and by [`Pipeline::step`](crate::strategy::Pipeline) of every batch it is given.
    ///
    /// # Errors
    /// [`ConfigError::MicroBatchesExceedBatch`].
    pub fn check_micro_batches(&self, batch: usize, replicas: usize) -> Result<(), ConfigError> {
        let smallest = match self.shard_policy {
            ShardPolicy::Uneven | ShardPolicy::Drop => batch / replicas.max(1),
            ShardPolicy::Pad => batch.div_ceil(replicas.max(1)),
        };
        if self.micro_batches > smallest {
            return Err(ConfigError::MicroBatchesExceedBatch {
                micro_batches: self.micro_batches,
                samples: smallest,
                batch,
                replicas,
            });
        }
        Ok(())
    }

    /// The `dp × pp` mesh for `world_size` ranks: the world's own when it has a `pp` axis,
    /// otherwise `dp = world_size / stages`.
    pub(crate) fn mesh(&self, world: &Mesh, world_size: usize) -> Result<Mesh, ConfigError> {
        let mismatch = || ConfigError::PipelineMesh {
            mesh: world.to_string(),
            stages: self.stages,
            world_size,
        };
        let pp = world.degree(Mesh::PP);
        if pp > 1 || world.axes().iter().any(|a| a.name == Mesh::PP) {
            let only_dp_pp = world
                .axes()
                .iter()
                .all(|a| a.name == Mesh::DP || a.name == Mesh::PP || a.degree == 1);
            if pp != self.stages || !only_dp_pp {
                return Err(mismatch());
            }
        } else if !world_size.is_multiple_of(self.stages) || world.degree(Mesh::TP) > 1 {
            return Err(mismatch());
        }
        Mesh::new(&[
            (Mesh::DP, world_size / self.stages),
            (Mesh::PP, self.stages),
        ])
        .map_err(|_| mismatch())
    }
}

/// How a stage orders its micro-batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Schedule {
    /// Every forward, then every backward: simple, holds all `m` micro-batches' activations.
    #[serde(rename = "gpipe")]
    GPipe,
    /// One forward, one backward: after a warm-up of `p − 1 − s` forwards, stage `s`
    /// alternates, so it holds at most `p − s` micro-batches' activations (at most `p`).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Schedule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|schedule| schedule.name() == s)
            .ok_or_else(|| format!("unknown schedule {s:?}; use gpipe or 1f1b"))
    }
}

impl Schedule {
    /// Every schedule.
    pub const ALL: [Schedule; 2] = [Schedule::GPipe, Schedule::OneFOneB];

    /// Their names, as [`Schedule::ALL`] lists them.
    pub const ALL_NAMES: [&'static str; 2] = [Self::ALL[0].name(), Self::ALL[1].name()];

    /// The name configs and command lines use.
    pub const fn name(self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
        }
    }
}
