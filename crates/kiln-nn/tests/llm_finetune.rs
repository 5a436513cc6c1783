//! LoRA and QLoRA fine-tuning of the pretrained fixtures through Kiln's strategies: the loss on
//! the training responses falls, `Single`, `Ddp` over 2 ranks and `Pipeline` over 2 stages
//! train the same adapters, and the base stays bit for bit what was loaded.

use burn::backend::{Autodiff, Flex};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::InMemDataset;
use burn::module::{AutodiffModule, Param};
use burn::optim::AdamWConfig;
use burn::optim::GradientsParams;
use burn::train::TrainStep;
use kiln_core::data::DataSource;
use kiln_core::fit::{FitError, Training, fit};
use kiln_core::optim::{MixedPrecision, PerformanceConfig, Precision};
use kiln_core::params::checksum;
use kiln_core::plan::{Plan, PlanRequest};
use kiln_core::strategy::{
    ConfigError, PerformanceSpec, Schedule, StepOutput, StrategyConfigs, StrategyError,
    StrategyKind,
};
use kiln_nn::llm::{
    CausalLm, DataFormat, DataSet, LlmTokenizer, LmBatch, LmBatcher, LmItem, LoraSpec, Packing,
    TARGET_MODULES, TokenizeOptions, TrainOn, load, load_4bit, load_config, tokenize,
};
use kiln_nn::lora::QuantConfig;

type B = Flex;
type A = Autodiff<B>;

mod common;
use common::{fixed_adapters, fixture};

/// The chat fixture as sequences of at most 24 tokens (both fixtures share the llama one's
/// vocabulary of 96 tokens).
fn chat_items() -> Vec<LmItem> {
    items(Packing::Pad)
}

/// The chat fixture as sequences of at most 24 tokens, `packing` them.
fn items(packing: Packing) -> Vec<LmItem> {
    let dir = fixture("llama");
    let tokenizer = LlmTokenizer::from_dir(&dir, &load_config(&dir).unwrap()).unwrap();
    let path = fixture("chat.jsonl");
    let options = TokenizeOptions {
        seq_len: 24,
        packing,
        train_on: TrainOn::Completion,
    };
    let data = DataSet::read(&path, DataFormat::Auto).unwrap();
    tokenize(&data, &tokenizer, options).unwrap().items
}

/// `base` with rank-4 adapters on all seven projections, the same in every run.
fn adapted(base: CausalLm<A>) -> CausalLm<A> {
    fixed_adapters(base.with_lora(&spec()).unwrap(), 7)
}

fn spec() -> LoraSpec {
    LoraSpec {
        rank: 4,
        alpha: 8.0,
        target_modules: TARGET_MODULES.map(String::from).to_vec(),
        use_rslora: false,
        dropout: 0.0,
    }
}

/// `start` trained for `steps` steps of 16 sequences at lr 3e-2 by `strategy` over `world`
/// ranks (a pipeline in 2 stages) in f32: the trained model and its losses.
fn train(
    start: &CausalLm<A>,
    strategy: StrategyKind,
    world: usize,
    steps: usize,
) -> Result<(CausalLm<B>, Vec<f64>), FitError> {
    train_in(start, strategy, world, steps, Precision::F32)
}

/// [`train`] in `precision`.
fn train_in(
    start: &CausalLm<A>,
    strategy: StrategyKind,
    world: usize,
    steps: usize,
    precision: Precision,
) -> Result<(CausalLm<B>, Vec<f64>), FitError> {
    train_on(chat_items(), start, strategy, world, steps, precision)
}

/// [`train_in`] on `items`.
fn train_on(
    items: Vec<LmItem>,
    start: &CausalLm<A>,
    strategy: StrategyKind,
    world: usize,
    steps: usize,
    precision: Precision,
) -> Result<(CausalLm<B>, Vec<f64>), FitError> {
    train_configured(items, start, strategy, world, steps, precision, |_| {})
}

