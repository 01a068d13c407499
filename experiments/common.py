"""What the experiments share. Each script imports it first (`import common`), before the project's modules and
pyplot: it puts the repository root on sys.path (a script runs as python experiments/NAME.py, from anywhere) and
sends matplotlib's figures to files. Then: the command line every experiment has, the tiny model of its --smoke
run, and the prepared data opened with a one-line error. (The machine in each JSON: bench.common.machine_info.)"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
matplotlib.use("Agg")  # figures are written to files; no window opens

from data.common import DataError, PreparedData  # noqa: E402 (the root is on sys.path from here)

CPU_CONFIG = "configs/shakespeare_char_cpu.json"  # as the results name it; read from ROOT
DATASET = "shakespeare_char"
# --smoke: the model and batch of every experiment's tiny end-to-end run, as train.py's options
SMOKE_MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "batch_size": 4}
SMOKE_FLAGS = [f"--{key}={value}" for key, value in SMOKE_MODEL.items()]


def parser(description: str, name: str, smoke_help: str, data_dir: bool = True) -> argparse.ArgumentParser:
    """--results_dir (experiments/results/<name>), --smoke, and --data_dir (the prepared Tiny Shakespeare)."""
    p = argparse.ArgumentParser(description=description)
    if data_dir:
        p.add_argument("--data_dir", default=str(ROOT / "data" / DATASET))
    p.add_argument("--results_dir", default=str(ROOT / "experiments" / "results" / name))
    p.add_argument("--smoke", action="store_true", help=smoke_help)
    return p


def config_flags(*flags: str) -> list[str]:
    """train.py's command line for CPU_CONFIG with these flags (for options.parse_args)."""
    return [str(ROOT / CPU_CONFIG), *flags]


def open_data(data_dir: str, block_size: int) -> PreparedData:
    """The prepared Tiny Shakespeare in data_dir; a missing or broken one exits with a one-line error."""
    try:
        return PreparedData(data_dir, DATASET, block_size)
    except DataError as e:
        raise SystemExit(f"error: {e}") from None
