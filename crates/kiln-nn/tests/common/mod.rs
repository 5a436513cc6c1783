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

/// `model` with every adapter's `A` drawn from a generator of its own, seeded with `seed`
/// (uniform in ±1/√in, as PEFT's Kaiming init bounds it), its `B` untouched. Burn's own
/// generator is shared by every test of a binary, and loading a model draws from it too, so
/// tests that compare runs fix the adapters this way.
pub fn fixed_adapters<K: kiln_nn::tensor_parallel::ShardedBackend>(
    mut model: kiln_nn::llm::CausalLm<K>,
    seed: u64,
) -> kiln_nn::llm::CausalLm<K> {
    use burn::module::Param;
    use burn::tensor::{Tensor, TensorData};
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (_, _, proj) in model.projections_mut() {
        let Some(adapter) = proj.lora.as_mut() else {
            continue;
        };
        let [d_in, r] = adapter.a.dims();
        let bound = 1.0 / (d_in as f32).sqrt();
        let values: Vec<f32> = (0..d_in * r)
            .map(|_| rng.random_range(-bound..bound))
            .collect();
        let device = adapter.a.device();
        let a = Tensor::<K, 2>::from_data(TensorData::new(values, [d_in, r]), &device);
        adapter.a = Param::initialized(adapter.a.id, a.require_grad());
    }
    model
}