/// [`train_on`], its strategies' settings changed by `configure` last.
fn train_configured(
    items: Vec<LmItem>,
    start: &CausalLm<A>,
    strategy: StrategyKind,
    world: usize,
    steps: usize,
    precision: Precision,
    configure: impl FnOnce(&mut StrategyConfigs),
) -> Result<(CausalLm<B>, Vec<f64>), FitError> {
    let data = DataSource::new(InMemDataset::new(items), LmBatcher::new(24));
    let mut configs = StrategyConfigs::default();
    configs.set_threads_per_rank(1);
    // A stage per rank.
    configs.pipeline.stages = if strategy == StrategyKind::Pipeline {
        world
    } else {
        2
    };
    configs.pipeline.micro_batches = 2;
    configs.ddp.check_replicas_every = Some(1);
    // Under `tensor`: 2 shards, in 2 stages when the world has 4 ranks (dp × pp × tp).
    configs.tensor.tp = 2;
    configs.tensor.stages = if strategy == StrategyKind::Tensor && world == 4 {
        2
    } else {
        1
    };
    // (Replicas are checked without stages only.)
    configs.tensor.check_replicas_every = (configs.tensor.stages == 1).then_some(1);
    configure(&mut configs);
    let plan = Plan::resolve(
        PlanRequest::new(strategy, 16)
            .with_world(world)
            .with_configs(configs),
    )?;
    let training = Training {
        steps,
        seed: 1,
        lr: &|_| 3e-2,
        resume: None,
        keep_optimizer_state: false,
        save_every: None,
        eval_every: None,
        lengths: None,
        stop: None,
    };
    let performance = PerformanceConfig {
        precision,
        ..PerformanceConfig::default()
    };
    let optim = PerformanceSpec::new(AdamWConfig::new(), performance).unwrap();
    let mut quiet = |_, _: &StepOutput| {};
    let (model, record) = fit(
        &plan,
        &training,
        vec![Default::default(); world],
        start.clone(),
        &optim,
        data,
        &mut quiet,
    )?;
    Ok((model.valid(), record.losses))
}

/// The same adapters: the whole model's sum and sum of squares agree within 1e-5.
fn assert_same(a: &CausalLm<B>, b: &CausalLm<B>, what: &str) {
    let (a, b) = (checksum(a), checksum(b));
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-5 * x.abs().max(1.0);
    assert!(
        close(a.sum, b.sum) && close(a.sq_sum, b.sq_sum),
        "{what}: {a:?} vs {b:?}"
    );
}

/// Every parameter of the base (all but the adapters) bit for bit as loaded, and the
/// adapters moved.
fn assert_only_adapters_trained(before: &CausalLm<B>, after: &CausalLm<B>) {
    let data = |m: &CausalLm<B>| {
        let d = &m.model;
        let mut all = vec![
            d.embed_tokens.weight.val().into_data(),
            d.norm.gamma.val().into_data(),
        ];
        for layer in &d.layers {
            all.push(layer.input_layernorm.gamma.val().into_data());
            let q = &layer.self_attn.q_proj;
            match (&q.base, &q.quantized) {
                (Some(linear), _) => all.push(linear.weight.val().into_data()),
                (None, Some(four)) => all.push(four.weight.scales.val().into_data()),
                (None, None) => unreachable!(),
            }
        }
        all
    };
    assert_eq!(data(before), data(after), "the base changed");
    let b = |m: &CausalLm<B>| {
        let adapter = m.model.layers[1].mlp.down_proj.lora.as_ref().unwrap();
        adapter.b.val().into_data()
    };
    assert_ne!(b(before), b(after), "the adapters did not train");
}

/// The mean loss of the first and of the last 10 steps.
fn head_and_tail(losses: &[f64]) -> (f64, f64) {
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    (mean(&losses[..10]), mean(&losses[losses.len() - 10..]))
}

