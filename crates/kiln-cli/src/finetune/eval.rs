//! Held-out evaluation while `kiln finetune` trains: the loss of the whole model on examples
//! it does not train on, every `--eval-every` steps, at every checkpoint and at the end.

use std::time::Instant;

use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use kiln_nn::llm::{CausalLm, LmItem};
use kiln_nn::tensor_parallel::ShardedBackend;

/// One evaluation of the run.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EvalPoint {
    /// Steps trained when it was taken.
    pub step: usize,
    /// The held-out loss, measured as the training loss is ([`kiln_nn::llm::EvalLoss`]).
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
}

/// Evaluates the model of a run on its held-out sequences, and remembers every result.
pub struct Evaluator<'a> {
    items: &'a [LmItem],
    /// Sequences per forward pass.
    batch: usize,
    /// The longest sequence a batch may pad to.
    max_len: usize,
    points: Vec<EvalPoint>,
}

impl<'a> Evaluator<'a> {
    /// Evaluates on `items`, `batch` sequences a pass, each padded to at most `max_len`.
    pub fn new(items: &'a [LmItem], batch: usize, max_len: usize) -> Self {
        Self {
            items,
            batch: batch.max(1),
            max_len,
            points: Vec::new(),
        }
    }

    /// The loss of `model` after `step` steps, on `device` (taken once per step: a save
    /// and a periodic evaluation of the same step share it).
    pub fn evaluate<B>(&mut self, step: usize, model: &CausalLm<B>, device: &B::Device) -> EvalPoint
    where
        B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend,
    {
        if let Some(point) = self.points.last().filter(|p| p.step == step) {
            return *point;
        }
        let started = Instant::now();
        let loss = model
            .valid()
            .eval_loss(self.items, self.batch, self.max_len, device);
        let point = EvalPoint {
            step,
            loss: loss.loss,
            perplexity: loss.perplexity(),
        };
        let best = self.best().is_none_or(|b| point.loss < b.loss);
        tracing::info!(
            "step {step}: eval loss {:.4} (perplexity {:.2}) on {} sequences, {:.1} s{}",
            point.loss,
            point.perplexity,
            loss.sequences,
            started.elapsed().as_secs_f64(),
            if best && !self.points.is_empty() {
                ", the best so far"
            } else {
                ""
            }
        );
        self.points.push(point);
        point
    }

    /// Every evaluation so far, in step order.
    pub fn points(&self) -> &[EvalPoint] {
        &self.points
    }

    /// The evaluation of the lowest loss (the earliest of equal ones).
    pub fn best(&self) -> Option<EvalPoint> {
        self.points
            .iter()
            .copied()
            .reduce(|best, p| if p.loss < best.loss { p } else { best })
    }
}
