//! The trainable pair `(A, B)` of a LoRA layer: the only part that trains and the only part
//! that needs saving.

use std::path::Path;

use burn::module::{Module, Param};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, RecorderError};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};

/// `A [d_in, r]` (Kaiming-uniform, as Burn's `Linear` initialises weights) and
/// `B [r, d_out]` (zeros).
#[derive(Module, Debug)]
pub struct LoraAdapter<B: Backend> {
    /// Down-projection.
    pub a: Param<Tensor<B, 2>>,
    /// Up-projection.
    pub b: Param<Tensor<B, 2>>,
}

impl<B: Backend> LoraAdapter<B> {
    /// A fresh adapter whose product `A·B` is zero. `A ~ U(±1/√d_in)`: Burn's `Linear`
    /// default (Kaiming-uniform with gain 1/√3). Both are created eagerly, not as Burn's lazy
    /// parameters, so that clones of the adapter (to save it, to move it between layers)
    /// hold the same values.
    pub fn new(d_in: usize, d_out: usize, rank: usize, device: &B::Device) -> Self {
        let bound = 1.0 / (d_in.max(1) as f64).sqrt();
        Self {
            a: Param::from_tensor(Tensor::random(
                [d_in, rank],
                Distribution::Uniform(-bound, bound),
                device,
            )),
            b: Param::from_tensor(Tensor::zeros([rank, d_out], device)),
        }
    }

    /// `scale · A·B`, `[d_in, d_out]`: what merging adds to the base weight, detached from
    /// the autodiff graph (a merged weight is an inference artifact, not a trained value).
    pub fn delta(&self, scale: f32) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val()).mul_scalar(scale).detach()
    }

    /// The rank.
    pub fn rank(&self) -> usize {
        self.a.dims()[1]
    }

    /// Saves the adapter alone (Burn's named MessagePack record, full precision).
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), RecorderError> {
        self.clone()
            .save_file(path.as_ref().to_path_buf(), &recorder())
    }

    /// Loads an adapter saved by [`LoraAdapter::save`] into this one, keeping its device.
    /// A file whose shapes differ from this adapter's is an error, not a silent reshape.
    pub fn load(self, path: impl AsRef<Path>, device: &B::Device) -> Result<Self, RecorderError> {
        let (a, b) = (self.a.dims(), self.b.dims());
        let loaded = self.load_file(path.as_ref().to_path_buf(), &recorder(), device)?;
        if loaded.a.dims() != a || loaded.b.dims() != b {
            return Err(RecorderError::Unknown(format!(
                "adapter file {} holds A {:?} and B {:?}, but this layer's are {a:?} and {b:?}",
                path.as_ref().display(),
                loaded.a.dims(),
                loaded.b.dims()
            )));
        }
        Ok(loaded)
    }
}

fn recorder() -> NamedMpkFileRecorder<FullPrecisionSettings> {
    NamedMpkFileRecorder::new()
}
