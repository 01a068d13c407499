"""Training steps: train.py per norm and per mode, beside nanoGPT; the norm comparison (--compare); a profile.

    python -m bench.training --norms custom,builtin --nanogpt ../nanogpt --out bench/results/train_cpu.json
    python -m bench.training --compare --out bench/results/compare_norms_cpu/table.json   # every norm, val_loss.png
    python -m bench.training --whole --norms builtin --nanogpt ../nanogpt --repeats 3   # the whole run, wall and RSS
    python -m bench.training --profile --norms builtin,triton --config configs/shakespeare_char.json  # torch.profiler

Each run is a fresh child process (no allocator, thread pool or compiled kernel leaks into the next). Sides (norm x
--modes, and nanoGPT) alternate, A B C A B C, --repeats times, so a drifting machine hits them alike. A run times
--iters steps after --warmup, logged one by one, evaluating only at 0 and at the end; --curves runs the config's own
schedule. Our figures come from metrics.jsonl, nanoGPT's from its log lines. ms/iter is the median over the timed
steps, evals left out on both sides (ours leaves them out of its windows; nanoGPT's eval iterations are dropped);
"train s to val" sums the step times up to the first eval at or below --target_val (nanoGPT's eval iterations at
its median step; its iteration 0 holds its compilation, as our first window holds ours).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import options
from bench.common import ROOT, comma_list, fmt, markdown_table, median, progress, run_child, spread, write_results
from device import DeviceError, resolve_device
from layernorm import NO_NORM, NORMS
from runlog import read_metrics

# train.py's flags for each mode; all but eager need CUDA.
MODES = {
    "eager": [],
    "graphs": ["--cuda_graphs=True"],
    "compile": ["--compile=True", "--compile_mode=default"],
    "reduce-overhead": ["--compile=True", "--compile_mode=reduce-overhead"],
}
# What decides the work of a step, and the schedule: nanoGPT gets each of these explicitly (its defaults differ).
NANOGPT_KEYS = (
    "batch_size",
    "block_size",
    "n_layer",
    "n_head",
    "n_embd",
    "dropout",
    "bias",
    "gradient_accumulation_steps",
    "learning_rate",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "decay_lr",
    "warmup_iters",
    "lr_decay_iters",
    "min_lr",
)
PROFILE_STEPS = 10  # after 3 of warm-up: enough to count kernels per step, few enough for the profiler's trace
NANOGPT_ITER = re.compile(r"^iter (\d+): loss [^,]+, time ([\d.]+)ms")  # nanoGPT's log lines, the only ones parsed
NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.naif]+), val loss ([\d.naif]+)")


def train_config(args: argparse.Namespace) -> options.TrainConfig:
    """The config file with --set on top, typed and checked by options.py (one clear line if something is wrong)."""
    try:
        return options.build_config(
            {**options.read_config_file(args.config), **options.parse_args([f"--{item}" for item in args.set])}
        )
    except options.ConfigError as e:
        raise SystemExit(f"error: {e}") from None


def plan_sides(args: argparse.Namespace, device: str) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """[(norm, mode)] to run, and {side: why it is skipped}."""
    fields = {f.name for f in dataclasses.fields(options.TrainConfig)}
    sides, skipped = [], {}
    for mode in args.modes:
        missing = [f for f in MODES[mode] if f[2:].split("=")[0] not in fields]
        for norm, _, only in (item.partition(":") for item in args.norms.split(",") if item):
            if only and only != mode:
                continue
            if norm not in (*NORMS, NO_NORM):
                raise SystemExit(f"error: --norms: {norm!r} is not a norm; choose from {', '.join(NORMS)}, {NO_NORM}")
            if missing:
                skipped[f"{norm} {mode}"] = f"train.py has no option {missing[0][2:].split('=')[0]!r}"
            elif mode != "eager" and device != "cuda":
                skipped[f"{norm} {mode}"] = "needs a CUDA device"
            elif norm == "triton" and device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
                skipped[f"{norm} {mode}"] = "no CUDA device (on a CPU: TRITON_INTERPRET=1, Triton's slow interpreter)"
            else:
                sides.append((norm, mode))
    return sides, skipped


def schedule(args: argparse.Namespace, cfg: options.TrainConfig) -> dict[str, Any]:
    """The iterations and evals of one run: the timing default, or the config's schedule with --curves."""
    if args.curves:
        return {k: getattr(cfg, k) for k in ("max_iters", "eval_interval", "eval_iters", "log_interval")}
    max_iters = args.warmup + args.iters
    return {"max_iters": max_iters, "eval_interval": max_iters, "eval_iters": args.eval_iters, "log_interval": 1}


