"""What the experiments share. Each script imports it first (`import common`), before the project's modules and
pyplot: it puts the repository root on sys.path (a script runs as python experiments/NAME.py, from anywhere) and
sends matplotlib's figures to files. Then: the command line every experiment has, the tiny model of its --smoke
run, the prepared data opened with a one-line error, and the machine a result was measured on."""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path
from typing import Any

import matplotlib
import torch

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


def machine() -> dict[str, Any]:
    """The machine a result was measured on: the platform, the CPU's name and cores, torch and its threads."""
    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    return {
        "platform": platform.platform(),
        "cpu": names[0] if names else platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }
