//! The workload and the cluster `kiln plan`'s flags describe.

use kiln_core::optim::Precision;
use kiln_core::plan::cost::{
    Cluster, PRESETS, Preset, TransformerShape, Workload, parse_bytes, parse_limits,
};
use kiln_nn::llm::LlmConfig;

use super::PlanArgs;

/// A description `kiln plan` cannot use.
#[derive(Debug, thiserror::Error)]
pub enum DescribeError {
    /// No model, or half of one.
    #[error(
        "describe the model: --model-config PATH, or --layers --hidden --heads --seq --vocab \
         (a transformer), or --params --flops-per-sample --activation-bytes-per-sample --layers \
         (totals); missing: {0}"
    )]
    Model(String),
    /// The Hugging Face config.
    #[error("{0}")]
    Config(#[from] kiln_nn::llm::LlmError),
    /// A device kind `--device` does not know.
    #[error(
        "unknown --device {name}: use one of {known}, and override its figures with \
             --device-memory, --device-tflops, --intra-node-gbps, --inter-node-gbps"
    )]
    Device {
        /// What was given.
        name: String,
        /// What is known.
        known: String,
    },
    /// A number that cannot be.
    #[error("{0}")]
    Value(String),
}

/// The model's name and what a step of it asks.
pub fn workload(args: &PlanArgs) -> Result<(String, Workload), DescribeError> {
    let precision: Precision = args.precision.into();
    if let Some(path) = &args.model_config {
        // A config file, a model folder, or a Hub name in the Hugging Face cache.
        let file = match path.is_file() {
            true => path.clone(),
            false => crate::hub::resolve(path)?.join("config.json"),
        };
        let config = LlmConfig::from_file(&file)?;
        let shape = TransformerShape {
            layers: config.num_hidden_layers,
            hidden: config.hidden_size,
            heads: config.num_attention_heads,
            kv_heads: config.num_key_value_heads,
            head_dim: config.head_dim,
            qkv_bias: config.qkv_bias,
            o_bias: config.o_bias,
            ffn: config.intermediate_size,
            seq: args.seq.unwrap_or(config.max_position_embeddings),
            vocab: config.vocab_size,
            gated: true,
            tied: config.tie_word_embeddings,
        };
        let name = format!("{} ({})", file.display(), config.model_type);
        shape
            .check()
            .map_err(|e| DescribeError::Value(format!("--seq: {e}")))?;
        return Ok((name, of_shape(args, &shape)?));
    }
    if let Some(params) = args.params {
        if args.lora_rank.is_some() || args.load_in_4bit {
            return Err(DescribeError::Value(
                "--lora-rank and --load-in-4bit need the model's shape (--model-config, or \
                 --layers --hidden ...), not its totals"
                    .into(),
            ));
        }
        let missing = [
            ("--flops-per-sample", args.flops_per_sample.is_none()),
            (
                "--activation-bytes-per-sample",
                args.activation_bytes_per_sample.is_none(),
            ),
            ("--layers", args.layers.is_none()),
        ];
        check_missing(&missing)?;
        let layers = positive("--layers", args.layers.unwrap_or(0))?;
        let activations = args.activation_bytes_per_sample.unwrap_or(0.0);
        let flops = args.flops_per_sample.unwrap_or(0.0);
        for (flag, value) in [
            ("--flops-per-sample", flops),
            ("--activation-bytes-per-sample", activations),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(DescribeError::Value(format!(
                    "{flag} {value} must be a finite number of at least 0"
                )));
            }
        }
        let name = format!("{params} parameters");
        return Ok((
            name,
            Workload {
                params,
                trainable: params,
                // Totals say nothing of where the parameters sit: spread over the blocks.
                embedding_params: 0,
                head_params: 0,
                weight_bytes: precision.weight_bytes(),
                trainable_extra_bytes: precision.trainable_extra_bytes(),
                gradient_bytes: precision.gradient_bytes(),
                activation_bytes: precision.activation_bytes(),
                forward_flops: flops,
                head_flops: 0.0,
                backward_passes: 2.0,
                layers,
                // Totals say nothing of a block's shape: no sharding, no stage traffic.
                block_activation_bytes: vec![activations / layers as f64],
                shardable: 1,
                head_activation_bytes: 0.0,
                boundary_bytes: 0.0,
                tp_bytes: 0.0,
                global_batch: batch(args)?,
                fixed_bytes: 0.0,
                stage_activation_scale: 1.0,
                // Totals say nothing of the model's blocks: no recomputation without stages.
                recomputes_blocks: false,
            },
        ));
    }
    let missing = [
        ("--layers", args.layers.is_none()),
        ("--hidden", args.hidden.is_none()),
        ("--heads", args.heads.is_none()),
        ("--seq", args.seq.is_none()),
        ("--vocab", args.vocab.is_none()),
    ];
    check_missing(&missing)?;
    let hidden = positive("--hidden", args.hidden.unwrap_or(0))?;
    let heads = positive("--heads", args.heads.unwrap_or(0))?;
    let kv_heads = positive("--kv-heads", args.kv_heads.unwrap_or(heads))?;
    if !heads.is_multiple_of(kv_heads) || !hidden.is_multiple_of(heads) {
        return Err(DescribeError::Value(format!(
            "--hidden {hidden}, --heads {heads}, --kv-heads {kv_heads}: the heads must divide \
             the width, and the key-value heads the heads"
        )));
    }
    let shape = TransformerShape {
        layers: positive("--layers", args.layers.unwrap_or(0))?,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        qkv_bias: false,
        o_bias: false,
        ffn: positive("--ffn", args.ffn.unwrap_or(hidden.saturating_mul(4)))?,
        seq: positive("--seq", args.seq.unwrap_or(0))?,
        vocab: positive("--vocab", args.vocab.unwrap_or(0))?,
        gated: args.gated,
        tied: args.tied,
    };
    shape
        .check()
        .map_err(|e| DescribeError::Value(format!("--{e}").replace("_", "-")))?;
    let name = format!(
        "a transformer of {} blocks, width {hidden}, {heads} heads",
        shape.layers
    );
    Ok((name, of_shape(args, &shape)?))
}