def commands(
    side: tuple[str, str] | None,
    cfg: options.TrainConfig,
    sched: dict[str, Any],
    out_dir: Path,
    device: str,
    args: argparse.Namespace,
) -> tuple[list[str], Path]:
    """The command line and folder of one run: ours (norm, mode) or nanoGPT's (side None)."""
    # --whole: each side's checkpoints as its config saves them, and our sample at the end, as its command runs
    common = {
        **sched,
        "out_dir": out_dir,
        "device": device,
        **({} if args.whole else {"always_save_checkpoint": False}),
    }
    if side is None:
        values = {**{k: getattr(cfg, k) for k in NANOGPT_KEYS}, **common}
        if device != "cuda":
            values.update(compile=False, dtype="float32")  # on CUDA its own defaults: compile on, bfloat16
        return [
            sys.executable,
            "train.py",
            "config/train_shakespeare_char.py",
            *[f"--{k}={v}" for k, v in values.items()],
        ], Path(args.nanogpt)
    norm, mode = side
    ours = {**common, "norm": norm, **({} if args.whole else {"sample_at_end": False})}
    ours.update({"data_dir": args.data_dir} if args.data_dir else {})
    return [
        sys.executable,
        "train.py",
        args.config,
        *[f"--{item}" for item in args.set],
        *[f"--{k}={v}" for k, v in ours.items()],
        *MODES[mode],
    ], ROOT


def to_target(steps: list[tuple[int, float]], evals: list[dict[str, Any]], target: float | None) -> float | None:
    """Seconds of training steps up to the first eval at or below target; steps are (iter, ms) windows."""
    hit = next((e["iter"] for e in evals if target is not None and e["val_loss"] <= target), None)
    if hit is None:
        return None
    previous = [-1] + [it for it, _ in steps]  # each window stands for the iterations since the one before
    return sum(ms * (it - prev) for (it, ms), prev in zip(steps, previous, strict=False) if it <= hit) / 1000


def measure(
    side: tuple[str, str] | None, child: Any, out_dir: Path, cfg: options.TrainConfig, warmup: int, target: float | None
) -> dict[str, Any]:
    """One run's figures: ours from its metrics.jsonl, nanoGPT's from its log lines."""
    if side is None:
        logged = {int(m[1]): float(m[2]) for m in map(NANOGPT_ITER.match, child.lines) if m}
        evals = [
            {"iter": int(m[1]), "train_loss": float(m[2]), "val_loss": float(m[3])}
            for m in map(NANOGPT_EVAL.match, child.lines)
            if m
        ]
        eval_iters = {e["iter"] for e in evals if e["iter"] > 0}
        timed = [ms for it, ms in logged.items() if it >= warmup and it not in eval_iters]
        typical = median(timed) or 0.0
        steps = [(it, typical if it in eval_iters else ms) for it, ms in sorted(logged.items())]
        tokens = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps
        summary, tok_s = {}, [tokens / ms * 1000 for ms in timed]
    else:
        records = read_metrics(out_dir / "metrics.jsonl")
        train = [r for r in records if r["kind"] == "train"]
        evals = [{k: r[k] for k in ("iter", "train_loss", "val_loss")} for r in records if r["kind"] == "eval"]
        summary = next((r for r in records if r["kind"] == "summary"), {})
        kept = [r for r in train[1:] if r["iter"] >= warmup]  # the first window holds the start-up
        timed, tok_s = [r["ms_per_iter"] for r in kept], [r["tokens_per_s"] for r in kept]
        steps = [(r["iter"], r["ms_per_iter"]) for r in train]
    return {
        "ok": child.ok and (side is None or bool(summary)),
        "returncode": child.returncode,
        "timed_out": child.timed_out,
        "steps_timed": len(timed),
        "ms_per_iter": median(timed),
        "ms_range": spread(timed),
        "tokens_per_s": median(tok_s),
        "max_rss_bytes": child.max_rss_bytes,
        "wall_s": child.wall_s,
        "cuda_peak_bytes": summary.get("peak_memory_bytes") if summary.get("device", "").startswith("cuda") else None,
        "evals": evals,
        "best_val_loss": min((e["val_loss"] for e in evals), default=None),
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "train_s_to_target": to_target(steps, evals, target),
        "tail": child.lines[-5:] if not child.ok else [],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r["ok"] or r["steps_timed"]]  # a run cut by its time limit still timed its steps
    ms = [r["ms_per_iter"] for r in good if r["ms_per_iter"] is not None]
    return {
        "runs_ok": sum(r["ok"] for r in runs),
        "runs": len(runs),
        "ms_per_iter": median(ms),
        "ms_spread": spread(ms) if len(ms) > 1 else good[0]["ms_range"] if good else None,
        "tokens_per_s": median([r["tokens_per_s"] for r in good if r["tokens_per_s"]]),
        "max_rss_mib": median([r["max_rss_bytes"] / 2**20 for r in good]),
        **{
            k: median([r[k] for r in good if r[k] is not None])
            for k in ("cuda_peak_bytes", "final_val_loss", "best_val_loss", "train_s_to_target", "wall_s")
        },
    }


