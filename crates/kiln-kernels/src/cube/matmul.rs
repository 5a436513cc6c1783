//! cubek's matmul strategies, one at a time, so that a GPU can say which suits each of Kiln's
//! products (`kiln bench matmul`).
//!
//! Burn 0.21 without its `autotune` feature runs cubek's `Strategy::Auto` for every product:
//! the simple cyclic tensor-core (`cmma`) kernel where it applies, else the unit kernel. With
//! `autotune` it times a set of candidates per shape at first use, which took the AD step's
//! first step past 75 s on an H100, so Kiln keeps it off. A rule by shape over a few strategies
//! needs to know which candidate wins where; [`candidates`] are autotune's own (the
//! matrix-vector, unit and tensor-core families, as burn-cubecl 0.21 lists them, less the TMA
//! ones, which need layouts Kiln's views do not give), and [`matmul_with`] launches one.

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{DType, Shape, TensorMetadata};
use burn_cubecl::element::BoolElement;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubek::matmul::components::tile::TileMatmulKind;
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
use cubek::matmul::launch::{Strategy, launch_ref};
use cubek::matmul::routines::BlueprintStrategy::Inferred;
use cubek::matmul::routines::TileSizeSelection;
use cubek::matmul::routines::double_buffering::DoubleBufferingArgs;
use cubek::matmul::routines::double_unit::DoubleUnitSelectionArgs;
use cubek::matmul::routines::ordered_double_buffering::OrderedSelectionArgs;
use cubek::matmul::routines::simple::SimpleArgs;
use cubek::matmul::routines::simple_unit::SimpleUnitSelectionArgs;
use cubek::std::InputBinding;

use super::layout;

/// One of cubek's matmul strategies, with the name cubek prints for it.
#[derive(Clone)]
pub struct Candidate {
    /// cubek's name of the strategy and its arguments (`matmul_simple_unit_max`, …).
    pub name: String,
    strategy: Strategy,
}

impl Candidate {
    fn new(strategy: Strategy) -> Self {
        Self {
            name: strategy.to_string(),
            strategy,
        }
    }

    /// What Burn runs without autotune: the yardstick of every other candidate.
    pub fn burn_default() -> Self {
        Self::new(Strategy::Auto)
    }
}

/// The candidates Burn's matmul autotune tries (burn-cubecl 0.21, `kernel/matmul/tune`),
/// without the TMA strategies, after [`Candidate::burn_default`].
pub fn candidates() -> Vec<Candidate> {
    let simple = |multi_rows, tile_matmul| {
        Inferred(SimpleArgs {
            multi_rows,
            tile_matmul,
        })
    };
    let double = |specialized, tile_matmul| {
        Inferred(DoubleBufferingArgs {
            specialized,
            tile_matmul,
        })
    };
    let ordered = |tile_matmul| {
        Inferred(OrderedSelectionArgs {
            partition_k: Some(2),
            row_count: Some(4),
            rows_per_plane: Some(2),
            tile_matmul,
        })
    };
    let (cmma, mma) = (TileMatmulKind::Cmma, TileMatmulKind::Mma);
    let mut strategies = vec![
        Strategy::Auto,
        Strategy::SimpleVecMat(Inferred(().into())),
        Strategy::DoubleVecMat(Inferred(().into())),
        Strategy::GemvPlaneParallel(Default::default()),
        Strategy::GemvUnitPerpendicular(Default::default()),
    ];
    for tile_size in [
        TileSizeSelection::MaxTileSize,
        TileSizeSelection::MinTileSize,
    ] {
        strategies.push(Strategy::SimpleUnit(Inferred(SimpleUnitSelectionArgs {
            tile_size,
        })));
        strategies.push(Strategy::DoubleUnit(Inferred(DoubleUnitSelectionArgs {
            tile_size,
        })));
    }
    for multi_rows in [false, true] {
        strategies.push(Strategy::SimpleCyclicCmma(simple(multi_rows, cmma)));
        strategies.push(Strategy::SimpleCyclicMma(simple(multi_rows, mma)));
    }
    strategies.push(Strategy::OrderedDoubleCmma(ordered(cmma)));
    strategies.push(Strategy::OrderedDoubleMma(ordered(mma)));
    for specialized in [false, true] {
        strategies.push(Strategy::DoubleCyclicCmma(double(specialized, cmma)));
        strategies.push(Strategy::DoubleCyclicMma(double(specialized, mma)));
    }
    strategies.push(Strategy::SpecializedCyclicCmma(Inferred(().into())));
    strategies.push(Strategy::SpecializedCyclicMma(Inferred(().into())));
    strategies.into_iter().map(Candidate::new).collect()
}

/// The backends whose matmul can run a chosen cubek strategy: Burn's plain CubeCL backends.
pub trait MatmulStrategies: Backend {
    /// `lhs·rhs` (`[m, k]·[k, n]`, either possibly a transposed view) by `candidate` into a new
    /// dense `[m, n]` tensor of `lhs`'s dtype, or cubek's reason why that strategy cannot run
    /// this shape, dtype or device.
    fn matmul_with(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        candidate: &Candidate,
    ) -> Result<FloatTensor<Self>, String>;
}

impl<R: CubeRuntime, F: FloatElement, I: IntElement, BT: BoolElement> MatmulStrategies
    for CubeBackend<R, F, I, BT>
{
    fn matmul_with(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        candidate: &Candidate,
    ) -> Result<FloatTensor<Self>, String> {
        matmul_with(lhs, rhs, candidate)
    }
}

fn matmul_with<R: CubeRuntime>(
    lhs: CubeTensor<R>,
    rhs: CubeTensor<R>,
    candidate: &Candidate,
) -> Result<CubeTensor<R>, String> {
    let [m, _] = lhs.shape().dims::<2>();
    let [_, n] = rhs.shape().dims::<2>();
    let dtype: DType = lhs.dtype;
    let out = layout::dense_output(&lhs, Shape::new([m, n]), dtype);
    let client = out.client.clone();
    let mut elems = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: dtype.into(),
        rhs: dtype.into(),
        out: dtype.into(),
    });
    launch_ref(
        &candidate.strategy,
        &client,
        InputBinding::new(lhs.binding(), dtype.into()),
        InputBinding::new(rhs.binding(), dtype.into()),
        out.clone().binding(),
        &mut elems,
    )
    .map_err(|e| format!("{e:?}"))?;
    Ok(out)
}
