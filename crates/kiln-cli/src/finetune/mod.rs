//! `kiln finetune`: LoRA or QLoRA fine-tuning of a Hugging Face model folder on a data file
//! (JSON Lines, JSON or Parquet; text, prompt-completion or conversations through the model's
//! chat template), through any replicating strategy, the adapters written in PEFT's layout.

mod args;
mod config;
mod eval;
mod hooks;
mod inputs;
mod log;
mod plot;
mod report;

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::time::Instant;

use burn::data::dataset::InMemDataset;
use burn::module::AutodiffModule;
use burn::tensor::backend::AutodiffBackend;
use indicatif::{ProgressBar, ProgressStyle};
use kiln_core::checkpoint::{RunInfo, Saver};
use kiln_core::data::DataSource;
use kiln_core::fit::{Resume, Training, fit};
use kiln_core::plan::Plan;
use kiln_core::strategy::{PerformanceSpec, StepOutput};
use kiln_nn::llm::{
    CausalLm, DataSet, Example, LlmTokenizer, LmBatcher, LoraAdapters, Packing, TokenizeOptions,
    TrainOn, load, load_4bit, load_config, tokenize,
};
use kiln_nn::tensor_parallel::ShardedBackend;

pub use args::FinetuneArgs;
pub use config::{CONFIG_FILE, FinetuneConfig, FinetuneConfigError, MergedDtype};
use eval::Evaluator;
use hooks::{RunSaves, write_log};
use log::{RunLog, StepRecord};
use report::FinetuneReport;

use crate::backend::{Job, dispatch};
use crate::checkpoint_args::RunCheckpoints;
use crate::launched::Launched;
use crate::signals::{Interrupted, Saved, Signals};

