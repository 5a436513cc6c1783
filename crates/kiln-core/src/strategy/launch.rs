//! How the ranks of a worker-thread strategy start: which world, which collectives each rank
//! holds, and which model each rank trains (a copy of one model, or its tensor-parallel
//! shard).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Bool, Int, Tensor};

use super::agree::Fact;
use super::exchange::all_gather_bytes;
use super::handover::sync_device;
use super::{ConfigError, RankFailure, StrategyError, StrategyKind};
use crate::World;
use crate::collective::MeshCollectives;
use crate::plan::Plan;
use crate::tensor_parallel::GroupHandle;
use crate::world::Mesh;

/// Refuses a world that spans processes when `strategy` cannot span them.
pub(crate) fn check_processes<D: Clone>(
    world: &World<D>,
    strategy: StrategyKind,
) -> Result<(), ConfigError> {
    strategy.check_processes(world.process().processes)
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
    /// One model per tensor-parallel shard, in shard order (the whole model without shards),
    /// disconnected from every group: what the ranks' parameters are decoded into when they
    /// are gathered from other processes, or assembled from stages.
    pub templates: Vec<M>,
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
        let mut groups = MeshCollectives::for_world(world, timeout).map_err(ConfigError::from)?;
        let model = match world.multi_process_enabled() {
            true => first_process_ids(model, &mut groups, world)?,
            false => model,
        };
        let ranks = groups
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
            templates: vec![model],
        })
    }
}

/// A world of this process's `devices` among the plan's processes, arranged as its mesh.
pub(super) fn world_on<D: Clone>(devices: Vec<D>, plan: &Plan) -> Result<World<D>, ConfigError> {
    let world = World::new(plan.process().clone(), devices)
        .and_then(|w| w.with_mesh(plan.mesh().clone()))
        .map_err(|_| ConfigError::NoDevices)?;
    Ok(plan.facts().iter().fold(world, |w, (name, value)| {
        w.agreeing_on(name.clone(), value.clone())
    }))
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

/// `model` with the parameter ids of the first process's: ids are drawn at random when a model
/// is built, and an optimizer's state is kept by id, so a stage's state saved by one process
/// must name the ids the saved model carries. One all-gather over the world, made by every
/// local rank together (each holds its part of the world group).
pub(crate) fn first_process_ids<B: AutodiffBackend, M: Module<B>>(
    model: M,
    groups: &mut [MeshCollectives<B::InnerBackend>],
    world: &World<B::Device>,
) -> Result<M, StrategyError> {
    let mine: Vec<u8> = param_ids::<B, M>(&model)
        .iter()
        .flat_map(|id| id.val().to_le_bytes())
        .collect();
    let gathered: Vec<Result<Vec<Vec<u8>>, _>> = std::thread::scope(|s| {
        let jobs: Vec<_> = groups
            .iter_mut()
            .zip(world.devices())
            .map(|(g, device)| {
                let mine = &mine;
                s.spawn(move || all_gather_bytes(g.world(), mine, device))
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().expect("an id exchange does not panic"))
            .collect()
    });
    let first = world.rank_of(0);
    let mut theirs = None;
    for result in gathered {
        let all = result.map_err(|error| {
            StrategyError::from_failures(vec![RankFailure {
                rank: first,
                error: error.into(),
            }])
        })?;
        theirs.get_or_insert(all.into_iter().next().expect("rank 0's ids"));
    }
    let theirs = theirs.expect("a process has at least one rank");
    if theirs.len() != mine.len() {
        return Err(ConfigError::ModelDiffers {
            ours: mine.len() / 8,
            theirs: theirs.len() / 8,
        }
        .into());
    }
    let ids = theirs
        .chunks(8)
        .map(|b| ParamId::from(u64::from_le_bytes(b.try_into().expect("8 bytes"))))
        .collect();
    Ok(model.map(&mut AdoptIds {
        ids,
        backend: std::marker::PhantomData,
    }))
}

/// Every parameter's id, in the order the module visits them.
fn param_ids<B: AutodiffBackend, M: Module<B>>(model: &M) -> Vec<ParamId> {
    struct Ids<B>(Vec<ParamId>, std::marker::PhantomData<B>);
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Ids<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.id);
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.0.push(param.id);
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.0.push(param.id);
        }
    }
    let mut ids = Ids(Vec::new(), std::marker::PhantomData);
    model.visit(&mut ids);
    ids.0
}

/// Gives the parameters, in visiting order, the ids `ids`.
struct AdoptIds<B> {
    ids: std::collections::VecDeque<ParamId>,
    backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> AdoptIds<B> {
    fn next(&mut self) -> ParamId {
        self.ids.pop_front().expect("as many ids as parameters")
    }
}

impl<B: AutodiffBackend> ModuleMapper<B> for AdoptIds<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (_, value, mapper) = param.consume();
        Param::from_mapped_value(self.next(), value, mapper)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let (_, value, mapper) = param.consume();
        Param::from_mapped_value(self.next(), value, mapper)
    }

    fn map_bool<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Bool>>,
    ) -> Param<Tensor<B, D, Bool>> {
        let (_, value, mapper) = param.consume();
        Param::from_mapped_value(self.next(), value, mapper)
    }
}
