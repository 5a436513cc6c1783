//! The training data: windows of `context` consecutive steps cut from learning histories,
//! crossing episode boundaries, and their encoding as model input.

use std::sync::Arc;

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::tensor::backend::Backend;
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use kiln_core::data::{dense_float_tensor, dense_tensor};

use crate::env::{ACTIONS, DarkRoomConfig};
use crate::error::AdError;
use crate::history::{Histories, Token};

/// Width of a token's encoding: one-hot x, one-hot y, one-hot previous action (or none),
/// one-hot previous reward (0, 1 or none).
pub fn feature_width(room: &DarkRoomConfig) -> usize {
    2 * usize::from(room.size) + (ACTIONS + 1) + 3
}

/// Writes the multi-hot encoding of `token` into `out` (`feature_width` zeros).
///
/// A linear layer over this encoding is exactly a sum of four embedding lookups, but its
/// forward and backward are dense matmuls instead of gathers and scatters.
pub fn encode(room: &DarkRoomConfig, token: Token, out: &mut [f32]) {
    let size = usize::from(room.size);
    out[usize::from(token.x)] = 1.0;
    out[size + usize::from(token.y)] = 1.0;
    out[2 * size + usize::from(token.prev_action)] = 1.0;
    out[2 * size + ACTIONS + 1 + usize::from(token.prev_reward)] = 1.0;
}

/// Where one window starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRef {
    /// The history.
    pub history: usize,
    /// Its first step.
    pub start: usize,
}

/// Every window of `context` consecutive steps of every history, addressed by index.
#[derive(Debug, Clone)]
pub struct WindowDataset {
    histories: Arc<Histories>,
    context: usize,
}

impl WindowDataset {
    /// Windows of `context` steps.
    ///
    /// # Errors
    /// [`AdError::ContextTooLong`] when `context` is 0 or exceeds a history's length.
    pub fn new(histories: Arc<Histories>, context: usize) -> Result<Self, AdError> {
        if !(1..=histories.len()).contains(&context) {
            return Err(AdError::ContextTooLong {
                context,
                steps: histories.len(),
            });
        }
        Ok(Self { histories, context })
    }

    fn per_history(&self) -> usize {
        self.histories.len() - self.context + 1
    }
}

impl Dataset<WindowRef> for WindowDataset {
    fn get(&self, index: usize) -> Option<WindowRef> {
        (index < self.len()).then(|| WindowRef {
            history: index / self.per_history(),
            start: index % self.per_history(),
        })
    }

    fn len(&self) -> usize {
        self.histories.count() * self.per_history()
    }
}

/// A batch of windows: encoded tokens and the source's actions to predict.
#[derive(Debug, Clone)]
pub struct AdBatch<B: Backend> {
    /// `[batch, context, feature_width]` multi-hot tokens.
    pub features: Tensor<B, 3>,
    /// `[batch, context]` the action the source took at each step.
    pub targets: Tensor<B, 2, Int>,
}

/// Gathers windows from the shared histories into an [`AdBatch`].
#[derive(Debug, Clone)]
pub struct WindowBatcher {
    histories: Arc<Histories>,
    context: usize,
    dtype: FloatDType,
}

impl WindowBatcher {
    /// A batcher over the same histories as the data set, its features in f32.
    pub fn new(histories: Arc<Histories>, context: usize) -> Self {
        Self {
            histories,
            context,
            dtype: FloatDType::F32,
        }
    }

    /// This batcher with its features in `dtype`, the model's compute dtype: converted on the
    /// host (the multi-hot values are exact in every float type), so that a bf16 or f16 step
    /// casts no input on the device.
    pub fn with_features_dtype(self, dtype: FloatDType) -> Self {
        Self { dtype, ..self }
    }
}

impl<B: Backend> Batcher<B, WindowRef, AdBatch<B>> for WindowBatcher {
    fn batch(&self, items: Vec<WindowRef>, device: &B::Device) -> AdBatch<B> {
        let room = self.histories.room();
        let width = feature_width(room);
        let (n, k) = (items.len(), self.context);
        let mut features = vec![0.0f32; n * k * width];
        let mut targets = Vec::with_capacity(n * k);
        for (i, w) in items.iter().enumerate() {
            for j in 0..k {
                let t = w.start + j;
                let at = (i * k + j) * width;
                encode(
                    room,
                    self.histories.token(w.history, t),
                    &mut features[at..at + width],
                );
                targets.push(i64::from(self.histories.action(w.history, t)));
            }
        }
        AdBatch {
            features: dense_float_tensor(
                TensorData::new(features, [n, k, width]),
                device,
                self.dtype,
            ),
            targets: dense_tensor(TensorData::new(targets, [n, k]), device),
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::NdArray;

    use super::*;
    use crate::history::{NO_ACTION, NO_REWARD};

    fn histories() -> Arc<Histories> {
        let room = DarkRoomConfig {
            size: 3,
            horizon: 2,
        };
        let mut h = Histories::with_goals(room, 2, vec![(0, 0), (2, 2)]);
        for history in 0..2 {
            for t in 0..4 {
                h.record(history, t, (t as u8 % 3, 1), (t % 5) as u8, (t % 2) as u8);
            }
        }
        Arc::new(h)
    }

    #[test]
    fn windows_cover_every_start_of_every_history() {
        let data = WindowDataset::new(histories(), 3).unwrap();
        assert!(WindowDataset::new(histories(), 5).is_err());
        assert!(WindowDataset::new(histories(), 0).is_err());
        assert_eq!(data.len(), 2 * 2);
        assert_eq!(
            data.get(3),
            Some(WindowRef {
                history: 1,
                start: 1
            })
        );
        assert_eq!(data.get(4), None);
    }

    #[test]
    fn batch_encodes_previous_action_and_reward_across_episodes() {
        let h = histories();
        let batch: AdBatch<NdArray> = WindowBatcher::new(h.clone(), 3).batch(
            vec![
                WindowRef {
                    history: 0,
                    start: 0,
                },
                WindowRef {
                    history: 1,
                    start: 1,
                },
            ],
            &Default::default(),
        );
        assert_eq!(batch.features.dims(), [2, 3, feature_width(h.room())]);
        let f: Vec<f32> = batch.features.into_data().to_vec().unwrap();
        let width = feature_width(h.room());
        // Window 0, step 0: the history's start has no previous action or reward.
        let first = &f[..width];
        assert_eq!(first[6 + usize::from(NO_ACTION)], 1.0);
        assert_eq!(first[6 + 6 + usize::from(NO_REWARD)], 1.0);
        // Window 1, step 1 is history step 2, the first of episode 2: it still sees the
        // last action (1) and reward (1) of episode 1.
        let crossing = &f[(3 + 1) * width..(3 + 2) * width];
        assert_eq!(crossing[2], 1.0, "x of step 2");
        assert_eq!(crossing[3 + 1], 1.0, "y of step 2");
        assert_eq!(crossing[6 + 1], 1.0, "previous action");
        assert_eq!(crossing[6 + 6 + 1], 1.0, "previous reward");
        assert_eq!(crossing.iter().sum::<f32>(), 4.0);
        let targets: Vec<i64> = batch.targets.into_data().convert::<i64>().to_vec().unwrap();
        assert_eq!(targets, vec![0, 1, 2, 1, 2, 3]);
    }
}