/// Runs `kiln finetune`.
///
/// # Errors
/// Invalid flags, config, model folder or data, or a failure while training.
pub fn run(args: FinetuneArgs) -> Result<(), Box<dyn std::error::Error>> {
    let launched = Launched::from_env()?;
    let (mut config, plan, reports, checkpoints) = args.into_config(&launched)?;
    // What the run writes (adapters, checkpoints, the merged model, the report), the first
    // process writes alone; the others train beside it.
    let main = launched.is_main();
    let json = reports.json.clone().filter(|_| main);
    let (log_file, svg) = match main {
        true => (reports.log_file.clone(), reports.svg.clone()),
        false => (None, None),
    };
    let placement = config.train.placement(&plan)?;
    config
        .train
        .backend
        .check_precision(config.train.optimizer.precision)?;
    // Everything the run reads and writes is checked before the model loads. A Hub name is
    // the Hugging Face cache's snapshot of it.
    let dir = crate::hub::resolve(config.model_dir()?)?;
    let dir = dir.as_path();
    let llm = load_config(dir)?;
    config.fit_model(&llm)?;
    // Held until the run ends: a second run given the same paths is refused now.
    let mut _claims = crate::outputs::check_files(&[
        ("--json", json.as_deref()),
        ("--log-file", log_file.as_deref()),
        ("--svg", svg.as_deref()),
    ])?;
    if main {
        _claims.push(crate::outputs::check_folder("--out", &config.output)?);
    }
    if let Some(merged) = config.merged.as_ref().filter(|_| main) {
        let same = |a: &std::path::Path, b: &std::path::Path| {
            a.canonicalize()
                .ok()
                .zip(b.canonicalize().ok())
                .is_some_and(|(a, b)| a == b)
        };
        if same(merged, dir) {
            return Err(FinetuneConfigError::MergedIntoBase(merged.clone()).into());
        }
        // `--out` is claimed (and so exists) by now.
        if same(merged, &config.output) {
            return Err(FinetuneConfigError::MergedIntoAdapters(merged.clone()).into());
        }
        _claims.push(crate::outputs::check_folder("--merged", merged)?);
    }
    // The checkpoint is read and verified before the data is: a damaged or foreign one is
    // reported at once.
    let opened = checkpoints
        .args
        .resume
        .as_deref()
        .map(kiln_core::checkpoint::Checkpoint::open)
        .transpose()?;
    if let Some(checkpoint) = &opened {
        config.check_resumed(checkpoint)?;
    }
    let mut tokenizer = LlmTokenizer::from_dir(dir, &llm)?;
    if let Some(template) = &config.chat_template {
        tokenizer = tokenizer.with_chat_template(template)?;
    }
    let data = config.data_file()?.to_path_buf();
    let data = data.as_path();
    let examples = DataSet::read(data, config.data_format)?;
    let (examples, held_out) = match (&config.eval.data, config.eval.split) {
        (Some(path), _) => (examples, Some(DataSet::read(path, config.data_format)?)),
        (None, Some(fraction)) => {
            let (train, held_out) = examples.split_off(fraction, config.train.seed)?;
            (train, Some(held_out))
        }
        (None, None) => (examples, None),
    };
    let options = TokenizeOptions {
        seq_len: config.seq_len(),
        packing: config.packing,
        train_on: config.train_on,
    };
    let tokenized = tokenize(&examples, &tokenizer, options)?;
    // Held-out examples are evaluated one a sequence, whatever the training packs: packed,
    // an example's loss would depend on its neighbours.
    let eval_items = match &held_out {
        Some(held_out) => Some(eval_items(held_out, &tokenizer, options, &config)?),
        None => None,
    };
    let conversations = examples
        .examples()
        .iter()
        .filter(|e| matches!(e, Example::Conversation { .. }))
        .count();
    if let Some(template) = tokenizer.chat_template().filter(|_| conversations > 0) {
        tracing::info!(
            "{conversations} conversations rendered with the chat template of {}, {}",
            template.path().display(),
            match config.train_on {
                TrainOn::Completion => "their assistant turns trained",
                TrainOn::All => "every token trained",
            }
        );
    }
    if tokenized.truncated > 0 {
        tracing::warn!(
            "{} of {} examples are longer than --seq-len {} and were cut; raise --seq-len to \
             train their ends",
            tokenized.truncated,
            examples.len(),
            config.seq_len()
        );
    }
    tracing::info!(
        "{} examples -> {} sequences of at most {} tokens ({:.1} on average, {}), {} tokens \
         trained",
        examples.len(),
        tokenized.items.len(),
        config.seq_len(),
        tokenized.tokens as f64 / tokenized.items.len().max(1) as f64,
        match config.packing {
            Packing::Pad => "each batch padded to its longest",
            Packing::Bfd => "whole examples packed best-fit, each attending only to itself",
            Packing::Wrapped => "the examples' stream cut into full sequences",
        },
        tokenized.trained_tokens
    );
    if let Some(steps) = config.steps_for(tokenized.items.len()) {
        config.train.steps = steps;
        tracing::info!(
            "{} epochs of {} sequences, {} per step: {steps} steps",
            config.epochs.unwrap_or_default(),
            tokenized.items.len(),
            config.train.batch
        );
    }
    let schedule = config.train.schedule();
    if schedule != kiln_core::optim::LrSchedule::default() {
        tracing::info!(
            "learning rate: {} warm-up steps to {}, then {}",
            schedule.warmup(config.train.steps),
            config.train.lr,
            schedule.decay
        );
    }
    // Installed before anything is written, so a signal from then on stops the run cleanly.
    let signals = Signals::install()?;
    let prepared = RunCheckpoints::prepare(
        &checkpoints.args,
        opened,
        checkpoints.save.as_deref().map(|dir| ("--save", dir)),
        &config.checkpoint,
        Some(&plan),
        config.train.steps,
        launched.is_main(),
    )?;
    // Digested only when a checkpoint records or checks them.
    let mut digests = match prepared.resume.is_some() || prepared.save.is_some() {
        true => Some(inputs::Inputs::digest(
            data,
            dir,
            config.chat_template.as_deref(),
        )?),
        false => None,
    };
    if let Some(resumed) = &prepared.resume {
        let current = digests.as_mut().map(inputs::Inputs::get).transpose()?;
        resumed.check_inputs(&current.unwrap_or_default())?;
    }
    // Opened now, before the model loads: a log that cannot be written is said at once.
    let run_log = log_file
        .as_deref()
        .map(|path| {
            let first = prepared.resume.as_ref().map_or(0, |c| c.step());
            RunLog::open(path, reports.log_every, first)
                .map_err(|e| crate::outputs::refuse("--log-file", path, e))
        })
        .transpose()?;
    let job = FinetuneJob {
        config: &config,
        model_dir: dir.to_path_buf(),
        plan: &plan,
        eval_items,
        run_log,
        svg,
        tokens_per_sequence: tokenized.tokens as f64 / tokenized.items.len().max(1) as f64,
        items: tokenized.items,
        checkpoints: prepared,
        signals: &signals,
        main,
        digests,
    };
    let report = dispatch(config.train.backend, &placement, job)?;
    if !main {
        return Ok(());
    }
    let resumed = report
        .resumed_from
        .map(|step| format!(" (resumed at step {step})"))
        .unwrap_or_default();
    println!(
        "fine-tuned {} with {} on {} rank(s): {} steps of {} sequences{resumed}, loss {:.4} -> \
         {:.4}, {:.0} tokens/s, peak host memory {}",
        report.model,
        report.strategy,
        report.world,
        report.steps,
        report.global_batch,
        report.first_loss,
        report.final_loss,
        report.tokens_per_s,
        report.peak_host_bytes.map_or_else(
            || "unknown".into(),
            |b| format!("{:.0} MiB", b as f64 / 1048576.0)
        ),
    );
    if let (Some(last), Some(best)) = (report.evals.last(), report.best_eval) {
        println!(
            "eval loss {:.4} (perplexity {:.2}) after step {}; the lowest, {:.4}, after step {}{}",
            last.loss,
            last.perplexity,
            last.step,
            best.loss,
            best.step,
            report
                .best_checkpoint
                .as_ref()
                .map(|dir| format!(", kept in {dir}"))
                .unwrap_or_default()
        );
    }
    match report.full {
        true => println!("model saved in {} (a Hugging Face folder)", report.adapters),
        false => println!("adapters saved in {} (PEFT layout)", report.adapters),
    }
    if let Some(saved) = &report.saved {
        println!("checkpoint saved in {saved}");
    }
    if let Some(merged) = &report.merged {
        println!("merged model saved in {merged}");
    }
    if let Some(path) = json {
        crate::outputs::write(
            "--json",
            &path,
            serde_json::to_string_pretty(&report)?.as_bytes(),
        )?;
    }
    Ok(())
}

