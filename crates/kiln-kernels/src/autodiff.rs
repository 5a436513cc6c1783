//! `Autodiff<B>` over any [`KernelBackend`]: each differentiable kernel gets a backward node
//! that calls `B`'s backward kernel, so a model trained with the fused ops runs them both ways.
//!
//! Only what a backward needs is kept (no probabilities for cross-entropy, no `deq(W)` for the
//! QLoRA matmul). The backward kernels themselves are not differentiable again: their results
//! are constants of the graph, as are the AdamW step and the gradient norm.

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Shape, TensorMetadata};

use crate::backend::KernelBackend;
use crate::quant::QuantizedPrimitive;
use crate::{AdamWStep, Epilogue, FlatLayout, Transpose};

type Ad<B, C> = Autodiff<B, C>;

/// A graph constant: a result no gradient flows through.
fn constant<B: KernelBackend, C: CheckpointStrategy>(t: FloatTensor<B>) -> FloatTensor<Ad<B, C>> {
    FloatTensor::<Ad<B, C>>::new(t)
}

fn inner<B: KernelBackend, C: CheckpointStrategy>(
    w: QuantizedPrimitive<Ad<B, C>>,
) -> QuantizedPrimitive<B> {
    QuantizedPrimitive {
        packed: w.packed,
        scales: w.scales.primitive,
        codebook: w.codebook.primitive,
        k: w.k,
        n: w.n,
    }
}

/// A linear layer's backward over `N` parents: `x` and `w`, then the bias where the layer
/// has one.
#[derive(Debug)]
struct LinearBackward<const N: usize>;

/// What a linear layer's backward keeps.
#[derive(Debug, Clone)]
struct LinearState<B: KernelBackend> {
    /// `x`, for `w`'s gradient; kept only when `w` wants one.
    x: Option<FloatTensor<B>>,
    /// `w`, for `x`'s gradient; kept only when `x` wants one.
    w: Option<FloatTensor<B>>,
    /// The output, after a ReLU epilogue: its backward passes the gradient where it is positive.
    relu: Option<FloatTensor<B>>,
    bias: bool,
}

impl<B: KernelBackend, const N: usize> Backward<B, N> for LinearBackward<N> {
    type State = LinearState<B>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        let mut parents = ops.parents.into_iter();
        let mut next = |present: bool| {
            if present {
                parents.next().flatten().map(|n| n.id)
            } else {
                None
            }
        };
        let (node_x, node_w) = (next(true), next(true));
        let node_b = next(state.bias);
        let mut dy = grads.consume::<B>(&ops.node);
        if let Some(y) = state.relu {
            dy = <B as KernelBackend>::relu_backward(dy, y);
        }
        linear_grads::<B>(dy, state.x, state.w, [node_x, node_w, node_b], grads);
    }
}

/// `a + r`'s backward: the gradient itself to both.
#[derive(Debug)]
struct ResidualBackward;

impl<B: KernelBackend> Backward<B, 2> for ResidualBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_a, node_r] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node_r {
            grads.register::<B>(node.id, dy.clone());
        }
        if let Some(node) = node_a {
            grads.register::<B>(node.id, dy);
        }
    }
}

