//! The resolved plan of a run: which strategy, on how many ranks, along which axes. Worked out
//! and checked once, here, before anything starts, then passed down to the builder, the
//! training loop and the reports, and printed.
//!
//! A run asks with a [`PlanRequest`]: the strategy by name (`auto` included), the ranks if the
//! user named them, the data-parallel replicas if named, the strategies' settings and the
//! global batch. [`Plan::resolve`] turns it into the mesh `dp × pp × tp` (torchtitan's
//! `ParallelDims`): each strategy owns some axes (`ddp`: `dp`; `pipeline`: `dp × pp`;
//! `tensor`: `dp × pp × tp`), and the world is their product.

mod auto;
mod config;
pub mod cost;
mod kind;
mod shard_state;

use std::fmt;

use crate::optim::{Precision, StateLayout};
use crate::plan::cost::Fixed;
use crate::world::{Mesh, ProcessInfo};

pub use auto::Planner;
pub use auto::layout_configs;
pub(crate) use config::check_threads;
pub use config::{
    AutoConfig, ConfigError, DataParallelConfig, DdpConfig, PipelineConfig, Schedule, SingleConfig,
    StrategyConfigs, TensorConfig,
};
pub use kind::StrategyKind;
pub use shard_state::ShardState;

/// What a run asks for, before it is resolved.
#[derive(Debug, Clone)]
pub struct PlanRequest {
    /// The strategy by name; `auto` chooses.
    pub strategy: StrategyKind,
    /// Ranks the user named (`--world`, `--devices`, a config's `world`); `None` lets the plan
    /// derive them from the degrees, or `auto` from the machine.
    pub world: Option<usize>,
    /// Data-parallel replicas the user named (`--dp`): with `pipeline` and `tensor`, the world
    /// is then their product with the other degrees.
    pub dp: Option<usize>,
    /// Every strategy's settings: the stages (`[parallel.pipeline]`, `[parallel.tensor]`) and
    /// shards (`[parallel.tensor]`) come from here.
    pub configs: StrategyConfigs,
    /// Samples per optimizer step over all ranks.
    pub global_batch: usize,
    /// When the ranks share a CPU: its cores, which `auto` makes ranks when nobody named a
    /// world. `None` for devices that are not shared cores (GPUs).
    pub cpu_cores: Option<usize>,
    /// The model and the devices, for `auto` to plan with; without them `auto` gives every
    /// rank a full replica (Ddp).
    pub planner: Option<Planner>,
    /// What the run fixes of `auto`'s layout beyond the user's `[parallel.auto]`, and why: a
    /// checkpoint's stages and shards, or a precision's.
    pub fixed: Option<(Fixed, String)>,
}

impl PlanRequest {
    /// A request for `strategy` at `global_batch`, with every other field left to the plan.
    pub fn new(strategy: StrategyKind, global_batch: usize) -> Self {
        Self {
            strategy,
            world: None,
            dp: None,
            configs: StrategyConfigs::default(),
            global_batch,
            cpu_cores: None,
            planner: None,
            fixed: None,
        }
    }

    /// This request with `world` ranks named.
    pub fn with_world(mut self, world: usize) -> Self {
        self.world = Some(world);
        self
    }

    /// This request with these strategy settings.
    pub fn with_configs(mut self, configs: StrategyConfigs) -> Self {
        self.configs = configs;
        self
    }
}

/// A run's resolved plan. See the [module docs](self).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    strategy: StrategyKind,
    reason: String,
    mesh: Mesh,
    configs: StrategyConfigs,
    global_batch: usize,
    /// This process's place among the run's processes (one process unless
    /// [`Plan::across`] says otherwise).
    process: ProcessInfo,
    /// What the processes must agree on beyond the strategy's own checks.
    facts: Vec<(String, String)>,
}

impl Plan {
    /// Checks that `precision` can run as this plan says: bf16 and f16 do not run with
    /// pipeline stages yet (under `pipeline`, or `tensor` with stages), whose stages are not
    /// wrapped. A whole model and a tensor-parallel shard are.
    ///
    /// # Errors
    /// [`ConfigError::PrecisionUnsupported`].
    pub fn check_precision(&self, precision: Precision) -> Result<(), ConfigError> {
        let staged = self.mesh().degree(Mesh::PP) > 1 || self.strategy() == StrategyKind::Pipeline;
        if precision != Precision::F32 && staged {
            return Err(ConfigError::PrecisionUnsupported {
                precision,
                strategy: self.strategy(),
            });
        }
        Ok(())
    }