/// The held-out examples tokenised for evaluation, each alone in its sequence, and a line
/// saying what the run evaluates.
fn eval_items(
    held_out: &DataSet,
    tokenizer: &LlmTokenizer,
    options: TokenizeOptions,
    config: &FinetuneConfig,
) -> Result<Vec<kiln_nn::llm::LmItem>, Box<dyn std::error::Error>> {
    let tokenized = tokenize(
        held_out,
        tokenizer,
        TokenizeOptions {
            packing: Packing::Pad,
            ..options
        },
    )?;
    let source = match (&config.eval.data, config.eval.split) {
        (Some(path), _) => path.display().to_string(),
        (_, fraction) => format!(
            "{:.0} % of --data, drawn with seed {}",
            100.0 * fraction.unwrap_or_default(),
            config.train.seed
        ),
    };
    tracing::info!(
        "evaluating on {} held-out examples ({source}; {} targets{}){} at every checkpoint \
         and at the end",
        held_out.len(),
        tokenized.trained_tokens,
        match tokenized.truncated {
            0 => String::new(),
            n => format!(", {n} cut to --seq-len"),
        },
        config
            .eval
            .every
            .map(|n| format!(" every {n} steps,"))
            .unwrap_or_default(),
    );
    Ok(tokenized.items)
}

/// `kiln finetune` on whichever backend was chosen.
struct FinetuneJob<'a> {
    config: &'a FinetuneConfig,
    /// The model folder (a Hub name resolved to the cache's snapshot).
    model_dir: PathBuf,
    plan: &'a Plan,
    /// The held-out sequences, when the run evaluates.
    eval_items: Option<Vec<kiln_nn::llm::LmItem>>,
    /// `--log-file`, open (the first process only).
    run_log: Option<RunLog>,
    /// `--svg` (the first process only).
    svg: Option<PathBuf>,
    items: Vec<kiln_nn::llm::LmItem>,
    /// Input tokens per sequence on average, pads not counted: what tokens/s counts.
    tokens_per_sequence: f64,
    checkpoints: RunCheckpoints,
    signals: &'a Signals,
    /// Whether this process writes the run (the first of its processes).
    main: bool,
    /// The inputs' digests, when a checkpoint records them.
    digests: Option<inputs::Inputs>,
}

/// What a fine-tuning checkpoint's manifest calls its model: the adapters alone.
const KIND: &str = "llm-lora-adapters";
/// What a checkpoint of full fine-tuning holds: the whole model.
const FULL_KIND: &str = "llm-full";

