//! Tensors to host buffers and back for MPI: in their own dtype where MPI only moves bytes,
//! in f32 (or f64) where it must add them up.

use burn::tensor::{DType, TensorData};

use super::group::{Combine, ProcessGroup};
use super::runtime::Failure;

/// Combines `data` with the other processes' (the same shape and dtype everywhere).
pub(super) fn all_reduce(
    procs: &ProcessGroup,
    data: TensorData,
    combine: Combine,
    seq: u64,
) -> Result<TensorData, Failure> {
    match data.dtype {
        DType::F64 => procs.all_reduce::<f64>(data, combine, seq),
        DType::F32 => procs.all_reduce::<f32>(data, combine, seq),
        // MPI cannot add half-precision numbers: sum them in f32, which is also more exact.
        dtype => {
            let summed = procs.all_reduce::<f32>(data.convert::<f32>(), combine, seq)?;
            Ok(summed.convert_dtype(dtype))
        }
    }
}

/// Combines `data` with the other processes' onto the process `root` alone (`None` elsewhere).
pub(super) fn reduce(
    procs: &ProcessGroup,
    data: TensorData,
    combine: Combine,
    root: usize,
    seq: u64,
) -> Result<Option<TensorData>, Failure> {
    match data.dtype {
        DType::F64 => procs.reduce::<f64>(data, combine, root, seq),
        DType::F32 => procs.reduce::<f32>(data, combine, root, seq),
        // Summed in f32, as the all-reduce does.
        dtype => {
            let summed = procs.reduce::<f32>(data.convert::<f32>(), combine, root, seq)?;
            Ok(summed.map(|s| s.convert_dtype(dtype)))
        }
    }
}

/// The root process's `data` on every process, byte for byte.
pub(super) fn broadcast(
    procs: &ProcessGroup,
    data: TensorData,
    root: usize,
    seq: u64,
) -> Result<TensorData, Failure> {
    let (shape, dtype) = (data.shape.clone(), data.dtype);
    let bytes = procs.broadcast(data.into_bytes().to_vec(), root, seq)?;
    Ok(TensorData::from_bytes_vec(bytes, shape, dtype))
}

/// Every process's `data` (`[n]` everywhere), concatenated in process order.
pub(super) fn all_gather(
    procs: &ProcessGroup,
    data: TensorData,
    seq: u64,
) -> Result<TensorData, Failure> {
    let (n, dtype) = (data.num_elements(), data.dtype);
    let bytes = procs.all_gather(data.into_bytes().to_vec(), seq)?;
    Ok(TensorData::from_bytes_vec(
        bytes,
        [n * procs.processes.len()],
        dtype,
    ))
}

/// The dtypes a message can carry, by code (its first byte).
const DTYPES: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// A point-to-point message: the values' bytes, then the dtype's code (last, so that taking
/// it off copies nothing).
pub(super) fn to_message(data: TensorData) -> Vec<u8> {
    let code = DTYPES
        .iter()
        .position(|d| *d == data.dtype)
        .unwrap_or_else(|| panic!("collectives carry float tensors, not {:?}", data.dtype));
    let mut message = Vec::with_capacity(1 + data.bytes.len());
    message.extend_from_slice(data.as_bytes());
    message.push(code as u8);
    message
}

/// The tensor data of a message from [`to_message`].
pub(super) fn from_message(mut message: Vec<u8>) -> TensorData {
    let dtype = DTYPES[message.pop().expect("a message ends with its dtype") as usize];
    let n = message.len() / dtype.size();
    TensorData::from_bytes_vec(message, [n], dtype)
}
