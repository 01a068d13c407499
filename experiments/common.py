"""What the experiments share (experiments/README.md lists it). Each script imports it first (`import common`), before
the project's modules and pyplot: it puts the repository root on sys.path (a script runs as python
experiments/NAME.py, from anywhere) and sends matplotlib's figures to files."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
matplotlib.use("Agg")  # figures are written to files; no window opens

import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)

from machinery.command import ArgumentParser  # noqa: E402 (the root is on sys.path from here)
from machinery.dataset import PreparedData  # noqa: E402
from machinery.device import Dist, resolve_dtype  # noqa: E402
from machinery.measure import machine_info, train_config  # noqa: E402

CPU_CONFIG = "configs/shakespeare_char_cpu.json"  # as the results name it; read from ROOT
DATASET = "shakespeare_char"
# --smoke: the model and batch of every experiment's tiny end-to-end run, as train.py's options
SMOKE_MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4}
SMOKE_FLAGS = [f"--{key}={value}" for key, value in SMOKE_MODEL.items()]


def parser(description: str, name: str, smoke_help: str, data_dir: bool = True) -> argparse.ArgumentParser:
    """--results_dir (experiments/results/<name>), --smoke, and --data_dir (the prepared Tiny Shakespeare)."""
    p = ArgumentParser(description=description.split("\n\n")[0])
    if data_dir:
        p.add_argument("--data_dir", default=str(ROOT / "data" / DATASET))
    p.add_argument("--results_dir", default=str(ROOT / "experiments" / "results" / name))
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    return p


def cpu_config(*flags: str) -> Any:
    """train.py's options (an options.TrainConfig) for CPU_CONFIG with these flags."""
    return train_config(str(ROOT / CPU_CONFIG), [], *flags)


def new_run(cfg: Any) -> Any:
    """A new run on the CPU as train.py sets it up (train.setup: the data, the model from cfg.seed, the optimizer,
    the data stream), in this one process; a missing or broken dataset is a DataError."""
    from train import setup  # (train below is train.py as a child process)

    return setup(cfg, {}, None, "cpu", resolve_dtype(cfg.dtype, "cpu"), Dist())


def fixed_batches(data: PreparedData, split: str, batch_size: int, count: int, seed: int) -> list[tuple[Any, Any]]:
    """`count` batches of `split` on the CPU, drawn from their own generator: the same for every model measured."""
    gen = torch.Generator().manual_seed(seed)
    starts = [torch.randint(data.num_starts(split), (batch_size,), generator=gen) for _ in range(count)]
    return [data.get(split, s, "cpu") for s in starts]


def train(label: str, flags: list[str], data_dir: str, out_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python train.py FLAGS` on the CPU from the repository's root, on data_dir's data, its checkpoint and
    metrics.jsonl in out_dir, without the sample at the end; its output and errors together in .stdout, its eval and
    error lines echoed after `[label]`."""
    where = [f"--data_dir={data_dir}", f"--out_dir={out_dir}", "--device=cpu", "--sample_at_end=false"]
    cmd = [sys.executable, "train.py", *flags, *where]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shown = [f"    [{label}] {line}\n" for line in proc.stdout.splitlines() if line.startswith(("step ", "error"))]
    print("".join(shown), end="", flush=True)
    return proc


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """fig, with a faint grid on every plot, as a PNG at path (its folder made), then closed."""
    for ax in fig.axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def write_json(path: Path, argv: list[str] | None, result: dict[str, Any]) -> None:
    """result as JSON at path (<name>.json, made by experiments/<name>.py), after the command line that made it and
    before the machine it ran on."""
    command = " ".join([f"python experiments/{path.stem}.py", *(sys.argv[1:] if argv is None else argv)])
    path.parent.mkdir(parents=True, exist_ok=True)
    result = {"command": command, **result, "machine": machine_info()}
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
