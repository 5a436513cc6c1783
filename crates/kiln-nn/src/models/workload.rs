//! What a training step of each reference model asks of the planner
//! ([`kiln_core::plan::cost::Workload`]): its exact parameters, its FLOPs and the bytes it
//! keeps and moves per sample, in f32.

use kiln_core::plan::cost::Workload;

use super::{MlpConfig, TransformerConfig};

/// Bytes of an f32 value.
const F32: f64 = 4.0;

impl TransformerConfig {
    /// Parameters of one encoder block: the attention's four `d × d` projections with biases,
    /// the feed-forward's two matrices with biases, two layer norms (scale and shift).
    fn block_params(&self) -> u64 {
        let (d, f) = (self.d_model as u64, self.d_ff as u64);
        4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * (2 * d)
    }

    /// Training every weight of this model in f32 on samples of `seq` tokens,
    /// `global_batch` a step.
    pub fn workload(&self, seq: usize, global_batch: usize) -> Workload {
        let (d, f, v, l) = (
            self.d_model as u64,
            self.d_ff as u64,
            self.vocab as u64,
            self.max_len as u64,
        );
        let embedding = v * d + l * d;
        let head = d * v + v;
        let params = embedding + head + self.layers as u64 * self.block_params();
        let (s, dm) = (seq as f64, d as f64);
        // Two FLOPs a weight a token meets; attention's scores and mixing, `4 · s² · d`.
        let block_flops = 2.0 * s * (4.0 * dm * dm + 2.0 * dm * f as f64) + 4.0 * s * s * dm;
        let head_flops = 2.0 * s * dm * v as f64;
        // A block keeps its input, the norms' outputs, q, k, v, the scores and their softmax
        // (`heads · s²` each), the attention's output, the feed-forward's two widths: about
        // `s · (10 d + 2 f) + 2 · heads · s²` values; shards keep their share of the heads and
        // of the feed-forward.
        let heads = self.heads as f64;
        let block_values =
            |tp: f64| s * (4.0 * dm + (6.0 * dm + 2.0 * f as f64) / tp) + 2.0 * heads * s * s / tp;
        let boundary = s * dm * F32;
        Workload {
            params,
            trainable: params,
            embedding_params: embedding,
            head_params: head,
            weight_bytes: F32,
            trainable_extra_bytes: 3.0 * F32,
            gradient_bytes: F32,
            activation_bytes: F32,
            forward_flops: self.layers as f64 * block_flops + head_flops,
            head_flops,
            backward_passes: 2.0,
            layers: self.layers,
            block_activation_bytes: (1..=self.heads)
                .map(|tp| block_values(tp as f64) * F32)
                .collect(),
            shardable: self.heads,
            // The logits and their gradient.
            head_activation_bytes: 2.0 * s * v as f64 * F32,
            boundary_bytes: boundary,
            // Two all-reduces of a block's output forward, two of its gradient backward.
            tp_bytes: 4.0 * boundary,
            global_batch,
            fixed_bytes: 0.0,
            stage_activation_scale: 1.0,
            // Recomputed only as pipeline stages.
            recomputes_blocks: false,
        }
    }
}

impl MlpConfig {
    /// Training every weight of this MLP in f32, `global_batch` samples a step. Its hidden
    /// layers are the blocks a pipeline splits (the first, from the input, stands for one of
    /// the others: the planner takes blocks as equal); it has no tensor-parallel form.
    pub fn workload(&self, global_batch: usize) -> Workload {
        let (i, h, c) = (self.input as u64, self.hidden as u64, self.classes as u64);
        let layers = self.layers.max(1);
        let hidden = match self.layers {
            0 => 0,
            n => (i * h + h) + (n as u64 - 1) * (h * h + h),
        };
        let head_in = if self.layers == 0 { i } else { h };
        let head = head_in * c + c;
        let params = hidden + head;
        Workload {
            params,
            trainable: params,
            embedding_params: 0,
            head_params: head,
            weight_bytes: F32,
            trainable_extra_bytes: 3.0 * F32,
            gradient_bytes: F32,
            activation_bytes: F32,
            forward_flops: 2.0 * params as f64,
            head_flops: 2.0 * head as f64,
            backward_passes: 2.0,
            layers,
            // A layer keeps its output and its ReLU's.
            block_activation_bytes: vec![2.0 * h as f64 * F32],
            shardable: 1,
            // The logits and their gradient.
            head_activation_bytes: 2.0 * c as f64 * F32,
            boundary_bytes: h as f64 * F32,
            tp_bytes: 0.0,
            global_batch,
            fixed_bytes: 0.0,
            stage_activation_scale: 1.0,
            // Recomputed only as pipeline stages.
            recomputes_blocks: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::Flex;
    use burn::module::Module;

    use super::*;

    #[test]
    fn the_workloads_count_the_models_parameters_exactly() {
        let device = Default::default();
        let transformer = TransformerConfig::new();
        let model = transformer.init::<Flex>(&device);
        assert_eq!(
            transformer.workload(16, 8).params,
            model.num_params() as u64
        );
        let mlp = MlpConfig::new().with_layers(3);
        assert_eq!(
            mlp.workload(8).params,
            mlp.init::<Flex>(&device).num_params() as u64
        );
    }
}
