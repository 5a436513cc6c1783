//! Every kernel written once more in plain Burn tensor ops: the implementation the backend
//! extension uses on backends without kernels (NdArray, Flex, …) and the ground truth the
//! kernel tests compare against. Clarity over speed: these may materialise what the kernels
//! avoid (the dequantised weight, the probabilities).

pub mod adamw;
pub mod attention;
pub mod cast;
pub mod cross_entropy;
pub mod grad_norm;
pub mod layer_norm;
pub mod linear;
pub mod qlora;
pub mod relu;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;
