"""PyTorch peer of `kiln bench kernels --backend cuda --full`: the ceilings its kernels are judged
against, measured on the same GPU in the same call.

- `copy`: the device's copy ceiling, a device-to-device `copy_` counted as bytes read plus bytes
  written, over the fused ops' size (4096 x 4096 values in the given dtype) rotated among enough
  buffers to overflow the L2 cache, and over one 1 GiB buffer.
- `dense`: cuBLAS's dense matmul at the QLoRA bench's shapes, `x[M, 4096] @ W[4096, 4096]` (the
  forward) and `g[M, 4096] @ W^T` (the input gradient), M = 1, 16, 256, 4096.

Times come from CUDA events around each call, after a warm-up, as the median of `--reps` calls;
inputs are random normals (never zeros) and every output is checked finite. The last lines,
`peer <name> <ms> <GB/s> <TFLOP/s>`, are for scripts.

    python3 benches/peer/kernel_ceilings.py [--dtype f16|bf16|f32] [--reps 200]

(Not `kernels.py`: a script's folder comes first on `sys.path`, so that name shadowed Hugging
Face's `kernels` package, which bitsandbytes imports for its CPU 4-bit matmul, in every peer here.)
"""

import argparse

import torch

KN = 4096  # Sizes::full().qlora_kn
MS = (1, 16, 32, 256, 4096)  # Sizes::full().qlora_m
ROWS = D = 4096  # Sizes::full().rows, .d


def median_ms(fn, reps, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def report(name, ms, bytes_moved=0.0, flops=0.0):
    gbs = bytes_moved / (ms * 1e-3) / 1e9
    tflops = flops / (ms * 1e-3) / 1e12
    print(f"peer {name} {ms:.5f} {gbs:.1f} {tflops:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["f16", "bf16", "f32"], default="f16")
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    size = torch.tensor([], dtype=dtype).element_size()
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.dtype}, "
          f"median of {args.reps} calls (CUDA events)")

    # The copy ceiling at the fused ops' size, rotating over ~400 MiB so that L2 does not serve it.
    buffers = max(2, (400 << 20) // (ROWS * D * size))
    sources = [torch.randn(ROWS, D, device=device, dtype=dtype) for _ in range(buffers)]
    target = torch.empty(ROWS, D, device=device, dtype=dtype)
    turn = iter(range(1 << 62))
    ms = median_ms(lambda: target.copy_(sources[next(turn) % buffers]), args.reps)
    report(f"copy_{ROWS}x{D}", ms, 2.0 * ROWS * D * size)
    del sources, target
    big = torch.randn((1 << 30) // size, device=device, dtype=dtype)  # 1 GiB
    other = torch.empty_like(big)
    ms = median_ms(lambda: other.copy_(big), max(20, args.reps // 10))
    report("copy_1GiB", ms, 2.0 * big.numel() * size)
    del big, other

    w = torch.randn(KN, KN, device=device, dtype=dtype) * KN ** -0.5
    for m in MS:
        xs = [torch.randn(m, KN, device=device, dtype=dtype) for _ in range(4)]
        turn = iter(range(1 << 62))
        forward = lambda: xs[next(turn) % 4] @ w
        ms = median_ms(forward, args.reps)
        assert torch.isfinite(forward()).all()
        moved = (2.0 * m * KN + KN * KN) * size
        report(f"dense_forward_m{m}", ms, moved, 2.0 * m * KN * KN)
        grad = lambda: xs[next(turn) % 4] @ w.t()
        ms = median_ms(grad, args.reps)
        assert torch.isfinite(grad()).all()
        report(f"dense_input_grad_m{m}", ms, moved, 2.0 * m * KN * KN)


if __name__ == "__main__":
    main()
