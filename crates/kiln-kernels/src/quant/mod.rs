//! 4-bit block-quantised weights: the code books and host-side packing ([`format`]) and the
//! frozen on-device weight ([`QuantizedWeight`]) that the QLoRA matmul reads.

pub mod format;
mod split;
mod weight;

pub use format::{BLOCK, HostQuantized, QuantFormat, ScaleDtype};
pub use split::BlockSplitError;
pub use weight::{QuantizedPrimitive, QuantizedWeight};
