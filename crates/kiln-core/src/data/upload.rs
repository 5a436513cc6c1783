//! Batches onto a device as dense row-major tensors.

use burn::tensor::backend::Backend;
use burn::tensor::{
    BasicOps, FloatDType, Shape, Tensor, TensorCreationOptions, TensorData, TensorKind,
};

/// `data` on `device` as a dense row-major tensor of `D` dimensions.
///
/// Burn's `Tensor::from_data` lets CubeCL's CUDA runtime pitch a tensor of two or more
/// dimensions (pad each row to an alignment: a `[batch, 60]` tensor of `i64` gets rows of 64),
/// and every kernel or reshape that needs dense rows then copies it, in every step. A
/// one-dimensional upload is never pitched, and reshaping it is a view, so batchers upload
/// through this. Elsewhere it is `from_data` and a free reshape.
pub fn dense_tensor<B, const D: usize, K>(data: TensorData, device: &B::Device) -> Tensor<B, D, K>
where
    B: Backend,
    K: TensorKind<B> + BasicOps<B>,
{
    upload_flat(data, device)
}

/// Float `data` on `device` as a dense row-major tensor of `dtype` (see [`dense_tensor`]),
/// converted on the host: a batch made in a model's compute dtype costs no cast on the device.
pub fn dense_float_tensor<B: Backend, const D: usize>(
    data: TensorData,
    device: &B::Device,
    dtype: FloatDType,
) -> Tensor<B, D> {
    upload_flat(data, (device, dtype.into()))
}

/// `data` uploaded as one dimension with `options`, then reshaped to its shape (a view).
fn upload_flat<B, const D: usize, K>(
    data: TensorData,
    options: impl Into<TensorCreationOptions<B>>,
) -> Tensor<B, D, K>
where
    B: Backend,
    K: TensorKind<B> + BasicOps<B>,
{
    let shape = data.shape.clone();
    let flat = TensorData {
        shape: Shape::new([shape.num_elements()]),
        ..data
    };
    Tensor::<B, 1, K>::from_data(flat, options).reshape(shape)
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::Int;

    use super::*;

    /// The same values and shape as `from_data`, floats and integers alike.
    #[test]
    fn holds_what_from_data_holds() {
        let device = Default::default();
        let floats: Vec<f32> = (0..24).map(|i| i as f32 * 0.5 - 3.0).collect();
        let data = TensorData::new(floats, [2, 3, 4]);
        let dense = dense_tensor::<Flex, 3, burn::tensor::Float>(data.clone(), &device);
        let direct = Tensor::<Flex, 3>::from_data(data, &device);
        assert_eq!(dense.dims(), [2, 3, 4]);
        assert_eq!(dense.into_data(), direct.into_data());
        let ints = TensorData::new((0..6).map(i64::from).collect::<Vec<_>>(), [3, 2]);
        let dense = dense_tensor::<Flex, 2, Int>(ints.clone(), &device);
        assert_eq!(dense.dims(), [3, 2]);
        assert_eq!(
            dense.into_data().convert::<i64>(),
            Tensor::<Flex, 2, Int>::from_data(ints, &device)
                .into_data()
                .convert::<i64>()
        );
    }
}
