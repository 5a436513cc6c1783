//! cubek's matmul strategies, one at a time: the tuner's candidates ([`super::tune`], a few
//! per product) and `kiln bench matmul`'s (all of them, to see which wins where on a GPU).
//!
//! Burn 0.21 without its `autotune` feature runs cubek's `Strategy::Auto` for every product:
//! the simple cyclic tensor-core (`cmma`) kernel where it applies, else the unit kernel. With
//! `autotune` it times a set of candidates per shape at first use, which took the AD step's
//! first step past 75 s on an H100, so Kiln keeps it off. [`candidates`] are autotune's own
//! (the matrix-vector, unit and tensor-core families, as burn-cubecl 0.21 lists them, less
//! the TMA ones, which need layouts Kiln's views do not give), and [`MatmulStrategies`]
//! launches one.

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

impl std::fmt::Debug for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
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

    /// Whether this is [`Candidate::burn_default`].
    pub fn is_burn_default(&self) -> bool {
        matches!(self.strategy, Strategy::Auto)
    }

    /// The matrix-vector kernel that splits each dot product over a plane.
    pub(crate) fn gemv_plane() -> Self {
        Self::new(Strategy::GemvPlaneParallel(Default::default()))
    }

    /// The matrix-vector kernel with one unit per output, reading across the reduction.
    pub(crate) fn gemv_unit() -> Self {
        Self::new(Strategy::GemvUnitPerpendicular(Default::default()))
    }

    /// The vector-matrix kernel (`[1, k]·[k, n]`), single or double buffered.
    pub(crate) fn vec_mat(double: bool) -> Self {
        Self::new(match double {
            false => Strategy::SimpleVecMat(Inferred(().into())),
            true => Strategy::DoubleVecMat(Inferred(().into())),
        })
    }

    /// The unit kernel (no tensor cores, a tile per unit), single or double buffered.
    pub(crate) fn unit(double: bool, tile_size: TileSizeSelection) -> Self {
        Self::new(match double {
            false => Strategy::SimpleUnit(Inferred(SimpleUnitSelectionArgs { tile_size })),
            true => Strategy::DoubleUnit(Inferred(DoubleUnitSelectionArgs { tile_size })),
        })
    }

    /// The single-buffered cyclic tensor-core kernel.
    pub(crate) fn simple_cyclic(multi_rows: bool, tile_matmul: TileMatmulKind) -> Self {
        let args = Inferred(SimpleArgs {
            multi_rows,
            tile_matmul,
        });
        Self::new(match tile_matmul {
            TileMatmulKind::Mma => Strategy::SimpleCyclicMma(args),
            _ => Strategy::SimpleCyclicCmma(args),
        })
    }

    /// The double-buffered cyclic tensor-core kernel.
    pub(crate) fn double_cyclic(specialized: bool, tile_matmul: TileMatmulKind) -> Self {
        let args = Inferred(DoubleBufferingArgs {
            specialized,
            tile_matmul,
        });
        Self::new(match tile_matmul {
            TileMatmulKind::Mma => Strategy::DoubleCyclicMma(args),
            _ => Strategy::DoubleCyclicCmma(args),
        })
    }

    /// The ordered double-buffered tensor-core kernel, with autotune's arguments.
    pub(crate) fn ordered_double(tile_matmul: TileMatmulKind) -> Self {
        let args = Inferred(OrderedSelectionArgs {
            partition_k: Some(2),
            row_count: Some(4),
            rows_per_plane: Some(2),
            tile_matmul,
        });
        Self::new(match tile_matmul {
            TileMatmulKind::Mma => Strategy::OrderedDoubleMma(args),
            _ => Strategy::OrderedDoubleCmma(args),
        })
    }
}

/// The candidates Burn's matmul autotune tries (burn-cubecl 0.21, `kernel/matmul/tune`),
/// without the TMA strategies, after [`Candidate::burn_default`].
pub fn candidates() -> Vec<Candidate> {
    let (cmma, mma) = (TileMatmulKind::Cmma, TileMatmulKind::Mma);
    let mut all = vec![
        Candidate::burn_default(),
        Candidate::vec_mat(false),
        Candidate::vec_mat(true),
        Candidate::gemv_plane(),
        Candidate::gemv_unit(),
    ];
    for tile_size in [
        TileSizeSelection::MaxTileSize,
        TileSizeSelection::MinTileSize,
    ] {
        all.push(Candidate::unit(false, tile_size));
        all.push(Candidate::unit(true, tile_size));
    }
    for multi_rows in [false, true] {
        all.push(Candidate::simple_cyclic(multi_rows, cmma));
        all.push(Candidate::simple_cyclic(multi_rows, mma));
    }
    all.push(Candidate::ordered_double(cmma));
    all.push(Candidate::ordered_double(mma));
    for specialized in [false, true] {
        all.push(Candidate::double_cyclic(specialized, cmma));
        all.push(Candidate::double_cyclic(specialized, mma));
    }
    all.push(Candidate::new(Strategy::SpecializedCyclicCmma(Inferred(
        ().into(),
    ))));
    all.push(Candidate::new(Strategy::SpecializedCyclicMma(Inferred(
        ().into(),
    ))));
    all
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