#[test]
fn the_loss_on_the_training_responses_falls_in_f32_bf16_and_f16() {
    let (_, base) = load::<A>(&fixture("llama"), &Default::default()).unwrap();
    let start = adapted(base);
    let (_, losses) = train(&start, StrategyKind::Single, 1, 60).unwrap();
    let (head, tail) = head_and_tail(&losses);
    // Measured 4.276 -> 4.099 (means of the first and last 10 steps) on the chat data's
    // responses: the random base's small weights (std 0.02, its head included) bound how far
    // adapters alone can move the logits.
    assert!(tail < head - 0.1, "the loss did not fall: {head} -> {tail}");
    // Mixed precision (f32 master weights) learns too, and ends near f32's loss: measured
    // 4.305 -> 4.099 in bf16, 4.280 -> 4.100 in f16.
    for precision in [Precision::Bf16, Precision::F16] {
        let (_, low) = train_in(&start, StrategyKind::Single, 1, 60, precision).unwrap();
        let (low_head, low_tail) = head_and_tail(&low);
        assert!(
            low_tail < low_head - 0.05 && (low_tail - tail).abs() < 0.03 * tail,
            "{precision:?}: {low_head} -> {low_tail}, f32 {head} -> {tail}"
        );
    }
}

/// Single, Ddp over 2 ranks and Pipeline over 2 stages fine-tune `start` to the same
/// adapters and leave its base alone; so do `tensor` over 2 shards and, in 2 stages of 2
/// shards, `pipeline × tensor`, when `tensor` is given. (4 steps: over many steps Adam's
/// sign-like updates of near-zero gradients amplify float rounding.)
fn strategies_agree(start: &CausalLm<A>, tensor: bool) {
    let (single, _) = train(start, StrategyKind::Single, 1, 4).unwrap();
    let mut others = vec![
        ("ddp", train(start, StrategyKind::Ddp, 2, 4).unwrap().0),
        (
            "pipeline",
            train(start, StrategyKind::Pipeline, 2, 4).unwrap().0,
        ),
    ];
    if tensor {
        others.push((
            "tensor",
            train(start, StrategyKind::Tensor, 2, 4).unwrap().0,
        ));
        others.push((
            "tensor in 2 stages",
            train(start, StrategyKind::Tensor, 4, 4).unwrap().0,
        ));
    }
    let before = start.valid();
    assert_only_adapters_trained(&before, &single);
    for (name, model) in &others {
        assert_same(&single, model, name);
        assert_only_adapters_trained(&before, model);
    }
}

#[test]
fn lora_on_llama_trains_the_same_adapters_through_single_ddp_pipeline_and_tensor() {
    let (_, base) = load::<A>(&fixture("llama"), &Default::default()).unwrap();
    strategies_agree(&adapted(base), true);
}

/// Qwen3's per-head query and key norms are replicated on every tensor-parallel shard.
#[test]
fn lora_on_qwen3_trains_the_same_adapters_through_single_ddp_pipeline_and_tensor() {
    let (_, base) = load::<A>(&fixture("qwen3"), &Default::default()).unwrap();
    strategies_agree(&adapted(base), true);
}

/// Stages of unequal blocks (1 + 3, 3 + 1 and 1 + 2 + 1, under both schedules, and 1 + 3 on a
/// dp × pp mesh of 4 ranks) train the same adapters as `Single`, on the llama fixture's sizes
/// with 4 layers (the fixture itself has 2), freshly initialised.
#[test]
fn lora_on_a_four_layer_llama_trains_the_same_adapters_through_uneven_stages() {
    let mut config = load_config(&fixture("llama")).unwrap();
    config.num_hidden_layers = 4;
    let start = adapted(config.init::<A>(&Default::default()));
    let (single, _) = train(&start, StrategyKind::Single, 1, 4).unwrap();
    let before = start.valid();
    assert_only_adapters_trained(&before, &single);
    let cases: [(&[usize], Schedule, usize); 5] = [
        (&[1, 3], Schedule::OneFOneB, 2),
        (&[3, 1], Schedule::GPipe, 2),
        (&[1, 2, 1], Schedule::OneFOneB, 3),
        (&[1, 2, 1], Schedule::GPipe, 3),
        (&[1, 3], Schedule::OneFOneB, 4),
    ];
    for (blocks, schedule, world) in cases {
        let (model, _) = train_configured(
            chat_items(),
            &start,
            StrategyKind::Pipeline,
            world,
            4,
            Precision::F32,
            |configs| {
                configs.pipeline.stages = blocks.len();
                configs.pipeline.stage_blocks = Some(blocks.to_vec());
                configs.pipeline.schedule = schedule;
            },
        )
        .unwrap();
        assert_eq!(model.model.layers.len(), 4, "the stages assembled");
        assert_same(
            &single,
            &model,
            &format!("stages of {blocks:?} blocks, {schedule:?}, {world} ranks"),
        );
        assert_only_adapters_trained(&before, &model);
    }
}

