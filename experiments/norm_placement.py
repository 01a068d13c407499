"""Pre-norm against post-norm: gradients at initialization, and training with and without a learning-rate warmup.

    python experiments/norm_placement.py                 # the defaults: about 8 minutes on two CPU cores
    python experiments/norm_placement.py --data_dir=data/shakespeare_char --smoke   # a tiny end-to-end check

With LayerNorm ("builtin"), what Xiong et al. (2020) predict (docs/04-why-layernorm.md): (a) at initialization, each
block's gradient norm over its attention and over its MLP parameters, the mean over --grad_batches batches and
--grad_seeds seeds, in this process; (b) four train.py runs, pre and post, each with and without warmup, at the same
peak learning rate, seed and data stream (a run that stops at a NaN or inf loss is recorded as diverged). Writes
norm_placement.json, grad_norms.png and training.png to --results_dir.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import common  # first: the repository's modules on sys.path, figures to files
import matplotlib.pyplot as plt
import torch
from torch.nn.utils import get_total_norm

from machinery.command import Failure, run_command
from machinery.dataset import PreparedData
from machinery.runlog import read_metrics
from model import GPT, GPTConfig

POSITIONS = ("pre", "post")
# The options both parts share, and their defaults (the model of (a); (b)'s models but for their depth).
SHARED = {"n_layer": 12, "n_head": 4, "n_embd": 128, "block_size": 64, "batch_size": 12, "seed": 1337}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__, "norm_placement", "2 layers, 32 wide, a few iterations: checks the pipeline")
    for name, default in SHARED.items():
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--grad_seeds", type=int, default=3, help="(a) models per placement")
    p.add_argument("--grad_batches", type=int, default=4, help="(a) batches per model")
    p.add_argument("--train_n_layer", type=int, default=12, help="(b) depth of the trained models")
    p.add_argument("--max_iters", type=int, default=800, help="(b) iterations per run")
    p.add_argument("--learning_rate", type=float, default=1e-3, help="(b) peak learning rate of all four runs")
    p.add_argument("--warmup_iters", type=int, default=100, help="(b) warmup of the runs with warmup")
    p.add_argument("--eval_interval", type=int, default=100)
    p.add_argument("--eval_iters", type=int, default=20)
    args = p.parse_args(argv)
    if args.smoke:  # the tiny model in both parts, and a few iterations
        vars(args).update(common.SMOKE_MODEL, train_n_layer=common.SMOKE_MODEL["n_layer"], grad_seeds=1, grad_batches=2)
        vars(args).update(max_iters=6, warmup_iters=2, eval_interval=3, eval_iters=2)
    return args


def grad_norms_at_init(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    """(a): {position: {"attn": [per block], "mlp": [per block]}}, each the mean over seeds and batches of the
    gradient norm over that sublayer's parameters."""
    data = PreparedData(args.data_dir, common.DATASET, args.block_size)
    batches = common.fixed_batches(data, "train", args.batch_size, args.grad_batches, args.seed)
    data.close()
    out = {}
    for position in POSITIONS:
        sums = {part: torch.zeros(args.n_layer, dtype=torch.float64) for part in ("attn", "mlp")}
        for seed in range(args.grad_seeds):
            config = GPTConfig.from_options(args, vocab_size=data.vocab_size, norm_position=position)
            model = GPT.from_seed(config, args.seed + seed).train()
            for x, y in batches:
                model.zero_grad(set_to_none=True)
                model(x, y)[1].backward()
                for i, block in enumerate(model.transformer.h):
                    for part in ("attn", "mlp"):
                        sums[part][i] += get_total_norm([p.grad.double() for p in getattr(block, part).parameters()])
        n = args.grad_seeds * args.grad_batches
        out[position] = {part: (s / n).tolist() for part, s in sums.items()}
        mlp = out[position]["mlp"]
        first_last = f"first block {mlp[0]:.3g}, last {mlp[-1]:.3g} (last/first {mlp[-1] / mlp[0]:.2f})"
        print(f"(a) {position}-norm, {args.n_layer} layers: MLP gradient norm {first_last}", flush=True)
    return out


