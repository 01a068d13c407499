"""What the Triton LayerNorm costs in Python per call, against F.layer_norm.

    python bench/triton_overhead.py                  # CPU: the kernel launches replaced by no-ops
    python bench/triton_overhead.py --device cuda    # GPU: real calls on a tiny input, where launches dominate

A training step calls each norm once forward and once backward per layer (13 norms in the GPU config), so a few
tens of microseconds of Python per call add up to a visible share of a step of a small model, whatever the kernels
do. On the CPU the launches are stubbed (kernel[grid](...) does nothing), so what is timed is everything around
them: argument checks, the autograd Function, allocations, launch parameters. F.layer_norm runs for real there
on the same tiny input [8, 384], as the yardstick. On a GPU nothing is stubbed: calls are queued back to back on
a tiny input and the wall time per call is the CPU-side cost (the GPU waits on the CPU at that size).

Microseconds per call, median of --repeats runs of --calls calls each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


class _NoLaunch:
    """Stands in for a jitted kernel: kernel[grid](*args, **kwargs) does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_launches() -> None:
    """Replace the kernels with no-ops, in this version's layout or in the earlier one (one module, kernels
    defined lazily in layernorm._KERNELS), so one script measures both sides of a change."""
    try:
        import layernorm_triton

        layernorm_triton.layer_norm_fwd_kernel = layernorm_triton.layer_norm_bwd_kernel = _NoLaunch()
    except ImportError:
        import layernorm

        layernorm._kernel("fwd")
        layernorm._KERNELS["fwd"] = layernorm._KERNELS["bwd"] = _NoLaunch()


def per_call_us(fn, calls: int, repeats: int, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(runs)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # CPU tensors pass the device check; launches are stubbed
    import torch
    import torch.nn.functional as F
    from common import machine_info, markdown_table, write_json

    import layernorm

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; run without --device for the CPU measurement")
    if args.device == "cpu":
        stub_launches()
    torch.set_num_threads(1)
    dev = torch.device(args.device)
    x = torch.randn(8, 384, device=dev, requires_grad=True)
    w = torch.ones(384, device=dev, requires_grad=True)
    b = torch.zeros(384, device=dev, requires_grad=True)
    dy = torch.randn(8, 384, device=dev)
    lt = layernorm._triton_module()
    impls = {"builtin": lambda: F.layer_norm(x, (384,), w, b), "triton": lambda: lt.layer_norm_triton(x, w, b)}
    sync = torch.cuda.synchronize if dev.type == "cuda" else lambda: None
    rows = []
    for name, fn in impls.items():
        fwd = per_call_us(fn, args.calls, args.repeats, sync)
        fwd_bwd = per_call_us(lambda fn=fn: torch.autograd.grad(fn(), (x, w, b), dy), args.calls, args.repeats, sync)
        rows.append({"impl": name, "fwd_us": round(fwd, 1), "fwd_bwd_us": round(fwd_bwd, 1)})
    mode = "kernel launches stubbed" if dev.type == "cpu" else "real calls, launch-bound"
    table = markdown_table(["impl", "forward us/call", "forward+backward us/call"],
                           [[r["impl"], r["fwd_us"], r["fwd_bwd_us"]] for r in rows])
    print(f"{args.device} ({mode}), input [8, 384] float32, median of {args.repeats} x {args.calls} calls\n\n{table}")
    report = {"device": args.device, "mode": mode, "shape": [8, 384], "rows": rows, "table": table,
              "machine": machine_info(), "command": ["python", "bench/triton_overhead.py", *(argv or sys.argv[1:])]}
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
