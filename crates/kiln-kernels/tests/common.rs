//! Shared helpers of the kernel tests: seeded data, backends, and the closeness check.
#![allow(dead_code, unused_imports)]

use burn::backend::{Autodiff, Flex};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData, f16};
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The kernels on the runtime under test, f32 and f16: wgpu by default (Mesa's lavapipe on a
/// machine without a GPU), CUDA with `--features cuda`. See `crates/kiln-kernels/GPU.md`.
/// `Gpu32` and `Gpu16` are the plain CubeCL backends (what `burn::backend::Wgpu` and `Cuda`
/// are in Kiln's build), `Fused32` and `Fused16` the same under Burn's fusion, where the kernels
/// run as custom operations of the stream.
#[cfg(not(feature = "cuda"))]
mod runtime {
    use burn::backend::wgpu::{CubeBackend, WgpuDevice, WgpuRuntime};
    use burn::tensor::f16;

    pub type Gpu32 = CubeBackend<WgpuRuntime, f32, i32, u32>;
    pub type Gpu16 = CubeBackend<WgpuRuntime, f16, i32, u32>;
    pub type Fused32 = burn_fusion::Fusion<Gpu32>;
    pub type Fused16 = burn_fusion::Fusion<Gpu16>;
    pub type GpuDevice = WgpuDevice;

    /// Burn's own f32 matmul is exact f32 here (lavapipe has no TF32), so results that pass
    /// through it (the QLoRA adapter's gradients) keep the kernels' own tolerance.
    pub const MATMUL_F32_TOL: f32 = 0.0;

    pub fn gpu() -> WgpuDevice {
        // Vulkan loaders warn without a runtime dir.
        if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
            // SAFETY: tests set it before any thread reads the environment.
            unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
        }
        WgpuDevice::Cpu
    }
}

#[cfg(feature = "cuda")]
mod runtime {
    use burn::backend::cuda::CudaDevice;
    use burn::tensor::f16;

    use burn_cubecl::CubeBackend;
    use burn_cubecl::cubecl::cuda::CudaRuntime;

    pub type Gpu32 = CubeBackend<CudaRuntime, f32, i32, u8>;
    pub type Gpu16 = CubeBackend<CudaRuntime, f16, i32, u8>;
    pub type Fused32 = burn_fusion::Fusion<Gpu32>;
    pub type Fused16 = burn_fusion::Fusion<Gpu16>;
    pub type GpuDevice = CudaDevice;

    /// Burn's f32 matmul on CUDA stages its inputs in TF32 on tensor cores (cubek-matmul's
    /// `adjust_dtypes`): 10 mantissa bits, so each product is off by up to 2⁻¹⁰ ≈ 1e-3 of its
    /// size. Results that pass through it (the adapter's terms of the QLoRA gradients) get
    /// this budget; the kernels' own outputs keep theirs.
    pub const MATMUL_F32_TOL: f32 = 2e-3;

    pub fn gpu() -> CudaDevice {
        CudaDevice::default()
    }
}

pub use runtime::*;

/// The reference, on the CPU.
pub type Cpu = Flex;
pub type AdCpu = Autodiff<Flex>;

/// Values uniform in `[-scale, scale]`, rounded to f16 when `half` so that the f16 kernel and
/// the f32 reference see the same inputs.
pub fn values(len: usize, scale: f32, seed: u64, half: bool) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len)
        .map(|_| {
            let v = (rng.random::<f32>() * 2.0 - 1.0) * scale;
            if half { f16::from_f32(v).to_f32() } else { v }
        })
        .collect()
}

/// A tensor in the backend's own float type. The dtype is explicit because Burn keeps the
/// default float type per device, and the f32 and f16 wgpu backends share `WgpuDevice::Cpu`:
/// whichever test reaches the device first would otherwise set it for all the others.
pub fn tensor<B: Backend, const D: usize>(
    values: &[f32],
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    let dtype = <B::FloatElem as burn::tensor::Element>::dtype();
    Tensor::from_data(TensorData::new(values.to_vec(), shape), (device, dtype))
}

pub fn to_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

/// `got` is within `tol · max|expected|` of `expected` everywhere: the error budget of a
/// result whose every element is a sum of comparable terms is relative to the result's scale,
/// not to each element (an element that cancels to ~0 keeps the absolute error of its terms).
pub fn assert_close(what: &str, got: &[f32], expected: &[f32], tol: f32) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    let scale = expected
        .iter()
        .fold(0.0f32, |m, v| m.max(v.abs()))
        .max(1e-6);
    let (mut worst, mut at) = (0.0f32, 0);
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        let d = (g - e).abs();
        assert!(g.is_finite(), "{what}[{i}] = {g}, expected {e}");
        if d > worst {
            worst = d;
            at = i;
        }
    }
    assert!(
        worst <= tol * scale,
        "{what}: max |diff| {worst} at {at} ({} vs {}) exceeds {tol} × {scale}",
        got[at],
        expected[at]
    );
}
