//! [`KernelBackend`] on Burn's fusion backend (`Fusion<B>`), which Burn's wgpu and CUDA
//! backends are: every Kiln kernel joins the fusion stream as a custom operation that runs the
//! inner backend's kernel ([`queue`]), between the fused blocks of Burn's own ops.
//!
//! A custom operation is never fused itself, so it ends the block before it. Each kernel here
//! replaces a chain of Burn ops that fusion would otherwise run as several kernels, reductions
//! among them (the book's kernels page has the launch counts).

mod queue;

use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};
use burn::tensor::{DType, Shape};
use burn_fusion::{Fusion, FusionBackend, get_client};

use self::queue::{Prim, queue, take};
use crate::backend::{KernelBackend, plain, transposed};
use crate::quant::QuantizedPrimitive;
use crate::{AdamWStep, Epilogue, FlatLayout, Product, Transpose};

/// The first `N` outputs of a queued kernel.
fn outputs<T, const N: usize>(outputs: Vec<T>) -> [T; N] {
    outputs
        .try_into()
        .unwrap_or_else(|_| unreachable!("a queued kernel returns the outputs it declared"))
}

/// Float outputs of the inner backend as a queued kernel returns them.
fn floats<B: FusionBackend, const N: usize>(tensors: [FloatTensor<B>; N]) -> Vec<Prim<B>> {
    tensors.into_iter().map(Prim::Float).collect()
}

/// `shape` with its last dimension dropped: a per-row statistic of a `[rows, d]` input.
fn rows_of(shape: &Shape) -> Shape {
    Shape::new([shape[0]])
}

/// `shape`'s last dimension alone: a per-column result of a `[rows, d]` input.
fn cols_of(shape: &Shape) -> Shape {
    Shape::new([shape[shape.num_dims() - 1]])
}

/// The inner backend's `kernel` of one float tensor, giving one float tensor of `shape` in the
/// input's dtype, queued as the custom op `name`.
fn one_float<B: FusionBackend>(
    name: &'static str,
    x: FloatTensor<Fusion<B>>,
    shape: Shape,
    kernel: fn(FloatTensor<B>) -> FloatTensor<B>,
) -> FloatTensor<Fusion<B>> {
    let out = [(shape, x.dtype)];
    let client = x.client.clone();
    let [y] = outputs(queue::<B, _>(name, &client, vec![x], &out, move |inputs| {
        let [x] = take(inputs);
        floats([kernel(x.float())])
    }));
    y
}

impl<B: FusionBackend + KernelBackend> KernelBackend for Fusion<B> {
    fn dense_float(t: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = t.shape.clone();
        one_float::<B>("kiln.dense", t, shape, B::dense_float)
    }

    fn dense_int(t: IntTensor<Self>) -> IntTensor<Self> {
        let out = [(t.shape.clone(), t.dtype)];
        let client = t.client.clone();
        let [t] = outputs(queue::<B, _>(
            "kiln.dense_int",
            &client,
            vec![t],
            &out,
            |inputs| {
                let [t] = take(inputs);
                vec![Prim::Int(B::dense_int(t.int()))]
            },
        ));
        t
    }

