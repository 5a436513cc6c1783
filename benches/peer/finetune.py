"""transformers + PEFT peer of `kiln bench llm`: the LoRA (or QLoRA) fine-tuning step on the
same model folder, batch and length, to put Kiln's tokens/s next to what its users run today.

The model is the folder `kiln bench llm` writes (`--dir`, default `runs/bench/llm-100m`): a
LLaMA of random weights, f32 safetensors with Hugging Face's names. Adapters of rank `--rank`
(alpha = rank, no dropout) on all seven projections, as Kiln's `TARGET_MODULES`; AdamW with
Kiln's `FusedAdamWConfig` defaults (betas 0.9/0.999, eps 1e-5, weight decay 1e-4; PyTorch's
fused kernel on CUDA) at lr 1e-4; the loss over every token; no gradient checkpointing, no
padding. `--load-in-4bit` holds the base in NF4 through bitsandbytes (on CUDA, or on the CPU
with bitsandbytes 0.49 or later), computing in f32 as Kiln's QLoRA does. Batches are random token sequences of `--seq-len + 1`
tokens, as Kiln's: transformers shifts the labels, so each of `--seq-len` positions is trained.

Run next to Kiln on the same machine (`.ci/gpu-perf` does both on a GPU):

    kiln bench llm --backend cuda --no-load --finetune single:1 --batch 8 --seq-len 256
    python3 benches/peer/finetune.py --device cuda --batch 8 --seq-len 256 [--load-in-4bit]
    python3 benches/peer/finetune.py --device cpu --threads 2 --batch 8 --seq-len 128 [--load-in-4bit]

The timed steps run between two synchronisations (on CUDA); the last lines,
`peer_tokens_per_s <median>` and `peer_peak_bytes <n>` (GPU memory allocated at the peak, or the
process's peak resident memory on the CPU), are for scripts.
"""

import argparse
import resource
import statistics
import time

import torch

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load(args):
    from transformers import LlamaForCausalLM

    kwargs = {"torch_dtype": torch.float32}
    if args.load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.float32,
            bnb_4bit_use_double_quant=False,
        )
        kwargs["device_map"] = {"": 0 if args.device == "cuda" else "cpu"}
    model = LlamaForCausalLM.from_pretrained(args.dir, **kwargs)
    if not args.load_in_4bit:
        model = model.to(args.device)
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", default="runs/bench/llm-100m")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--load-in-4bit", action="store_true")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="recompute each decoder layer in the backward (transformers' non-reentrant "
        "checkpointing, as TRL turns it on)",
    )
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="ROWS",
        help="after the timed steps, profile one more with torch.profiler and print its ROWS "
        "costliest operators by self time (the book's benchmarks page compares them with "
        "Kiln's profile of the same step)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":
        # Burn's f32 matmul on CUDA runs on the tensor cores in TF32; PyTorch's does so only
        # when asked. The same arithmetic on both sides (benches/peer/ad_step.py does the same).
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = load(args)
    model = get_peft_model(
        model,
        LoraConfig(
            r=args.rank,
            lora_alpha=args.rank,
            lora_dropout=0.0,
            target_modules=TARGET_MODULES,
            bias="none",
            task_type="CAUSAL_LM",
        ),
    )
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    cuda = args.device == "cuda"
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(
        params, lr=1e-4, betas=(0.9, 0.999), eps=1e-5, weight_decay=1e-4, fused=cuda or None
    )
    vocab = model.config.vocab_size
    total = args.warmup + args.steps
    batches = torch.randint(0, vocab, (total, args.batch, args.seq_len + 1))

    def step(tokens):
        tokens = tokens.to(args.device)
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    for i in range(args.warmup):
        step(batches[i])
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup, total):
        start = time.perf_counter()
        step(batches[i])
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            step(batches[total - 1])
            if cuda:
                torch.cuda.synchronize()
        sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=sort, row_limit=args.profile))
    tokens_per_s = [args.batch * args.seq_len / t for t in times]
    median = statistics.median(tokens_per_s)
    peak = (
        torch.cuda.max_memory_allocated()
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    mode = "QLoRA" if args.load_in_4bit else "LoRA"
    print(
        f"transformers + PEFT {mode} on {args.device}: {1e3 * statistics.median(times):.1f} ms/step, "
        f"{median:.0f} tokens/s (batch {args.batch} x {args.seq_len}, rank {args.rank})"
    )
    print(f"peer_tokens_per_s {median:.1f}")
    print(f"peer_peak_bytes {peak}")


if __name__ == "__main__":
    main()
