//! LoRA and QLoRA layers: a fresh adapter changes nothing, merging changes nothing, the base
//! never trains, adapters save and load alone, and the 4-bit base fits in 0.57 bytes per
//! parameter. On Flex, whose kernels are the plain-Burn reference.

use burn::backend::{Autodiff, Flex};
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use kiln_kernels::ScaleDtype;
use kiln_nn::lora::{LoraBlockConfig, LoraConfig, LoraKind, LoraLinear, QLoraLinear, QuantConfig};

type B = Autodiff<Flex>;

fn linear(d_in: usize, d_out: usize, bias: bool) -> Linear<B> {
    let device = Default::default();
    B::seed(&device, 5);
    LinearConfig::new(d_in, d_out)
        .with_bias(bias)
        .init::<B>(&device)
        .fork(&device)
}

fn input(rows: usize, d: usize) -> Tensor<B, 3> {
    Tensor::random(
        [2, rows, d],
        Distribution::Normal(0.0, 1.0),
        &Default::default(),
    )
}

fn max_diff<const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> f32 {
    (a - b).abs().max().into_scalar()
}

/// Gives the adapter a non-zero `B`, as training would.
fn train_adapter_b(b: Param<Tensor<B, 2>>) -> Param<Tensor<B, 2>> {
    Param::from_tensor(b.val().random_like(Distribution::Normal(0.0, 0.1)))
}

#[test]
fn lora_starts_as_the_base_and_merging_keeps_the_output() {
    let base = linear(24, 10, true);
    let x = input(3, 24);
    let mut layer = LoraLinear::from_linear(
        base.clone(),
        &LoraConfig::new().with_rank(4).with_alpha(8.0),
    );
    assert_eq!(
        max_diff(layer.forward(x.clone()), base.forward(x.clone())),
        0.0
    );

    layer.adapter.b = train_adapter_b(layer.adapter.b);
    let unmerged = layer.forward(x.clone());
    assert!(
        max_diff(unmerged.clone(), base.forward(x.clone())) > 1e-3,
        "the adapter must matter"
    );
    let merged = layer.merge();
    assert!(merged.is_merged());
    assert!(max_diff(merged.forward(x.clone()), unmerged.clone()) < 1e-5);
    let back = merged.unmerge();
    assert!(max_diff(back.base.weight.val(), base.weight.val()) < 1e-6);
    assert!(max_diff(back.forward(x), unmerged) < 1e-5);
}

#[test]
fn only_the_adapter_gets_gradients() {
    let mut layer = LoraLinear::from_linear(linear(8, 6, true), &LoraConfig::new().with_rank(2));
    layer.adapter.b = train_adapter_b(layer.adapter.b);
    let grads = layer.forward(input(3, 8)).sum().backward();
    assert!(layer.base.weight.grad(&grads).is_none());
    assert!(layer.base.bias.as_ref().unwrap().grad(&grads).is_none());
    assert!(layer.adapter.a.grad(&grads).is_some());
    assert!(layer.adapter.b.grad(&grads).is_some());

    let mut q = QLoraLinear::from_linear(
        linear(64, 6, true),
        &LoraConfig::new().with_rank(2),
        &QuantConfig::new(),
    );
    q.adapter.b = train_adapter_b(q.adapter.b);
    let grads = q.forward(input(3, 64)).sum().backward();
    assert!(q.base.scales.grad(&grads).is_none());
    assert!(q.bias.as_ref().unwrap().grad(&grads).is_none());
    assert!(q.adapter.a.grad(&grads).is_some() && q.adapter.b.grad(&grads).is_some());
}

#[test]
fn qlora_stores_its_base_in_at_most_0_57_bytes_per_parameter() {
    for (scales, bytes) in [(ScaleDtype::F32, 0.5625), (ScaleDtype::F16, 0.53125)] {
        let q = QLoraLinear::from_linear(
            linear(256, 48, false),
            &LoraConfig::new(),
            &QuantConfig::new().with_scales(scales),
        );
        let per_param = q.base.storage_bytes() as f64 / (256.0 * 48.0);
        assert!(per_param <= 0.57);
        assert_eq!(per_param, bytes, "{scales:?}");
    }
}

