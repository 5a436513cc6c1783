//! Kiln's CubeCL kernels, exposed as a Burn backend extension with reference implementations
//! for every other backend: the QLoRA (4-bit NF4 / int4) matmul and fused ops (RMSNorm, SwiGLU,
//! softmax cross-entropy, AdamW, global squared norm). Empty until that work lands (DESIGN §4).
