//! Every rank's shard of the model, with its tensor-parallel group.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::World;
use crate::collective::MeshCollectives;
use crate::model::{ShardError, TensorParallelModel};
use crate::strategy::agree::values_fact;
use crate::strategy::launch::{Launch, RankStart, Shards, first_process_ids, world_facts};
use crate::strategy::{ConfigError, StrategyError};
use crate::tensor_parallel::{TpBackend, TpGroup};
use crate::world::Mesh;

/// This process's ranks of `world` on `mesh` (with a `tp` axis), each holding its shard of
/// `model` (whose parameters are materialised) over its `tp` group; the other groups (world,
/// `dp`, `pp`) stay with the rank. Across processes every process cuts its ranks' shards from
/// its own copy of the model (built from the same seed, as the pipeline's stages are), under
/// the first process's parameter ids.
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
    let world = world
        .clone()
        .with_mesh(mesh.clone())
        .expect("the tensor mesh has the world's size");
    let mut groups = MeshCollectives::for_world(&world, timeout).map_err(ConfigError::from)?;
    let mut facts = world_facts(&world);
    let model = match world.multi_process_enabled() {
        true => {
            // Each process cuts its shards from its own copy: they must be the same model.
            facts.push(values_fact::<B, M>(model));
            first_process_ids(model.clone(), &mut groups, &world)?
        }
        false => model.clone(),
    };
    // The `tp` groups move the tensors of the layers' wire backend; the others, the
    // strategy's gradients and facts.
    let tp_groups = MeshCollectives::<B::Wire>::axis_for_world(&world, Mesh::TP, timeout)
        .map_err(ConfigError::from)?;
    let tp = mesh.degree(Mesh::TP);
    let mut ranks = Vec::with_capacity(groups.len());
    let mut replicated = None;
    for ((mut groups, device), group) in groups.into_iter().zip(world.devices()).zip(tp_groups) {
        // The strategy's own copy of the `tp` axis is not used: the layers hold theirs.
        drop(groups.take_axis(Mesh::TP));
        let group = TpGroup::<B>::new(group);
        let shard = model
            .shard(group.clone())
            .map_err(ConfigError::from)?
            .fork(device);
        // Every shard is checked: each is cut by its own rank's slice.
        let found = classify::<B, M, M::Sharded>(&model, &shard, tp).map_err(ConfigError::from)?;
        replicated.get_or_insert(found);
        ranks.push(RankStart {
            device: device.clone(),
            model: shard,
            groups,
            shard_group: Some(Box::new(group)),
        });
    }
    // Every shard, this process's or not: the ranks of other processes send theirs as bytes.
    let templates = (0..tp)
        .map(|t| model.shard(TpGroup::unconnected_rank(t, tp)))
        .collect::<Result<_, _>>()
        .map_err(ConfigError::from)?;
    Ok(Launch {
        mesh: mesh.clone(),
        first_rank: world.rank_of(0),
        sharing: world.process().local_processes,
        facts,
        ranks,
        shards: Some(Shards {
            count: tp,
            replicated: Arc::new(replicated.unwrap_or_default()),
        }),
        templates,
    })
}

/// The parameters `shard` holds whole (replicated: their gradients are the same on every
/// shard), checking that every other one is a `1/tp` slice of the whole model's parameter of
/// the same id along one dimension, so the guards count each gradient element once.
fn classify<B: Backend, M: Module<B>, S: Module<B>>(
    model: &M,
    shard: &S,
    tp: usize,
) -> Result<HashSet<ParamId>, ShardError> {
    let whole: HashMap<ParamId, (String, Vec<usize>)> = shapes::<B, M>(model)
        .into_iter()
        .map(|(id, path, shape)| (id, (path, shape)))
        .collect();
    let mut replicated = HashSet::new();
    for (id, path, shape) in shapes::<B, S>(shard) {
        let refuse = |why: String| ShardError::Parameter {
            path: path.clone(),
            shard: shape.clone(),
            why,
            tp,
        };
        let Some((_, full)) = whole.get(&id) else {
            return Err(refuse(
                "has a ParamId the whole model does not have".to_string(),
            ));
        };
        if *full == shape {
            replicated.insert(id);
            continue;
        }
        let differing: Vec<usize> = (0..shape.len().min(full.len()))
            .filter(|&d| shape[d] != full[d])
            .collect();
        let sliced = full.len() == shape.len()
            && matches!(differing.as_slice(), [d] if shape[*d] * tp == full[*d]);
        if !sliced {
            return Err(refuse(format!(
                "is neither the whole parameter (shape {full:?}) nor a 1/{tp} slice of it"
            )));
        }
    }
    Ok(replicated)
}

/// Every float parameter of `module`: its id, module path and shape (a tied parameter once).
fn shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(ParamId, String, Vec<usize>)> {
    struct Shapes<B> {
        path: Vec<String>,
        seen: HashSet<ParamId>,
        found: Vec<(ParamId, String, Vec<usize>)>,
        backend: std::marker::PhantomData<B>,
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes<B> {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if self.seen.insert(param.id) {
                let shape = param.val().dims().to_vec();
                self.found.push((param.id, self.path.join("."), shape));
            }
        }
    }
    let mut shapes = Shapes::<B> {
        path: Vec::new(),
        seen: HashSet::new(),
        found: Vec::new(),
        backend: std::marker::PhantomData,
    };
    module.visit(&mut shapes);
    shapes.found
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Param;
    use burn::nn::{Linear, LinearConfig};

    use super::*;

    fn whole() -> Linear<Flex> {
        LinearConfig::new(4, 8).init(&Default::default())
    }

    /// `linear`'s weight as `cols` columns under the same id, the bias as it is.
    fn with_columns(linear: &Linear<Flex>, cols: usize) -> Linear<Flex> {
        let weight = linear.weight.val().narrow(1, 0, cols);
        Linear {
            weight: Param::initialized(linear.weight.id, weight),
            bias: linear.bias.clone(),
        }
    }

    #[test]
    fn whole_parameters_are_replicated_and_halves_are_split() {
        let model = whole();
        let shard = with_columns(&model, 4);
        let found = classify::<Flex, _, _>(&model, &shard, 2).unwrap();
        let bias = model.bias.as_ref().unwrap().id;
        assert_eq!(found, HashSet::from([bias]));
        let copy = classify::<Flex, _, _>(&model, &model.clone(), 2).unwrap();
        assert_eq!(copy, HashSet::from([model.weight.id, bias]));
    }

    #[test]
    fn a_shard_parameter_of_another_width_or_id_is_refused_by_path() {
        let model = whole();
        let error = classify::<Flex, _, _>(&model, &with_columns(&model, 3), 2).unwrap_err();
        assert!(
            matches!(&error, ShardError::Parameter { path, .. } if path == "weight"),
            "{error}"
        );
        assert!(error.to_string().contains("nor a 1/2 slice"), "{error}");
        let error = classify::<Flex, _, _>(&model, &whole(), 2).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("has a ParamId the whole model does not have"),
            "{error}"
        );
    }
}
