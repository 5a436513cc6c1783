//! Kiln's kernels as a Burn backend extension: the QLoRA matmul over 4-bit (NF4 / int4)
//! block-quantised weights and fused RMSNorm, LayerNorm, causal attention, SwiGLU, ReLU,
//! softmax cross-entropy, AdamW and a global squared norm with a non-finite check.
//!
//! [`KernelBackend`] is implemented five ways (the book's kernels page explains why):
//! - for Burn's CubeCL backends (`CubeBackend<R, ..>`: wgpu, CUDA) by the kernels in [`cube`],
//!   written once in CubeCL, with a path that uses no plane (warp) operations;
//! - for Burn's fusion backend (`Fusion<B>`) by queueing the inner backend's kernels as custom
//!   operations of the fusion stream ([`fusion`]);
//! - for Flex by vectorised CPU kernels for LayerNorm, causal attention and cross-entropy
//!   (the private `cpu` module), and the reference for the rest;
//! - for `Autodiff<B>` with a backward for every differentiable op ([`autodiff`]);
//! - for every other backend (NdArray, …) by the plain-Burn [`reference`], which is also
//!   what the kernel tests compare against.
//!
//! Models call the `Tensor` functions in [`ops`] and run on any of them.

mod adamw_step;
pub mod autodiff;
pub mod backend;
pub mod backends;
mod cpu;
pub mod cube;
mod epilogue;
pub mod flat;
pub mod fusion;
pub mod ops;
pub mod optim;
pub mod product;
pub mod quant;
pub mod reference;
pub mod split_k;

pub use adamw_step::AdamWStep;
pub use backend::KernelBackend;
pub use epilogue::Epilogue;
pub use flat::FlatLayout;
pub use optim::{AdamWRule, FusedAdamW, FusedAdamWConfig, FusedAdamWRecord, LowCopies};
pub use product::{Product, Transpose};
pub use quant::{QuantFormat, QuantizedWeight, ScaleDtype};
