"""cuBLAS (through PyTorch) at the products `kiln bench matmul` timed: each product's time for
Burn's default strategy, the fastest cubek strategy and PyTorch's matmul side by side.

Reads the JSON `kiln bench matmul --json` wrote (the shapes, the transposed operands and the
dtype come from it, so the two lists cannot drift apart), times `torch.matmul` on the same views
on CUDA (TF32 for f32, as Burn's f32 matmul runs on the tensor cores; the median of CUDA-event
timings over rotated operands), and prints one line per product:

    kiln bench matmul --backend cuda --json matmul.json
    python3 benches/peer/matmul.py matmul.json
"""

import argparse
import json

import torch

# The same CUDA-event median as the kernel peer's (this script's folder is on sys.path).
from kernel_ceilings import median_ms


def operand(rows, cols, transposed, dtype):
    if transposed:
        return torch.rand(cols, rows, device="cuda", dtype=dtype).sub_(0.5).t()
    return torch.rand(rows, cols, device="cuda", dtype=dtype).sub_(0.5)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("json", help="what `kiln bench matmul --json` wrote")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    report = json.load(open(args.json))
    dtype = {"f32": torch.float32, "f16": torch.float16}[report["dtype"]]
    products = {}
    for row in report["rows"]:
        p = products.setdefault(row["product"], {"row": row, "rows": []})
        p["rows"].append(row)
    print(f"{'product':<26} {'[m, k, n]':<20} {'burn default':>12} {'best cubek':>11} "
          f"{'cuBLAS':>9} {'best/cuBLAS':>11}  best strategy")
    for name, p in products.items():
        m, k, n = p["row"]["shape"]
        lhs_t, rhs_t = p["row"]["lhs_t"], p["row"]["rhs_t"]
        # Four operand sets rotated, so that repeated products do not all hit the L2.
        sets = [(operand(m, k, lhs_t, dtype), operand(k, n, rhs_t, dtype)) for _ in range(4)]
        it = iter(range(1 << 30))
        cublas = median_ms(lambda: torch.matmul(*sets[next(it) % 4]), 50, warmup=5)
        ran = [r for r in p["rows"] if r["seconds"] is not None]
        default = next((r for r in ran if r["strategy"] == "matmul_auto"), None)
        best = min(ran, key=lambda r: r["seconds"]) if ran else None
        fmt = lambda r: f"{r['seconds'] * 1e3:.4f}" if r else "-"
        ratio = f"{best['seconds'] * 1e3 / cublas:.2f}x" if best else "-"
        print(f"{name:<26} {str([m, k, n]):<20} {fmt(default):>12} {fmt(best):>11} "
              f"{cublas:>9.4f} {ratio:>11}  {best['strategy'] if best else '-'}")


if __name__ == "__main__":
    main()
