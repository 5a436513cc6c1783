//! The optimizer Burn's `Learner` holds when a Kiln strategy trains: a handle on the
//! strategy's own optimizers, so that what Burn's checkpointer saves is the state that trained.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, LearningRate, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;

use crate::model::TrainModel;
use crate::optim::OptimizerState;
use crate::strategy::Strategy;

/// A strategy that can move to the thread Burn's training runs on.
pub type SendStrategy<B, M> = Box<dyn Strategy<B, M> + Send>;

pub(crate) struct Shared<B: AutodiffBackend, M: TrainModel<B>> {
    /// The strategy, once the adapter has built it.
    pub strategy: Option<SendStrategy<B, M>>,
    /// A state Burn loaded (a resumed checkpoint) before the strategy existed.
    pub pending: Option<OptimizerState>,
}

/// The `Learner`'s optimizer under [`KilnLearning`](super::KilnLearning): Burn saves and loads
/// it with its checkpoints, and it reads and writes the strategy's optimizer state
/// ([`Strategy::optimizer_state`]). The strategy steps its own optimizers on its ranks, so this
/// one is never stepped.
pub struct StrategyOptimizer<B: AutodiffBackend, M: TrainModel<B>> {
    pub(crate) shared: Arc<Mutex<Shared<B, M>>>,
}

impl<B: AutodiffBackend, M: TrainModel<B>> Clone for StrategyOptimizer<B, M> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: AutodiffBackend, M: TrainModel<B>> StrategyOptimizer<B, M> {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Mutex::new(Shared {
                strategy: None,
                pending: None,
            })),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Shared<B, M>> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

const NOT_STEPPED: &str = "StrategyOptimizer is stepped by the Kiln strategy on its ranks; use it \
     only as the Learner's optimizer under TrainingStrategy::Custom(KilnLearning)";

impl<B, M> Optimizer<M, B> for StrategyOptimizer<B, M>
where
    B: AutodiffBackend,
    M: TrainModel<B> + AutodiffModule<B>,
{
    /// The layout's name and the encoded parts of [`OptimizerState`].
    type Record = (String, Vec<Vec<u8>>);

    fn step(&mut self, _lr: LearningRate, _module: M, _grads: GradientsParams) -> M {
        panic!("{NOT_STEPPED}")
    }

    fn step_multi(&mut self, _lr: LearningRate, _module: M, _grads: MultiGradientsParams) -> M {
        panic!("{NOT_STEPPED}")
    }

    fn to_record(&self) -> Self::Record {
        let shared = self.lock();
        let state = match (&shared.strategy, &shared.pending) {
            // Burn checkpoints between epochs, when the ranks are idle and healthy; a failed
            // strategy has stopped the training before any checkpoint is asked for.
            (Some(strategy), _) => strategy
                .optimizer_state()
                .unwrap_or_else(|e| panic!("cannot read the strategy's optimizer state: {e}")),
            (None, Some(pending)) => pending.clone(),
            (None, None) => return (String::new(), Vec::new()),
        };
        state.into_record()
    }

    fn load_record(self, record: Self::Record) -> Self {
        {
            let mut shared = self.lock();
            shared.pending = OptimizerState::from_record(record);
        }
        self
    }
}
