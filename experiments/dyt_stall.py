"""Why DyT stalled: the scale of what each norm hands on, of the logits, and the gradient reaching each block.

    python experiments/dyt_stall.py                  # the defaults: about 1.5 minutes on two CPU cores
    python experiments/dyt_stall.py --data_dir=data/shakespeare_char --smoke      # a tiny end-to-end check

Three models of the CPU configuration, from the same seed: LayerNorm, DyT at the paper's default (every alpha
starting at 0.5, the embeddings unscaled: PAPER_DEFAULT_DYT) and DyT with its recipe (--norm=dyt). Each is measured at
initialization and after --iters iterations of train.py (the schedule of a full run, cut there), on --batches training
batches: the median per-token RMS entering each norm and of what it hands on (ln_1 to the attention, ln_2 to the MLP,
ln_f to the head), of the logits, the gradient norm of each block, and for DyT alpha and the share of elements tanh
saturates (|alpha x| > 2, where its slope is below 0.07). Writes dyt_stall.json and dyt_stall.png to --results_dir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import common  # first: the repository's modules on sys.path, figures to files
import matplotlib.pyplot as plt
import torch

from bench.common import at_least
from machinery.checkpoint import load_checkpoint
from machinery.command import Failure, run_command
from machinery.dataset import PreparedData
from machinery.measure import progress
from model import GPT

CONFIG = common.CPU_CONFIG
PAPER_DEFAULT_DYT = ["--norm=dyt", "--norm_alpha=0.5", "--embed_scale=false"]
MODELS = {"LayerNorm": ["--norm=builtin"], "DyT, alpha 0.5": PAPER_DEFAULT_DYT, "DyT, recipe": ["--norm=dyt"]}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__, "dyt_stall", "2 layers, 32 wide, 4 iterations: checks the pipeline")
    p.add_argument(
        "--iters", type=at_least(1), default=300, help="iterations of train.py before the second measurement"
    )
    p.add_argument("--batches", type=at_least(1), default=8, help="training batches each measurement averages over")
    args = p.parse_args(argv)
    args.extra = common.SMOKE_FLAGS if args.smoke else []
    if args.smoke:
        vars(args).update(iters=4, batches=2)
    return args


def trained_model(name: str, flags: list[str], args: argparse.Namespace, out_dir: Path) -> GPT:
    """--iters iterations of train.py with these flags (a child process); the model it checkpointed."""
    schedule = {"max_iters": args.iters, "eval_interval": args.iters, "eval_iters": 10}
    schedule["log_interval"] = max(1, args.iters // 3)
    proc = common.train(name, [CONFIG, *flags, *(f"--{k}={v}" for k, v in schedule.items())], args.data_dir, out_dir)
    if proc.returncode != 0:
        raise Failure(f"train.py failed ({proc.returncode}): {proc.stdout.strip()[-500:]}")
    return GPT.from_checkpoint(load_checkpoint(out_dir / "ckpt.pt"))


def token_rms(x: torch.Tensor) -> float:
    """The median over tokens of each token's RMS over its features."""
    return x.detach().double().pow(2).mean(-1).sqrt().median().item()


