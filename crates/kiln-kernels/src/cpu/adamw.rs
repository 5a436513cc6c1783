//! AdamW over every parameter in one pass per element: the moments and the parameter read
//! once and written once. The reference composes about fourteen Burn ops per parameter, each a
//! full pass with its own temporary (a LoRA model's hundreds of small adapters make that the
//! step's largest cost outside the products after attention).
//!
//! Each element takes the reference's operations in the reference's order, without fused
//! multiply-adds, so the result is the same to the bit (the unit test holds it to that).

use std::mem::MaybeUninit;

use rayon::prelude::*;

use super::TASK_ELEMENTS;
use super::simd::{Kernel, vectorized};
use crate::{AdamWStep, FlatLayout};

/// `(params, m, v)` after one step, flat in `layout` (padding zero), from every parameter's
/// values and gradient (the gradients multiplied by `grad_scale` first) and the flat moments
/// `m`, `v`.
pub(crate) fn step_many(
    params: &[&[f32]],
    grads: &[&[f32]],
    m: &[f32],
    v: &[f32],
    layout: &FlatLayout,
    h: &AdamWStep,
    grad_scale: f32,
) -> [Vec<f32>; 3] {
    let lens = layout.lens();
    assert!(
        params.len() == lens.len()
            && grads.len() == lens.len()
            && params
                .iter()
                .chain(grads)
                .zip(lens.iter().chain(lens))
                .all(|(x, &n)| x.len() == n),
        "{} parameters and {} gradients for a layout of {} segments",
        params.len(),
        grads.len(),
        lens.len()
    );
    let total = layout.total();
    let c = Constants::of(h, grad_scale);
    let mut outs: [Vec<f32>; 3] = std::array::from_fn(|_| Vec::with_capacity(total));
    let [p_out, m_out, v_out] = outs
        .each_mut()
        .map(|o| segments(&mut o.spare_capacity_mut()[..total], layout));
    // One task list over every segment's chunks.
    let mut tasks = Vec::new();
    let outs_by_segment = p_out.into_iter().zip(m_out).zip(v_out);
    for (i, ((p_out, m_out), v_out)) in outs_by_segment.enumerate() {
        let range = layout.segment(i);
        let (m, v) = (&m[range.clone()], &v[range]);
        let outs = p_out
            .chunks_mut(TASK_ELEMENTS)
            .zip(m_out.chunks_mut(TASK_ELEMENTS))
            .zip(v_out.chunks_mut(TASK_ELEMENTS));
        let ins = params[i]
            .chunks(TASK_ELEMENTS)
            .zip(grads[i].chunks(TASK_ELEMENTS))
            .zip(m.chunks(TASK_ELEMENTS).zip(v.chunks(TASK_ELEMENTS)));
        for (((p_out, m_out), v_out), ((param, grad), (m, v))) in outs.zip(ins) {
            tasks.push(Elements {
                param,
                grad,
                m,
                v,
                p_out,
                m_out,
                v_out,
                c,
            });
        }
    }
    tasks.into_par_iter().for_each(vectorized);
    // SAFETY: every element of the three buffers lies in a segment, whose tasks wrote it in
    // full (its parameter, gradient and moments have the segment's length, asserted above),
    // or in padding, written zero by `segments`.
    for out in &mut outs {
        unsafe { out.set_len(total) };
    }
    outs
}

/// The segments of `layout` in `out`, in order, the padding after each written zero.
fn segments<'a>(
    mut out: &'a mut [MaybeUninit<f32>],
    layout: &FlatLayout,
) -> Vec<&'a mut [MaybeUninit<f32>]> {
    let mut parts = Vec::with_capacity(layout.lens().len());
    for (i, &len) in layout.lens().iter().enumerate() {
        let (segment, rest) = out.split_at_mut(len);
        let (padding, rest) = rest.split_at_mut(layout.padding(i));
        padding.fill(MaybeUninit::new(0.0));
        parts.push(segment);
        out = rest;
    }
    parts
}

/// The step's scalars, each computed as the reference computes it (in f32).
#[derive(Clone, Copy)]
struct Constants {
    grad_scale: Option<f32>,
    beta_1: f32,
    one_minus_beta_1: f32,
    beta_2: f32,
    one_minus_beta_2: f32,
    bias_correction_1: f32,
    bias_correction_2: f32,
    epsilon: f32,
    decay: f32,
    lr: f32,
}

