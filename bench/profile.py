"""Where a training step goes: a few steps per norm under torch.profiler, in this process, as train.py takes them.

What a step is, what is reported, and the figure beside --out: bench/README.md.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function
from torch.profiler import profile as torch_profile

import train
from bench.common import (
    comma_list,
    fmt,
    median,
    parse,
    parser,
    report,
    timed,
)
from layernorm import NORMS, Norm
from machinery.command import run_command
from machinery.device import Dist, resolve_dtype
from machinery.measure import markdown_table, train_config
from machinery.options import TrainConfig
from machinery.step import train_step

STEPS = 10  # after 3 of warm-up: enough to count kernels per step, few enough for the profiler's trace
# An op goes to the first category its own name or a caller's (outermost first) matches; the clip's ops by name.
CATEGORIES = {
    "matrix products": re.compile(r"^aten::(linear|mm|addmm|bmm|baddbmm|matmul)$|: (Mm|Addmm|Bmm|Baddbmm)Backward"),
    "attention": re.compile(r"scaled_dot_product|ScaledDotProduct|^aten::_softmax|SoftmaxBackward"),
    "norms": re.compile(r"^norm$|Norm\w*Backward|_LayerNorm\w*Backward|LayerNorm"),
    "activation": re.compile(r"^aten::gelu|GeluBackward"),
    "optimizer": re.compile(r"^Optimizer\.|^aten::(_foreach_\w+|stack|linalg_vector_norm|reciprocal|clamp)$"),
    "data": re.compile(r"^data$"),
}
COLUMNS = [*CATEGORIES, "everything else"]
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def category(event: Any) -> str:
    chain = []
    while event is not None:
        chain.append(event.name)
        event = event.cpu_parent
    for name in reversed(chain):  # the outermost caller first: an mm inside attention counts as attention
        for cat, pattern in CATEGORIES.items():
            if pattern.search(name):
                return cat
    return "everything else"


def matmul_rate(shapes: dict[tuple, list[float]], device: str, dtype: torch.dtype) -> float | None:
    """GFLOP/s of the step's matrix products ({(op, input shapes): each call's FLOPs}), each shape timed alone in
    the dtype the step computes them in (autocast's)."""
    total_flops = 0.0
    total_s = 0.0
    for (name, dims), flops in shapes.items():
        args = [torch.randn(d, device=device, dtype=dtype) for d in dims]
        op = getattr(torch, name.removeprefix("aten::"))
        op(*args)
        seconds = median([timed(lambda op=op, args=args: op(*args), device, calls=20) for _ in range(5)])
        total_flops += sum(flops)
        total_s += seconds * len(flops)
    return total_flops / total_s / 1e9 if total_s else None


def profile_norm(norm: str, cfg: TrainConfig, device: str, data_dir: str | None) -> dict[str, Any]:
    """STEPS training steps of one norm under torch.profiler, after 3 unprofiled ones."""
    cfg = replace(cfg, norm=norm, data_dir=data_dir or cfg.data_dir)
    device_type = torch.device(device).type
    run = train.setup(cfg, {}, None, device, resolve_dtype(cfg.dtype, device_type), Dist())  # train.py's set-up
    model, data = run.model, run.data
    for module in model.modules():  # each norm's forward as a range of its own (its backward is an autograd node)
        if isinstance(module, Norm):
            module.register_forward_pre_hook(lambda m, _: setattr(m, "_range", record_function("norm").__enter__()))
            module.register_forward_hook(lambda m, _, __: m._range.__exit__(None, None, None))

    def step() -> None:
        with record_function("data"):
            shape = (cfg.gradient_accumulation_steps, cfg.batch_size)
            xs, ys = data.get("train", torch.randint(data.num_starts("train"), shape, generator=run.data_gen), device)
        loss = train_step(model, run.optimizer, xs, ys, grad_clip=cfg.grad_clip, autocast=run.amp, scaler=run.scaler)
        loss.item()  # the read-back train.py makes at a log line

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    t0 = time.perf_counter()
    with torch_profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for _ in range(STEPS):
            step()
    wall_us = (time.perf_counter() - t0) * 1e6
    data.close()
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    averages = prof.key_averages()
    ops = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:8]
    by_category = dict.fromkeys(COLUMNS, 0.0)
    gpu_by_category = dict.fromkeys(COLUMNS, 0.0)  # the GPU time of the kernels each op launched itself
    shapes: dict[tuple, list[float]] = {}
    for e in [e for e in events if e.device_type.name == "CPU"]:
        by_category[category(e)] += e.self_cpu_time_total / STEPS
        gpu_by_category[category(e)] += e.self_device_time_total / STEPS
        if e.name in MATMUL_OPS and e.flops:
            dims = tuple(tuple(d) for d in e.input_shapes if d)[:3]  # the tensors (addmm's scalars left out)
            shapes.setdefault((e.name, dims), []).append(e.flops)
    matmul_flops = sum(sum(flops) for flops in shapes.values()) / STEPS
    # the products' rate inside the step: over the time that computes them, the GPU's where there is one
    matmul_us = gpu_by_category["matrix products"] if kernels else by_category["matrix products"]
    return {
        "ms_per_step": wall_us / 1000 / STEPS,
        "kernels_per_step": len(kernels) / STEPS if kernels else None,
        "gpu_busy": sum(e.device_time for e in kernels) / wall_us if kernels else None,
        "cpu_us_per_step": {e.key: e.self_cpu_time_total / STEPS for e in ops},
        "calls_per_step": {e.key: e.count / STEPS for e in ops},
        "copy_calls_per_step": sum(e.count for e in averages if e.key == "aten::copy_") / STEPS,
        "category_us_per_step": by_category,
        "gpu_category_us_per_step": gpu_by_category if kernels else None,
        "matmul_gflop_per_step": matmul_flops / 1e9,
        "matmul_gflops_in_step": matmul_flops / matmul_us / 1e3 if matmul_us else None,
        "matmul_gflops_alone": matmul_rate(shapes, device, getattr(torch, run.dtype)),
        "step_gflops": matmul_flops / (wall_us / STEPS) / 1e3,
    }


