//! `FusedAdamW` trains exactly like Burn's `AdamW` through Burn's own optimizer adaptor: on the
//! CPU (the reference step) and on wgpu (the kernel), three steps of a small MLP.

mod common;

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Module};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::activation::relu;
use burn::tensor::backend::AutodiffBackend;
use common::*;
use kiln_kernels::{FusedAdamWConfig, KernelBackend};

#[derive(Module, Debug)]
struct Mlp<B: burn::tensor::backend::Backend> {
    a: Linear<B>,
    b: Linear<B>,
}

fn model<B: burn::tensor::backend::Backend>(device: &B::Device) -> Mlp<B> {
    // Weights from fixed values so that both backends start from the same point.
    let load = |d_in: usize, d_out: usize, seed: u64| {
        let mut l = LinearConfig::new(d_in, d_out).init::<B>(device);
        l.weight = burn::module::Param::from_tensor(tensor(
            &values(d_in * d_out, 0.3, seed, false),
            [d_in, d_out],
            device,
        ));
        l.bias = Some(burn::module::Param::from_tensor(tensor(
            &values(d_out, 0.1, seed + 1, false),
            [d_out],
            device,
        )));
        l
    };
    Mlp {
        a: load(12, 9, 1),
        b: load(9, 3, 3),
    }
}

fn train<B: AutodiffBackend, O: Optimizer<Mlp<B>, B>>(
    mut optim: O,
    device: &B::Device,
) -> Vec<f32> {
    let mut m = model::<B>(device);
    for step in 0..3u64 {
        let x = tensor::<B, 2>(&values(5 * 12, 1.0, 10 + step, false), [5, 12], device);
        let loss = m.b.forward(relu(m.a.forward(x))).powi_scalar(2).mean();
        let grads = GradientsParams::from_grads(loss.backward(), &m);
        m = optim.step(1e-2, m, grads);
    }
    let m = m.valid();
    [m.a.weight.val(), m.b.weight.val()]
        .into_iter()
        .flat_map(to_vec)
        .chain(
            [m.a.bias.unwrap().val(), m.b.bias.unwrap().val()]
                .into_iter()
                .flat_map(to_vec),
        )
        .collect()
}

fn check<B: AutodiffBackend<InnerBackend: KernelBackend>>(device: &B::Device) {
    let burn = train::<B, _>(AdamWConfig::new().with_weight_decay(0.1).init(), device);
    let fused = train::<B, _>(
        FusedAdamWConfig::new().with_weight_decay(0.1).init(),
        device,
    );
    let start: Vec<f32> = {
        let m = model::<B>(device).valid();
        [m.a.weight.val(), m.b.weight.val()]
            .into_iter()
            .flat_map(to_vec)
            .collect()
    };
    assert_ne!(
        &burn[..start.len()],
        &start[..],
        "training moved the weights"
    );
    assert_close("fused vs burn adamw", &fused, &burn, 1e-5);
}

#[test]
fn fused_adamw_trains_like_burns_adamw_on_the_cpu() {
    check::<AdCpu>(&Default::default());
}

#[test]
fn fused_adamw_trains_like_burns_adamw_on_wgpu() {
    check::<Autodiff<Gpu32>>(&gpu());
    check::<Autodiff<Fused32>>(&gpu());
}

/// One training step of `m` with `optim`, on the `step`-th batch.
fn step<B: AutodiffBackend, O: Optimizer<Mlp<B>, B>>(
    m: Mlp<B>,
    optim: &mut O,
    step: u64,
    device: &B::Device,
) -> Mlp<B> {
    let x = tensor::<B, 2>(&values(5 * 12, 1.0, 10 + step, false), [5, 12], device);
    let loss = m.b.forward(relu(m.a.forward(x))).powi_scalar(2).mean();
    let grads = GradientsParams::from_grads(loss.backward(), &m);
    optim.step(1e-2, m, grads)
}

fn weights<B: AutodiffBackend>(m: Mlp<B>) -> Vec<f32> {
    let m = m.valid();
    [m.a.weight.val(), m.b.weight.val()]
        .into_iter()
        .flat_map(to_vec)
        .collect()
}

