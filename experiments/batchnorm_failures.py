"""BatchNorm's three failures in a GPT, on a model trained with BatchNorm, beside LayerNorm.

    python experiments/batchnorm_failures.py          # trains the CPU config with --norm=batchnorm, then measures

Trains configs/shakespeare_char_cpu.json with --norm=batchnorm for --iters iterations (a train.py child), then, on
its checkpoint and on a LayerNorm model of the same size:
1. one token alone: every token of the vocabulary fed alone, [1, 1], with batch statistics (training mode): how
   far apart their logits are;
2. the causal leak: one val window, then the same window with only its last token changed, with batch statistics:
   how far position 0's logits move;
3. training against inference statistics: the val loss with the running averages (eval mode, what train.py's
   evaluation reports), with batch statistics over a training batch, and with batch statistics over one window.
Writes batchnorm_failures.json to --results_dir.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # first: the repository's modules on sys.path
import torch

from machinery.checkpoint import load_checkpoint
from machinery.command import Failure, run_command
from machinery.dataset import PreparedData
from model import GPT

LAYERNORM = "builtin"


@torch.no_grad()
def one_token_spread(model: GPT) -> float:
    """With batch statistics, the largest difference between the logits of any two tokens each fed alone."""
    model = copy.deepcopy(model).train()  # a copy: training mode would update the running averages
    logits = torch.stack([model(torch.tensor([[t]]))[0][0, 0] for t in range(model.config.vocab_size)])
    return (logits - logits[0]).abs().max().item()


@torch.no_grad()
def causal_leak(model: GPT, window: torch.Tensor, training: bool = True) -> float:
    """How far position 0's logits move when only the last token of `window` [T] changes (training mode: batch
    statistics; else the running averages)."""
    model = copy.deepcopy(model).train(training)
    changed = window.clone()
    changed[-1] = (window[-1] + 1) % model.config.vocab_size
    first, second = (model(s[None])[0][0, 0] for s in (window, changed))  # each a batch of one sequence
    return (first - second).abs().max().item()


@torch.no_grad()
def val_loss(model: GPT, batches: list[tuple[Any, Any]], training: bool, rows: int | None = None) -> float:
    """The mean loss over `batches`, with batch statistics (training) or the running averages; `rows` splits each
    batch into forward passes of that many windows."""
    model = copy.deepcopy(model).train(training)
    losses = []
    for x, y in batches:
        step = rows or len(x)
        losses += [model(x[i : i + step], y[i : i + step])[1] for i in range(0, len(x), step)]
    return torch.stack(losses).mean().item()


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    p = common.parser(__doc__, "batchnorm_failures", "a tiny model trained for 4 iterations (for tests)")
    p.add_argument("--iters", type=int, default=600, help="training iterations of the BatchNorm model (default 600)")
    args = p.parse_args(argv)
    iters = 4 if args.smoke else args.iters
    flags = [common.CPU_CONFIG, "--norm=batchnorm", f"--max_iters={iters}", f"--lr_decay_iters={iters}"]
    flags += [f"--eval_interval={iters}", f"--warmup_iters={min(100, iters // 2)}"]
    flags += common.SMOKE_FLAGS if args.smoke else []
    block_size = common.cpu_config(*flags[1:]).block_size
    data = PreparedData(args.data_dir, common.DATASET, block_size)  # a missing dataset: one line, before training
    with tempfile.TemporaryDirectory() as out:
        proc = common.train("batchnorm", flags, args.data_dir, Path(out))
        if proc.returncode != 0:
            last = proc.stdout.strip().splitlines()[-1:] or ["no output"]
            raise Failure(f"train.py {' '.join(flags)} failed: {last[0]}")
        trained = GPT.from_checkpoint(load_checkpoint(Path(out) / "ckpt.pt"))
    cfg = trained.config
    layernorm = GPT.from_seed(dataclasses.replace(cfg, norm=LAYERNORM), seed=0).eval()
    batches = common.fixed_batches(data, "val", 2 if args.smoke else 12, 2 if args.smoke else 8, seed=0)
    window = batches[0][0][0]
    result = {
        "iters": iters,
        "model_args": dataclasses.asdict(cfg),
        "one_token_spread": {"batchnorm": one_token_spread(trained), LAYERNORM: one_token_spread(layernorm)},
        "causal_leak": {
            "batchnorm": causal_leak(trained, window),
            "batchnorm, running averages": causal_leak(trained, window, training=False),
            LAYERNORM: causal_leak(layernorm, window),
        },
        "val_loss": {
            "running averages (eval mode)": val_loss(trained, batches, training=False),
            "batch statistics, a training batch": val_loss(trained, batches, training=True),
            "batch statistics, one window": val_loss(trained, batches, training=True, rows=1),
        },
        "val_windows": sum(len(x) for x, _ in batches),
        "run_time_s": round(time.perf_counter() - t0, 1),
    }
    for key in ("one_token_spread", "causal_leak", "val_loss"):
        print(key, {k: round(v, 4) for k, v in result[key].items()})
    common.write_json(Path(args.results_dir) / "batchnorm_failures.json", argv, result)
    print(f"done in {result['run_time_s']} s")


if __name__ == "__main__":
    sys.exit(run_command(main))