/// Training all of `shape`, or its LoRA adapters over a (4-bit) frozen base, as `kiln
/// finetune` trains Kiln's LLM of that shape (which may recompute one block at a time).
fn of_shape(args: &PlanArgs, shape: &TransformerShape) -> Result<Workload, DescribeError> {
    of_shape_as_trained(args, shape).map(Workload::as_llm)
}

fn of_shape_as_trained(
    args: &PlanArgs,
    shape: &TransformerShape,
) -> Result<Workload, DescribeError> {
    let (precision, batch) = (args.precision.into(), batch(args)?);
    match (args.lora_rank, args.load_in_4bit) {
        (None, false) => Ok(Workload::transformer(shape, precision, batch)),
        (None, true) => Err(DescribeError::Value(
            "--load-in-4bit freezes the base, which then trains through adapters: add \
             --lora-rank"
                .into(),
        )),
        (Some(rank), four_bit) => {
            // A rank beyond the narrowest projection adds nothing a full update would not.
            let narrowest = shape
                .hidden
                .min(shape.ffn)
                .min(shape.kv_heads * shape.head_dim);
            if rank > narrowest {
                return Err(DescribeError::Value(format!(
                    "--lora-rank {rank} is larger than the narrowest projection ({narrowest}) \
                     can use"
                )));
            }
            Ok(Workload::lora(
                shape,
                precision,
                batch,
                positive("--lora-rank", rank)?,
                four_bit,
            ))
        }
    }
}

fn check_missing(flags: &[(&str, bool)]) -> Result<(), DescribeError> {
    let missing: Vec<&str> = flags.iter().filter(|(_, m)| *m).map(|(f, _)| *f).collect();
    match missing.is_empty() {
        true => Ok(()),
        false => Err(DescribeError::Model(missing.join(", "))),
    }
}