    /// Resolves and checks `request`: the concrete strategy (and why), the degrees and the
    /// mesh, and the settings with the degrees written in (the pipeline's `stages` is `pp`).
    ///
    /// # Errors
    /// [`ConfigError`] for a world the strategy cannot run on, degrees that do not multiply
    /// to the world, zero of anything, settings that cannot work, or a batch too small for
    /// the replicas or the micro-batches.
    pub fn resolve(request: PlanRequest) -> Result<Plan, ConfigError> {
        let PlanRequest {
            strategy,
            world,
            dp,
            mut configs,
            global_batch,
            cpu_cores,
            planner,
            fixed,
        } = request;
        if world == Some(0) {
            return Err(ConfigError::NoDevices);
        }
        if dp == Some(0) {
            return Err(ConfigError::ZeroReplicas);
        }
        let (strategy, reason, world) = match strategy {
            StrategyKind::Auto => {
                configs.validate(StrategyKind::Auto)?;
                let limited =
                    configs.auto.max_memory.is_some() || configs.auto.memory_margin.is_some();
                if limited && planner.is_none() {
                    return Err(ConfigError::LimitsWithoutPlanner);
                }
                let fixed = auto::fixed(&configs, fixed)?;
                // The ranks one replica of the fixed stages and shards takes.
                let model_parallel = fixed
                    .as_ref()
                    .map_or(1, |(f, _)| f.pp.unwrap_or(1) * f.tp.unwrap_or(1));
                let from_cores = world.or(dp).is_none() && cpu_cores.is_some();
                let ranks = match (world, dp) {
                    (None, Some(dp)) => {
                        dp.checked_mul(model_parallel)
                            .ok_or_else(|| ConfigError::TooManyRanks {
                                ranks: format!("dp {dp} × {model_parallel}, which overflows"),
                            })?
                    }
                    _ => auto_ranks(world, cpu_cores, &configs, global_batch, model_parallel),
                };
                let (kind, chosen, reason) = auto::choose(
                    ranks,
                    from_cores,
                    planner.as_ref(),
                    fixed.as_ref(),
                    &configs,
                )?;
                configs = chosen;
                (kind, reason, Some(ranks))
            }
            kind => (kind, "chosen by the user".to_string(), world),
        };
        let (dp, pp, tp) = match strategy {
            StrategyKind::Single => match world.or(dp).unwrap_or(1) {
                1 => (1, 1, 1),
                ranks => return Err(ConfigError::SingleWithMany { ranks }),
            },
            StrategyKind::DataParallel | StrategyKind::Ddp => (replicas(world, dp, 1)?, 1, 1),
            StrategyKind::Pipeline => {
                let pp = configs.pipeline.stages;
                if pp == 0 {
                    return Err(ConfigError::ZeroStages);
                }
                (replicas(world, dp, pp)?, pp, 1)
            }
            StrategyKind::Tensor => {
                let (tp, pp) = (configs.tensor.tp, configs.tensor.stages);
                if tp == 0 {
                    return Err(ConfigError::ZeroShards);
                }
                if pp == 0 {
                    return Err(ConfigError::ZeroStages);
                }
                let model_parallel = pp.checked_mul(tp).ok_or(ConfigError::TooManyRanks {
                    ranks: format!("pp {pp} × tp {tp}, which overflows"),
                })?;
                (replicas(world, dp, model_parallel)?, pp, tp)
            }
            StrategyKind::Auto => unreachable!("auto resolves to a concrete strategy above"),
        };
        let ranks = [dp, pp, tp]
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= crate::world::MAX_LOCAL_RANKS)
            .ok_or_else(|| ConfigError::TooManyRanks {
                ranks: format!("dp {dp} × pp {pp} × tp {tp}"),
            })?;
        debug_assert!(ranks >= 1);
        let mut axes = vec![(Mesh::DP, dp)];
        if strategy == StrategyKind::Pipeline || pp > 1 {
            axes.push((Mesh::PP, pp));
        }
        if strategy == StrategyKind::Tensor {
            axes.push((Mesh::TP, tp));
        }
        let mesh = Mesh::new(&axes).expect("the degrees are positive and the names distinct");
        if strategy == StrategyKind::Pipeline {
            configs.pipeline.stages = pp;
        }
        configs.validate(strategy)?;
        let accumulation = configs.grad_accumulation(strategy);
        if accumulation > global_batch {
            return Err(ConfigError::AccumulationExceedsBatch {
                micro_batches: accumulation,
                batch: global_batch,
            });
        }
        if global_batch < dp {
            return Err(ConfigError::BatchSmallerThanReplicas {
                batch: global_batch,
                replicas: dp,
            });
        }
        if pp > 1 {
            // The schedule the stages run with: Tensor's own settings over the pipeline's.
            let pipeline = match strategy {
                StrategyKind::Tensor => configs.tensor.pipeline(&configs.pipeline),
                _ => configs.pipeline.clone(),
            };
            pipeline.check_micro_batches(global_batch, dp)?;
        }
        Ok(Plan {
            strategy,
            reason,
            mesh,
            configs,
            global_batch,
            process: ProcessInfo::single(),
            facts: Vec::new(),
        })
    }

    /// This plan with its ranks spread over the processes `process` describes (as a launcher
    /// such as `mpirun` started them): each process holds `world / processes` consecutive
    /// ranks.
    ///
    /// # Errors
    /// [`ConfigError::WorldNotDivisible`] when the ranks do not divide among the processes,
    /// and [`ConfigError::MultiProcess`] for a strategy that cannot span processes.
    pub fn across(mut self, process: ProcessInfo) -> Result<Plan, ConfigError> {
        let processes = process.processes;
        if processes > 1 {
            if !self.world_size().is_multiple_of(processes) {
                return Err(ConfigError::WorldNotDivisible {
                    world: self.world_size(),
                    processes,
                });
            }
            self.strategy.check_processes(processes)?;
        }
        self.process = process;
        Ok(self)
    }

    /// This plan, whose ranks also check at start-up that they agree on `value` (as
    /// [`World::agreeing_on`](crate::World::agreeing_on)).
    pub fn agreeing_on(mut self, name: impl Into<String>, value: String) -> Self {
        self.facts.push((name.into(), value));
        self
    }

    /// What the ranks check they agree on, beyond the strategy's own checks.
    pub fn facts(&self) -> &[(String, String)] {
        &self.facts
    }

    /// This process's place among the run's processes.
    pub fn process(&self) -> &ProcessInfo {
        &self.process
    }

    /// Ranks this process holds: the world divided among the processes.
    pub fn local_ranks(&self) -> usize {
        self.world_size() / self.process.processes
    }

    /// The strategy that runs (never `auto`).
    pub fn strategy(&self) -> StrategyKind {
        self.strategy
    }

    /// Why it was chosen.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// The ranks along the strategy's axes (`dp`, `pp`, `tp`).
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// Ranks in all.
    pub fn world_size(&self) -> usize {
        self.mesh.size()
    }

    /// The degree of `axis` (1 for an axis the plan does not use).
    pub fn degree(&self, axis: &str) -> usize {
        self.mesh.degree(axis)
    }

    /// Every strategy's settings, the degrees written in.
    pub fn configs(&self) -> &StrategyConfigs {
        &self.configs
    }

    /// This plan for a model that computes in `dtype` under mixed precision: `ddp`'s replicas
    /// that split their state hold the others' parameters in it
    /// ([`DdpConfig::compute_dtype`]).
    pub(crate) fn computing_in(mut self, dtype: burn::tensor::FloatDType) -> Self {
        self.configs.ddp.compute_dtype = Some(dtype);
        self
    }

    /// Samples per optimizer step over all ranks.
    pub fn global_batch(&self) -> usize {
        self.global_batch
    }

    /// How the strategy cuts its optimizer state: what a checkpoint of this plan holds, and
    /// what a resumed run of this plan can load.
    pub fn state_layout(&self) -> StateLayout {
        let (pp, tp) = (self.degree(Mesh::PP), self.degree(Mesh::TP));
        // Staged plans run on the pipeline's engine, the others on Ddp's (as `build` says).
        let staged = self.strategy == StrategyKind::Pipeline || pp > 1;
        match (staged, tp) {
            (_, 2..) => StateLayout::Sharded {
                stages: pp,
                shards: tp,
            },
            (true, _) => StateLayout::Stages(pp),
            (false, _) => StateLayout::Replica,
        }
    }

    /// Micro-batches per rank and step the strategy accumulates.
    pub fn grad_accumulation(&self) -> usize {
        self.configs.grad_accumulation(self.strategy)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} rank(s), mesh {}: {}",
            self.strategy,
            self.world_size(),
            self.mesh,
            self.reason
        )
    }
}

