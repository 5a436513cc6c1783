//! A frozen 4-bit weight on a device, as a Burn module so that it moves, forks and saves with
//! the model that holds it, but never trains.

use burn::module::{Module, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{DType, Int, Tensor, TensorData, TensorPrimitive};

use std::ops::Range;

use super::BlockSplitError;
use super::format::{HostQuantized, QuantFormat, ScaleDtype, blocks, words_per_column};
use crate::KernelBackend;

/// A `[k, n]` weight stored as packed 4-bit codes and per-block scales; `deq(W)` exists only
/// inside the kernels that read it.
///
/// Storage: `k·n/2` bytes of codes plus one scale per 64 values, 0.5625 bytes per parameter
/// with f32 scales and 0.53125 with f16 ones (for `k` a multiple of 64; a shorter last block
/// costs one more scale per column).
#[derive(Module, Debug)]
pub struct QuantizedWeight<B: Backend> {
    /// `[n, ceil(k / 8)]` 32-bit words (stored as i32: the bit pattern is what counts).
    pub packed: Param<Tensor<B, 2, Int>>,
    /// `[n, ceil(k / 64)]` absmax scales, f32 or f16.
    pub scales: Param<Tensor<B, 2>>,
    /// The 16 normalised values of the code book, f32.
    pub codebook: Param<Tensor<B, 1>>,
    /// Rows of the weight: the reduction dimension of `x·W`.
    pub k: usize,
    /// Columns: the output dimension.
    pub n: usize,
    /// Which code book the codes index.
    #[module(skip)]
    pub format: QuantFormat,
}

/// The primitives of a [`QuantizedWeight`], the form the backend extension takes.
#[derive(Debug, Clone)]
pub struct QuantizedPrimitive<B: Backend> {
    /// See [`QuantizedWeight::packed`].
    pub packed: IntTensor<B>,
    /// See [`QuantizedWeight::scales`].
    pub scales: FloatTensor<B>,
    /// See [`QuantizedWeight::codebook`].
    pub codebook: FloatTensor<B>,
    /// Rows of the weight.
    pub k: usize,
    /// Columns of the weight.
    pub n: usize,
}

impl<B: KernelBackend> QuantizedWeight<B> {
    /// Quantises a `[k, n]` weight (a Burn `Linear`'s layout) block-wise along `k`.
    pub fn quantize(weight: &Tensor<B, 2>, format: QuantFormat, scale: ScaleDtype) -> Self {
        let [k, n] = weight.dims();
        let values = weight
            .to_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 data after convert");
        Self::from_host(
            &HostQuantized::quantize(&values, k, n, format, scale),
            scale,
            &weight.device(),
        )
    }

    /// Moves host-quantised codes and scales onto `device`, stored dense
    /// ([`KernelBackend::dense_float`]): the kernels read them on every call and would copy
    /// a pitched layout each time.
    pub fn from_host(q: &HostQuantized, scale: ScaleDtype, device: &B::Device) -> Self {
        let words: Vec<i32> = q.packed.iter().map(|&w| w as i32).collect();
        let packed = Tensor::<B, 2, Int>::from_data(
            TensorData::new(words, [q.n, words_per_column(q.k)]),
            (device, DType::I32),
        );
        let packed = Tensor::from_primitive(B::dense_int(packed.into_primitive()));
        let scale_dtype = match scale {
            ScaleDtype::F32 => DType::F32,
            ScaleDtype::F16 => DType::F16,
        };
        let scales = Tensor::<B, 2>::from_data(
            TensorData::new(q.scales.clone(), [q.n, blocks(q.k)]),
            (device, scale_dtype),
        );
        let scales = Tensor::from_primitive(TensorPrimitive::Float(B::dense_float(
            scales.into_primitive().tensor(),
        )));
        let codebook = Tensor::from_data(
            TensorData::new(q.format.codebook().to_vec(), [16]),
            (device, DType::F32),
        );
        Self {
            packed: Param::initialized(ParamId::new(), packed),
            scales: Param::from_tensor(scales).set_require_grad(false),
            codebook: Param::from_tensor(codebook).set_require_grad(false),
            k: q.k,
            n: q.n,
            format: q.format,
        }
    }

    /// The columns `cols` (output features) of the weight, as a weight of its own on the same
    /// device with the same parameter ids: a column-parallel shard. The codes and scales are
    /// the whole weight's, not quantised again.
    pub fn columns(&self, cols: Range<usize>) -> Self {
        self.with_host(&self.to_host().columns(cols))
    }

    /// The rows `rows` (input features) of the weight, as [`Self::columns`] for a row-parallel
    /// shard: whole quantisation blocks only.
    ///
    /// # Errors
    /// [`BlockSplitError`] for a range that cuts a block.
    pub fn rows(&self, rows: Range<usize>) -> Result<Self, BlockSplitError> {
        Ok(self.with_host(&self.to_host().rows(rows)?))
    }

    /// The weight whose columns are `parts`' side by side, with the first part's ids: the
    /// inverse of [`Self::columns`].
    ///
    /// # Panics
    /// When `parts` is empty or its parts are not column shards of one weight.
    pub fn concat_columns(parts: &[Self]) -> Self {
        let hosts: Vec<_> = parts.iter().map(Self::to_host).collect();
        parts[0].with_host(&HostQuantized::concat_columns(&hosts))
    }

    /// The weight whose rows are `parts`' one after another, with the first part's ids: the
    /// inverse of [`Self::rows`].
    ///
    /// # Panics
    /// As [`HostQuantized::concat_rows`].
    pub fn concat_rows(parts: &[Self]) -> Self {
        let hosts: Vec<_> = parts.iter().map(Self::to_host).collect();
        parts[0].with_host(&HostQuantized::concat_rows(&hosts))
    }

    /// The precision of the scales.
    pub fn scale_dtype(&self) -> ScaleDtype {
        match self.scales.val().dtype() {
            DType::F16 => ScaleDtype::F16,
            _ => ScaleDtype::F32,
        }
    }

    /// `q` on this weight's device, under this weight's parameter ids.
    fn with_host(&self, q: &HostQuantized) -> Self {
        let device = self.scales.val().device();
        let fresh = Self::from_host(q, self.scale_dtype(), &device);
        Self {
            packed: Param::initialized(self.packed.id, fresh.packed.val()),
            scales: Param::initialized(self.scales.id, fresh.scales.val()).set_require_grad(false),
            codebook: Param::initialized(self.codebook.id, fresh.codebook.val())
                .set_require_grad(false),
            ..fresh
        }
    }
}

impl<B: Backend> QuantizedWeight<B> {
    /// Reads the codes and scales back to the host.
    pub fn to_host(&self) -> HostQuantized {
        let packed = self
            .packed
            .val()
            .into_data()
            .convert::<i32>()
            .into_vec::<i32>()
            .expect("i32 data after convert")
            .into_iter()
            .map(|w| w as u32)
            .collect();
        let scales = self
            .scales
            .val()
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 data after convert");
        HostQuantized {
            format: self.format,
            k: self.k,
            n: self.n,
            packed,
            scales,
        }
    }

    /// The bytes the weight occupies on its device: codes plus scales (the 64-byte code book
    /// is shared by every weight of a format and is not counted).
    pub fn storage_bytes(&self) -> usize {
        let packed = self.packed.val();
        let scales = self.scales.val();
        packed.shape().num_elements() * packed.dtype().size()
            + scales.shape().num_elements() * scales.dtype().size()
    }

    /// The primitives, for the backend extension.
    pub fn primitive(&self) -> QuantizedPrimitive<B> {
        QuantizedPrimitive {
            packed: self.packed.val().into_primitive(),
            scales: self.scales.val().into_primitive().tensor(),
            codebook: self.codebook.val().into_primitive().tensor(),
            k: self.k,
            n: self.n,
        }
    }
}
