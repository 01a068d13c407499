"""LayerNorm taken apart: it centres a token (subtracts its mean) and rescales it (divides by its standard deviation).
Which of the two does training need here?

    python experiments/centre_and_rescale.py                        # one seed each: about 18 minutes on two CPU cores
    python experiments/centre_and_rescale.py --seeds 1337 1 2 --rows layernorm rmsnorm      # more seeds for some rows
    python experiments/centre_and_rescale.py --data_dir=data/shakespeare_char --smoke      # a tiny end-to-end check

Five models of the CPU configuration (ROWS below), each trained from the same seed on the same batches with the
same schedule by train.py's iteration with one micro-step (its optimizer, step.get_lr, its data stream,
step.train_step), in this process, since one norm (CentreOnly) is not in the registry. The val loss is estimated
every --eval_interval iterations on --eval_batches fixed batches, the same for every row and seed (train.py's are
drawn from the run's seed). Each finished run is kept in <results_dir>/runs/ and not run again (delete it to rerun);
centre_and_rescale.json, .md and .png are written from every run found there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common  # first: the repository's modules on sys.path, figures to files
import matplotlib.pyplot as plt
import torch

from layernorm import Norm
from machinery.command import run_command
from machinery.dataset import PreparedData
from machinery.measure import markdown_table, progress
from machinery.options import TrainConfig
from machinery.step import get_lr, train_step

ROWS = {  # name: (what it does, the registry norm it is built with)
    "layernorm": ("centre and rescale", "builtin"),
    "rmsnorm": ("rescale only", "rmsnorm"),
    "centre": ("centre only", "builtin"),  # then every norm is swapped for CentreOnly
    "dyt": ("neither: tanh(alpha x)", "dyt"),
    "none": ("nothing", "none"),
}
SMOKE = [*common.SMOKE_FLAGS, "--max_iters=6", "--lr_decay_iters=6", "--warmup_iters=2"]


class CentreOnly(Norm):
    """y = (x - mean(x)) * weight + bias over the last dimension: LayerNorm without the division by the std."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = (x - x.mean(-1, keepdim=True)) * self.weight
        return y if self.bias is None else y + self.bias


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__, "centre_and_rescale", "2 layers, 32 wide, 6 iterations: checks the pipeline")
    p.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    p.add_argument("--seeds", nargs="+", type=int, default=[1337], help="one run per row and seed")
    p.add_argument("--eval_interval", type=int, default=100)
    p.add_argument("--eval_batches", type=int, default=50)
    args = p.parse_args(argv)
    args.argv = argv
    args.extra = SMOKE if args.smoke else []
    if args.smoke:
        vars(args).update(eval_interval=3, eval_batches=2)
    return args


def row_config(row: str, seed: int, args: argparse.Namespace) -> TrainConfig:
    """train.py's options for this row: CPU_CONFIG, the row's norm (with its defaults: DyT's recipe) and the seed."""
    return common.cpu_config(f"--norm={ROWS[row][1]}", f"--seed={seed}", f"--data_dir={args.data_dir}", *args.extra)


def new_row_run(row: str, cfg: TrainConfig) -> Any:
    """The row's run as train.py sets it up (common.new_run), from cfg.seed; the centre row's norms swapped
    for CentreOnly after construction, and its optimizer built again over their parameters."""
    run = common.new_run(cfg)
    if row == "centre":
        model = run.model
        for block in model.transformer.h:
            block.ln_1 = CentreOnly(cfg.n_embd, bias=cfg.bias)
            block.ln_2 = CentreOnly(cfg.n_embd, bias=cfg.bias)
        model.transformer.ln_f = CentreOnly(cfg.n_embd, bias=cfg.bias)
        run.optimizer = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), "cpu")
    return run


def train_row(row: str, cfg: TrainConfig, val: list, args: argparse.Namespace, clock: dict) -> dict:
    """One run: {"row", "seed", "evals": [[iter, val loss]], "final_val_loss", "wall_s", "diverged"}."""
    t0 = time.perf_counter()
    run = new_row_run(row, cfg)
    model, optimizer, data = run.model, run.optimizer, run.data
    evals = []
    for it in range(cfg.max_iters + 1):
        if it % args.eval_interval == 0 or it == cfg.max_iters:
            model.eval()
            with torch.no_grad():
                evals.append([it, sum(model(x, y)[1].item() for x, y in val) / len(val)])
            model.train()
            if not math.isfinite(evals[-1][1]):
                break
            done = clock["done"] + it  # iterations of this invocation so far
            where = f"  {row} seed {cfg.seed}: iter {it}, val loss {evals[-1][1]:.4f}"
            print(f"{where}; iterations {progress(done, clock['total'], clock['t0'])}", flush=True)
        if it == cfg.max_iters:
            break
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it, cfg)
        starts = torch.randint(data.num_starts("train"), (1, cfg.batch_size), generator=run.data_gen)
        xs, ys = data.get("train", starts, "cpu")
        train_step(model, optimizer, xs, ys, grad_clip=cfg.grad_clip)
    data.close()
    clock["done"] += cfg.max_iters
    final = evals[-1][1]
    run = {"row": row, "seed": cfg.seed, "evals": evals, "final_val_loss": final, "diverged": not math.isfinite(final)}
    return {**run, "wall_s": round(time.perf_counter() - t0, 1)}


