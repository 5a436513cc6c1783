//! How an activation crosses a stage boundary: a header with its shape, then its values, flat,
//! over the pipeline group's send and receive.

use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use super::Activation;
use crate::collective::{Collective, CollectiveError};

/// Sends `y` to stage `to` of `pp`: its shape, then its values.
pub(crate) fn send_activation<B: AutodiffBackend, A: Activation<B>>(
    pp: &mut dyn Collective<B::InnerBackend>,
    y: &A,
    to: usize,
) -> Result<(), CollectiveError> {
    let dims: Vec<f32> = y.dims().iter().map(|&d| d as f32).collect();
    let flat = y.to_flat();
    let header = Tensor::<B::InnerBackend, 1>::from_floats(dims.as_slice(), &flat.device());
    pp.send(header, to)?;
    pp.send(flat, to)
}

/// The next activation stage `from` of `pp` sent: its values, flat, and its shape.
pub(crate) fn recv_activation<B: AutodiffBackend, A: Activation<B>>(
    pp: &mut dyn Collective<B::InnerBackend>,
    from: usize,
    device: &B::Device,
) -> Result<(Tensor<B::InnerBackend, 1>, Vec<usize>), CollectiveError> {
    let header = pp.recv(from, A::RANK, device)?;
    let dims: Vec<usize> = header
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .expect("f32 header")
        .into_iter()
        .map(|d| d as usize)
        .collect();
    let flat = pp.recv(from, dims.iter().product(), device)?;
    Ok((flat, dims))
}