/// The graph node of a linear layer `x·w (+ b)` whose value (after a ReLU when `relu` holds
/// it) is `out`.
fn track_linear<B: KernelBackend, C: CheckpointStrategy>(
    x: FloatTensor<Ad<B, C>>,
    w: FloatTensor<Ad<B, C>>,
    b: Option<FloatTensor<Ad<B, C>>>,
    relu: Option<FloatTensor<B>>,
    out: FloatTensor<B>,
) -> FloatTensor<Ad<B, C>> {
    // Each input is kept only for the other's gradient.
    let state = LinearState {
        x: (!w.node.requirement.is_none()).then(|| x.primitive.clone()),
        w: (!x.node.requirement.is_none()).then(|| w.primitive.clone()),
        relu,
        bias: b.is_some(),
    };
    match b {
        Some(b) => match LinearBackward::<3>
            .prepare::<C>([x.node, w.node, b.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
        None => match LinearBackward::<2>
            .prepare::<C>([x.node, w.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
    }
}

/// `dx = dy·wᵀ`, `dw = xᵀ·dy`, `db = Σ_rows dy`, for the parents that want them.
fn linear_grads<B: KernelBackend>(
    dy: FloatTensor<B>,
    x: Option<FloatTensor<B>>,
    w: Option<FloatTensor<B>>,
    [node_x, node_w, node_b]: [Option<NodeId>; 3],
    grads: &mut Gradients,
) {
    if let Some(node) = node_b {
        grads.register::<B>(node, B::column_sum(dy.clone()));
    }
    if let Some(node) = node_w {
        let x = x.expect("x is kept when w wants a gradient");
        grads.register::<B>(node, B::weight_grad(x, dy.clone()));
    }
    if let Some(node) = node_x {
        let w = w.expect("w is kept when x wants a gradient");
        grads.register::<B>(node, B::matmul(dy, w, Transpose::Rhs));
    }
}

#[derive(Debug)]
struct QLoraBackward;

impl<B: KernelBackend> Backward<B, 3> for QLoraBackward {
    // The weight, t = x·A, the adapter B and the scale: dx needs the weight, dt needs B,
    // dB needs t; x itself is not needed.
    type State = (QuantizedPrimitive<B>, FloatTensor<B>, FloatTensor<B>, f32);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_t, node_b] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (weight, t, b, scale) = ops.state;
        // A scale of 1 (PEFT's default `alpha = rank`) multiplies by nothing: no launch.
        let scaled = |g: FloatTensor<B>| match scale == 1.0 {
            true => g,
            false => B::float_mul_scalar(g, scale.into()),
        };
        if let Some(node) = node_t {
            let dt = B::matmul(dy.clone(), b, Transpose::Rhs);
            grads.register::<B>(node.id, scaled(dt));
        }
        if let Some(node) = node_b {
            let db = B::weight_grad(t, dy.clone());
            grads.register::<B>(node.id, scaled(db));
        }
        if let Some(node) = node_x {
            grads.register::<B>(node.id, B::qlora_input_grad(dy, weight));
        }
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl<B: KernelBackend> Backward<B, 2> for RmsNormBackward {
    type State = (FloatTensor<B>, FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, gamma, rstd) = ops.state;
        match node_gamma {
            Some(node_gamma) => {
                let (dx, dgamma) = B::rms_norm_backward(dy, x, gamma, rstd);
                if let Some(node) = node_x {
                    grads.register::<B>(node.id, dx);
                }
                grads.register::<B>(node_gamma.id, dgamma);
            }
            // A frozen gain (a fine-tuned model's norms): no sum down the rows for it.
            None => {
                if let Some(node) = node_x {
                    grads.register::<B>(node.id, B::rms_norm_input_grad(dy, x, gamma, rstd));
                }
            }
        }
    }
}

#[derive(Debug)]
struct LayerNormBackward;

impl<B: KernelBackend> Backward<B, 3> for LayerNormBackward {
    // x, gamma, and the forward's per-row mean and rstd.
    type State = (
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
        FloatTensor<B>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (x, gamma, mean, rstd) = ops.state;
        let (dx, dgamma, dbeta) = B::layer_norm_backward(dy, x, gamma, mean, rstd);
        for (node, grad) in [(node_x, dx), (node_gamma, dgamma), (node_beta, dbeta)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct CausalAttentionBackward;

impl<B: KernelBackend> Backward<B, 3> for CausalAttentionBackward {
    // q, k, v, the output, its log-sum-exp per query and head, the number of heads and the
    // queries' first keys.
    type State = (
        [FloatTensor<B>; 3],
        FloatTensor<B>,
        FloatTensor<B>,
        usize,
        Option<IntTensor<B>>,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let dout = grads.consume::<B>(&ops.node);
        let (qkv, out, lse, heads, starts) = ops.state;
        let dqkv = B::causal_attention_backward(dout, qkv, out, lse, heads, starts);
        for (node, grad) in ops.parents.into_iter().zip(dqkv) {
            if let Some(node) = node {
                grads.register::<B>(node.id, grad);
            }
        }
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl<B: KernelBackend> Backward<B, 2> for SwigluBackward {
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_gate, node_up] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        let (gate, up) = ops.state;
        let (dgate, dup) = B::swiglu_backward(dy, gate, up);
        if let Some(node) = node_gate {
            grads.register::<B>(node.id, dgate);
        }
        if let Some(node) = node_up {
            grads.register::<B>(node.id, dup);
        }
    }
}

#[derive(Debug)]
struct ReluBackward;

impl<B: KernelBackend> Backward<B, 1> for ReluBackward {
    type State = FloatTensor<B>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, <B as KernelBackend>::relu_backward(dy, ops.state));
        }
    }
}

/// A column sum's backward: the gradient of each column repeated down its `rows` rows (a view).
#[derive(Debug)]
struct ColumnSumBackward;

impl<B: KernelBackend> Backward<B, 1> for ColumnSumBackward {
    type State = usize;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::broadcast_rows(dy, ops.state));
        }
    }
}

