//! The planner's memory model fitted to layouts measured on this machine.
//!
//! The calibration ([`calibrate`](super::measure::calibrate)) counts one rank's peak with the
//! whole model at two batch sizes, and the workload's block activations are scaled to it. That
//! scale is the whole model's, and a layout that cuts the model is not a share of it: a block's
//! activations split over `t` shards do not shrink as a formula of the model's shape says (the
//! norms, residuals and the all-reduces' buffers are whole on every shard), and a pipeline
//! stage holds its boundary's copies and the embedding's or the head's own activations beside
//! its blocks'. So where the process counts its memory, [`fit_memory`] runs each cut once, at
//! the calibration's batch, and fits the workload to what a rank of it held.

use burn::tensor::backend::AutodiffBackend;

use super::measure::{Budget, MOST_SHARDS, MeasureError, cannot_cut, time_steps};
use kiln_core::data::DataSource;
use kiln_core::plan::cost::{Layout, StageSplit, memory, strategy};
use kiln_core::plan::{Plan, PlanRequest, Planner, layout_configs};
use kiln_core::strategy::StrategyModel;
use kiln_core::strategy::{OptimizerSpec, StrategyConfigs, StrategyError};
use kiln_core::tensor_parallel::TpBackend;

/// `planner`'s workload fitted to the peak bytes of one rank of each cut of `model` on
/// `device`'s CPU ranks, trained with `optim` on batches of `data` as large as the largest
/// whose memory the calibration counted: the model split over 2 to [`MOST_SHARDS`]
/// tensor-parallel shards (each a `block_activation_bytes` entry), and over two pipeline
/// stages (the `stage_activation_scale`). Three steps each, alone. The planner is returned
/// as it was where the process does not count its memory, or its calibration did not.
///
/// # Errors
/// What a step returns, but for a model that cannot be cut so.
pub fn fit_memory<B, M, S, I>(
    mut planner: Planner,
    device: &B::Device,
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    seed: u64,
) -> Result<Planner, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    // The batch the calibration's memory line reaches: the fit is exact there.
    let counted = planner.cluster.measured.as_ref().and_then(|m| {
        m.memory_line()?;
        m.timings
            .iter()
            .filter(|t| t.peak_bytes.is_some())
            .map(|t| t.samples)
            .max()
    });
    let Some(batch) = counted.filter(|_| kiln_core::memory::counting()) else {
        return Ok(planner);
    };
    let peak = |layout: &Layout| peak_of(layout, device, model, optim, data, seed);
    let whole = Layout {
        dp: 1,
        pp: 1,
        tp: 1,
        micro_batches: 1,
        micro_batch: batch,
        recompute: false,
        shard_state: kiln_core::plan::ShardState::None,
        split: StageSplit::Even,
    };
    let (work, cluster) = (&mut planner.workload, &planner.cluster);
    let per_block_sample = (work.layers * batch) as f64;
    let shards = work.block_activation_bytes.len().min(MOST_SHARDS);
    for tp in (2..=shards).filter(|t| work.shardable.is_multiple_of(*t)) {
        let layout = Layout { tp, ..whole };
        let Some(measured) = peak(&layout)? else {
            break;
        };
        let predicted = memory(work, cluster, &layout).total;
        let bytes = &mut work.block_activation_bytes[tp - 1];
        *bytes = (*bytes + (measured - predicted) / per_block_sample).max(0.0);
    }
    if work.layers >= 2 {
        let layout = Layout { pp: 2, ..whole };
        work.stage_activation_scale = 1.0;
        if let Some(measured) = peak(&layout)? {
            let predicted = memory(work, cluster, &layout);
            if predicted.activations > 0.0 {
                let more = (measured - predicted.total) / predicted.activations;
                work.stage_activation_scale = (1.0 + more).max(0.0);
            }
        }
    }
    Ok(planner)
}

/// The most bytes a rank of `layout` held over three steps of `model`, alone on the CPU;
/// `None` for a model that cannot be cut so.
fn peak_of<B, M, S, I>(
    layout: &Layout,
    device: &B::Device,
    model: &M,
    optim: &S,
    data: &DataSource<B, I, M::Input>,
    seed: u64,
) -> Result<Option<f64>, MeasureError>
where
    B: AutodiffBackend + TpBackend,
    M: StrategyModel<B>,
    S: OptimizerSpec<B>,
    I: Send + 'static,
{
    let mut base = StrategyConfigs::default();
    base.set_threads_per_rank(1);
    let ranks = layout.dp * layout.pp * layout.tp;
    let kind = strategy(layout, ranks);
    let plan = Plan::resolve(
        PlanRequest::new(kind, layout.micro_batch * layout.micro_batches)
            .with_world(ranks)
            .with_configs(layout_configs(kind, layout, None, &base)),
    )
    .map_err(StrategyError::from)?;
    let devices = vec![device.clone(); ranks];
    let timed = time_steps(
        &plan,
        &devices,
        model.clone(),
        optim,
        data.clone(),
        Budget::steps(1, 2),
        seed,
    );
    match timed {
        Ok(timed) => Ok(timed
            .ranks
            .iter()
            .filter_map(|r| r.peak_bytes)
            .max()
            .map(|b| b as f64)),
        Err(error) if cannot_cut(&error) => Ok(None),
        Err(other) => Err(other.into()),
    }
}
