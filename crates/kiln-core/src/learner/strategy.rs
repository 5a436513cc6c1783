//! [`KilnLearning`]: a Kiln strategy as burn-train's `TrainingStrategy::Custom`.

use std::sync::{Arc, Mutex, PoisonError};

use burn::data::dataloader::Progress;
use burn::data::dataloader::split::split_dataloader;
use burn::module::{AutodiffModule, Module};
use burn::tensor::backend::AutodiffBackend;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsTypes,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainStep,
    TrainingComponents, TrainingItem, TrainingModel, ValidLoader,
};

use super::feed::Feed;
use super::optimizer::{SendStrategy, StrategyOptimizer};
use crate::data::DataSource;
use crate::model::{StepLoss, TrainModel};
use crate::strategy::StrategyError;

/// How the adapter builds its strategy once Burn hands it the model: from the model and the
/// data source of the feed's slots.
pub type BuildStrategy<B, M> = Box<
    dyn FnOnce(
            M,
            DataSource<B, usize, <M as TrainStep>::Input>,
        ) -> Result<SendStrategy<B, M>, StrategyError>
        + Send,
>;

/// Any Kiln strategy as burn-train's `TrainingStrategy::Custom`, so that `SupervisedTraining`
/// (metrics, checkpoints, early stopping, learning-rate schedulers, the renderer) trains
/// through Kiln's parallelism.
///
/// Burn's `Learner` keeps its optimizer private and hands the strategy data loaders of
/// collated batches. So:
/// - the `Learner`'s optimizer is a [`StrategyOptimizer`], a handle on the strategy's own
///   optimizers, which makes Burn's checkpoints save (and resume from) the state that trained;
/// - the train loader is split into one contiguous part per rank and micro-batch ("slot"), as
///   Burn's own data-parallel strategies split it, and each step gives every slot its next
///   batch: the global batch is `slots × ` the loader's batch size;
/// - the learning rate comes from the `Learner`'s scheduler, stepped once per global step;
/// - after each epoch the trained weights go back into the `Learner`, which validates and
///   checkpoints them on this thread. The ranks never touch the renderer, the loggers or the
///   checkpointer.
///
/// Every rank's output items are reported, each with the mean loss over all ranks, so the loss
/// Burn logs is the global batch's. Each slot counts as one equal part of the global batch: a
/// last, shorter batch in some slot is weighted as a full one, as in Burn's own strategies.
/// The pipeline returns no items (its stages never run the whole training step), so it cannot
/// feed burn-train's metrics.
pub struct KilnLearning<B: AutodiffBackend, M: TrainModel<B>> {
    build: Mutex<Option<BuildStrategy<B, M>>>,
    optimizer: StrategyOptimizer<B, M>,
    slot_devices: Vec<B::Device>,
    feed: Feed<<M as TrainStep>::Input>,
    error: Arc<Mutex<Option<StrategyError>>>,
}

impl<B: AutodiffBackend, M: TrainModel<B>> KilnLearning<B, M> {
    /// An adapter whose strategy `build` makes, over ranks on `devices` that each run
    /// `micro_batches` micro-batches per step (the strategy's gradient accumulation).
    ///
    /// Give [`Self::optimizer`] to the `Learner` and the adapter to
    /// `TrainingStrategy::Custom(Arc::new(...))`.
    pub fn new(devices: Vec<B::Device>, micro_batches: usize, build: BuildStrategy<B, M>) -> Self {
        let micro_batches = micro_batches.max(1);
        let slot_devices = devices
            .iter()
            .flat_map(|device| std::iter::repeat_n(device.clone(), micro_batches))
            .collect();
        Self {
            build: Mutex::new(Some(build)),
            optimizer: StrategyOptimizer::new(),
            slot_devices,
            feed: Feed::new(),
            error: Arc::new(Mutex::new(None)),
        }
    }

    /// The optimizer to build the `Learner` with.
    pub fn optimizer(&self) -> StrategyOptimizer<B, M> {
        self.optimizer.clone()
    }

    /// A handle that reports the error that stopped training, if one did: `SupervisedTraining`
    /// has no way to return it, so the adapter stops the training through its interrupter and
    /// keeps the error here.
    pub fn error_handle(&self) -> Arc<Mutex<Option<StrategyError>>> {
        Arc::clone(&self.error)
    }

    fn fail(&self, error: StrategyError, interrupter: &burn::train::Interrupter) {
        tracing::error!("Kiln strategy failed: {error}");
        interrupter.stop(Some(&error.to_string()));
        *self.error.lock().unwrap_or_else(PoisonError::into_inner) = Some(error);
    }

