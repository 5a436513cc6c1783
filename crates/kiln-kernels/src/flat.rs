//! Many tensors side by side in one flat buffer: the layout of the fused AdamW's moments and
//! updated parameters, so that one launch steps every parameter.

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};

/// Where each of a list of tensors lies in a flat buffer: one after another, each segment
/// starting at a multiple of `align` elements (the device's offset alignment), so that a slice
/// of one segment is a view of the buffer, not a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlatLayout {
    lens: Vec<usize>,
    offsets: Vec<usize>,
    total: usize,
    align: usize,
}

impl FlatLayout {
    /// Segments of `lens` elements, each starting at a multiple of `align` (at least 1); the
    /// buffer's length is a multiple of `align` too, so that the last segment ends aligned.
    pub fn new(lens: Vec<usize>, align: usize) -> Self {
        let align = align.max(1);
        let mut offsets = Vec::with_capacity(lens.len());
        let mut total = 0;
        for &len in &lens {
            offsets.push(total);
            total += len.div_ceil(align) * align;
        }
        Self {
            lens,
            offsets,
            total,
            align,
        }
    }

    /// The segments' lengths, in order.
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }

    /// The segments' first elements, in order.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Segment `i` as a range of the buffer.
    pub fn segment(&self, i: usize) -> std::ops::Range<usize> {
        self.offsets[i]..self.offsets[i] + self.lens[i]
    }

    /// The buffer's length, padding included.
    pub fn total(&self) -> usize {
        self.total
    }

    /// The alignment of the segments, in elements.
    pub fn align(&self) -> usize {
        self.align
    }

    /// The padding after segment `i`: what lies between its end and the next segment.
    pub fn padding(&self, i: usize) -> usize {
        self.lens[i].div_ceil(self.align) * self.align - self.lens[i]
    }

    /// The number of segments.
    pub fn len(&self) -> usize {
        self.lens.len()
    }

    /// Whether there are no segments.
    pub fn is_empty(&self) -> bool {
        self.lens.is_empty()
    }

    /// `parts` (one `[len_i]` tensor per segment, in order) as one flat `dtype` tensor laid out
    /// this way on `device`, zeros in the padding: how the plain-Burn paths build a flat buffer.
    pub fn join<B: Backend>(
        &self,
        parts: Vec<Tensor<B, 1>>,
        device: &B::Device,
        dtype: DType,
    ) -> Tensor<B, 1> {
        debug_assert_eq!(parts.len(), self.len(), "a part per segment");
        let mut padded = Vec::with_capacity(2 * parts.len());
        for (i, part) in parts.into_iter().enumerate() {
            padded.push(part);
            let pad = self.padding(i);
            if pad > 0 {
                padded.push(Tensor::zeros([pad], (device, dtype)));
            }
        }
        if padded.is_empty() {
            Tensor::zeros([0], (device, dtype))
        } else {
            Tensor::cat(padded, 0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_start_and_end_aligned() {
        let layout = FlatLayout::new(vec![5, 64, 0, 70], 64);
        assert_eq!(layout.offsets(), &[0, 64, 128, 128]);
        assert_eq!(layout.total(), 256);
        assert_eq!(layout.segment(3), 128..198);
        assert_eq!(layout.padding(0), 59);
        assert_eq!(layout.padding(1), 0);
        let dense = FlatLayout::new(vec![5, 3], 1);
        assert_eq!((dense.offsets(), dense.total()), (&[0, 5][..], 8));
    }
}