/// The fused AdamW's state is Burn's `AdamWState`: a checkpoint of Burn's AdamW, written and
/// read through a recorder, resumes with the fused one as Burn's own would continue.
#[test]
fn a_burn_adamw_checkpoint_resumes_with_the_fused_adamw() {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    type B = AdCpu;
    let device = Default::default();
    let mut burn = AdamWConfig::new().init::<B, Mlp<B>>();
    let mut m = model::<B>(&device);
    for s in 0..2 {
        m = step(m, &mut burn, s, &device);
    }
    let recorder = BinBytesRecorder::<FullPrecisionSettings>::default();
    let bytes = recorder.record(burn.to_record(), ()).unwrap();
    let mut resumed = FusedAdamWConfig::new()
        .init::<B, Mlp<B>>()
        .load_record(recorder.load(bytes, &device).unwrap());
    let mut fresh = FusedAdamWConfig::new().init::<B, Mlp<B>>();
    let expected = weights(step(m.clone(), &mut burn, 2, &device));
    let got = weights(step(m.clone(), &mut resumed, 2, &device));
    assert_close("resumed fused vs burn adamw", &got, &expected, 1e-5);
    // Without the moments the step is another one: the test sees whether they were loaded.
    let restarted = weights(step(m, &mut fresh, 2, &device));
    assert!(
        restarted
            .iter()
            .zip(&expected)
            .any(|(a, b)| (a - b).abs() > 1e-4),
        "a fresh optimizer's step equals the resumed one"
    );
}

/// More parameters than one launch binds on wgpu, of sizes that do not fill an aligned segment:
/// the step runs in chunks, and every parameter still matches Burn's AdamW.
#[derive(Module, Debug)]
struct Deep<B: burn::tensor::backend::Backend> {
    layers: Vec<Linear<B>>,
}

fn train_deep<B: AutodiffBackend, O: Optimizer<Deep<B>, B>>(
    mut optim: O,
    device: &B::Device,
) -> Vec<f32> {
    let widths = [7usize, 13, 5, 64, 3, 17, 9, 31, 2, 11, 6, 8, 4, 10, 3];
    let mut m = Deep {
        layers: widths
            .windows(2)
            .enumerate()
            .map(|(i, w)| {
                let mut l = LinearConfig::new(w[0], w[1]).init::<B>(device);
                l.weight = burn::module::Param::from_tensor(tensor(
                    &values(w[0] * w[1], 0.4, 50 + i as u64, false),
                    [w[0], w[1]],
                    device,
                ));
                l.bias = Some(burn::module::Param::from_tensor(tensor(
                    &values(w[1], 0.1, 70 + i as u64, false),
                    [w[1]],
                    device,
                )));
                l
            })
            .collect(),
    };
    for step in 0..3u64 {
        let mut x = tensor::<B, 2>(&values(4 * 7, 1.0, 90 + step, false), [4, 7], device);
        for layer in &m.layers {
            x = relu(layer.forward(x)) + 0.01;
        }
        let grads = GradientsParams::from_grads(x.powi_scalar(2).mean().backward(), &m);
        m = optim.step(1e-2, m, grads);
    }
    let m = m.valid();
    m.layers
        .into_iter()
        .flat_map(|l| [to_vec(l.weight.val()), to_vec(l.bias.unwrap().val())])
        .flatten()
        .collect()
}

fn check_deep<B: AutodiffBackend<InnerBackend: KernelBackend>>(device: &B::Device) {
    let burn = train_deep::<B, _>(AdamWConfig::new().with_weight_decay(0.1).init(), device);
    let fused = train_deep::<B, _>(
        FusedAdamWConfig::new().with_weight_decay(0.1).init(),
        device,
    );
    assert_close("28 parameters, fused vs burn adamw", &fused, &burn, 1e-5);
}

#[test]
fn fused_adamw_steps_many_parameters_like_burns_adamw() {
    check_deep::<AdCpu>(&Default::default());
    check_deep::<Autodiff<Gpu32>>(&gpu());
    check_deep::<Autodiff<Fused32>>(&gpu());
}