    /// Builds the strategy from `model` (the `Learner`'s, a resumed checkpoint's when Burn
    /// resumed), and loads the optimizer state Burn resumed, if any.
    fn start(&self, model: M) -> Result<(), StrategyError> {
        let build = self
            .build
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or(StrategyError::Broken { culprit: 0 })?;
        let mut strategy = build(model, self.feed.source(self.slot_devices.len()))?;
        let mut shared = self.optimizer.lock();
        if let Some(state) = shared.pending.take() {
            strategy.load_optimizer_state(&state)?;
        }
        shared.strategy = Some(strategy);
        Ok(())
    }

    /// One global step over `batches` (one per slot); the items to report.
    fn step(
        &self,
        batches: Vec<<M as TrainStep>::Input>,
        lr: f64,
    ) -> Result<Vec<<M as TrainStep>::Output>, StrategyError> {
        let slots: Vec<usize> = (0..batches.len()).collect();
        self.feed.fill(batches);
        let mut shared = self.optimizer.lock();
        let strategy = shared
            .strategy
            .as_mut()
            .ok_or(StrategyError::Broken { culprit: 0 })?;
        let (out, items) = strategy.step_with_items(&slots, lr)?;
        Ok(items.into_iter().map(|i| i.with_loss(out.loss)).collect())
    }

    fn trained_model(&self) -> Result<M, StrategyError> {
        let shared = self.optimizer.lock();
        shared
            .strategy
            .as_ref()
            .ok_or(StrategyError::Broken { culprit: 0 })?
            .model()
    }
}

impl<LC> SupervisedLearningStrategy<LC> for KilnLearning<LC::Backend, LC::TrainingModel>
where
    LC: LearningComponentsTypes,
    LC::TrainingModel: TrainModel<LC::Backend>,
    // Only the StrategyOptimizer itself converts into one: the Learner must hold it, since
    // Burn checkpoints the Learner's optimizer.
    LC::Optimizer: Into<StrategyOptimizer<LC::Backend, LC::TrainingModel>>,
{
    fn fit(
        &self,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let TrainingComponents {
            num_epochs,
            mut checkpointer,
            interrupter,
            mut early_stopping,
            mut event_processor,
            event_store,
            ..
        } = components;
        if let Err(error) = self.start(learner.model()) {
            self.fail(error, &interrupter);
            return (learner.model(), event_processor);
        }
        let loaders = split_dataloader(dataloader_train, &self.slot_devices);
        let slots = loaders.len();

        for epoch in starting_epoch..=num_epochs {
            let global = Progress::new(epoch, num_epochs);
            let mut iterators: Vec<_> = loaders.iter().map(|l| l.iter()).collect();
            let mut iteration = 0;
            'steps: loop {
                let mut batches = Vec::with_capacity(slots);
                for it in &mut iterators {
                    match it.next() {
                        Some(batch) => batches.push(batch),
                        None => break 'steps,
                    }
                }
                iteration += 1;
                let first = iterators[0].progress();
                let progress =
                    Progress::new(first.items_processed * slots, first.items_total * slots);
                learner.lr_step();
                let lr = learner.lr_current();
                match self.step(batches, lr) {
                    Ok(items) => {
                        for item in items {
                            let item = TrainingItem::new(
                                item,
                                progress.clone(),
                                global.clone(),
                                Some(iteration),
                                Some(lr),
                            );
                            event_processor.process_train(LearnerEvent::ProcessedItem(item));
                        }
                    }
                    Err(error) => {
                        self.fail(error, &interrupter);
                        break;
                    }
                }
                if interrupter.should_stop() {
                    break;
                }
            }
            event_processor.process_train(LearnerEvent::EndEpoch(epoch));
            if interrupter.should_stop() {
                break;
            }

            // The Learner validates and checkpoints the trained weights.
            match self.trained_model() {
                Ok(model) => learner.load_model(model.into_record()),
                Err(error) => {
                    self.fail(error, &interrupter);
                    break;
                }
            }
            let model: LC::InferenceModel = learner.model().valid();
            let mut it = dataloader_valid.iter();
            let mut iteration = 0;
            while let Some(batch) = it.next() {
                iteration += 1;
                let item = InferenceStep::step(&model, batch);
                let item =
                    TrainingItem::new(item, it.progress(), global.clone(), Some(iteration), None);
                event_processor.process_valid(LearnerEvent::ProcessedItem(item));
                if interrupter.should_stop() {
                    break;
                }
            }
            event_processor.process_valid(LearnerEvent::EndEpoch(epoch));

            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &event_store);
            }
            if let Some(early_stopping) = &mut early_stopping
                && early_stopping.should_stop(epoch, &event_store)
            {
                break;
            }
        }
        (learner.model(), event_processor)
    }
}