def summarize(runs: list[dict]) -> dict[str, dict]:
    """Per row: the final val loss of each seed, their mean and (with 2+ seeds) standard deviation."""
    table = {}
    for row in ROWS:
        mine = [r for r in runs if r["row"] == row]
        finals = [r["final_val_loss"] for r in mine]
        if finals:
            std = statistics.stdev(finals) if len(finals) > 1 else None
            seeds = [r["seed"] for r in mine]
            table[row] = {"seeds": seeds, "final_val_loss": finals, "mean": statistics.mean(finals), "std": std}
    return table


def write(runs: list[dict], results: Path, cfg: TrainConfig, args: argparse.Namespace, run_time: float) -> None:
    table = summarize(runs)
    base = table.get("layernorm", {}).get("mean")
    rows = []
    for row, t in table.items():
        std = f"{t['std']:.4f}" if t["std"] is not None else "-"
        delta = f"{t['mean'] - base:+.4f}" if base is not None else "-"
        rows.append([row, ROWS[row][0], len(t["seeds"]), f"{t['mean']:.4f}", std, delta])
    headers = ["row", "what it does", "seeds", "final val loss (mean)", "std", "vs layernorm"]
    text = markdown_table(headers, rows)
    (results / "centre_and_rescale.md").write_text(text + "\n", encoding="utf-8")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    every_row = set.intersection(*(set(t["seeds"]) for t in table.values()))  # the seed every row ran: solid lines
    for i, row in enumerate(table):
        for r in sorted((r for r in runs if r["row"] == row), key=lambda r: r["seed"] not in every_row):
            first = r["seed"] in every_row
            style = {"alpha": 1, "lw": 1.5, "label": f"{row} ({ROWS[row][0]})"} if first else {"alpha": 0.35, "lw": 1}
            ax.plot(*zip(*r["evals"], strict=True), color=f"C{i}", **style)
    title = f"{common.CPU_CONFIG}: {cfg.max_iters} iterations, seed {min(every_row, default='-')} (faint: other seeds)"
    ax.set(xlabel="iteration", ylabel=f"val loss ({args.eval_batches} batches)", ylim=(1.4, 4.3), title=title)
    ax.legend()
    common.save_figure(fig, results / "centre_and_rescale.png")
    record = {"config": common.CPU_CONFIG, "eval_interval": args.eval_interval, "eval_batches": args.eval_batches}
    record |= {"this_invocation_s": round(run_time, 1), "table": table, "runs": runs}
    common.write_json(results / "centre_and_rescale.json", args.argv, record)
    print(text)


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    args = parse(argv)
    results = Path(args.results_dir)
    runs_dir = results / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    base = row_config("layernorm", args.seeds[0], args)
    data = PreparedData(args.data_dir, common.DATASET, base.block_size)
    val = common.fixed_batches(data, "val", base.batch_size, args.eval_batches, seed=0)  # the same for every run
    data.close()
    todo = [
        (row, seed) for seed in args.seeds for row in args.rows if not (runs_dir / f"{row}_seed{seed}.json").exists()
    ]
    clock = {"t0": t0, "done": 0, "total": len(todo) * base.max_iters}
    print(f"{len(todo)} runs of {base.max_iters} iterations to go", flush=True)
    for row, seed in todo:
        run = train_row(row, row_config(row, seed, args), val, args, clock)
        (runs_dir / f"{row}_seed{seed}.json").write_text(json.dumps(run) + "\n", encoding="utf-8")
        print(f"{row} seed {seed}: final val loss {run['final_val_loss']:.4f} ({run['wall_s']:.0f} s)", flush=True)
    runs = [json.loads(p.read_text()) for p in sorted(runs_dir.glob("*.json"))]
    write(runs, results, base, args, time.perf_counter() - t0)
    print(f"wrote {results}/centre_and_rescale.json, .md, .png; total time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    sys.exit(run_command(main))