def table(result: dict[str, Any]) -> str:
    sides = result["sides"]
    base = sides.get("builtin eager", {}).get("ms_per_iter")
    nano = sides.get("nanogpt", {}).get("ms_per_iter")
    rows = [
        [
            name,
            f"{s['runs_ok']}/{s['runs']}",
            fmt(s["ms_per_iter"]),
            "-".join(fmt(v) for v in s["ms_spread"] or [None]),
            fmt(s["tokens_per_s"], ".0f"),
            fmt(s["max_rss_mib"], ".0f"),
            fmt(s["cuda_peak_bytes"] and s["cuda_peak_bytes"] / 2**20, ".0f"),
            fmt(s["final_val_loss"], ".4f"),
            fmt(s["best_val_loss"], ".4f"),
            fmt(s["train_s_to_target"], ".1f"),
            fmt(s["wall_s"], ".1f"),
            fmt(s["ms_per_iter"] and base and s["ms_per_iter"] / base, ".3f"),
            fmt(s["ms_per_iter"] and nano and s["ms_per_iter"] / nano, ".3f"),
        ]
        for name, s in sides.items()
    ]
    rows += [[name, f"skipped: {why}", *[""] * 11] for name, why in result["skipped"].items()]
    c, s = result["config"], result["schedule"]
    title = (
        f"### {Path(c['config']).stem}: {c['n_layer']} x {c['n_embd']}, block {c['block_size']}, batch "
        f"{c['batch_size']}, on {result['device']}; {s['max_iters']} iterations, eval every "
        f"{s['eval_interval']} on {s['eval_iters']} batches, {result['repeats']} alternating repeats"
    )
    return "\n".join(
        [
            title,
            "",
            markdown_table(
                [
                    "side",
                    "runs ok",
                    "ms/iter",
                    "spread",
                    "tokens/s",
                    "peak RSS MiB",
                    "CUDA peak MiB",
                    "final val",
                    "best val",
                    f"train s to val <= {result['target_val'] or '--target_val'}",
                    "wall s",
                    "x builtin eager",
                    "x nanoGPT",
                ],
                rows,
            ),
        ]
    )