/// A mean's backward: `1/n` of the gradient for every value, one scalar broadcast (a view).
#[derive(Debug)]
struct MeanBackward;

impl<B: KernelBackend> Backward<B, 1> for MeanBackward {
    /// The input's shape.
    type State = Shape;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            let shape = ops.state;
            let n = shape.num_elements();
            let one = B::float_div_scalar(dy, (n as f32).into());
            let ones = Shape::from(vec![1; shape.num_dims()]);
            grads.register::<B>(node.id, B::float_expand(B::float_reshape(one, ones), shape));
        }
    }
}

/// A row broadcast's backward: the column sums of the gradient, over the whole GPU.
#[derive(Debug)]
struct BroadcastRowsBackward;

impl<B: KernelBackend> Backward<B, 1> for BroadcastRowsBackward {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            grads.register::<B>(node.id, B::column_sum(dy));
        }
    }
}

#[derive(Debug)]
struct RopeBackward;

impl<B: KernelBackend> Backward<B, 1> for RopeBackward {
    // The tables: `cos` and the negated `sin`, the backward's rotation.
    type State = (FloatTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node] = ops.parents;
        let dy = grads.consume::<B>(&ops.node);
        if let Some(node) = node {
            let (cos, minus_sin) = ops.state;
            grads.register::<B>(node.id, B::rope(dy, cos, minus_sin));
        }
    }
}

#[derive(Debug)]
struct CrossEntropyBackward;

impl<B: KernelBackend> Backward<B, 1> for CrossEntropyBackward {
    type State = (FloatTensor<B>, IntTensor<B>, FloatTensor<B>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_logits] = ops.parents;
        let dloss = grads.consume::<B>(&ops.node);
        let (logits, targets, lse) = ops.state;
        if let Some(node) = node_logits {
            grads.register::<B>(
                node.id,
                B::cross_entropy_backward(dloss, logits, targets, lse),
            );
        }
    }
}

impl<B: KernelBackend, C: CheckpointStrategy> KernelBackend for Autodiff<B, C> {
    /// A dense copy is a constant of the graph: it is for frozen tensors, which have no
    /// gradient to pass on.
    fn dense_float(t: FloatTensor<Self>) -> FloatTensor<Self> {
        constant::<B, C>(B::dense_float(t.primitive))
    }

    fn dense_int(t: IntTensor<Self>) -> IntTensor<Self> {
        B::dense_int(t)
    }

