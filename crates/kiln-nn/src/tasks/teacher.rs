//! Classification by a random linear teacher: `label = argmax(W·x)`, `x ~ N(0, 1)`.

use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kiln_core::data::dense_tensor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One sample: features and the teacher's label.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassificationItem {
    /// Input features.
    pub features: Vec<f32>,
    /// Class index.
    pub label: usize,
}

/// A batch of [`ClassificationItem`]s on a device.
#[derive(Debug, Clone)]
pub struct ClassificationBatch<B: Backend> {
    /// `[batch, features]`.
    pub features: Tensor<B, 2>,
    /// `[batch]`.
    pub labels: Tensor<B, 1, Int>,
}

/// Builds the teacher data set.
#[derive(Debug, Clone)]
pub struct TeacherTask {
    /// Samples.
    pub samples: usize,
    /// Features per sample.
    pub features: usize,
    /// Classes.
    pub classes: usize,
    /// Seed of the teacher and the inputs.
    pub seed: u64,
}

impl TeacherTask {
    /// Generates the samples.
    pub fn dataset(&self) -> InMemDataset<ClassificationItem> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let teacher: Vec<f32> = (0..self.features * self.classes)
            .map(|_| normal(&mut rng))
            .collect();
        let items = (0..self.samples)
            .map(|_| {
                let features: Vec<f32> = (0..self.features).map(|_| normal(&mut rng)).collect();
                let label = (0..self.classes)
                    .map(|c| {
                        let row = &teacher[c * self.features..(c + 1) * self.features];
                        row.iter().zip(&features).map(|(w, x)| w * x).sum::<f32>()
                    })
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                    .map_or(0, |(c, _)| c);
                ClassificationItem { features, label }
            })
            .collect();
        InMemDataset::new(items)
    }
}

/// A standard normal sample (Box–Muller), to avoid a distribution crate for one function.
fn normal(rng: &mut StdRng) -> f32 {
    let u1: f32 = rng.random::<f32>().max(f32::MIN_POSITIVE);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
}

/// Stacks [`ClassificationItem`]s into a [`ClassificationBatch`].
#[derive(Debug, Clone, Default)]
pub struct ClassificationBatcher;

impl<B: Backend> Batcher<B, ClassificationItem, ClassificationBatch<B>> for ClassificationBatcher {
    fn batch(&self, items: Vec<ClassificationItem>, device: &B::Device) -> ClassificationBatch<B> {
        let n = items.len();
        let width = items.first().map_or(0, |i| i.features.len());
        let features: Vec<f32> = items
            .iter()
            .flat_map(|i| i.features.iter().copied())
            .collect();
        let labels: Vec<i64> = items.iter().map(|i| i.label as i64).collect();
        ClassificationBatch {
            features: dense_tensor(TensorData::new(features, [n, width]), device),
            labels: Tensor::from_data(TensorData::new(labels, [n]), device),
        }
    }
}
