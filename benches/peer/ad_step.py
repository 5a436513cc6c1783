"""PyTorch peer of `benches/ad_step.rs`: time per training step of the Algorithm Distillation
transformer on one CPU thread or one CUDA GPU, to put Kiln's (Burn's) number next to a plain eager
PyTorch loop.

The model mirrors `crates/kiln-ad/src/model.rs` with its defaults (and `kiln-nn`'s
`PreNormBlock` / `CausalSelfAttention`): multi-hot step tokens of the default 9x9 Dark Room
(feature width 2*9 + (5+1) + 3 = 27) through a bias-free linear embedding plus learned positions
[60, 64]; 2 pre-norm blocks (LayerNorm eps 1e-5; attention with 4 heads, biased q/k/v and output
projections; feed-forward 64 -> 256 -> 64 with ReLU; no dropout); a final LayerNorm; a linear
head to the 5 actions. Loss: mean cross-entropy over every position of a [batch, 60] batch
(`--batch`, default 32 as Kiln's).
Optimizer: AdamW with Burn's `AdamWConfig` defaults (betas 0.9/0.999, eps 1e-5, weight decay
1e-4) at lr 1e-3. Batches are random (exactly four ones per token, as Kiln's encoding has),
pre-generated and cycled through, so no data preparation is timed.

Run (CPU-only wheel; plain `pip install torch` works too):

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu
    taskset -c 1 /tmp/torchvenv/bin/python benches/peer/ad_step.py [--steps 100 --rounds 3
        --warmup 5 --attention sdpa|manual --batch 32]
    python3 benches/peer/ad_step.py --device cuda [--dtype bf16] --batch 256

On CUDA the timed steps run between two `torch.cuda.synchronize()` calls (the loss is never
read inside them, as a PyTorch user's loop does not); `--dtype bf16|f16` runs the forward and
backward under `torch.autocast` with f32 master weights, as Kiln's `MixedPrecision` does.

`--attention sdpa` uses `F.scaled_dot_product_attention(is_causal=True)` (a fused CPU kernel,
what a PyTorch user writes today); `manual` writes out scores, a causal `masked_fill` and a
softmax, as Kiln's plain-Burn reference (`kiln_kernels::reference::attention`) does. Each round builds a fresh
model and optimizer, runs the untimed warm-up steps, then times the steps; the last line,
`peer_ms_per_step <median>`, is for scripts.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

ROOM_SIZE = 9  # DarkRoomConfig::default().size
ACTIONS = 5  # crates/kiln-ad/src/env.rs
FEATURE_WIDTH = 2 * ROOM_SIZE + (ACTIONS + 1) + 3  # x, y, previous action or none, reward 0/1/none
CONTEXT, D_MODEL, LAYERS, HEADS, D_FF = 60, 64, 2, 4, 256  # AdModelConfig::default()


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads, manual):
        super().__init__()
        self.heads, self.manual = heads, manual
        self.query, self.key, self.value, self.output = (nn.Linear(d_model, d_model) for _ in range(4))
        self.register_buffer("future", torch.ones(CONTEXT, CONTEXT, dtype=torch.bool).triu(1))

    def forward(self, x):
        b, s, d = x.shape
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.manual:
            scores = (q * (d // self.heads) ** -0.5) @ k.transpose(-2, -1)
            weights = scores.masked_fill(self.future[:s, :s], float("-inf")).softmax(dim=-1)
            context = weights @ v
        else:
            context = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output(context.transpose(1, 2).reshape(b, s, d))


class PreNormBlock(nn.Module):
    def __init__(self, manual):
        super().__init__()
        self.norm_attn, self.norm_ff = nn.LayerNorm(D_MODEL, eps=1e-5), nn.LayerNorm(D_MODEL, eps=1e-5)
        self.attn = CausalSelfAttention(D_MODEL, HEADS, manual)
        self.ff = nn.Sequential(nn.Linear(D_MODEL, D_FF), nn.ReLU(), nn.Linear(D_FF, D_MODEL))

    def forward(self, x):
        x = x + self.attn(self.norm_attn(x))
        return x + self.ff(self.norm_ff(x))


class AdTransformer(nn.Module):
    def __init__(self, manual):
        super().__init__()
        self.embed = nn.Linear(FEATURE_WIDTH, D_MODEL, bias=False)
        self.positions = nn.Parameter(0.02 * torch.randn(CONTEXT, D_MODEL))
        self.blocks = nn.ModuleList(PreNormBlock(manual) for _ in range(LAYERS))
        self.norm = nn.LayerNorm(D_MODEL, eps=1e-5)
        self.head = nn.Linear(D_MODEL, ACTIONS)

    def forward(self, features):
        x = self.embed(features) + self.positions[: features.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def random_batch(generator, batch):
    """[batch, CONTEXT, FEATURE_WIDTH] multi-hot features and [batch, CONTEXT] actions."""
    draw = lambda n: torch.randint(n, (batch, CONTEXT, 1), generator=generator)
    hot = torch.cat([draw(ROOM_SIZE), ROOM_SIZE + draw(ROOM_SIZE),
                     2 * ROOM_SIZE + draw(ACTIONS + 1), 2 * ROOM_SIZE + ACTIONS + 1 + draw(3)], dim=-1)
    features = torch.zeros(batch, CONTEXT, FEATURE_WIDTH).scatter_(-1, hot, 1.0)
    return features, torch.randint(ACTIONS, (batch, CONTEXT), generator=generator)


def train_step(model, optimizer, features, targets, dtype=None):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(features.device.type, dtype=dtype, enabled=dtype is not None):
        logits = model(features)
        loss = F.cross_entropy(logits.reshape(-1, ACTIONS).float(), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss


def run_round(args, batches, seed):
    torch.manual_seed(seed)
    model = AdTransformer(manual=args.attention == "manual").to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-5, weight_decay=1e-4)
    dtype = {"f32": None, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for i in range(args.warmup):
        train_step(model, optimizer, *batches[i % len(batches)], dtype)
    sync()
    start = time.perf_counter()
    for i in range(args.warmup, args.warmup + args.steps):
        loss = train_step(model, optimizer, *batches[i % len(batches)], dtype)
    sync()
    elapsed = time.perf_counter() - start
    assert torch.isfinite(loss).item(), "the loss is not finite"
    return 1e3 * elapsed / args.steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before each round")
    parser.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa")
    parser.add_argument("--batch", type=int, default=32, help="samples per step (Kiln's default 32)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32",
                        help="autocast precision of the forward and backward (f32 master weights)")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
    else:
        # Kiln's f32 matmuls are TF32 on CUDA tensor cores; the peer is allowed the same.
        torch.backends.cuda.matmul.allow_tf32 = True
    generator = torch.Generator().manual_seed(7)
    batches = [tuple(t.to(args.device) for t in random_batch(generator, args.batch)) for _ in range(64)]
    where = "one thread" if args.device == "cpu" else torch.cuda.get_device_name()
    print(f"torch {torch.__version__}; AD step: batch {args.batch}, context {CONTEXT}, features {FEATURE_WIDTH}, "
          f"d_model {D_MODEL}, {LAYERS} layers, {HEADS} heads, d_ff {D_FF}, attention {args.attention}, "
          f"{args.dtype}; {where}; {args.steps} steps x {args.rounds} rounds after {args.warmup} warm-up")
    times = []
    for r in range(args.rounds):
        times.append(run_round(args, batches, seed=r))
        print(f"round {r}: {times[-1]:.2f} ms/step")
    median = sorted(times)[len(times) // 2]  # the upper median, as benches/ad_step.rs takes it
    print(f"median: {median:.2f} ms/step")
    print(f"peer_ms_per_step {median:.4f}")


if __name__ == "__main__":
    main()
