//! The GPU backends Kiln trains on: Burn's CubeCL runtimes under Burn's fusion, so that chains
//! of element-wise ops (residuals, casts, LoRA's scaling, RoPE's rotations) run as one kernel,
//! with Kiln's kernels queued between the fused blocks ([`crate::fusion`]).
//!
//! Kiln names them itself rather than turning on Burn's `fusion` feature, which would make
//! `burn::backend::Wgpu` and `Cuda` fused wherever they are named: the kernel tests and
//! benchmarks time and check each kernel on the plain backends (`CubeBackend`) as well as under
//! fusion, and need both.

/// wgpu under Burn's fusion (`Fusion<CubeBackend<WgpuRuntime, ..>>`), in f32.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn_fusion::Fusion<
    burn_cubecl::CubeBackend<burn_cubecl::cubecl::wgpu::WgpuRuntime, f32, i32, u32>,
>;

/// CUDA under Burn's fusion (`Fusion<CubeBackend<CudaRuntime, ..>>`), in f32.
#[cfg(feature = "cuda")]
pub type Cuda = burn_fusion::Fusion<
    burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>,
>;