#[test]
fn qlora_merge_gives_a_dense_linear_with_the_same_output_and_unmerge_restores_the_codes() {
    let lora = LoraConfig::new().with_rank(3);
    let quant = QuantConfig::new();
    let mut q = QLoraLinear::from_linear(linear(130, 20, true), &lora, &quant);
    q.adapter.b = train_adapter_b(q.adapter.b);
    let x = input(5, 130);
    let merged = q.merge();
    assert!(max_diff(merged.forward(x.clone()), q.forward(x.clone())) < 1e-5);

    let back = QLoraLinear::unmerge(merged, q.adapter.clone(), &lora, &quant);
    let (before, after) = (q.base.to_host(), back.base.to_host());
    assert_eq!(before.packed, after.packed, "the codes come back exactly");
    for (s0, s1) in before.scales.iter().zip(&after.scales) {
        assert!((s0 - s1).abs() <= 1e-6 * s0.abs(), "{s0} vs {s1}");
    }
    assert!(max_diff(back.forward(x.clone()), q.forward(x)) < 1e-5);
}

#[test]
fn adapters_save_and_load_alone() {
    let dir = std::env::temp_dir().join(format!("kiln-lora-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let device = Default::default();
    let config = LoraBlockConfig::new(
        16,
        2,
        24,
        LoraConfig::new().with_rank(2),
        LoraKind::QLora(QuantConfig::new()),
    );
    let mut trained = config.init::<B>(&device);
    let adapters = trained.adapters();
    let adapters = kiln_nn::lora::LoraBlockAdapters {
        adapters: adapters
            .adapters
            .into_iter()
            .map(|mut a| {
                a.b = train_adapter_b(a.b);
                a
            })
            .collect(),
    };
    trained = trained.with_adapters(adapters);
    let path = dir.join("block-adapters");
    trained.save_adapters(&path).unwrap();
    let file = std::fs::metadata(path.with_extension("mpk")).unwrap().len();
    // Seven rank-2 adapters of width ≤ 24: a few KB, nothing of the base.
    assert!(file < 8 * 1024, "{file} bytes");

    // A block with the same base but fresh adapters gets the trained behaviour back.
    let x = input(4, 16);
    let fresh = trained
        .clone()
        .with_adapters(config.init::<B>(&device).adapters());
    assert!(max_diff(fresh.forward(x.clone()), trained.forward(x.clone())) > 1e-4);
    let loaded = fresh.load_adapters(&path, &device).unwrap();
    assert_eq!(max_diff(loaded.forward(x.clone()), trained.forward(x)), 0.0);

    // Adapters of another shape are refused with a message naming both.
    let other = LoraBlockConfig::new(16, 2, 24, LoraConfig::new().with_rank(3), LoraKind::Lora)
        .init::<B>(&device);
    let err = other.load_adapters(&path, &device).unwrap_err().to_string();
    assert!(err.contains("shapes"), "{err}");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn dropout_applies_to_the_adapter_input_only_and_only_in_training() {
    use burn::module::AutodiffModule;
    let base = linear(16, 8, true);
    let x = input(4, 16);
    {
        let config = LoraConfig::new().with_rank(4).with_dropout(0.5);
        let mut layer = LoraLinear::from_linear(base.clone(), &config);
        layer.adapter.b = train_adapter_b(layer.adapter.b);
        let plain = layer.clone();
        // Training: two passes draw two masks, so the outputs differ…
        let (a, b) = (layer.forward(x.clone()), layer.forward(x.clone()));
        assert!(max_diff(a.clone(), b) > 1e-4);
        // …but only through the adapter: with B = 0 the masks change nothing.
        let mut zero = layer.clone();
        zero.adapter.b = Param::from_tensor(zero.adapter.b.val().zeros_like());
        assert_eq!(
            max_diff(zero.forward(x.clone()), base.forward(x.clone())),
            0.0
        );
        // Inference (the inner backend) keeps every input: it equals the layer without dropout.
        let mut no_dropout =
            LoraLinear::from_linear(base.clone(), &config.clone().with_dropout(0.0));
        no_dropout.adapter = plain.adapter.clone();
        let xv = x.clone().inner();
        assert_eq!(
            max_diff_inner(
                plain.valid().forward(xv.clone()),
                no_dropout.valid().forward(xv)
            ),
            0.0
        );
    }
}

fn max_diff_inner<const D: usize>(a: Tensor<Flex, D>, b: Tensor<Flex, D>) -> f32 {
    (a - b).abs().max().into_scalar()
}
