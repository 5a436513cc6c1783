//! The whole job in one call: data → training through a strategy → evaluation.

use burn::module::AutodiffModule;
use burn::tensor::backend::{AutodiffBackend, Backend};

use crate::config::AdConfig;
use crate::error::AdError;
use crate::model::AdTransformer;
use crate::report::{EvalReport, evaluate};
use crate::train::{Data, TrainSummary, generate, train};

/// What a whole run produced.
#[derive(Debug)]
pub struct Run<B: Backend> {
    /// The data it trained on.
    pub data: Data,
    /// The trained model, frozen.
    pub model: AdTransformer<B>,
    /// How training went.
    pub train: TrainSummary,
    /// The evaluation on the held-out goals.
    pub eval: EvalReport,
}

/// Runs `config` end to end on `devices` (one rank each), logging progress with `tracing`.
///
/// # Errors
/// An invalid config or a failure while training.
pub fn run<B: AutodiffBackend>(
    config: &AdConfig,
    devices: Vec<B::Device>,
) -> Result<Run<B::InnerBackend>, AdError> {
    let data = generate(config)?;
    tracing::info!(
        "{} histories of {} steps on {} training goals in {:.2} s",
        data.histories.count(),
        data.histories.len(),
        data.goals.train.len(),
        data.seconds
    );
    let device = devices[0].clone();
    let every = (config.train.steps / 10).max(1);
    let (model, summary) = train::<B>(config, &data, devices, &mut |step, loss| {
        if step % every == 0 {
            tracing::info!("step {step}/{}: loss {loss:.4}", config.train.steps);
        }
    })?;
    let model = model.valid();
    let eval = evaluate(
        &model,
        config,
        &data.goals.held_out,
        &device,
        &mut |_, _| {},
    );
    Ok(Run {
        data,
        model,
        train: summary,
        eval,
    })
}