/// The ranks `auto` plans for: those named, else the CPU's cores (as many as the batch can
/// feed, each of `threads_per_rank` threads, in whole replicas of `model_parallel` ranks,
/// one replica at least), else one device.
fn auto_ranks(
    ranks: Option<usize>,
    cpu_cores: Option<usize>,
    configs: &StrategyConfigs,
    global_batch: usize,
    model_parallel: usize,
) -> usize {
    ranks.unwrap_or_else(|| match cpu_cores {
        Some(cores) => {
            let threads = configs.ddp.threads_per_rank.unwrap_or(1).max(1);
            let ranks = StrategyKind::auto_cpu_world(cores / threads, global_batch);
            (ranks / model_parallel).max(1) * model_parallel
        }
        None => 1,
    })
}

/// The data-parallel replicas of a world of `world` ranks (if named), `dp` replicas (if
/// named), each replica `model_parallel` ranks (its stages times its shards).
fn replicas(
    world: Option<usize>,
    dp: Option<usize>,
    model_parallel: usize,
) -> Result<usize, ConfigError> {
    match (world, dp) {
        (Some(w), Some(d)) if d.checked_mul(model_parallel) != Some(w) => {
            Err(ConfigError::WorldNotMesh {
                world: w,
                dp: d,
                model_parallel,
            })
        }
        (Some(w), None) if !w.is_multiple_of(model_parallel) => Err(ConfigError::WorldNotMesh {
            world: w,
            dp: 0,
            model_parallel,
        }),
        (Some(w), _) => Ok(w / model_parallel),
        (None, Some(d)) => Ok(d),
        (None, None) => Ok(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(
        kind: StrategyKind,
        world: Option<usize>,
        dp: Option<usize>,
    ) -> Result<Plan, ConfigError> {
        let mut configs = StrategyConfigs::default();
        configs.tensor.tp = 2;
        Plan::resolve(PlanRequest {
            world,
            dp,
            configs,
            ..PlanRequest::new(kind, 64)
        })
    }

    #[test]
    fn degrees_multiply_to_the_world() {
        let p = plan(StrategyKind::Tensor, Some(4), None).unwrap();
        assert_eq!(p.mesh().to_string(), "dp=2 × tp=2");
        let p = plan(StrategyKind::Pipeline, None, Some(3)).unwrap();
        assert_eq!(p.mesh().to_string(), "dp=3 × pp=2");
        assert_eq!(p.world_size(), 6);
        let p = plan(StrategyKind::Ddp, Some(3), None).unwrap();
        assert_eq!(p.mesh().to_string(), "dp=3");
        assert_eq!(
            plan(StrategyKind::Tensor, Some(3), None).unwrap_err(),
            ConfigError::WorldNotMesh {
                world: 3,
                dp: 0,
                model_parallel: 2
            }
        );
        assert!(matches!(
            plan(StrategyKind::Pipeline, Some(4), Some(3)),
            Err(ConfigError::WorldNotMesh { .. })
        ));
        assert!(matches!(
            plan(StrategyKind::Single, Some(2), None),
            Err(ConfigError::SingleWithMany { ranks: 2 })
        ));
    }

    #[test]
    fn auto_takes_the_named_ranks_or_the_cores() {
        let p = plan(StrategyKind::Auto, Some(1), None).unwrap();
        assert_eq!(p.strategy(), StrategyKind::Single);
        let p = plan(StrategyKind::Auto, Some(3), None).unwrap();
        assert_eq!((p.strategy(), p.world_size()), (StrategyKind::Ddp, 3));
        let cores = Plan::resolve(PlanRequest {
            cpu_cores: Some(2),
            ..PlanRequest::new(StrategyKind::Auto, 32)
        })
        .unwrap();
        assert_eq!(
            (cores.strategy(), cores.world_size()),
            (StrategyKind::Ddp, 2)
        );
        assert!(cores.to_string().contains("CPU's cores"), "{cores}");
    }

    #[test]
    fn batches_too_small_are_refused() {
        let small = Plan::resolve(PlanRequest::new(StrategyKind::Ddp, 2).with_world(3));
        assert!(matches!(
            small,
            Err(ConfigError::BatchSmallerThanReplicas { .. })
        ));
        let mut configs = StrategyConfigs::default();
        configs.pipeline.micro_batches = 8;
        let micro = Plan::resolve(
            PlanRequest::new(StrategyKind::Pipeline, 12)
                .with_world(4)
                .with_configs(configs),
        );
        assert!(matches!(
            micro,
            Err(ConfigError::MicroBatchesExceedBatch { .. })
        ));
    }
}