def write_curves(out: Path, result: dict[str, Any]) -> None:
    """evals.csv (norm, iter, train_loss, val_loss) and val_loss.png: every side's curve, and its second half."""
    curves = {name.split()[0]: runs[0]["evals"] for name, runs in result["runs"].items()}
    (out.parent / "evals.csv").write_text(
        "".join(
            [
                "norm,iter,train_loss,val_loss\n",
                *[f"{n},{e['iter']},{e['train_loss']},{e['val_loss']}\n" for n, evals in curves.items() for e in evals],
            ]
        )
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, start, title in zip(
        axes, (0, result["schedule"]["max_iters"] // 2), ("val loss", "second half"), strict=True
    ):
        for norm, evals in curves.items():
            kept = [e for e in evals if e["iter"] >= start]
            ax.plot([e["iter"] for e in kept], [e["val_loss"] for e in kept], marker=".", label=norm)
        ax.set(title=title, xlabel="iteration", ylabel="val loss")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out.parent / "val_loss.png", dpi=120)


def run_all(args: argparse.Namespace, device: str, out: Path | None) -> dict[str, Any]:
    cfg = train_config(args)
    sides, skipped = plan_sides(args, device)
    sched = schedule(args, cfg)
    names = [f"{n} {m}" for n, m in sides] + (["nanogpt"] if args.nanogpt else [])
    plan = [(rep, name, side) for rep in range(args.repeats) for name, side in zip(names, [*sides, None], strict=False)]
    result = {
        "device": device,
        "config": {"config": args.config, **dataclasses.asdict(cfg)},
        "schedule": sched,
        "repeats": args.repeats,
        "target_val": args.target_val,
        "skipped": skipped,
        "sides": {},
        "runs": {name: [] for name in names},
    }
    if args.nanogpt:
        git = subprocess.run(
            ["git", "-C", args.nanogpt, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        result["nanogpt_commit"] = git.stdout.strip() or None
    print(
        f"{len(plan)} runs of {sched['max_iters']} iterations: {', '.join(names)}"
        + "".join(f"\nskipping {k}: {why}" for k, why in skipped.items()),
        flush=True,
    )
    work, t0 = Path(tempfile.mkdtemp(prefix="bench_training_")), time.perf_counter()
    try:
        for done, (rep, name, side) in enumerate(plan):
            cmd, cwd = commands(side, cfg, sched, work / f"{name.replace(' ', '_')}_{rep}", device, args)
            print(f"== {name}, repeat {rep + 1}/{args.repeats}: {' '.join(cmd[1:])}", flush=True)
            child = run_child(cmd, cwd=cwd, timeout_s=args.time_limit, echo=name if args.verbose else None)
            run = measure(side, child, work / f"{name.replace(' ', '_')}_{rep}", cfg, args.warmup, args.target_val)
            result["runs"][name].append(run)
            result["sides"][name] = summarise(result["runs"][name])
            print(
                f"   {name}: {fmt(run['ms_per_iter'])} ms/iter, best val {fmt(run['best_val_loss'], '.4f')}"
                f"{'' if run['ok'] else ', FAILED: ' + ' | '.join(run['tail'])}; {progress(done + 1, len(plan), t0)}",
                flush=True,
            )
            if out:  # after every run, so that a benchmark cut short keeps what it measured
                write_results(out, ["bench.training", *args.argv], result, table(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return result


# Where a step's CPU time goes: each profiled op goes to the first category that its own name or one of its callers'
# names (outermost first) matches. Callers: the profile's own ranges (data, optimizer, norm), torch's autograd nodes.
CATEGORIES = {
    "matrix products": re.compile(r"^aten::(linear|mm|addmm|bmm|baddbmm|matmul)$|: (Mm|Addmm|Bmm|Baddbmm)Backward"),
    "attention": re.compile(r"scaled_dot_product|ScaledDotProduct|^aten::_softmax|SoftmaxBackward"),
    "norms": re.compile(r"^norm$|Norm\w*Backward|_LayerNorm\w*Backward|LayerNorm"),
    "activation": re.compile(r"^aten::gelu|GeluBackward"),
    "optimizer": re.compile(r"^optimizer$|^Optimizer\."),
    "data": re.compile(r"^data$"),
}
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


def matmul_rate(shapes: dict[tuple, list[float]], device: str) -> float | None:
    """GFLOP/s of the step's own matrix products (each op and input shape), each timed alone, FLOP-weighted."""
    import torch

    from bench.common import timed

    total_flops = total_s = 0.0
    for (name, dims), (count, flops) in shapes.items():
        args = [torch.randn(d, device=device) for d in dims]
        op = getattr(torch, name.removeprefix("aten::"))
        op(*args)
        seconds = median([timed(lambda op=op, args=args: op(*args), device, calls=20) for _ in range(5)])
        total_flops += flops
        total_s += seconds * count
    return total_flops / total_s / 1e9 if total_s else None


def profile_norm(norm: str, cfg: options.TrainConfig, device: str, steps: int, data_dir: str | None) -> dict[str, Any]:
    """A few training steps of one norm under torch.profiler, in this process, as train.py takes them (a batch from
    the prepared data, forward, backward, clip, the optimizer model.configure_optimizers builds): kernels per step,
    how busy the GPU is, where the CPU's time goes (self time per op, and per category), and the rate of the
    step's matrix products in the step and alone."""
    import torch
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    from data.common import DataError, PreparedData
    from device import autocast, resolve_dtype
    from layernorm import Norm
    from model import GPT, GPTConfig

    try:
        data = PreparedData(data_dir, cfg.dataset, cfg.block_size)
    except DataError as e:
        raise SystemExit(f"error: {e}") from None
    model_args = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(GPTConfig) if hasattr(cfg, f.name)}
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(**{**model_args, "norm": norm, "vocab_size": data.vocab_size})).to(device)
    device_type = device.split(":")[0]
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
    mixed = autocast(device, resolve_dtype(cfg.dtype, device_type))
    gen = torch.Generator().manual_seed(cfg.seed)
    for module in model.modules():  # each norm's forward as a range of its own (its backward is an autograd node)
        if isinstance(module, Norm):
            module.register_forward_pre_hook(lambda m, _: setattr(m, "_range", record_function("norm").__enter__()))
            module.register_forward_hook(lambda m, _, __: m._range.__exit__(None, None, None))

    def step() -> None:
        with record_function("data"):
            starts = torch.randint(data.num_starts("train"), (cfg.batch_size,), generator=gen)
            x, y = data.get("train", starts, device)
        with mixed:
            _, loss = model(x, y)
        loss.backward()
        with record_function("optimizer"):
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss.item()  # the read-back train.py makes at a log line

    for _ in range(3):
        step()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.startswith("cuda") else [])
    t0 = time.perf_counter()
    with torch_profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for _ in range(steps):
            step()
    wall_us = (time.perf_counter() - t0) * 1e6
    data.close()
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
    cpu = [e for e in events if e.device_type.name == "CPU"]
    by_category = dict.fromkeys([*CATEGORIES, "everything else"], 0.0)
    shapes: dict[tuple, list[float]] = {}
    for e in cpu:
        by_category[category(e)] += e.self_cpu_time_total / steps
        if e.name in MATMUL_OPS and e.flops:
            dims = tuple(tuple(d) for d in e.input_shapes if d)[:3]  # the tensors (addmm's scalars left out)
            entry = shapes.setdefault((e.name, dims), [0, 0.0])
            entry[0] += 1
            entry[1] += e.flops
    matmul_flops = sum(f for _, f in shapes.values()) / steps
    return {
        "ms_per_step": wall_us / 1000 / steps,
        "kernels_per_step": len(kernels) / steps if kernels else None,
        "gpu_busy": sum(e.device_time for e in kernels) / wall_us if kernels else None,
        "cpu_us_per_step": {e.key: e.self_cpu_time_total / steps for e in ops},
        "calls_per_step": {e.key: e.count / steps for e in ops},
        "copy_calls_per_step": sum(e.count for e in prof.key_averages() if e.key == "aten::copy_") / steps,
        "category_us_per_step": by_category,
        "matmul_gflop_per_step": matmul_flops / 1e9,
        "matmul_gflops_in_step": matmul_flops / by_category["matrix products"] / 1e3,
        "matmul_gflops_alone": matmul_rate(shapes, device),
        "step_gflops": matmul_flops / (wall_us / steps) / 1e3,
    }


def profile(args: argparse.Namespace, device: str) -> tuple[dict[str, Any], str]:
    cfg, rows = train_config(args), {}
    for norm in args.norms.split(","):
        rows[norm] = profile_norm(norm, cfg, device, PROFILE_STEPS, args.data_dir)
        print(f"profile {norm}: {rows[norm]['ms_per_step']:.2f} ms/step", flush=True)
    table = markdown_table(
        ["norm", "ms/step (profiled)", "kernels/step", "GPU busy", "top CPU self time, us/step"],
        [
            [
                n,
                fmt(r["ms_per_step"]),
                fmt(r["kernels_per_step"], ".0f"),
                fmt(r["gpu_busy"] and 100 * r["gpu_busy"], ".0f") + "%",
                "; ".join(f"{k} {v:.0f}" for k, v in r["cpu_us_per_step"].items()),
            ]
            for n, r in rows.items()
        ],
    )
    cats = [*CATEGORIES, "everything else"]
    breakdown = markdown_table(
        ["norm", *[f"{c} ms" for c in cats], "CPU ms", "matmul GFLOP/step", "GFLOP/s: step, its products, alone"],
        [
            [
                n,
                *[fmt(r["category_us_per_step"][c] / 1000) for c in cats],
                fmt(sum(r["category_us_per_step"].values()) / 1000),
                fmt(r["matmul_gflop_per_step"], ".3f"),
                f"{fmt(r['step_gflops'], '.0f')}, {fmt(r['matmul_gflops_in_step'], '.0f')}, "
                f"{fmt(r['matmul_gflops_alone'], '.0f')}",
            ]
            for n, r in rows.items()
        ],
    )
    return (
        {"device": device, "config": args.config, "set": args.set, "steps": PROFILE_STEPS, "norms": rows},
        f"### torch.profiler, {PROFILE_STEPS} training steps per norm on {device}\n\n{table}\n\n"
        f"### Where a step's CPU time goes (self time per category, per step)\n\n{breakdown}",
    )


def write_profile_plot(png: Path, sides: dict[str, dict[str, Any]], norm: str) -> None:
    """One bar per side (e.g. before, after): the step's CPU ms by category; beside it the GFLOP/s of the whole
    step, of its matrix products inside it, and of the same products alone (the machine's rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cats = [*CATEGORIES, "everything else"]
    rows = {name: side["norms"][norm] for name, side in sides.items()}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.2), gridspec_kw={"width_ratios": [2.2, 1]})
    for y, r in enumerate(rows.values()):
        x = 0.0
        for i, cat in enumerate(cats):
            ms = r["category_us_per_step"][cat] / 1000
            left.barh(y, ms, left=x, color=f"C{i}", label=cat if y == 0 else None)
            x += ms
        left.text(x, y, f" {x:.1f} ms", va="center")
    left.set(yticks=range(len(rows)), yticklabels=list(rows), xlabel="CPU ms per training step (self time)")
    left.invert_yaxis()
    left.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    rates = ("step_gflops", "matmul_gflops_in_step", "matmul_gflops_alone")
    labels = ("whole\nstep", "its matrix\nproducts", "the same\nproducts alone")
    width = 0.8 / len(rows)
    for j, (name, r) in enumerate(rows.items()):
        right.bar([i + j * width for i in range(3)], [r[k] or 0 for k in rates], width, label=name)
    right.set(xticks=[i + width * (len(rows) - 1) / 2 for i in range(3)], xticklabels=labels, ylabel="GFLOP/s")
    right.tick_params(axis="x", labelsize=8)
    right.legend(fontsize=8)
    fig.suptitle(f"Where a training step goes: {norm} norm, {next(iter(sides.values()))['config']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def write_loss_pair(before: Path, after: Path, out: Path) -> tuple[dict[str, Any], str]:
    """Two runs' logged losses (their metrics.jsonl) side by side: out (JSON, .md) and one plot of both (.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {name: read_metrics(folder / "metrics.jsonl") for name, folder in (("before", before), ("after", after))}
    logged = {
        name: [(r["kind"], r["iter"], r["loss"] if r["kind"] == "train" else r["val_loss"]) for r in records]
        for name, records in runs.items()
        for records in [[r for r in records if r["kind"] in ("train", "eval")]]
    }
    pairs = list(zip(logged["before"], logged["after"], strict=True))
    rel = [abs(a[2] - b[2]) / abs(a[2]) for a, b in pairs]
    out.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, points), style in zip(logged.items(), ("-", "--"), strict=True):
        for kind in ("train", "eval"):
            kept = [(it, v) for k, it, v in points if k == kind]
            label = f"{name}: {'train' if kind == 'train' else 'val'}"
            ax.plot(*zip(*kept, strict=True), style, marker=".", label=label)
    ax.set(xlabel="iteration", ylabel="loss", title=f"logged losses before and after (max relative gap {max(rel):.1e})")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    rows = [[k, it, f"{a:.7f}", f"{b:.7f}", f"{abs(a - b):.1e}"] for (k, it, a), (_, _, b) in pairs]
    table = markdown_table(["logged", "iter", "before", "after", "|after - before|"], rows)
    return {"before": str(before), "after": str(after), "max_relative_gap": max(rel), "logged": pairs}, table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/shakespeare_char_cpu.json", help="a train.py config file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py option for every side")
    p.add_argument("--norms", default="custom,builtin", help="comma list of norms; NORM:MODE runs it in that mode only")
    p.add_argument(
        "--modes",
        default=["eager"],
        type=comma_list(MODES),
        help=f"comma list from {', '.join(MODES)} (all but eager need CUDA)",
    )
    p.add_argument("--nanogpt", help="a nanoGPT checkout with data/shakespeare_char prepared, run beside ours")
    p.add_argument("--repeats", type=int, default=5, help="alternating runs per side (default 5)")
    p.add_argument("--warmup", type=int, default=10, help="iterations not timed at the start of a run (default 10)")
    p.add_argument("--iters", type=int, default=200, help="timed iterations per run (default 200)")
    p.add_argument("--eval_iters", type=int, default=20, help="batches of the evals at 0 and at the end (default 20)")
    p.add_argument("--curves", action="store_true", help="the config's own iterations and evals (loss curves)")
    p.add_argument(
        "--whole",
        action="store_true",
        help="--curves, with each side's checkpoints and our sample: the config's run as its command runs it",
    )
    p.add_argument(
        "--compare",
        action="store_true",
        help="every norm (or --norms) once, --curves, and evals.csv and val_loss.png beside --out",
    )
    p.add_argument("--target_val", type=float, default=None, help="report the training time to this val loss")
    p.add_argument("--profile", action="store_true", help=f"torch.profiler over {PROFILE_STEPS} steps per norm")
    p.add_argument(
        "--before", type=Path, help="with --profile and --out: an earlier profile's JSON, drawn beside this one (PNG)"
    )
    p.add_argument(
        "--pair",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="two train.py out_dirs: their logged losses side by side, in --out (and one plot, .png)",
    )
    p.add_argument("--time_limit", type=float, default=None, help="seconds before a run is killed")
    p.add_argument("--data_dir", help="our train.py's --data_dir (default: the config's dataset)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N, mps")
    p.add_argument("--verbose", action="store_true", help="echo every line of the runs")
    p.add_argument("--out", type=Path, help="results as JSON here, the table as .md beside it")
    args = p.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.curves = args.curves or args.whole
    if args.compare:
        args.curves, args.repeats = True, 1
        args.norms = args.norms if "--norms" in args.argv else ",".join((*NORMS, NO_NORM))
    if args.nanogpt and not (Path(args.nanogpt) / "data" / "shakespeare_char" / "train.bin").exists():
        raise SystemExit(
            f"error: --nanogpt {args.nanogpt}: no data/shakespeare_char/train.bin there; put Tiny "
            f"Shakespeare in its data/shakespeare_char/input.txt and run its prepare.py there"
        )
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        raise SystemExit(f"error: {e}") from None
    if args.pair:
        result, text = write_loss_pair(*args.pair, args.out or Path("loss_pair.json"))
        write_results(args.out or Path("loss_pair.json"), ["bench.training", *args.argv], result, text)
    elif args.profile:
        result, text = profile(args, device)
        if args.out:
            write_results(args.out, ["bench.training", *args.argv], result, text)
            sides = {"before": json.loads(args.before.read_text()), "after": result} if args.before else {"now": result}
            write_profile_plot(args.out.with_suffix(".png"), sides, args.norms.split(",")[0])
    else:
        result = run_all(args, device, args.out)
        text = table(result)
        if args.out and args.compare:
            write_curves(args.out, result)
    print("\n" + text)
    return result


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(s.get("runs_ok") == s.get("runs") for s in result.get("sides", {}).values()) else 1)