fn positive(flag: &str, value: usize) -> Result<usize, DescribeError> {
    match value {
        0 => Err(DescribeError::Value(format!("{flag} must be at least 1"))),
        v => Ok(v),
    }
}

fn batch(args: &PlanArgs) -> Result<usize, DescribeError> {
    at_most(
        "--global-batch",
        positive("--global-batch", args.global_batch)?,
        1 << 22,
    )
}

/// `value`, unless it is beyond `max`, the largest the planner takes.
fn at_most(flag: &str, value: usize, max: usize) -> Result<usize, DescribeError> {
    match value <= max {
        true => Ok(value),
        false => Err(DescribeError::Value(format!(
            "{flag} {value} is beyond {max}, the largest the planner takes"
        ))),
    }
}

/// `--max-memory` and `--memory-margin` written into `cluster`.
///
/// # Errors
/// What is wrong with either, in words.
pub fn limit(cluster: &mut Cluster, args: &PlanArgs) -> Result<(), String> {
    if let Some(limits) = &args.max_memory {
        cluster.max_memory = parse_limits(limits)?;
    }
    if let Some(margin) = &args.memory_margin {
        cluster.margin = Some(parse_bytes(margin)?);
    }
    Ok(())
}

/// The devices the flags describe: a preset, with any figure overridden.
pub fn cluster(args: &PlanArgs) -> Result<Cluster, DescribeError> {
    let preset = Preset::named(&args.device).ok_or_else(|| DescribeError::Device {
        name: args.device.clone(),
        known: PRESETS.map(|p| p.name).join(", "),
    })?;
    // Each device's memory, where they are listed one by one.
    let listed = match &args.device_memory {
        Some(text) if text.contains(',') => Some(
            text.split(',')
                .map(|size| parse_bytes(size).map_err(DescribeError::Value))
                .collect::<Result<Vec<u64>, _>>()?,
        ),
        _ => None,
    };
    // As many as the planner's search goes to (`kiln_core::plan::cost`).
    let devices = at_most(
        "--devices",
        positive(
            "--devices",
            args.devices.or(listed.as_ref().map(Vec::len)).unwrap_or(8),
        )?,
        1 << 20,
    )?;
    let per_node = positive(
        "--gpus-per-node",
        args.gpus_per_node.unwrap_or(devices.min(8)),
    )?;
    if !(args.efficiency > 0.0 && args.efficiency <= 1.0) {
        return Err(DescribeError::Value(format!(
            "--efficiency {} is a share of the peak: give a number in (0, 1]",
            args.efficiency
        )));
    }
    let mut cluster = preset.cluster(devices, per_node, args.efficiency);
    match (&listed, &args.device_memory) {
        (Some(each), _) => {
            // The largest, for the line that describes the devices; each its own for the plan.
            cluster.memory = each.iter().copied().max().unwrap_or(cluster.memory);
            cluster.device_memory = each.clone();
        }
        (None, Some(memory)) => {
            cluster.memory = parse_bytes(memory).map_err(DescribeError::Value)?;
        }
        (None, None) => {}
    }
    // Checked against the devices by the search (`Cluster::check_limits`), before any layout.
    limit(&mut cluster, args).map_err(DescribeError::Value)?;
    let rate = |flag: &str, value: Option<f64>, unit: f64, current: f64| match value {
        Some(v) if v > 0.0 => Ok(v * unit),
        Some(v) => Err(DescribeError::Value(format!("{flag} {v} must be positive"))),
        None => Ok(current),
    };
    cluster.peak_flops = rate(
        "--device-tflops",
        args.device_tflops,
        1e12,
        cluster.peak_flops,
    )?;
    cluster.intra_bandwidth = rate(
        "--intra-node-gbps",
        args.intra_node_gbps,
        1e9,
        cluster.intra_bandwidth,
    )?;
    cluster.inter_bandwidth = rate(
        "--inter-node-gbps",
        args.inter_node_gbps,
        1e9,
        cluster.inter_bandwidth,
    )?;
    Ok(cluster)
}
