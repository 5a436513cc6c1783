//! The forward/backward part every strategy shares: a rank's shard, cut into micro-batches,
//! each weighted by its share of the global batch.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::train::TrainStep;

use super::{RankError, handover::panic_error};
use crate::data::{DataSource, split_even};
use crate::grads::add_weighted;
use crate::model::{StepLoss, TrainModel};

/// Gradients of one rank for one global batch, before synchronisation.
pub(crate) struct LocalGradients<O> {
    /// `Σ_m (n_m / N) ∇ mean_loss_m` over this rank's micro-batches.
    pub grads: GradientsParams,
    /// `Σ_m n_m · mean_loss_m`, to report the global mean loss.
    pub loss_sum: f64,
    /// Samples of this rank.
    pub samples: usize,
    /// Time spent.
    pub compute: Duration,
    /// Each micro-batch's training-step output, when asked for (burn-train's metrics read
    /// them); empty otherwise, so nothing is held longer than the step.
    pub items: Vec<O>,
}

/// Runs forward and backward over `shard` in `accumulation` micro-batches (empty ones are
/// skipped), weighting each by `n_m / global_samples`. Data are loaded on `device`. A panic in
/// loading or in the model becomes [`RankError::Panicked`]. `keep_items` keeps each
/// micro-batch's output item.
pub(crate) fn local_gradients<B, M, I>(
    model: &M,
    data: &DataSource<B, I, M::Input>,
    shard: &[usize],
    global_samples: usize,
    accumulation: usize,
    device: &B::Device,
    keep_items: bool,
) -> Result<LocalGradients<<M as TrainStep>::Output>, RankError>
where
    B: AutodiffBackend,
    M: TrainModel<B>,
{
    let start = Instant::now();
    // Loading and the model both run user code; a panic in either is this rank's failure.
    let (grads, loss_sum, items) = catch_unwind(AssertUnwindSafe(|| {
        let mut grads = GradientsParams::new();
        let mut loss_sum = 0.0;
        let mut items = Vec::new();
        for range in split_even(shard.len(), accumulation) {
            if range.is_empty() {
                continue;
            }
            let samples = range.len();
            let input = data.load(&shard[range], device)?;
            let output = model.step(input);
            loss_sum += output.item.loss() * samples as f64;
            let weight = samples as f64 / global_samples as f64;
            grads = add_weighted(model, grads, output.grads, weight, device);
            if keep_items {
                items.push(output.item);
            }
        }
        Ok::<_, RankError>((grads, loss_sum, items))
    }))
    .map_err(panic_error)??;
    Ok(LocalGradients {
        grads,
        loss_sum,
        samples: shard.len(),
        compute: start.elapsed(),
        items,
    })
}
