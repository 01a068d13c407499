"""What the benchmarks (bench/) and the experiments (experiments/) record and print beside their figures: the
machine and commit measured, train.py's options for a measurement, a Markdown table, a progress line. torch is
imported where it is used."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from machinery import options
from machinery.command import BadOption

ROOT = Path(__file__).resolve().parents[1]


def train_config(config: str, sets: Sequence[str], *flags: str) -> options.TrainConfig:
    """train.py's options from a config file, KEY=VALUE items (--set) and --key=value flags on top, typed and checked
    by machinery/options.py; a bad one is one line naming --set, whose options `python train.py --help` lists."""
    try:
        return options.build_config(options.parse_args([config, *(f"--{item}" for item in sets), *flags]))
    except BadOption as e:
        told = str(e).replace("--help", "python train.py --help")  # (this command's --help does not list them)
        raise BadOption(f"--set {' '.join(sets)}: {told}") from None


def progress(done: int, total: int, t0: float) -> str:
    """'3/9 done, 42 s in, about 84 s left' (the rest estimated at the mean pace so far; none before the first)."""
    spent = time.perf_counter() - t0
    left = f", about {spent / done * (total - done):.0f} s left" if done else ""
    return f"{done}/{total} done, {spent:.0f} s in{left}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def machine_info() -> dict[str, Any]:
    """The commit measured (BENCH_COMMIT, as bench/gpu.sh passes it to a copy of the tree without git; else git's,
    '+changes' if the files differ from it; else None), CPU, GPU and the versions behind the figures."""
    import torch

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    cpu = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    try:  # without importing it (importing triton fixes TRITON_INTERPRET)
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    commit = os.environ.get("BENCH_COMMIT") or output_of(
        "git", "-C", str(ROOT), "describe", "--always", "--dirty=+changes", "--abbrev=7"
    )
    info = {
        "commit": commit,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu[0] if cpu else platform.processor(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "triton": triton,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    if info["gpu"]:
        query = "--query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version"
        info["nvidia_smi"] = output_of("nvidia-smi", query, "--format=csv,noheader") or ""
        info["cuda"] = torch.version.cuda
    return info


def output_of(*cmd: str) -> str | None:
    """cmd's output, or None where it fails or is not installed (no git, no nvidia-smi: the figures still count)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None
