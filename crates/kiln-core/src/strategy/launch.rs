//! How the ranks of a worker-thread strategy start: which world, which collectives each rank
//! holds, and which model each rank trains (a copy of one model, or its tensor-parallel
//! shard).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use burn::module::{Module, ParamId};
use burn::tensor::backend::AutodiffBackend;

use super::agree::Fact;
use super::handover::sync_device;
use super::{ConfigError, RankFailure, StrategyError, StrategyKind};
use crate::World;
use crate::collective::MeshCollectives;
use crate::tensor_parallel::GroupHandle;
use crate::world::Mesh;

/// Refuses a world that spans processes when `strategy` cannot span them.
pub(crate) fn check_processes<D: Clone>(
    world: &World<D>,
    strategy: StrategyKind,
) -> Result<(), ConfigError> {
    match strategy.single_process_only() {
        Some(reason) if world.multi_process_enabled() => Err(ConfigError::MultiProcess {
            strategy,
            processes: world.process().processes,
            reason,
        }),
        _ => Ok(()),
    }
}

/// `model` with its parameters materialised on `device`, once, before rank threads copy it.
///
/// Burn initialises parameters lazily, on first use, from the backend's global RNG; done
/// here, the values do not depend on how the rank threads interleave, and match what a
/// single-device run draws from the same seed. The device is synchronised because the rank
/// threads read these parameters next.
pub(crate) fn materialise<B: AutodiffBackend, M: Module<B>>(
    model: M,
    device: &B::Device,
) -> Result<M, StrategyError> {
    let model = model.fork(device);
    sync_device::<B>(device)
        .map_err(|error| StrategyError::from_failures(vec![RankFailure { rank: 0, error }]))?;
    Ok(model)
}

/// The ranks of one process, ready to start: a rank's device, collectives and model, in rank
/// order.
pub(crate) struct Launch<B: AutodiffBackend, M> {
    /// How the world's ranks are arranged.
    pub mesh: Mesh,
    /// The world's rank of this process's first rank (its ranks are consecutive).
    pub first_rank: usize,
    /// Processes of the run on this machine, which share its cores with this one.
    pub sharing: usize,
    /// What every rank checks at start-up that the others hold too.
    pub facts: Vec<Fact>,
    /// Each of this process's ranks' start.
    pub ranks: Vec<RankStart<B, M>>,
    /// How the model is sharded, when it is.
    pub shards: Option<Shards>,
}

/// What one rank starts with.
pub(crate) struct RankStart<B: AutodiffBackend, M> {
    /// Its device.
    pub device: B::Device,
    /// The model it trains: a copy of the whole, or its shard.
    pub model: M,
    /// Its groups: the world and every axis but the tensor-parallel one (which the model's
    /// layers hold).
    pub groups: MeshCollectives<B::InnerBackend>,
    /// The rank's tensor-parallel group (its model's layers call it): the strategy fails it
    /// when the rank fails, so that no shard waits for a failed one, and reads its traffic.
    pub shard_group: Option<Box<dyn GroupHandle>>,
}

/// A model sharded over the `tp` axis.
#[derive(Debug, Clone)]
pub(crate) struct Shards {
    /// Shards (the `tp` degree).
    pub count: usize,
    /// The parameters every shard holds whole: the guard counts them once, and Kiln reports
    /// them once.
    pub replicated: Arc<HashSet<ParamId>>,
}

/// A rank's tensor-parallel shard, as its worker keeps it: which shard of how many, the
/// parameters every shard holds whole, and the group (to fail it and read its traffic).
pub(crate) struct ShardPlace {
    pub shard: usize,
    pub shards: usize,
    pub replicated: Arc<HashSet<ParamId>>,
    pub group: Box<dyn GroupHandle>,
}

impl ShardPlace {
    /// Where `rank` of `mesh` sits among `shards`, holding `group`; `None` for an unsharded
    /// model.
    pub fn of(
        shards: Option<&Shards>,
        group: Option<Box<dyn GroupHandle>>,
        mesh: &Mesh,
        rank: usize,
    ) -> Option<Self> {
        let (shards, group) = (shards?, group?);
        Some(Self {
            shard: mesh.coord(rank, Mesh::TP),
            shards: shards.count,
            replicated: shards.replicated.clone(),
            group,
        })
    }
}

impl<B: AutodiffBackend, M: Module<B> + Clone> Launch<B, M> {
    /// Every rank of this process in `world` starts from `model`, materialised once on the
    /// first device; the ranks' collectives span the world's mesh (through MPI when it spans
    /// processes) and time out after `timeout`.
    ///
    /// # Errors
    /// Processes that cannot be connected, or a device that fails to synchronise.
    pub fn whole(
        world: &World<B::Device>,
        model: M,
        timeout: Duration,
    ) -> Result<Self, StrategyError> {
        let mesh = world.mesh().clone();
        let model = materialise(model, &world.devices()[0])?;
        let ranks = MeshCollectives::for_world(world, timeout)
            .map_err(ConfigError::from)?
            .into_iter()
            .zip(world.devices())
            .map(|(groups, device)| RankStart {
                device: device.clone(),
                model: model.clone(),
                groups,
                shard_group: None,
            })
            .collect();
        Ok(Self {
            mesh,
            first_rank: world.rank_of(0),
            sharing: world.process().local_processes,
            facts: world_facts(world),
            ranks,
            shards: None,
        })
    }
}

/// The facts of `world` every rank must share: its layout and what its program added.
pub(crate) fn world_facts<D: Clone>(world: &World<D>) -> Vec<Fact> {
    let layout = format!(
        "{} ranks in {} process(es), mesh {}",
        world.world_size(),
        world.process().processes,
        world.mesh()
    );
    std::iter::once(("world".to_string(), layout))
        .chain(world.facts().iter().cloned())
        .collect()
}