def train_runs(args: argparse.Namespace, tmp: Path) -> dict[str, dict]:
    """(b): four train.py runs; {name: {"command", "warmup_iters", "norm_position", "evals", "train", "summary",
    "diverged", "returncode", "wall_s"}}."""
    runs = {}
    for position in POSITIONS:
        for warmup in (args.warmup_iters, 0):
            name = f"{position}, {'warmup ' + str(warmup) if warmup else 'no warmup'}"
            out_dir = tmp / f"{position}-warmup{warmup}"
            options = {**{k: getattr(args, k) for k in SHARED}, "n_layer": args.train_n_layer}
            options |= {"learning_rate": args.learning_rate, "min_lr": args.learning_rate / 10}
            options |= {"max_iters": args.max_iters, "lr_decay_iters": args.max_iters, "warmup_iters": warmup}
            options |= {"eval_interval": args.eval_interval, "eval_iters": args.eval_iters}
            options |= {"log_interval": max(1, args.eval_interval // 4), "norm_position": position}
            flags = [*(f"--{k}={v}" for k, v in options.items()), "--dropout=0.0"]
            print(f"(b) {name}: train.py {' '.join(flags)}", flush=True)
            t0 = time.perf_counter()
            proc = common.train(name, flags, args.data_dir, out_dir)
            wall_s = time.perf_counter() - t0
            lines = proc.stdout.splitlines()
            records = read_metrics(out_dir / "metrics.jsonl")
            summary = next((r for r in records if r["kind"] == "summary"), None)
            runs[name] = {
                "norm_position": position,
                "warmup_iters": warmup,
                "command": proc.args[1:],
                "returncode": proc.returncode,
                "wall_s": wall_s,
                "diverged": any("diverg" in line.lower() for line in lines),
                "evals": [r for r in records if r["kind"] == "eval"],
                "train": [{k: r[k] for k in ("iter", "loss", "lr")} for r in records if r["kind"] == "train"],
                "summary": summary,
                "last_lines": lines[-3:],
            }
            if proc.returncode != 0 and not runs[name]["diverged"]:
                raise Failure(f"train.py failed ({proc.returncode}):\n" + "\n".join(lines[-10:]))
            outcome = "DIVERGED" if runs[name]["diverged"] else f"final val loss {summary['final_val_loss']:.4f}"
            print(f"    [{name}] {outcome} ({wall_s:.0f} s)", flush=True)
    return runs


def plot(args: argparse.Namespace, grads: dict, runs: dict, results: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    layers = range(1, args.n_layer + 1)
    for ax, part in zip(axes, ("attn", "mlp"), strict=True):
        for position, style in zip(POSITIONS, ("o-", "s--"), strict=True):
            ax.plot(layers, grads[position][part], style, label=f"{position}-norm")
        ax.set(title=f"{part} weights", xlabel="block (1 = next to the input)", yscale="log")
    axes[0].set_ylabel("gradient norm at init")
    axes[0].legend()
    fig.suptitle(
        f"Gradient norm per block at initialization: {args.n_layer} layers, {args.n_embd} wide, "
        f"mean of {args.grad_seeds} seeds x {args.grad_batches} batches"
    )
    common.save_figure(fig, results / "grad_norms.png")

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        color = "C0" if run["norm_position"] == "pre" else "C3"
        style = "-" if run["warmup_iters"] else "--"
        label = name + (" (diverged)" if run["diverged"] else "")
        train = ([r["iter"] for r in run["train"]], [r["loss"] for r in run["train"]])
        evals = ([r["iter"] for r in run["evals"]], [r["val_loss"] for r in run["evals"]])
        axes[0].plot(*train, style, color=color, label=label, alpha=0.8)
        axes[1].plot(*evals, style, color=color, marker=".", label=label)
    axes[0].set(title="train loss (one batch)", xlabel="iteration", ylabel="loss")
    axes[1].set(title="val loss", xlabel="iteration")
    axes[1].legend()
    fig.suptitle(
        f"{args.train_n_layer} layers, {args.n_embd} wide, peak lr {args.learning_rate:g}, "
        f"cosine to lr/10 over {args.max_iters} iterations"
    )
    common.save_figure(fig, results / "training.png")


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    args = parse_args(argv)
    results = Path(args.results_dir)
    results.mkdir(parents=True, exist_ok=True)
    grads = grad_norms_at_init(args)
    print(f"(a) done in {time.perf_counter() - t0:.0f} s", flush=True)
    with tempfile.TemporaryDirectory(prefix="norm_placement-") as tmp:
        runs = train_runs(args, Path(tmp))
    plot(args, grads, runs, results)
    run_time = time.perf_counter() - t0
    ratios = {p: {part: g[-1] / g[0] for part, g in grads[p].items()} for p in POSITIONS}
    final = {name: None if r["diverged"] else r["summary"]["final_val_loss"] for name, r in runs.items()}
    record = {"args": vars(args), "run_time_s": run_time, "grad_norms_at_init": grads}
    record |= {"grad_norm_ratio_last_over_first": ratios, "final_val_loss": final, "runs": runs}
    common.write_json(results / "norm_placement.json", argv, record)
    for p in POSITIONS:
        print(f"{p}-norm gradient norm, last block / first: attn {ratios[p]['attn']:.2f}, mlp {ratios[p]['mlp']:.2f}")
    for name, loss in final.items():
        print(f"{name}: {'diverged' if loss is None else f'final val loss {loss:.4f}'}")
    print(f"wrote {results}/norm_placement.json, grad_norms.png, training.png; total time {run_time:.0f} s")


if __name__ == "__main__":
    sys.exit(run_command(main))
