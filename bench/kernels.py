"""The LayerNorms alone: forward, and forward+backward, per implementation at [rows, C]; or the Python cost per call.

The implementations, the commands, how each figure is timed and what GB/s counts: bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

import layernorm
from bench.common import at_least, comma_list, fmt, median, parse, parser, report, spread, timed, write_results
from machinery.command import run_command
from machinery.measure import markdown_table

IMPLS = ("custom", "builtin", "triton", "naive")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_SIZES = "128,384,768,4096"
CUDA_SIZES = "768,1024,2048,4096,8192"
# glibc hands large freed blocks back to the OS and page-faults them in again at the next allocation. On a CPU that
# costs more than a LayerNorm of [16384, 384] and varies with the allocator's state (builtin's fwd+bwd there: 5-7 ms
# with freed memory kept, 12-14 ms without, 2-core EPYC), so the timings keep freed memory; --system-malloc does not.
STEADY_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}
STEADY = all(os.environ.get(k) == v for k, v in STEADY_MALLOC.items())  # glibc reads them as the process starts


def implementation(name: str, C: int, dtype: torch.dtype, device: str) -> tuple[Callable, list[torch.Tensor]]:
    """(x -> LayerNorm(x) over C features, [weight, bias]), the same weight and bias for every implementation."""
    module = layernorm.make_norm("builtin" if name == "naive" else name, C).to(device, dtype)
    torch.manual_seed(0)
    with torch.no_grad():
        module.weight.normal_(1, 0.1)
        module.bias.normal_(0, 0.1)
    params = [module.weight, module.bias]
    if name == "naive":
        return (lambda x: layernorm.layer_norm_naive(x, *params)), params
    return module, params


def time_ms(fns: dict[str, Callable[[], Any]], device: str, reps: int) -> dict[str, float]:
    """{name: fn} -> {name: median ms}: on CUDA triton's do_bench; on the CPU `reps` rounds of one call each."""
    if device.startswith("cuda"):
        import triton.testing

        return {k: triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median") for k, fn in fns.items()}
    times = [[timed(fn, device) * 1e3 for fn in fns.values()] for _ in range(reps + 2)][2:]  # 2 to warm up
    return {k: median([t[i] for t in times]) for i, k in enumerate(fns)}


def bench_shape(rows: int, C: int, dtype: torch.dtype, device: str, impls: list[str], reps: int) -> list[dict]:
    x = (torch.randn(rows, C, device=device) * 2 + 1).to(dtype).requires_grad_()
    dy = torch.randn(rows, C, device=device).to(dtype)
    made = {name: implementation(name, C, dtype, device) for name in impls}  # name -> (fn, [weight, bias])
    copy = torch.empty_like(x)
    copy_ms = time_ms({"copy": lambda: copy.copy_(x.detach())}, device, reps)["copy"]
    with torch.no_grad():
        reference = made.get("builtin", made[impls[0]])[0](x).float()
        errors = {name: (fn(x).float() - reference).abs().max().item() for name, (fn, _) in made.items()}
    fwd = time_ms({name: lambda fn=fn: fn(x) for name, (fn, _) in made.items()}, device, reps)
    grads = {name: lambda fn=fn, p=p: torch.autograd.grad(fn(x), [x, *p], dy) for name, (fn, p) in made.items()}
    fwd_bwd = time_ms(grads, device, reps)
    size = rows * C * x.element_size() / 1e9  # GB per pass
    where = {"rows": rows, "C": C, "dtype": str(dtype).removeprefix("torch."), "device": device}
    return [
        {
            "impl": name,
            **where,
            "max_abs_err_vs_builtin": errors[name],
            "fwd_ms": fwd[name],
            "fwd_bwd_ms": fwd_bwd[name],
            "bwd_ms": fwd_bwd[name] - fwd[name],
            "fwd_gbps": 2 * size / (fwd[name] / 1e3),
            "fwd_bwd_gbps": 5 * size / (fwd_bwd[name] / 1e3),
            "copy_gbps": 2 * size / (copy_ms / 1e3),
        }
        for name in impls
    ]


KERNELS_HEADERS = (
    "impl|shape|dtype|fwd ms|fwd GB/s (% copy)|fwd+bwd ms|fwd+bwd GB/s (% copy)|bwd ms|fwd+bwd vs builtin|copy GB/s"
    "|max err vs builtin"
).split("|")


def kernels_table(rows: list[dict]) -> str:
    builtin = {(r["rows"], r["C"], r["dtype"]): r["fwd_bwd_ms"] for r in rows if r["impl"] == "builtin"}
    cells = []
    for r in rows:
        shape = (r["rows"], r["C"], r["dtype"])
        vs_builtin = fmt(r["fwd_bwd_ms"] / builtin[shape], ".2f") + "x" if shape in builtin else "n/a"
        fwd, fwd_bwd = (f"{r[k]:.1f} ({100 * r[k] / r['copy_gbps']:.0f}%)" for k in ("fwd_gbps", "fwd_bwd_gbps"))
        cells.append(
            [
                r["impl"],
                f"[{r['rows']}, {r['C']}]",
                r["dtype"],
                fmt(r["fwd_ms"], ".3f"),
                fwd,
                fmt(r["fwd_bwd_ms"], ".3f"),
                fwd_bwd,
                fmt(r["bwd_ms"], ".3f"),
                vs_builtin,
                fmt(r["copy_gbps"], ".1f"),
                f"{r['max_abs_err_vs_builtin']:.1e}",
            ]
        )
    return markdown_table(KERNELS_HEADERS, cells)


class _NoLaunch:
    """Stands in for a jitted kernel: kernel[grid](*args) does nothing."""

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def overhead(device: str, calls: int, repeats: int) -> list[dict]:
    """us per call, forward and forward+backward, builtin and triton on [8, 384], alternating round by round."""
    import triton.runtime

    import layernorm_triton

    kernels = {k: v for k, v in vars(layernorm_triton).items() if isinstance(v, triton.runtime.KernelInterface)}
    if device == "cpu":  # every @triton.jit of the module launches nothing, until the end of this function
        vars(layernorm_triton).update(dict.fromkeys(kernels, _NoLaunch()))
    torch.set_num_threads(1)  # at [8, 384] more threads only wait on each other
    x = torch.randn(8, 384, device=device, requires_grad=True)
    dy = torch.randn(8, 384, device=device)
    modules = {name: layernorm.make_norm(name, 384).to(device) for name in ("builtin", "triton")}
    fns = {(k, "fwd"): lambda m=m: m(x) for k, m in modules.items()}
    fns |= {(k, "fwd+bwd"): lambda m=m: torch.autograd.grad(m(x), [x, *m.parameters()], dy) for k, m in modules.items()}
    try:  # the first round warms up
        rounds = [[timed(fn, device, calls) * 1e6 for fn in fns.values()] for _ in range(repeats + 1)][1:]
    finally:
        vars(layernorm_triton).update(kernels)
    times = {key: [r[i] for r in rounds] for i, key in enumerate(fns)}
    return [{"impl": impl, "what": what, "us": median(us), "spread": spread(us)} for (impl, what), us in times.items()]


def overhead_table(rows: list[dict], device: str, calls: int, repeats: int) -> str:
    how = "kernel launches stubbed" if device == "cpu" else "real calls, launch-bound"
    cell = {(r["impl"], r["what"]): f"{r['us']:.1f} ({r['spread'][0]:.1f}-{r['spread'][1]:.1f})" for r in rows}
    title = f"### Python cost per call on {device} ({how}), [8, 384] float32, median (min-max) of {repeats} rounds"
    cells = [[impl, cell[impl, "fwd"], cell[impl, "fwd+bwd"]] for impl in ("builtin", "triton")]
    table = markdown_table(["impl", "forward us/call", "forward+backward us/call"], cells)
    return f"{title} of {calls} calls\n\n{table}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--dtype", type=comma_list(DTYPES), help="comma list (default float32; on CUDA bfloat16,float32)")
    p.add_argument("--sizes", type=comma_list(), help=f"comma list of C (default {CPU_SIZES}; CUDA {CUDA_SIZES})")
    p.add_argument("--rows", type=comma_list(), help="comma list of rows = B * T (default 16384; CUDA 32768)")
    p.add_argument("--impls", type=comma_list(IMPLS), help=f"comma list from {', '.join(IMPLS)} (default: those here)")
    p.add_argument("--reps", type=at_least(1), default=10, help="timed calls per measurement on the CPU (median)")
    p.add_argument("--overhead", action="store_true", help="the Python cost per call instead (bench/README.md)")
    p.add_argument("--calls", type=at_least(1), default=1000, help="--overhead: calls per round")
    p.add_argument("--repeats", type=at_least(1), default=7, help="--overhead: rounds")
    p.add_argument("--system-malloc", action="store_true", help="keep glibc's allocator defaults (bench/README.md)")
    args = parse(p, argv)
    if args.overhead and args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: CPU tensors pass; launches are stubbed
    cuda = args.device.startswith("cuda")
    interpreter = os.environ.get("TRITON_INTERPRET") == "1"
    runs_here = {"triton": cuda or interpreter, "naive": not cuda}
    args.impls = args.impls or [i for i in IMPLS if runs_here.get(i, True)]
    args.dtype = args.dtype or (["bfloat16", "float32"] if cuda else ["float32"])
    args.sizes = args.sizes or comma_list()(CUDA_SIZES if cuda else CPU_SIZES)
    args.rows = args.rows or [32768 if cuda else 16384]
    if "triton" in args.impls and not (cuda or interpreter or args.overhead):
        p.error("triton runs on CUDA, or on the CPU with TRITON_INTERPRET=1 set (slow): leave it out of --impls")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.overhead:
        rows = overhead(args.device, args.calls, args.repeats)
        result = {"device": args.device, "overhead": rows}
        table = overhead_table(rows, args.device, args.calls, args.repeats)
        return report(args, "bench.kernels", result, table)
    result = {"device": args.device, "malloc": "steady" if STEADY else "system default", "results": []}
    for dtype, rows, C in itertools.product(args.dtype, args.rows, args.sizes):
        result["results"] += bench_shape(rows, C, DTYPES[dtype], args.device, args.impls, args.reps)
        table = kernels_table(result["results"])
        print("\n".join(table.splitlines()[-len(args.impls) :]), flush=True)
        write_results(args, "bench.kernels", result, table)  # after every shape: a run cut short keeps them
    return result


if __name__ == "__main__":
    if sys.platform == "linux" and "--system-malloc" not in sys.argv and not STEADY:
        argv = [sys.executable, "-m", "bench.kernels", *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, **STEADY_MALLOC})
    sys.exit(run_command(main, "--rows or --sizes"))