impl Constants {
    fn of(h: &AdamWStep, grad_scale: f32) -> Self {
        Self {
            grad_scale: (grad_scale != 1.0).then_some(grad_scale),
            beta_1: h.beta_1,
            one_minus_beta_1: 1.0 - h.beta_1,
            beta_2: h.beta_2,
            one_minus_beta_2: 1.0 - h.beta_2,
            bias_correction_1: h.bias_correction_1(),
            bias_correction_2: h.bias_correction_2(),
            epsilon: h.epsilon,
            decay: 1.0 - h.lr * h.weight_decay,
            lr: h.lr,
        }
    }
}

struct Elements<'a> {
    param: &'a [f32],
    grad: &'a [f32],
    m: &'a [f32],
    v: &'a [f32],
    p_out: &'a mut [MaybeUninit<f32>],
    m_out: &'a mut [MaybeUninit<f32>],
    v_out: &'a mut [MaybeUninit<f32>],
    c: Constants,
}

impl Kernel for Elements<'_> {
    type Output = ();

    #[inline(always)]
    fn run(self) {
        let c = self.c;
        let outs = self
            .p_out
            .iter_mut()
            .zip(self.m_out.iter_mut())
            .zip(self.v_out.iter_mut());
        let ins = self
            .param
            .iter()
            .zip(self.grad)
            .zip(self.m.iter().zip(self.v));
        for (((p_out, m_out), v_out), ((&p, &g), (&m, &v))) in outs.zip(ins) {
            let g = c.grad_scale.map_or(g, |s| g * s);
            let m = m * c.beta_1 + g * c.one_minus_beta_1;
            let v = v * c.beta_2 + (g * g) * c.one_minus_beta_2;
            let update = (m * c.bias_correction_1) / ((v * c.bias_correction_2).sqrt() + c.epsilon);
            p_out.write(p * c.decay - update * c.lr);
            m_out.write(m);
            v_out.write(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::tensor::{Tensor, TensorData};

    use super::*;
    use crate::reference;

    /// The kernel against the reference's composition of Burn ops, bit for bit, over
    /// segments that leave padding, span several tasks and include an empty one, with and
    /// without a gradient scale.
    #[test]
    fn equals_the_reference_bit_for_bit() {
        let lens = vec![5, 0, TASK_ELEMENTS + 37, 64];
        let layout = FlatLayout::new(lens.clone(), 16);
        let wave = |n: usize, phase: f32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as f32) * 0.37 + phase).sin() * (1.0 + i as f32 * 1e-3))
                .collect()
        };
        let params: Vec<Vec<f32>> = lens.iter().map(|&n| wave(n, 0.1)).collect();
        let grads: Vec<Vec<f32>> = lens.iter().map(|&n| wave(n, 1.7)).collect();
        let mut m = wave(layout.total(), 2.3);
        let mut v: Vec<f32> = wave(layout.total(), 0.9).iter().map(|x| x * x).collect();
        for i in 0..lens.len() {
            let end = layout.segment(i).end;
            let pad = end..end + layout.padding(i);
            m[pad.clone()].fill(0.0);
            v[pad].fill(0.0);
        }
        let h = AdamWStep {
            lr: 3e-3,
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.01,
            time: 3,
        };
        for grad_scale in [1.0, 0.25] {
            let (ps, gs): (Vec<&[f32]>, Vec<&[f32]>) = params
                .iter()
                .zip(&grads)
                .map(|(p, g)| (p.as_slice(), g.as_slice()))
                .unzip();
            let ours = step_many(&ps, &gs, &m, &v, &layout, &h, grad_scale);
            let device = Default::default();
            let flat = |x: &[f32]| Tensor::<Flex, 1>::from_data(TensorData::from(x), &device);
            let (p, mm, vv) = reference::adamw::step_many::<Flex>(
                params.iter().map(|x| flat(x)).collect(),
                grads.iter().map(|x| flat(x)).collect(),
                flat(&m),
                flat(&v),
                &layout,
                &h,
                grad_scale,
            );
            for (name, ours, theirs) in [
                ("param", &ours[0], p),
                ("m", &ours[1], mm),
                ("v", &ours[2], vv),
            ] {
                let theirs = theirs.into_data().to_vec::<f32>().unwrap();
                let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(ours), bits(&theirs), "{name}, grad scale {grad_scale}");
            }
        }
    }
}