impl Job for FinetuneJob<'_> {
    type Output = FinetuneReport;

    fn run<B: AutodiffBackend<InnerBackend: ShardedBackend> + ShardedBackend>(
        self,
        devices: Vec<B::Device>,
    ) -> Result<FinetuneReport, Box<dyn std::error::Error>> {
        let FinetuneJob {
            config,
            model_dir,
            plan,
            eval_items,
            run_log,
            svg,
            items,
            tokens_per_sequence,
            checkpoints,
            signals,
            main,
            mut digests,
        } = self;
        let train = &config.train;
        let dir = model_dir.as_path();
        B::seed(&devices[0], train.seed);
        let loading = Instant::now();
        let (llm, base) = if config.load_in_4bit {
            load_4bit::<B>(dir, &devices[0], &config.quant)?
        } else {
            load::<B>(dir, &devices[0])?
        };
        let spec = config.lora.spec();
        let model = match config.full {
            // Every weight as loaded trains: Burn's parameters are trainable unless frozen.
            true => base,
            false => base.with_lora(&spec)?,
        }
        .with_gradient_checkpointing(config.gradient_checkpointing);
        if config.full {
            tracing::info!(
                "full fine-tuning: every weight trains ({} parameters), no adapters; --out \
                 receives the whole model",
                llm.parameters()
            );
        }
        if config.gradient_checkpointing {
            tracing::info!(
                "activation checkpointing: each decoder layer keeps its input alone and \
                 recomputes its activations in the backward"
            );
        }
        let (model, resume) = match &checkpoints.resume {
            Some(checkpoint) => {
                let model = match config.full {
                    true => checkpoint.model(FULL_KIND, model, &devices[0])?,
                    false => {
                        let adapters = checkpoint.model(KIND, model.adapters(), &devices[0])?;
                        model.with_adapters(adapters)?
                    }
                };
                let resume = Resume {
                    step: checkpoint.step(),
                    optimizer: checkpoint.optimizer(plan)?,
                };
                tracing::info!("resuming from {}", checkpoint.dir().display());
                (model, Some(resume))
            }
            None => (model, None),
        };
        let mut saver = match checkpoints.save {
            Some(folder) => {
                let run = RunInfo::of(plan, "adamw", train.optimizer.precision);
                let text = toml::to_string_pretty(config)?;
                // The model has loaded meanwhile; the digests are done or nearly.
                let inputs = digests
                    .as_mut()
                    .map(inputs::Inputs::get)
                    .transpose()?
                    .unwrap_or_default();
                Some(
                    Saver::new(folder, if config.full { FULL_KIND } else { KIND }, run)
                        .with_file(CONFIG_FILE, text.into_bytes())
                        .with_inputs(inputs),
                )
            }
            None => None,
        };
        tracing::info!(
            "loaded {} ({} parameters{}) in {:.1} s",
            dir.display(),
            llm.parameters(),
            if config.load_in_4bit {
                ", projections in 4 bits"
            } else {
                ""
            },
            loading.elapsed().as_secs_f64()
        );
        let stop = || signals.stop_requested();
        let lengths: Option<Vec<usize>> = config
            .group_by_length
            .then(|| items.iter().map(|item| item.trained.len()).collect());
        if lengths.is_some() {
            tracing::info!("batches grouped by length: examples of similar lengths train together");
        }
        let training = Training {
            steps: train.steps,
            seed: train.seed,
            lr: &|step| train.lr_at(step),
            resume: resume.as_ref(),
            keep_optimizer_state: saver.is_some(),
            save_every: checkpoints.every,
            lengths: lengths.as_deref(),
            eval_every: config.eval.every,
            stop: Some(&stop),
        };
        let tokens_per_step = train.batch as f64 * tokens_per_sequence;
        let bar = if main {
            ProgressBar::new(train.steps as u64)
        } else {
            ProgressBar::hidden()
        }
        .with_style(
            ProgressStyle::with_template("{bar:40} {pos}/{len} steps  {msg}  [{elapsed}<{eta}]")
                .expect("valid template"),
        );
        let first = training.first_step();
        bar.set_position(first as u64);
        let started = Instant::now();
        // The last eval loss, shown beside the training loss until the next evaluation.
        let last_eval: Cell<Option<f64>> = Cell::new(None);
        let run_log = RefCell::new(run_log);
        let on_step = |step: usize, out: &StepOutput| {
            let done = (step - first) as f64;
            let rate = tokens_per_step * done / started.elapsed().as_secs_f64();
            let eval = last_eval
                .get()
                .map(|loss| format!("  eval {loss:.4}"))
                .unwrap_or_default();
            bar.set_message(format!("loss {:.4}{eval}  {rate:.0} tokens/s", out.loss));
            bar.inc(1);
            tracing::debug!("step {step}: loss {:.6}", out.loss);
            let record = StepRecord {
                step,
                loss: out.loss,
                lr: train.lr_at(step - 1),
                grad_norm: out.guard.map(|g| g.grad_norm),
                tokens_per_s: rate,
            };
            write_log(&run_log, |log| log.step(record, step == train.steps));
        };
        // Only the first process evaluates: it is the one that saves and reports.
        let mut evaluator = eval_items
            .as_deref()
            .filter(|_| main)
            .map(|items| Evaluator::new(items, train.batch, config.seq_len()));
        let eval_device = devices[0].clone();
        let mut hooks = RunSaves {
            on_step,
            full: config.full,
            saver: saver.as_mut(),
            eval: evaluator.as_mut().map(|e| (e, &eval_device, &last_eval)),
            run_log: &run_log,
        };
        let spec_optim = PerformanceSpec::new(train.adamw(), train.optimizer.clone())?;
        let data = DataSource::new(InMemDataset::new(items), LmBatcher::new(config.seq_len()));
        let (trained, record) = fit(
            plan,
            &training,
            devices,
            model,
            &spec_optim,
            data,
            &mut hooks,
        )?;
        bar.finish_and_clear();
        // The end is evaluated unless the run was stopped early: a stopped run exits at once.
        if let Some(evaluator) = evaluator.as_mut().filter(|_| !record.stopped) {
            let point = evaluator.evaluate(record.last_step, &trained, &eval_device);
            if let Some(saver) = saver.as_mut() {
                saver.record_eval(point.step, point.loss);
            }
            write_log(&run_log, |log| log.eval(&point));
        }
        if let Some(path) = &svg {
            let evals = evaluator
                .as_ref()
                .map(Evaluator::points)
                .unwrap_or_default();
            plot::write_svg(path, record.first_step, &record.losses, evals)
                .map_err(|e| crate::outputs::refuse("--svg", path, e))?;
        }
        let saved = match (saver.as_mut(), config.full) {
            (Some(saver), true) => record.save_end::<B, CausalLm<B>>(saver, trained.clone())?,
            (Some(saver), false) => {
                record.save_end::<B, LoraAdapters<B>>(saver, trained.adapters())?
            }
            (None, _) => None,
        };
        let trained = trained.valid();
        // As the user named it: a Hub name is what PEFT and the Hub expect here.
        let base_name = config.model_dir()?.display().to_string();
        if main {
            match config.full {
                // With the base's config and tokenizer files: the folder is complete.
                true => trained.save_pretrained_as(
                    &config.output,
                    dir,
                    config.merged_dtype.resolve(dir)?,
                )?,
                false => trained.save_peft(&config.output, &spec, &base_name)?,
            }
        }
        if record.stopped {
            return Err(Box::new(Interrupted {
                signal: signals.signal().unwrap_or(signal_hook::consts::SIGINT),
                step: record.last_step,
                steps: train.steps,
                saved: Some(
                    match saved.zip(saver.as_ref().map(|s| s.folder().root().to_path_buf())) {
                        _ if !main => Saved::ByFirstProcess,
                        Some((dir, root)) => Saved::Checkpoint(dir, root),
                        None if config.full => Saved::Model(config.output.clone()),
                        None => Saved::Adapters(config.output.clone()),
                    },
                ),
            }));
        }
        if let Some(merged) = config.merged.as_ref().filter(|_| main) {
            // With the tokenizer: the folder is complete.
            trained.save_pretrained_as(merged, dir, config.merged_dtype.resolve(dir)?)?;
        }
        let steps = record.losses.len();
        Ok(FinetuneReport {
            model: base_name,
            strategy: plan.strategy().to_string(),
            world: plan.world_size(),
            backend: train.backend.to_string(),
            load_in_4bit: config.load_in_4bit,
            full: config.full,
            steps,
            resumed_from: resume.as_ref().map(|r| r.step),
            saved: saved.as_deref().map(|dir| dir.display().to_string()),
            global_batch: train.batch,
            seq_len: config.seq_len(),
            first_loss: record.losses.first().copied().unwrap_or(f64::NAN),
            final_loss: record.losses.last().copied().unwrap_or(f64::NAN),
            losses: record.losses.clone(),
            wall_s: record.wall_s,
            tokens_per_s: tokens_per_step * steps as f64 / record.wall_s.max(f64::MIN_POSITIVE),
            peak_host_bytes: kiln_bench::memory::peak_host_bytes(),
            ranks: record.ranks.clone(),
            adapters: config.output.display().to_string(),
            merged: config.merged.as_ref().map(|m| m.display().to_string()),
            evals: evaluator
                .as_ref()
                .map(|e| e.points().to_vec())
                .unwrap_or_default(),
            best_eval: evaluator.as_ref().and_then(Evaluator::best),
            best_checkpoint: match saver.as_ref() {
                Some(saver) => saver
                    .folder()
                    .best()?
                    .map(|(step, _)| saver.folder().step_dir(step).display().to_string()),
                None => None,
            },
        })
    }
}