/// Qwen2's head is tied to its embedding, which the pipeline's last stage holds a copy of.
#[test]
fn qlora_on_tied_qwen2_trains_the_same_adapters_through_single_ddp_and_pipeline() {
    let (_, base) =
        load_4bit::<A>(&fixture("qwen2"), &Default::default(), &QuantConfig::new()).unwrap();
    strategies_agree(&adapted(base), false);
    // Tensor parallelism would cut its 4-bit bases' blocks of 64 rows (the fixture's output
    // projections have 32): refused in one line naming the layer.
    let Err(error) = train(
        &adapted(
            load_4bit::<A>(&fixture("qwen2"), &Default::default(), &QuantConfig::new())
                .unwrap()
                .1,
        ),
        StrategyKind::Tensor,
        2,
        1,
    ) else {
        panic!("a 4-bit base was cut inside its quantisation blocks");
    };
    assert!(
        error.to_string().contains("o_proj") && error.to_string().contains("64"),
        "{error}"
    );
}

/// QLoRA in bf16 and f16 (the 4-bit base's scales and code book cast too) computes the
/// adapters' f32 gradients to half precision's accuracy: the relative L2 error of all their
/// gradients together, on a batch of the chat data. (Single gradients can be far worse: the
/// query projection's passes through the softmax of the random model's near-uniform
/// attention and cancels almost entirely; with or without 4 bits, bf16 keeps little of it.)
#[test]
fn qlora_gradients_in_bf16_and_f16_are_f32_s_to_half_precision() {
    let (_, base) =
        load_4bit::<A>(&fixture("qwen2"), &Default::default(), &QuantConfig::new()).unwrap();
    let mut model = adapted(base);
    // B starts at zero; give it values so that A's gradient is not zero either.
    let mut ids = Vec::new();
    for (_, _, proj) in model.projections_mut() {
        let adapter = proj.lora.as_mut().unwrap();
        let b = adapter.b.val().detach().ones_like().mul_scalar(0.05);
        adapter.b = Param::initialized(adapter.b.id, b.require_grad());
        ids.extend([adapter.a.id, adapter.b.id]);
    }
    let batch = LmBatcher::new(24).batch(chat_items()[..8].to_vec(), &Default::default());
    let flat = |grads: &GradientsParams| -> Vec<f32> {
        ids.iter()
            .flat_map(|id| {
                let g = grads
                    .get::<B, 2>(*id)
                    .expect("every adapter has a gradient");
                g.into_data().to_vec::<f32>().unwrap()
            })
            .collect()
    };
    let exact = flat(&model.step(batch.clone()).grads);
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    // Measured: 0.0086 in bf16 (8 bits of mantissa), 0.0011 in f16 (11 bits).
    for (precision, bound) in [(Precision::Bf16, 0.03), (Precision::F16, 0.005)] {
        let low = flat(
            &MixedPrecision::new(model.clone(), precision)
                .step(batch.clone())
                .grads,
        );
        let error: Vec<f32> = exact.iter().zip(&low).map(|(a, b)| a - b).collect();
        let relative = norm(&error) / norm(&exact);
        // The floor fails a run that stayed in f32.
        assert!(
            norm(&exact) > 0.0 && relative < bound && relative > 1e-5,
            "{precision:?}: relative error {relative} of the adapters' gradients"
        );
    }
}

