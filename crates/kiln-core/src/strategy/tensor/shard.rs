//! Every rank's shard of the model, with its tensor-parallel group.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::World;
use crate::collective::{InProcess, MeshCollectives};
use crate::model::TensorParallelModel;
use crate::strategy::launch::{Launch, RankStart, Shards};
use crate::strategy::{ConfigError, StrategyError};
use crate::tensor_parallel::{TpBackend, TpGroup};
use crate::world::Mesh;

/// The ranks of `world` on `mesh` (with a `tp` axis), each holding its shard of `model` (whose
/// parameters are materialised) over its `tp` group; the other groups (world, `dp`, `pp`) stay
/// with the rank.
pub(super) fn launch<B, M>(
    world: &World<B::Device>,
    mesh: &Mesh,
    model: &M,
    timeout: Duration,
) -> Result<Launch<B, M::Sharded>, StrategyError>
where
    B: AutodiffBackend + TpBackend,
    M: TensorParallelModel<B>,
{
    // The `tp` groups move the tensors of the layers' wire backend; the others, the
    // strategy's gradients and facts.
    let mut tp_groups: Vec<Option<TpGroup<B>>> = (0..mesh.size()).map(|_| None).collect();
    for members in mesh.groups(Mesh::TP).expect("a tensor mesh has tp") {
        let handles = InProcess::<B::Wire>::subgroup(members.clone(), timeout);
        for (rank, handle) in members.into_iter().zip(handles) {
            tp_groups[rank] = Some(TpGroup::new(Box::new(handle)));
        }
    }
    let mut ranks = Vec::with_capacity(mesh.size());
    let mut replicated = None;
    for ((mut groups, device), group) in MeshCollectives::in_process(mesh, timeout)
        .into_iter()
        .zip(world.devices())
        .zip(tp_groups)
    {
        // The strategy's own copy of the `tp` axis is not used: the layers hold theirs.
        drop(groups.take_axis(Mesh::TP));
        let group = group.expect("every rank is in a tp group");
        let shard = model
            .shard(group.clone())
            .map_err(ConfigError::from)?
            .fork(device);
        if replicated.is_none() {
            replicated = Some(unchanged(model, &shard));
        }
        ranks.push(RankStart {
            device: device.clone(),
            model: shard,
            groups,
            shard_group: Some(Box::new(group)),
        });
    }
    Ok(Launch {
        mesh: mesh.clone(),
        ranks,
        shards: Some(Shards {
            count: mesh.degree(Mesh::TP),
            replicated: Arc::new(replicated.unwrap_or_default()),
        }),
    })
}

/// The parameters `shard` holds whole: those of `model`'s that kept their shape (a sharded
/// parameter is a slice, smaller than the whole).
fn unchanged<B: Backend, M: Module<B>, S: Module<B>>(model: &M, shard: &S) -> HashSet<ParamId> {
    let whole = shapes::<B, M>(model);
    shapes::<B, S>(shard)
        .into_iter()
        .filter(|(id, shape)| whole.get(id) == Some(shape))
        .map(|(id, _)| id)
        .collect()
}

fn shapes<B: Backend, M: Module<B>>(module: &M) -> HashMap<ParamId, Vec<usize>> {
    struct Shapes<B>(HashMap<ParamId, Vec<usize>>, std::marker::PhantomData<B>);
    impl<B: Backend> ModuleVisitor<B> for Shapes<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.insert(param.id, param.val().dims().to_vec());
        }
    }
    let mut shapes = Shapes::<B>(HashMap::new(), std::marker::PhantomData);
    module.visit(&mut shapes);
    shapes.0
}
