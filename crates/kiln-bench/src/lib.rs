//! Kiln's benchmark harness, shared by the `kiln bench` commands.
//!
//! - [`ad_step`]: the Algorithm Distillation training step the benchmarks time and count.
//! - [`kernels`]: every CubeCL kernel next to the Burn composite it replaces, with achieved
//!   bandwidth and throughput (`kiln bench kernels`).
//! - [`strategies`]: a matrix of strategy × world size × model, each scenario repeated after a
//!   warm-up in rotating order, reported as JSON, a Markdown table and an SVG chart, and
//!   compared against an earlier run (`kiln bench strategies`).
//! - [`llm`]: a random LLaMA-family checkpoint of a chosen size, its host memory when loaded
//!   in f32 and in 4 bits, and LoRA / QLoRA fine-tuning throughput through strategies
//!   (`kiln bench llm`).
//! - [`llm_step`]: the users' LoRA / QLoRA fine-tuning step, its launches per decoder layer.
//! - [`memory`]: the process's peak host memory.
//! - [`launches`]: kernel launches and host synchronisations, counted on any CubeCL runtime
//!   (the AD step benchmark reports them per step).
//!
//! Both measure side by side in one run: on a shared machine, only ratios taken in the same
//! run mean much, and the median of rotated repeats is the figure to read.

pub mod ad_step;
pub mod kernels;
pub mod launches;
pub mod llm;
pub mod llm_step;
pub mod matmul;
pub mod memory;
pub mod plan;
pub mod stats;
pub mod strategies;
