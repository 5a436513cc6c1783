//! The few strategies a product is timed with: Burn's default and three of cubek's picked by
//! the product's shape, where Burn's autotune times up to nineteen (which took the AD step's
//! first step past 75 s on an H100).
//!
//! The families follow burn-cubecl 0.21's autotune priorities: matrix-vector kernels for a
//! one-row or one-column product, the unit kernels (no tensor cores) where a side is at most a
//! tensor-core tile, tensor-core kernels otherwise. Which members of each family win on which
//! GPU is what `kiln bench matmul` measures, beside every other candidate.

use cubek::matmul::components::tile::TileMatmulKind::{Cmma, Mma};
use cubek::matmul::routines::TileSizeSelection::{MaxTileSize, MinTileSize};

use crate::Product;
use crate::cube::matmul::Candidate;

/// At most this side is a skinny product's short side: a LoRA adapter's rank, a few tokens.
const SKINNY: usize = 16;
/// A product all of whose sides are shorter than this is small (cubek's own scale).
const SMALL: usize = 512;

/// The candidates `product` is timed with, Burn's default first.
pub fn shortlist(product: &Product) -> Vec<Candidate> {
    let short = product.m.min(product.n);
    let longest = product.m.max(product.n).max(product.k);
    let family = if short == 1 {
        vec![
            Candidate::gemv_plane(),
            Candidate::gemv_unit(),
            Candidate::vec_mat(false),
        ]
    } else if short <= SKINNY {
        vec![
            Candidate::unit(false, MaxTileSize),
            Candidate::unit(true, MaxTileSize),
            Candidate::simple_cyclic(false, Cmma),
        ]
    } else if longest < SMALL {
        vec![
            Candidate::unit(false, MinTileSize),
            Candidate::unit(false, MaxTileSize),
            Candidate::simple_cyclic(false, Cmma),
        ]
    } else {
        vec![
            Candidate::simple_cyclic(true, Mma),
            Candidate::double_cyclic(false, Cmma),
            Candidate::ordered_double(Mma),
        ]
    };
    std::iter::once(Candidate::burn_default())
        .chain(family)
        .collect()
}

#[cfg(test)]
mod tests {
    use burn::tensor::DType;

    use super::*;
    use crate::Transpose;

    #[test]
    fn each_shape_tries_four_strategies_burns_default_first() {
        let product = |m, k, n| Product {
            m,
            k,
            n,
            transpose: Transpose::Neither,
            dtype: DType::F32,
        };
        let shapes = [
            product(1, 768, 32_000),
            product(2048, 768, 16),
            product(256, 64, 64),
            product(2048, 768, 2048),
        ];
        let mut families = Vec::new();
        for p in shapes {
            let list = shortlist(&p);
            assert_eq!(list.len(), 4, "{p:?}");
            assert!(list[0].is_burn_default());
            assert!(list[1..].iter().all(|c| !c.is_burn_default()));
            families.push(list[1].name.clone());
        }
        families.dedup();
        assert_eq!(families.len(), shapes.len(), "{families:?}");
    }
}
