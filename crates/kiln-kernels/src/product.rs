//! A matrix product as Kiln's layers ask for it: its shape, which operand is multiplied
//! transposed, and its dtype. Named before any tensor exists, so that a backend can decide how
//! to run it while the fusion backend is still recording the step.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, TensorMetadata};
use serde::{Deserialize, Serialize};

/// Which operand of `lhs·rhs` is passed as it is stored and multiplied transposed.
///
/// A linear layer's backward multiplies by transposed operands: `dy·wᵀ` for the input's
/// gradient, `xᵀ·dy` for the weight's. Naming the transpose, rather than handing over a
/// transposed view, lets a backend choose its kernel from the layout before the operands
/// exist (the fusion backend records the step first and runs it later).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transpose {
    /// `lhs·rhs`.
    Neither,
    /// `lhsᵀ·rhs`: `lhs` is stored `[k, m]`.
    Lhs,
    /// `lhs·rhsᵀ`: `rhs` is stored `[n, k]`.
    Rhs,
}

/// `[m, k]·[k, n]` in `dtype`, one operand possibly transposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Product {
    /// Output rows.
    pub m: usize,
    /// The reduction's length.
    pub k: usize,
    /// Output columns.
    pub n: usize,
    /// The operand multiplied transposed.
    pub transpose: Transpose,
    /// The operands' and the output's dtype.
    pub dtype: DType,
}

impl Product {
    /// The product of `lhs` and `rhs` stored with these shapes (`[rows, cols]` each), the
    /// transposed operand's shape as stored.
    pub fn of(lhs: [usize; 2], rhs: [usize; 2], transpose: Transpose, dtype: DType) -> Self {
        let (m, k) = match transpose {
            Transpose::Lhs => (lhs[1], lhs[0]),
            _ => (lhs[0], lhs[1]),
        };
        let n = match transpose {
            Transpose::Rhs => rhs[0],
            _ => rhs[1],
        };
        Self {
            m,
            k,
            n,
            transpose,
            dtype,
        }
    }

    /// The product of two matrices of `B` as stored, `transpose` applied, in `lhs`'s dtype.
    pub fn of_operands<B: Backend>(
        lhs: &FloatTensor<B>,
        rhs: &FloatTensor<B>,
        transpose: Transpose,
    ) -> Self {
        let dims = |t: &FloatTensor<B>| t.shape().dims::<2>();
        Self::of(dims(lhs), dims(rhs), transpose, lhs.dtype())
    }

    /// The multiply-adds times two.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.k as f64 * self.n as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_read_through_the_transpose() {
        let p = |l, r, t| {
            let p = Product::of(l, r, t, DType::F32);
            [p.m, p.k, p.n]
        };
        assert_eq!(p([4, 8], [8, 3], Transpose::Neither), [4, 8, 3]);
        // A weight's gradient xᵀ·dy: x [rows = 8, m = 4], dy [8, 3].
        assert_eq!(p([8, 4], [8, 3], Transpose::Lhs), [4, 8, 3]);
        // An input's gradient dy·wᵀ: dy [4, 3], w [8, 3].
        assert_eq!(p([4, 3], [8, 3], Transpose::Rhs), [4, 3, 8]);
    }
}