#[test]
fn a_pipeline_refuses_to_split_a_trainable_tied_embedding() {
    let (_, full) = load::<A>(&fixture("qwen2"), &Default::default()).unwrap();
    let Err(error) = train(&full, StrategyKind::Pipeline, 2, 1) else {
        panic!("a trainable tied embedding was split between stages");
    };
    assert!(
        matches!(
            error,
            FitError::Strategy(StrategyError::Config(ConfigError::SplitRefused {
                stages: 2,
                ..
            }))
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("freeze the embedding"),
        "{error}"
    );
}

/// QLoRA under `tensor`, on a model wide enough for its row-parallel shards to hold whole
/// blocks of 64 rows (written from a fresh initialisation: the fixtures are narrower), trains
/// Single's adapters.
#[test]
fn qlora_through_tensor_trains_single_s_adapters_on_a_model_wide_enough() {
    let dir = std::env::temp_dir().join(format!("kiln-llm-tp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 96, "max_position_embeddings": 64, "tie_word_embeddings": false,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let whole = load_config(&dir).unwrap().init::<B>(&Default::default());
    whole.save_pretrained(&dir, &dir).unwrap();
    let (_, base) = load_4bit::<A>(&dir, &Default::default(), &QuantConfig::new()).unwrap();
    let start = adapted(base);
    let (single, _) = train(&start, StrategyKind::Single, 1, 4).unwrap();
    let (tensor, _) = train(&start, StrategyKind::Tensor, 2, 4).unwrap();
    assert_same(&single, &tensor, "tensor");
    assert_only_adapters_trained(&start.valid(), &tensor);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_eval_loss_is_the_training_loss_of_one_forward_over_the_whole_set() {
    let items = chat_items();
    let device = Default::default();
    let model = adapted(load::<A>(&fixture("llama"), &device).unwrap().1).valid();
    // The training loss of the whole set as one batch, padded to its longest.
    let whole: LmBatch<B> = LmBatcher::new(24).batch(items.clone(), &device);
    let expected = model.forward_masked(whole).loss.into_scalar() as f64;
    // In batches of 3 (each padded to its own longest; the last one short), the same mean.
    let eval = model.eval_loss(&items, 3, 24, &device);
    assert_eq!(eval.sequences, items.len());
    let trained: usize = items
        .iter()
        .map(|i| i.trained.iter().filter(|&&t| t).count())
        .sum();
    assert_eq!(eval.tokens, trained);
    assert!(
        (eval.loss - expected).abs() < 1e-5,
        "{} vs {expected}",
        eval.loss
    );
    assert!((eval.perplexity() - expected.exp()).abs() < 1e-3);
    // A different set gives a different loss: the comparison can fail.
    let other = model.eval_loss(&items[..5], 3, 24, &device);
    assert!((other.loss - expected).abs() > 1e-4);
}

#[test]
fn lora_dropout_drops_the_adapters_input_while_training_and_never_at_inference() {
    use burn::tensor::backend::Backend;
    let device = Default::default();
    let model = |dropout: f64| {
        let base = load::<A>(&fixture("llama"), &device).unwrap().1;
        let mut model = fixed_adapters(base.with_lora(&LoraSpec { dropout, ..spec() }).unwrap(), 7);
        // A non-zero B, so that both factors' gradients and the output depend on the input.
        for (_, _, proj) in model.projections_mut() {
            if let Some(adapter) = proj.lora.as_mut() {
                let b = adapter.b.val().ones_like().mul_scalar(0.01);
                adapter.b = Param::initialized(adapter.b.id, b.require_grad());
            }
        }
        model
    };
    let batch: LmBatch<A> = LmBatcher::new(24).batch(chat_items()[..4].to_vec(), &device);
    // The first adapter's A gradient after one backward, the backend's draws seeded alike.
    let gradient = |model: &CausalLm<A>| {
        A::seed(&device, 5);
        let grads = model.forward_masked(batch.clone()).loss.backward();
        let mut model = model.clone();
        let (_, _, proj) = model.projections_mut().remove(0);
        let a = proj.lora.as_ref().unwrap().a.clone();
        a.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap()
    };
    let (none, half) = (model(0.0), model(0.5));
    assert_eq!(gradient(&none), gradient(&none));
    assert_ne!(
        gradient(&none),
        gradient(&half),
        "dropout changed no gradient"
    );
    // Without autodiff (inference, evaluation) nothing is dropped.
    let logits = |model: CausalLm<A>| {
        let inputs = LmBatcher::new(24)
            .batch(chat_items()[..4].to_vec(), &device)
            .inputs;
        let out: burn::tensor::Tensor<B, 3> = model.valid().forward(inputs);
        out.into_data().to_vec::<f32>().unwrap()
    };
    assert_eq!(logits(none), logits(half));
}

/// Every adapter value of `model`, in order.
fn adapter_values(model: &CausalLm<B>) -> Vec<f32> {
    let mut model = model.clone();
    model
        .projections_mut()
        .into_iter()
        .filter_map(|(_, _, proj)| proj.lora.as_ref())
        .flat_map(|a| {
            let mut v = a.a.val().into_data().to_vec::<f32>().unwrap();
            v.extend(a.b.val().into_data().to_vec::<f32>().unwrap());
            v
        })
        .collect()
}

#[test]
fn activation_checkpointing_trains_the_same_adapters_under_single_ddp_and_tensor() {
    let (_, base) = load::<A>(&fixture("llama"), &Default::default()).unwrap();
    let start = adapted(base);
    let recomputed = start.clone().with_gradient_checkpointing(true);
    for (strategy, world, precision) in [
        (StrategyKind::Single, 1, Precision::F32),
        (StrategyKind::Ddp, 2, Precision::F32),
        (StrategyKind::Tensor, 2, Precision::F32),
        (StrategyKind::Single, 1, Precision::Bf16),
    ] {
        let run = |model: &CausalLm<A>| train_in(model, strategy, world, 3, precision).unwrap();
        let ((plain, plain_losses), (kept, kept_losses)) = (run(&start), run(&recomputed));
        let (a, b) = (adapter_values(&plain), adapter_values(&kept));
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst <= 1e-6,
            "{strategy:?} {precision:?}: adapters differ by {worst}"
        );
        assert_eq!(plain_losses.len(), kept_losses.len());
        for (x, y) in plain_losses.iter().zip(&kept_losses) {
            assert!(
                (x - y).abs() <= 1e-6,
                "{strategy:?} {precision:?}: {x} vs {y}"
            );
        }
        assert_ne!(a, adapter_values(&start.valid()), "nothing trained");
    }
}

/// Packed rows train alike under every strategy, with and without recomputed activations: Ddp
/// splits the rows between ranks, pipeline stages each read where the examples begin from the
/// micro-batch, `tensor` splits the heads between shards, and each keeps a row's examples apart.
#[test]
fn packed_rows_train_the_same_adapters_under_every_strategy_and_checkpointing() {
    // The fixture twice: a step takes 16 rows.
    let items = [items(Packing::Bfd), items(Packing::Bfd)].concat();
    assert!(items.len() >= 16 && items.iter().any(|i| i.examples() > 1));
    let (_, base) = load::<A>(&fixture("llama"), &Default::default()).unwrap();
    let start = adapted(base);
    let run = |model: &CausalLm<A>, strategy, world| {
        train_on(items.clone(), model, strategy, world, 3, Precision::F32).unwrap()
    };
    let (single, losses) = run(&start, StrategyKind::Single, 1);
    assert_only_adapters_trained(&start.valid(), &single);
    assert_same(&single, &run(&start, StrategyKind::Ddp, 2).0, "ddp");
    assert_same(
        &single,
        &run(&start, StrategyKind::Pipeline, 2).0,
        "pipeline",
    );
    assert_same(&single, &run(&start, StrategyKind::Tensor, 2).0, "tensor");
    let staged = run(&start, StrategyKind::Tensor, 4).0;
    assert_same(&single, &staged, "tensor in 2 stages");
    // Three stages of a three-layer model: the middle one loads the micro-batch for its
    // context alone.
    let mut config = load_config(&fixture("llama")).unwrap();
    config.num_hidden_layers = 3;
    let deep = adapted(config.init::<A>(&Default::default()));
    let (deep_single, _) = run(&deep, StrategyKind::Single, 1);
    let deep_staged = run(&deep, StrategyKind::Pipeline, 3).0;
    assert_same(&deep_single, &deep_staged, "pipeline in 3 stages");
    let recomputed = start.clone().with_gradient_checkpointing(true);
    let (kept, kept_losses) = run(&recomputed, StrategyKind::Single, 1);
    let worst = adapter_values(&single)
        .iter()
        .zip(adapter_values(&kept))
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1e-6, "checkpointed: adapters differ by {worst}");
    for (x, y) in losses.iter().zip(&kept_losses) {
        assert!((x - y).abs() <= 1e-6, "checkpointed: {x} vs {y}");
    }
}