RATES = ("step_gflops", "matmul_gflops_in_step", "matmul_gflops_alone")  # the whole step, its products, alone


def tables(rows: dict[str, dict[str, Any]], device: str) -> str:
    steps = []
    breakdown = []
    for n, r in rows.items():
        busy = fmt(r["gpu_busy"] and 100 * r["gpu_busy"], ".0f") + "%"
        top = "; ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_step"].items())
        steps.append([n, fmt(r["ms_per_step"]), fmt(r["kernels_per_step"], ".0f"), busy, top])
        by_category = r["category_us_per_step"]
        breakdown.append(
            [
                n,
                *[fmt(by_category[c] / 1000) for c in COLUMNS],
                fmt(sum(by_category.values()) / 1000),
                fmt(r["matmul_gflop_per_step"], ".3f"),
                ", ".join(fmt(r[k], ".0f") for k in RATES),
            ]
        )
    steps_headers = ["norm", "ms/step (profiled)", "kernels/step", "GPU busy", "top CPU self time, us/step"]
    breakdown_headers = [
        "norm",
        *[f"{c} ms" for c in COLUMNS],
        "CPU ms",
        "matmul GFLOP/step",
        "GFLOP/s: step, its products, alone",
    ]
    return (
        f"### torch.profiler, {STEPS} training steps per norm on {device}\n\n{markdown_table(steps_headers, steps)}"
        "\n\n### Where a step's CPU time goes (self time per category, per step)\n\n"
        f"{markdown_table(breakdown_headers, breakdown)}"
    )


def plot(png: Path, rows: dict[str, dict[str, Any]], title: str) -> None:
    """One bar per norm: the step's CPU ms by category; beside it the GFLOP/s of the whole step, of its matrix
    products inside it, and of the same products alone (the machine's rate)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 1.8 + 0.7 * len(rows)))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [2.2, 1]})
    for y, r in enumerate(rows.values()):
        x = 0.0
        for i, cat in enumerate(COLUMNS):
            ms = r["category_us_per_step"][cat] / 1000
            left.barh(y, ms, left=x, color=f"C{i}", label=cat if y == 0 else None)
            x += ms
        left.text(x, y, f" {x:.1f} ms", va="center")
    left.set(yticks=range(len(rows)), yticklabels=list(rows), xlabel="CPU ms per training step (self time)")
    left.invert_yaxis()
    left.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    width = 0.8 / len(rows)
    for j, (name, r) in enumerate(rows.items()):
        rates = [r[k] or 0 for k in RATES]
        right.bar([i + j * width for i in range(3)], rates, width, label=name)
    labels = ("whole\nstep", "its matrix\nproducts", "the same\nproducts alone")
    right.set(xticks=[i + width * (len(rows) - 1) / 2 for i in range(3)], xticklabels=labels, ylabel="GFLOP/s")
    right.tick_params(axis="x", labelsize=8)
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__, config=True)
    p.add_argument("--norms", type=comma_list(NORMS), default=["builtin"], help="comma list of norms (default builtin)")
    p.add_argument("--data_dir", help="the prepared data (default: the config's dataset)")
    args = parse(p, argv)
    cfg = train_config(args.config, args.set)
    rows = {}
    for norm in args.norms:
        rows[norm] = profile_norm(norm, cfg, args.device, args.data_dir)
        print(f"profile {norm}: {rows[norm]['ms_per_step']:.2f} ms/step", flush=True)
    result = {"device": args.device, "config": args.config, "set": args.set, "steps": STEPS, "norms": rows}
    text = tables(rows, args.device)
    report(args, "bench.profile", result, text)
    if args.out:  # and the figure beside it (.png)
        plot(args.out.with_suffix(".png"), rows, f"Where a training step goes: {args.config} on {args.device}")
    return result


if __name__ == "__main__":
    sys.exit(run_command(main, "the model's size or batch (--set batch_size=..., --set n_embd=...)"))