    fn linear_forward(
        x: FloatTensor<Self>,
        w: FloatTensor<Self>,
        b: Option<FloatTensor<Self>>,
        epilogue: Epilogue<FloatTensor<Self>>,
    ) -> FloatTensor<Self> {
        let relu = matches!(epilogue, Epilogue::Relu);
        let out = B::linear_forward(
            x.primitive.clone(),
            w.primitive.clone(),
            b.as_ref().map(|b| b.primitive.clone()),
            epilogue.clone().map(|r| r.primitive),
        );
        let Epilogue::Residual(r) = epilogue else {
            let relu = relu.then(|| out.clone());
            return track_linear::<B, C>(x, w, b, relu, out);
        };
        // Recorded as `linear(x, w, b) + r` would be, a linear node and then an add node with
        // the residual, both computed in the one pass above: the graph Burn's own ops make.
        // The linear node's value is never read: its backward needs only its inputs.
        let linear = track_linear::<B, C>(x, w, b, None, out.clone());
        match ResidualBackward
            .prepare::<C>([linear.node, r.node])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn column_sum(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let rows = x.primitive.shape()[0];
        let nodes = [x.node.clone()];
        let y = B::column_sum(x.primitive);
        match ColumnSumBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(rows, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn mean(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let shape = x.primitive.shape();
        let nodes = [x.node.clone()];
        let y = B::mean(x.primitive);
        match MeanBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(shape, y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn broadcast_rows(v: FloatTensor<Self>, rows: usize) -> FloatTensor<Self> {
        let nodes = [v.node.clone()];
        let y = B::broadcast_rows(v.primitive, rows);
        match BroadcastRowsBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn qlora_forward(
        x: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
        t: FloatTensor<Self>,
        b: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self> {
        let weight = inner(weight);
        let nodes = [x.node.clone(), t.node.clone(), b.node.clone()];
        let out = B::qlora_forward(
            x.primitive,
            weight.clone(),
            t.primitive.clone(),
            b.primitive.clone(),
            scale,
        );
        match QLoraBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((weight, t.primitive, b.primitive, scale), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn qlora_input_grad(
        dy: FloatTensor<Self>,
        weight: QuantizedPrimitive<Self>,
    ) -> FloatTensor<Self> {
        constant::<B, C>(B::qlora_input_grad(dy.primitive, inner(weight)))
    }

    fn rms_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [x.node.clone(), gamma.node.clone()];
        let (y, rstd) = B::rms_norm_forward(x.primitive.clone(), gamma.primitive.clone(), eps);
        let y = match RmsNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((x.primitive, gamma.primitive, rstd.clone()), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        (y, constant::<B, C>(rstd))
    }

    fn rms_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dg) =
            B::rms_norm_backward(dy.primitive, x.primitive, gamma.primitive, rstd.primitive);
        (constant::<B, C>(dx), constant::<B, C>(dg))
    }

    fn rms_norm_input_grad(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        constant::<B, C>(B::rms_norm_input_grad(
            dy.primitive,
            x.primitive,
            gamma.primitive,
            rstd.primitive,
        ))
    }

    fn layer_norm_forward(
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        beta: FloatTensor<Self>,
        eps: f32,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [x.node.clone(), gamma.node.clone(), beta.node.clone()];
        let (y, mean, rstd) = B::layer_norm_forward(
            x.primitive.clone(),
            gamma.primitive.clone(),
            beta.primitive,
            eps,
        );
        let y = match LayerNormBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(
                (x.primitive, gamma.primitive, mean.clone(), rstd.clone()),
                y,
            ),
            OpsKind::UnTracked(prep) => prep.finish(y),
        };
        (y, constant::<B, C>(mean), constant::<B, C>(rstd))
    }

    fn layer_norm_backward(
        dy: FloatTensor<Self>,
        x: FloatTensor<Self>,
        gamma: FloatTensor<Self>,
        mean: FloatTensor<Self>,
        rstd: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (dx, dg, db) = B::layer_norm_backward(
            dy.primitive,
            x.primitive,
            gamma.primitive,
            mean.primitive,
            rstd.primitive,
        );
        (
            constant::<B, C>(dx),
            constant::<B, C>(dg),
            constant::<B, C>(db),
        )
    }

    fn causal_attention_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [q.node.clone(), k.node.clone(), v.node.clone()];
        let qkv = [q.primitive, k.primitive, v.primitive];
        let [q, k, v] = qkv.clone();
        let (out, lse) = B::causal_attention_forward(q, k, v, heads, starts.clone());
        let y = match CausalAttentionBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                prep.finish((qkv, out.clone(), lse.clone(), heads, starts), out)
            }
            OpsKind::UnTracked(prep) => prep.finish(out),
        };
        (y, constant::<B, C>(lse))
    }

    fn causal_attention_backward(
        dout: FloatTensor<Self>,
        qkv: [FloatTensor<Self>; 3],
        out: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        heads: usize,
        starts: Option<IntTensor<Self>>,
    ) -> [FloatTensor<Self>; 3] {
        B::causal_attention_backward(
            dout.primitive,
            qkv.map(|t| t.primitive),
            out.primitive,
            lse.primitive,
            heads,
            starts,
        )
        .map(constant::<B, C>)
    }

    fn swiglu_forward(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [gate.node.clone(), up.node.clone()];
        let y = B::swiglu_forward(gate.primitive.clone(), up.primitive.clone());
        match SwigluBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((gate.primitive, up.primitive), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn swiglu_backward(
        dy: FloatTensor<Self>,
        gate: FloatTensor<Self>,
        up: FloatTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let (dg, du) = B::swiglu_backward(dy.primitive, gate.primitive, up.primitive);
        (constant::<B, C>(dg), constant::<B, C>(du))
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        // The tables are constants of the graph: positions, not parameters.
        let (cos, sin) = (cos.primitive, sin.primitive);
        let nodes = [x.node.clone()];
        let y = B::rope(x.primitive, cos.clone(), sin.clone());
        match RopeBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish((cos, B::float_neg(sin)), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn relu_forward(x: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [x.node.clone()];
        let y = B::relu_forward(x.primitive);
        match ReluBackward.prepare::<C>(nodes).compute_bound().stateful() {
            // The backward needs only the output, which the graph keeps anyway.
            OpsKind::Tracked(prep) => prep.finish(y.clone(), y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn relu_backward(dy: FloatTensor<Self>, y: FloatTensor<Self>) -> FloatTensor<Self> {
        constant::<B, C>(<B as KernelBackend>::relu_backward(
            dy.primitive,
            y.primitive,
        ))
    }

    fn cross_entropy_forward(
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let nodes = [logits.node.clone()];
        let (loss, lse) = B::cross_entropy_forward(logits.primitive.clone(), targets.clone());
        let loss = match CrossEntropyBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((logits.primitive, targets, lse.clone()), loss),
            OpsKind::UnTracked(prep) => prep.finish(loss),
        };
        (loss, constant::<B, C>(lse))
    }

    fn cross_entropy_backward(
        dloss: FloatTensor<Self>,
        logits: FloatTensor<Self>,
        targets: IntTensor<Self>,
        lse: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        constant::<B, C>(B::cross_entropy_backward(
            dloss.primitive,
            logits.primitive,
            targets,
            lse.primitive,
        ))
    }

    fn adamw_step(
        param: FloatTensor<Self>,
        grad: FloatTensor<Self>,
        m: FloatTensor<Self>,
        v: FloatTensor<Self>,
        step: &AdamWStep,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (p, m, v) = B::adamw_step(
            param.primitive,
            grad.primitive,
            m.primitive,
            v.primitive,
            step,
        );
        (
            constant::<B, C>(p),
            constant::<B, C>(m),
            constant::<B, C>(v),
        )
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
        let inner = |ts: Vec<FloatTensor<Self>>| ts.into_iter().map(|t| t.primitive).collect();
        let (p, m, v) = B::adamw_many(
            inner(params),
            inner(grads),
            m.primitive,
            v.primitive,
            layout,
            step,
            grad_scale,
        );
        (
            constant::<B, C>(p),
            constant::<B, C>(m),
            constant::<B, C>(v),
        )
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
        let grads = grads.into_iter().map(|t| t.primitive).collect();
        B::adamw_many_copy(
            params.primitive,
            grads,
            m.primitive,
            v.primitive,
            layout,
            step,
            grad_scale,
            copy,
        )
        .map(constant::<B, C>)
    }

    fn cast_many(
        tensors: Vec<FloatTensor<Self>>,
        layout: &FlatLayout,
        dtype: burn::tensor::FloatDType,
        device: &Self::Device,
    ) -> FloatTensor<Self> {
        let tensors = tensors.into_iter().map(|t| t.primitive).collect();
        constant::<B, C>(B::cast_many(tensors, layout, dtype, device))
    }

    fn flat_segments(flat: FloatTensor<Self>, layout: &FlatLayout) -> Vec<FloatTensor<Self>> {
        B::flat_segments(flat.primitive, layout)
            .into_iter()
            .map(constant::<B, C>)
            .collect()
    }

    fn same_tensor(a: &FloatTensor<Self>, b: &FloatTensor<Self>) -> bool {
        B::same_tensor(&a.primitive, &b.primitive)
    }

    fn flat_alignment(device: &Self::Device, dtype: burn::tensor::DType) -> usize {
        B::flat_alignment(device, dtype)
    }

    fn grad_sq_norm(tensors: Vec<FloatTensor<Self>>, device: &Self::Device) -> FloatTensor<Self> {
        constant::<B, C>(B::grad_sq_norm(
            tensors.into_iter().map(|t| t.primitive).collect(),
            device,
        ))
    }
}