    fn column_sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = cols_of(&x.shape);
        one_float::<B>("kiln.column_sum", x, shape, B::column_sum)
    }

    fn matmul(
        lhs: FloatTensor<Self>,
        rhs: FloatTensor<Self>,
        transpose: Transpose,
    ) -> FloatTensor<Self> {
        let product = Product::of_operands::<Self>(&lhs, &rhs, transpose);
        if !B::tuned_matmul(lhs.client.device(), &product) {
            // Burn's matmul, fused with the element-wise ops around it.
            let (lhs, rhs) = transposed::<Self>(lhs, rhs, transpose);
            return Self::float_matmul(lhs, rhs);
        }
        let out = [(Shape::new([product.m, product.n]), product.dtype)];
        let client = lhs.client.clone();
        let [y] = outputs(queue::<B, _>(
            "kiln.matmul",
            &client,
            vec![lhs, rhs],
            &out,
            move |inputs| {
                let [lhs, rhs] = take(inputs);
                floats([B::matmul(lhs.float(), rhs.float(), transpose)])
            },
        ));
        y
    }

    fn tuned_matmul(device: &Self::Device, product: &Product) -> bool {
        B::tuned_matmul(device, product)
    }

    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let product = Product::of_operands::<Self>(&x, &w, Transpose::Neither);
        if !B::tuned_matmul(x.client.device(), &product) {
            return plain::linear_forward::<Self>(x, w, b, epilogue);
        }
        // The tuned product and Kiln's epilogue kernel, as the inner backend runs them.
        let out = [(Shape::new([product.m, product.n]), product.dtype)];
        let client = x.client.clone();
        let has_bias = b.is_some();
        let relu = matches!(epilogue, Epilogue::Relu);
        let mut inputs = vec![x, w];
        inputs.extend(b);
        if let Epilogue::Residual(r) = epilogue {
            inputs.push(r);
        }
        let [y] = outputs(queue::<B, _>(
            "kiln.linear",
            &client,
            inputs,
            &out,
            move |inputs| {
                let mut inputs = inputs.into_iter().map(Prim::float);
                let (x, w) = (inputs.next().unwrap(), inputs.next().unwrap());
                let b = if has_bias { inputs.next() } else { None };
                let epilogue = match (inputs.next(), relu) {
                    (Some(r), _) => Epilogue::Residual(r),
                    (None, true) => Epilogue::Relu,
                    (None, false) => Epilogue::None,
                };
                floats([B::linear_forward(x, w, b, epilogue)])
            },
        ));
        y
    }

    fn weight_grad(x: FloatTensor<Self>, dy: FloatTensor<Self>) -> FloatTensor<Self> {
        // Burn's own ops and Kiln's column sum, each queued: the same cut as the inner backend's.
        crate::split_k::weight_grad::<Self>(x, dy)
    }

    fn mean(x: FloatTensor<Self>) -> FloatTensor<Self> {
        one_float::<B>("kiln.mean", x, Shape::new([1]), B::mean)
    }

    fn qlora_forward(
        x: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let out = [(Shape::new([x.shape[0], weight.n]), x.dtype)];
        let (k, n) = (weight.k, weight.n);
        let client = x.client.clone();
        let inputs = vec![x, weight.packed, weight.scales, weight.codebook, t, b];
        let [y] = outputs(queue::<B, _>(
            "kiln.qlora",
            &client,
            inputs,
            &out,
            move |inputs| {
                let [x, packed, scales, codebook, t, b] = take(inputs);
                let weight = QuantizedPrimitive {
                    packed: packed.int(),
                    scales: scales.float(),
                    codebook: codebook.float(),
                    k,
                    n,
                };
                floats([B::qlora_forward(
                    x.float(),
                    weight,
                    t.float(),
                    b.float(),
                    scale,
                )])
            },
        ));
        y
    }

    fn qlora_input_grad(
        dy: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
    ) -> FloatTensor<Self> {
        let out = [(Shape::new([dy.shape[0], weight.k]), dy.dtype)];
        let (k, n) = (weight.k, weight.n);
        let client = dy.client.clone();
        let inputs = vec![dy, weight.packed, weight.scales, weight.codebook];
        let [dx] = outputs(queue::<B, _>(
            "kiln.qlora_input_grad",
            &client,
            inputs,
            &out,
            move |inputs| {
                let [dy, packed, scales, codebook] = take(inputs);
                let weight = QuantizedPrimitive {
                    packed: packed.int(),
                    scales: scales.float(),
                    codebook: codebook.float(),
                    k,
                    n,
                };
                floats([B::qlora_input_grad(dy.float(), weight)])
            },
        ));
        dx
    }

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = [(x.shape.clone(), x.dtype), (rows_of(&x.shape), x.dtype)];
        let client = x.client.clone();
        let [y, rstd] = outputs(queue::<B, _>(
            "kiln.rms_norm",
            &client,
            vec![x, gamma],
            &out,
            move |inputs| {
                let [x, gamma] = take(inputs);
                let (y, rstd) = B::rms_norm_forward(x.float(), gamma.float(), eps);
                floats([y, rstd])
            },
        ));
        (y, rstd)
    }

    fn rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = [(x.shape.clone(), x.dtype), (cols_of(&x.shape), x.dtype)];
        let client = x.client.clone();
        let [dx, dgamma] = outputs(queue::<B, _>(
            "kiln.rms_norm_backward",
            &client,
            vec![dy, x, gamma, rstd],
            &out,
            |inputs| {
                let [dy, x, gamma, rstd] = take(inputs);
                let (dx, dgamma) =
                    B::rms_norm_backward(dy.float(), x.float(), gamma.float(), rstd.float());
                floats([dx, dgamma])
            },
        ));
        (dx, dgamma)
    }

    fn rms_norm_input_grad(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = [(x.shape.clone(), x.dtype)];
        let client = x.client.clone();
        let [dx] = outputs(queue::<B, _>(
            "kiln.rms_norm_input_grad",
            &client,
            vec![dy, x, gamma, rstd],
            &out,
            |inputs| {
                let [dy, x, gamma, rstd] = take(inputs);
                floats([B::rms_norm_input_grad(
                    dy.float(),
                    x.float(),
                    gamma.float(),
                    rstd.float(),
                )])
            },
        ));
        dx
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let rows = rows_of(&x.shape);
        let out = [
            (x.shape.clone(), x.dtype),
            (rows.clone(), x.dtype),
            (rows, x.dtype),
        ];
        let client = x.client.clone();
        let [y, mean, rstd] = outputs(queue::<B, _>(
            "kiln.layer_norm",
            &client,
            vec![x, gamma, beta],
            &out,
            move |inputs| {
                let [x, gamma, beta] = take(inputs);
                let (y, mean, rstd) =
                    B::layer_norm_forward(x.float(), gamma.float(), beta.float(), eps);
                floats([y, mean, rstd])
            },
        ));
        (y, mean, rstd)
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let cols = cols_of(&x.shape);
        let out = [
            (x.shape.clone(), x.dtype),
            (cols.clone(), x.dtype),
            (cols, x.dtype),
        ];
        let client = x.client.clone();
        let [dx, dgamma, dbeta] = outputs(queue::<B, _>(
            "kiln.layer_norm_backward",
            &client,
            vec![dy, x, gamma, mean, rstd],
            &out,
            |inputs| {
                let [dy, x, gamma, mean, rstd] = take(inputs);
                let (dx, dgamma, dbeta) = B::layer_norm_backward(
                    dy.float(),
                    x.float(),
                    gamma.float(),
                    mean.float(),
                    rstd.float(),
                );
                floats([dx, dgamma, dbeta])
            },
        ));
        (dx, dgamma, dbeta)
    }

    fn causal_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (batch, q_len) = (q.shape[0], q.shape[1]);
        let out = [
            (q.shape.clone(), q.dtype),
            (Shape::new([batch, heads, q_len]), q.dtype),
        ];
        let client = q.client.clone();
        let mut inputs = vec![q, k, v];
        inputs.extend(starts);
        let [y, lse] = outputs(queue::<B, _>(
            "kiln.causal_attention",
            &client,
            inputs,
            &out,
            move |mut inputs| {
                let starts = (inputs.len() == 4).then(|| inputs.remove(3).int());
                let [q, k, v] = take(inputs);
                let (y, lse) =
                    B::causal_attention_forward(q.float(), k.float(), v.float(), heads, starts);
                floats([y, lse])
            },
        ));
        (y, lse)
    }

    fn causal_attention_backward(
        dout: FloatTensor<Self>,
        [q, k, v]: [FloatTensor<Self>; 3],
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> [FloatTensor<Self>; 3] {
        let shapes = [
            (q.shape.clone(), q.dtype),
            (k.shape.clone(), q.dtype),
            (v.shape.clone(), q.dtype),
        ];
        let client = q.client.clone();
        outputs(queue::<B, _>(
            "kiln.causal_attention_backward",
            &client,
            [dout, q, k, v, out, lse]
                .into_iter()
                .chain(starts)
                .collect(),
            &shapes,
            move |mut inputs| {
                let starts = (inputs.len() == 7).then(|| inputs.remove(6).int());
                let [dout, q, k, v, out, lse] = take(inputs);
                floats(B::causal_attention_backward(
                    dout.float(),
                    [q.float(), k.float(), v.float()],
                    out.float(),
                    lse.float(),
                    heads,
                    starts,
                ))
            },
        ))
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = [(gate.shape.clone(), gate.dtype)];
        let client = gate.client.clone();
        let [y] = outputs(queue::<B, _>(
            "kiln.swiglu",
            &client,
            vec![gate, up],
            &out,
            |inputs| {
                let [gate, up] = take(inputs);
                floats([B::swiglu_forward(gate.float(), up.float())])
            },
        ));
        y
    }

    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let out = [
            (gate.shape.clone(), gate.dtype),
            (gate.shape.clone(), gate.dtype),
        ];
        let client = gate.client.clone();
        let [dgate, dup] = outputs(queue::<B, _>(
            "kiln.swiglu_backward",
            &client,
            vec![dy, gate, up],
            &out,
            |inputs| {
                let [dy, gate, up] = take(inputs);
                let (dgate, dup) = B::swiglu_backward(dy.float(), gate.float(), up.float());
                floats([dgate, dup])
            },
        ));
        (dgate, dup)
    }

    fn relu_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.shape.clone();
        one_float::<B>("kiln.relu", x, shape, B::relu_forward)
    }

    fn relu_backward(dy: FloatTensor<Self>, y: FloatTensor<Self>) -> FloatTensor<Self> {
        let out = [(y.shape.clone(), y.dtype)];
        let client = y.client.clone();
        let [dx] = outputs(queue::<B, _>(
            "kiln.relu_backward",
            &client,
            vec![dy, y],
            &out,
            |inputs| {
                let [dy, y] = take(inputs);
                floats([<B as KernelBackend>::relu_backward(dy.float(), y.float())])
            },
        ));
        dx
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let rows = rows_of(&logits.shape);
        // f32 whatever the logits' dtype (the backend contract).
        let out = [(rows.clone(), DType::F32), (rows, DType::F32)];
        let client = logits.client.clone();
        let [loss, lse] = outputs(queue::<B, _>(
            "kiln.cross_entropy",
            &client,
            vec![logits, targets],
            &out,
            |inputs| {
                let [logits, targets] = take(inputs);
                let (loss, lse) = B::cross_entropy_forward(logits.float(), targets.int());
                floats([loss, lse])
            },
        ));
        (loss, lse)
    }

    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let out = [(logits.shape.clone(), logits.dtype)];
        let client = logits.client.clone();
        let [dlogits] = outputs(queue::<B, _>(
            "kiln.cross_entropy_backward",
            &client,
            vec![dloss, logits, targets, lse],
            &out,
            |inputs| {
                let [dloss, logits, targets, lse] = take(inputs);
                floats([B::cross_entropy_backward(
                    dloss.float(),
                    logits.float(),
                    targets.int(),
                    lse.float(),
                )])
            },
        ));
        dlogits
    }

    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: &AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let out = [
            (param.shape.clone(), param.dtype),
            (m.shape.clone(), m.dtype),
            (v.shape.clone(), v.dtype),
        ];
        let client = param.client.clone();
        let step = *step;
        let [param, m, v] = outputs(queue::<B, _>(
            "kiln.adamw",
            &client,
            vec![param, grad, m, v],
            &out,
            move |inputs| {
                let [param, grad, m, v] = take(inputs);
                let (param, m, v) =
                    B::adamw_step(param.float(), grad.float(), m.float(), v.float(), &step);
                floats([param, m, v])
            },
        ));
        (param, m, v)
    }

    fn adamw_many(
        params: Vec<FloatTensor<Self>>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let flat = (m.shape.clone(), m.dtype);
        let out = [flat.clone(), flat.clone(), flat];
        let client = m.client.clone();
        let count = params.len();
        let (layout, step) = (layout.clone(), *step);
        let inputs = params.into_iter().chain(grads).chain([m, v]).collect();
        let [p, m, v] = outputs(queue::<B, _>(
            "kiln.adamw_many",
            &client,
            inputs,
            &out,
            move |inputs| {
                let mut inputs = inputs.into_iter().map(Prim::float);
                let params = inputs.by_ref().take(count).collect();
                let grads = inputs.by_ref().take(count).collect();
                let (m, v) = (inputs.next(), inputs.next());
                let (m, v) = m.zip(v).expect("the moments follow the tensors");
                let (p, m, v) = B::adamw_many(params, grads, m, v, &layout, &step, grad_scale);
                floats([p, m, v])
            },
        ));
        (p, m, v)
    }

    fn adamw_many_copy(
        params: FloatTensor<Self>,
        grads: Vec<FloatTensor<Self>>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        layout: &FlatLayout,
        step: &AdamWStep,
        grad_scale: f32,
        copy: (&FlatLayout, burn::tensor::FloatDType),
    ) -> [FloatTensor<Self>; 4] {
        let flat = (m.shape.clone(), m.dtype);
        let low = (Shape::new([copy.0.total()]), copy.1.into());
        let out = [flat.clone(), flat.clone(), flat, low];
        let client = m.client.clone();
        let count = grads.len();
        let (layout, step) = (layout.clone(), *step);
        let (copy_layout, copy_dtype) = (copy.0.clone(), copy.1);
        let inputs = [params].into_iter().chain(grads).chain([m, v]).collect();
        outputs(queue::<B, _>(
            "kiln.adamw_many_copy",
            &client,
            inputs,
            &out,
            move |inputs| {
                let mut inputs = inputs.into_iter().map(Prim::float);
                let params = inputs.next().expect("the parameters come first");
                let grads = inputs.by_ref().take(count).collect();
                let (m, v) = (inputs.next(), inputs.next());
                let (m, v) = m.zip(v).expect("the moments follow the gradients");
                let copy = (&copy_layout, copy_dtype);
                floats(B::adamw_many_copy(
                    params, grads, m, v, &layout, &step, grad_scale, copy,
                ))
            },
        ))
    }

    fn cast_many(
        tensors: Vec<FloatTensor<Self>>,
        layout: &FlatLayout,
        dtype: burn::tensor::FloatDType,
        device: &Self::Device,
    ) -> FloatTensor<Self> {
        let client = get_client::<B>(device);
        let out = [(Shape::new([layout.total()]), dtype.into())];
        let (layout, on) = (layout.clone(), device.clone());
        let [flat] = outputs(queue::<B, _>(
            "kiln.cast_many",
            &client,
            tensors,
            &out,
            move |inputs| {
                let tensors = inputs.into_iter().map(Prim::float).collect();
                floats([B::cast_many(tensors, &layout, dtype, &on)])
            },
        ));
        flat
    }

    fn flat_segments(flat: FloatTensor<Self>, layout: &FlatLayout) -> Vec<FloatTensor<Self>> {
        let out: Vec<(Shape, DType)> = layout
            .lens()
            .iter()
            .map(|&len| (Shape::new([len]), flat.dtype))
            .collect();
        let client = flat.client.clone();
        let layout = layout.clone();
        queue::<B, _>(
            "kiln.flat_segments",
            &client,
            vec![flat],
            &out,
            move |inputs| {
                let [flat] = take(inputs);
                B::flat_segments(flat.float(), &layout)
                    .into_iter()
                    .map(Prim::Float)
                    .collect()
            },
        )
    }

    fn same_tensor(a: &FloatTensor<Self>, b: &FloatTensor<Self>) -> bool {
        a.id == b.id
    }

    fn flat_alignment(device: &Self::Device, dtype: DType) -> usize {
        B::flat_alignment(device, dtype)
    }

    fn grad_sq_norm(tensors: Vec<FloatTensor<Self>>, device: &Self::Device) -> FloatTensor<Self> {
        let client = get_client::<B>(device);
        let out = [(Shape::new([2]), DType::F32)];
        let on = device.clone();
        let [norm] = outputs(queue::<B, _>(
            "kiln.grad_sq_norm",
            &client,
            tensors,
            &out,
            move |inputs| {
                let tensors = inputs.into_iter().map(Prim::float).collect();
                floats([B::grad_sq_norm(tensors, &on)])
            },
        ));
        norm
    }
}
