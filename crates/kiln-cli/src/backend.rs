//! The backends `kiln` can train on, and the devices of each.

use std::fmt;

/// A Burn backend selectable on the command line.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Burn's Flex CPU backend (the fastest CPU backend; ranks share the one CPU device).
    #[default]
    Flex,
    /// Burn's NdArray CPU backend.
    Ndarray,
    /// wgpu (Vulkan / Metal / DX12); needs the `wgpu` feature.
    Wgpu,
    /// CUDA, one rank per GPU; needs the `cuda` feature.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Flex => "flex",
            BackendKind::Ndarray => "ndarray",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        })
    }
}
