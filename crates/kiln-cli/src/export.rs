//! `kiln export`: a model out in the forms the rest of the ecosystem loads. `gguf` writes one
//! GGUF file for llama.cpp, Ollama and LM Studio; `merged` a Hugging Face folder with the
//! adapters folded in (what `kiln finetune --merged` writes at the end of a run).

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use kiln_nn::llm::{GgufType, export_gguf, load, load_config};

use crate::finetune::MergedDtype;

/// The forms `kiln export` writes.
#[derive(clap::Subcommand, Debug)]
pub enum ExportCommand {
    /// A model folder (merged with PEFT adapters when given) as one GGUF file with llama.cpp's
    /// names, metadata, tokenizer and chat template: LLaMA, Mistral, Qwen2 and Qwen3.
    Gguf(GgufArgs),
    /// A model folder with PEFT adapters merged into its weights, as a Hugging Face folder
    /// (the base's tokenizer and generation files beside it).
    Merged(MergedArgs),
}

/// Flags of `kiln export gguf`.
#[derive(clap::Args, Debug)]
pub struct GgufArgs {
    /// The Hugging Face model folder, or a Hub name (org/name[@revision]) in the Hugging Face
    /// cache.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// LoRA adapters in PEFT's layout (what kiln finetune writes), merged in first.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// The GGUF file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// The weights' type: f16, bf16, or q8_0 (8-bit blocks: half of f16's size). Norms and
    /// biases stay f32.
    #[arg(long = "type", value_enum, default_value_t = TypeArg::F16)]
    ty: TypeArg,
}

/// `--type`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TypeArg {
    F16,
    Bf16,
    #[value(name = "q8_0")]
    Q8_0,
}

/// Flags of `kiln export merged`.
#[derive(clap::Args, Debug)]
pub struct MergedArgs {
    /// The Hugging Face model folder the adapters were trained on, or a Hub name.
    #[arg(long, value_name = "DIR")]
    model: PathBuf,
    /// LoRA adapters in PEFT's layout to merge.
    #[arg(long, value_name = "DIR")]
    adapter: PathBuf,
    /// The folder to write.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The weights' dtype [default: auto, the base folder's].
    #[arg(long, value_enum, default_value_t = MergedDtype::Auto)]
    dtype: MergedDtype,
}

/// Runs `kiln export`.
///
/// # Errors
/// A model folder, adapter or output that cannot be used, before anything is written.
pub fn run(command: ExportCommand) -> Result<(), Box<dyn std::error::Error>> {
    match command {
        ExportCommand::Gguf(args) => gguf(args),
        ExportCommand::Merged(args) => merged(args),
    }
}

fn gguf(args: GgufArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_file("--out", &args.out)?;
    let dir = crate::hub::resolve(&args.model)?;
    let config = load_config(&dir)?;
    let ty = match args.ty {
        TypeArg::F16 => GgufType::F16,
        TypeArg::Bf16 => GgufType::Bf16,
        TypeArg::Q8_0 => GgufType::Q8_0,
    };
    if let Some(window) = config.sliding_window {
        tracing::warn!(
            "this {} attends within a sliding window of {window} tokens, which llama.cpp's \
             llama architecture does not apply: past {window} tokens of context it answers \
             otherwise than transformers and Kiln",
            config.model_type
        );
    }
    // Adapters are merged in f32 into a folder beside the file, converted once, and removed.
    // The folder takes the base's name, which the file records as the model's.
    let staged = match &args.adapter {
        Some(adapter) => {
            let scratch = kiln_core::output::folder_of(&args.out).join(format!(
                ".{}.merged",
                args.out.file_name().unwrap_or_default().to_string_lossy()
            ));
            let name = dir
                .canonicalize()?
                .file_name()
                .unwrap_or_default()
                .to_owned();
            let merged = merge(&dir, adapter, &scratch.join(name), burn::tensor::DType::F32);
            if merged.is_err() {
                std::fs::remove_dir_all(&scratch).ok();
            }
            Some((scratch, merged?))
        }
        None => None,
    };
    let source = staged.as_ref().map_or(dir.as_path(), |(_, merged)| merged);
    let exported = export_gguf(source, &args.out, ty);
    if let Some((scratch, _)) = &staged {
        std::fs::remove_dir_all(scratch).ok();
    }
    let report = exported?;
    tracing::info!(
        "wrote {} ({}, {} tensors in {ty}, {} tokens, {:.2} MB)",
        args.out.display(),
        report.architecture,
        report.tensors,
        report.tokens,
        report.bytes as f64 / 1e6
    );
    Ok(())
}

fn merged(args: MergedArgs) -> Result<(), Box<dyn std::error::Error>> {
    let _claim = crate::outputs::check_folder("--out", &args.out)?;
    let dir = crate::hub::resolve(&args.model)?;
    let dtype = args.dtype.resolve(&dir)?;
    merge(&dir, &args.adapter, &args.out, dtype)?;
    tracing::info!(
        "wrote {} ({dtype:?}): {} merged into {}",
        args.out.display(),
        args.adapter.display(),
        dir.display()
    );
    Ok(())
}

/// The model of `dir` with the adapters of `adapter` merged, written into `out` in `dtype`;
/// returns `out`.
fn merge(
    dir: &Path,
    adapter: &Path,
    out: &Path,
    dtype: burn::tensor::DType,
) -> Result<PathBuf, Box<dyn std::error::Error>> {
    kiln_nn::llm::check_peft_base(adapter, dir);
    let (_, model) = load::<Flex>(dir, &Default::default())?;
    let (model, _) = model.load_peft(adapter)?;
    // Merged in place, each base weight freed as its merged one is made: the model is held
    // in f32 once, not twice (as saving the unmerged model, which merges a copy, would).
    let model = model.merge_lora();
    model.save_pretrained_as(out, dir, dtype)?;
    Ok(out.to_path_buf())
}
