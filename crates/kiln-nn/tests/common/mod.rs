//! What the tests of pretrained models share: the fixtures of `.ci/llm-fixtures` and their
//! reference tensors.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A path inside tests/fixtures/llm.
pub fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llm")
        .join(path)
}

/// The reference tensors of a fixture: tokens `[2, 12]`, and the named f32 tensor.
pub fn expected(model: &str, name: &str) -> (Vec<i64>, Vec<f32>, Vec<usize>) {
    let bytes = std::fs::read(fixture(model).join("expected.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tokens = file.tensor("tokens").unwrap();
    let tokens = tokens
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let values = file.tensor(name).unwrap();
    let shape = values.shape().to_vec();
    let values = values
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (tokens, values, shape)
}

/// The largest absolute difference of two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

