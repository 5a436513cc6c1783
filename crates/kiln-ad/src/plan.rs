//! `auto` for the AD transformer: its step as the planner reads it ([`workload`]), and this
//! machine measured with it ([`planner`]), as `kiln train` measures its built-in models.

use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use kiln_core::plan::Planner;
use kiln_core::plan::cost::Workload;
use kiln_nn::models::TransformerConfig;
use kiln_nn::tensor_parallel::ShardedBackend;
use kiln_planner as planner;

use crate::config::AdConfig;
use crate::dataset::feature_width;
use crate::env::ACTIONS;
use crate::error::AdError;
use crate::train::{Data, optimizer, window_source};

/// The AD transformer's training step in f32, `global_batch` windows of `context` steps a
/// step, as the planner reads it. It is the reference transformer's but for its ends: the
/// embedding is a linear map of each step's multi-hot features (no bias) where the reference
/// looks tokens up, a final norm comes before the head, and the head scores the actions.
pub fn workload(config: &AdConfig, global_batch: usize) -> Workload {
    let m = &config.model;
    let reference = TransformerConfig {
        vocab: ACTIONS,
        max_len: m.context,
        d_model: m.d_model,
        d_ff: m.d_ff,
        heads: m.heads,
        layers: m.layers,
    };
    let mut work = reference.workload(m.context, global_batch);
    let d = m.d_model as u64;
    let embedding = feature_width(&config.env) as u64 * d + m.context as u64 * d;
    let final_norm = 2 * d;
    work.params = work.params - work.embedding_params + embedding + final_norm;
    work.trainable = work.params;
    work.embedding_params = embedding;
    work.head_params += final_norm;
    work
}

/// This machine's `cores` as devices for `config`'s model on `data`: the step timed on one
/// core (beside copies on the others, and alone), the in-process collective probed, and the
/// step over two to four ranks of `devices` ([`planner::TIMED_RANKS`]) for what several
/// ranks cost beyond their parts. About a second.
///
/// # Errors
/// A step or the probe that fails, or timings that cannot be fitted.
pub fn planner<B>(
    config: &AdConfig,
    data: &Data,
    devices: &[B::Device],
    cores: usize,
) -> Result<Planner, AdError>
where
    B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
{
    let device = &devices[0];
    B::seed(device, config.seed);
    let model = config.model.init::<B>(&config.env, device);
    let (source, optim) = (window_source::<B>(config, data)?, optimizer(config)?);
    let work = workload(config, config.train.batch);
    debug_assert_eq!(work.params as usize, model.num_params());
    Ok(planner::planner(
        work,
        devices,
        &model,
        &optim,
        &source,
        config.train.batch,
        cores,
        config.seed,
    )?)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Module;

    use super::*;
    use crate::model::AdModelConfig;

    #[test]
    fn the_workload_counts_the_model_s_parameters_exactly() {
        for model in [
            AdModelConfig::default(),
            AdModelConfig {
                layers: 3,
                d_model: 32,
                heads: 2,
                d_ff: 48,
                context: 20,
                ..AdModelConfig::default()
            },
        ] {
            let config = AdConfig {
                model: model.clone(),
                ..AdConfig::default()
            };
            let built = config.model.init::<Flex>(&config.env, &Default::default());
            let work = workload(&config, 32);
            assert_eq!(work.params as usize, built.num_params(), "{model:?}");
            assert_eq!(work.layers, model.layers);
            assert!(work.forward_flops > work.head_flops && work.head_flops > 0.0);
        }
    }
}