def measure(model: GPT, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """{"norm_in"/"norm_out": {norm: RMS}, "logits": RMS, "grad": [per block]}, each the mean over batches."""
    model.train()
    modules = model.named_modules()
    norms = {k.removeprefix("transformer."): m for k, m in modules if k.split(".")[-1] in ("ln_1", "ln_2", "ln_f")}
    out: dict = {"norm_in": dict.fromkeys(norms, 0.0), "norm_out": dict.fromkeys(norms, 0.0), "logits": 0.0}
    out |= {"grad": [0.0] * len(model.transformer.h), "saturated": {}, "alpha": {}}

    def record(name: str, module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        out["norm_in"][name] += token_rms(inputs[0]) / len(batches)
        out["norm_out"][name] += token_rms(output) / len(batches)
        if hasattr(module, "alpha"):  # DyT
            share = ((module.alpha * inputs[0]).abs() > 2).double().mean().item()
            out["saturated"][name] = out["saturated"].get(name, 0.0) + share / len(batches)
            out["alpha"][name] = module.alpha.item()

    handles = [m.register_forward_hook(partial(record, name)) for name, m in norms.items()]
    for x, y in batches:
        model.zero_grad(set_to_none=True)
        logits, loss = model(x, y)
        out["logits"] += token_rms(logits) / len(batches)
        loss.backward()
        for i, block in enumerate(model.transformer.h):
            grads = [p.grad.double().pow(2).sum() for p in block.parameters() if p.grad is not None]
            out["grad"][i] += torch.sqrt(sum(grads)).item() / len(batches)
    for h in handles:
        h.remove()
    return out


def plot(results: dict, args: argparse.Namespace, path: Path) -> None:
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    axes = axes.flatten()
    for (name, r), color in zip(results.items(), ("C0", "C3", "C2"), strict=True):
        for when, style in (("init", "--"), ("trained", "-")):
            m = r[when]
            label = f"{name}, {'initialization' if when == 'init' else f'after {args.iters} iterations'}"
            names = list(m["norm_out"])
            series = [list(m["norm_in"].values()), [*m["norm_out"].values(), m["logits"]], m["grad"]]
            series.append(list(m["saturated"].values()))  # DyT's only: empty for LayerNorm
            for i, (ax, ys) in enumerate(zip(axes, series, strict=True)):
                xs = range(1, len(ys) + 1) if i == 2 else range(len(ys))  # the blocks from 1
                if ys:
                    ax.plot(xs, ys, style, color=color, marker=".", label=label)
    axes[0].set(title="RMS of the residual stream entering each norm", yscale="log")
    axes[1].set(title="RMS of what each norm hands on, and of the logits", yscale="log")
    axes[2].set(title="gradient norm of each block's parameters", xlabel="block", yscale="log")
    axes[2].set_xticks(range(1, len(m["grad"]) + 1))
    axes[3].set(title="DyT: share of elements tanh saturates (|alpha x| > 2)", ylim=(-0.02, 1.02))
    for ax, labels in ((axes[0], names), (axes[1], [*names, "logits"]), (axes[3], names)):
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
    axes[2].legend(fontsize=7)
    fig.suptitle(f"{CONFIG} (median per-token RMS, mean of {args.batches} training batches of the same seed)")
    common.save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    args = parse(argv)
    results_dir = Path(args.results_dir)
    base = common.cpu_config(*args.extra)  # the batches' shape: the configuration's
    data = PreparedData(args.data_dir, common.DATASET, base.block_size)
    batches = common.fixed_batches(data, "train", base.batch_size, args.batches, seed=0)
    data.close()
    results = {}
    with tempfile.TemporaryDirectory(prefix="dyt_stall-") as tmp:
        for i, (name, flags) in enumerate(MODELS.items()):
            flags = [*flags, *args.extra]
            init = measure(common.new_run(common.cpu_config(*flags, f"--data_dir={args.data_dir}")).model, batches)
            rms = f"ln_1 of block 1 hands on RMS {init['norm_out']['h.0.ln_1']:.3g}, logits RMS {init['logits']:.3g}"
            line = f"{name}: at init {rms}; training {args.iters} iterations"
            print(f"{line} ({progress(i, len(MODELS), t0)})", flush=True)
            trained = measure(trained_model(name, flags, args, Path(tmp) / str(i)), batches)
            results[name] = {"flags": flags, "init": init, "trained": trained}
    plot(results, args, results_dir / "dyt_stall.png")
    run_time = time.perf_counter() - t0
    commands = {name: " ".join(["python train.py", CONFIG, *r["flags"]]) for name, r in results.items()}
    record = {"train_commands": commands, "iters": args.iters, "batches": args.batches}
    record |= {"run_time_s": round(run_time, 1), "results": results}
    common.write_json(results_dir / "dyt_stall.json", argv, record)
    print(f"wrote {results_dir}/dyt_stall.json and dyt_stall.png; total time {run_time:.0f} s")


if __name__ == "__main__":
    sys.exit(run_command(main))
