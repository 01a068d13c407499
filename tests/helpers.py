"""Helpers shared by several test files: norms that can't run here, and tiny training runs of train.py.

Training runs use tiny models (2 layers, 32 wide, block 16, batch 4) on a tiny character dataset written by
`make_dataset`. Subprocesses run with one thread: with several engineers' processes on two cores, torch's
multi-threaded kernels slow down badly, and one thread keeps results identical between processes.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from layernorm import TritonUnavailableError, make_norm

ROOT = Path(__file__).resolve().parents[1]
TEXT = "the quick brown fox jumps over the lazy dog; a stitch in time saves nine.\n" * 200
VOCAB = len(set(TEXT))  # 30
TINY = [
    "--n_layer=2",
    "--n_head=2",
    "--n_embd=32",
    "--block_size=16",
    "--batch_size=4",
    "--eval_iters=2",
    "--log_interval=1",
    "--warmup_iters=2",
    "--lr_decay_iters=40",
    "--sample_at_end=False",
    "--device=cpu",
]

# `python -c DIVERGE AT FACTOR ARGS...` runs train.py with ARGS, with the model's training loss multiplied by FACTOR
# (nan, inf) at its AT-th training forward pass (counted from 0: iteration AT of a run from scratch with one
# micro-step). train.py is not changed: the patch replaces GPT.forward before train.py is loaded, and everything
# after the loss (backward, the weights, the read-back that must notice) is the real thing.
DIVERGE = """\
import runpy, sys
sys.path.insert(0, ".")
import model
at, factor = int(sys.argv[1]), float(sys.argv[2])
forward, calls = model.GPT.forward, [0]
def diverging_forward(self, idx, targets=None, kv_cache=None):
    logits, loss = forward(self, idx, targets, kv_cache)
    if self.training and targets is not None:
        if calls[0] == at:
            loss = loss * factor
        calls[0] += 1
    return logits, loss
model.GPT.forward = diverging_forward
sys.argv = ["train.py", *sys.argv[3:]]
runpy.run_path("train.py", run_name="__main__")
"""


class RunsCodeOnLoad:
    """Pickled, this object is the call `function(*args)`: unpickling it makes that call."""

    def __init__(self, function: Callable[..., object], *args: object) -> None:
        self.function, self.args = function, args

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return self.function, self.args


# What a malicious checkpoint could hold: an object whose unpickling writes `marker`. torch's weights_only loader
# refuses both, with different errors: Path.touch is a global it does not allow, os.system comes from a module it
# blocks outright.
PAYLOADS: dict[str, Callable[[Path], RunsCodeOnLoad]] = {
    "Path.touch": lambda marker: RunsCodeOnLoad(Path.touch, marker),
    "os.system": lambda marker: RunsCodeOnLoad(os.system, f"echo ran > {shlex.quote(str(marker))}"),
}


def save_with_payload(path: Path, checkpoint: dict, marker: Path, payload: str = "Path.touch") -> None:
    """`checkpoint` (otherwise valid) saved to `path` with one more entry whose unpickling would write `marker`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**checkpoint, "note": PAYLOADS[payload](marker)}, path)


def skip_unless_runs(norm: str) -> None:
    """Skip a test for a norm that can't run here (Triton without CUDA or its CPU interpreter)."""
    try:
        make_norm(norm, 8)(torch.randn(2, 8))
    except TritonUnavailableError as e:
        pytest.skip(f"{norm} can't run here: {str(e).splitlines()[0]}")


def make_dataset(folder: Path, text: str = TEXT, val_fraction: float = 0.1) -> Path:
    """A character-level dataset in the data/<name>/ format: train.bin, val.bin (uint16), meta.json."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    n = len(ids) - int(len(ids) * val_fraction)
    ids[:n].tofile(folder / "train.bin")
    ids[n:].tofile(folder / "val.bin")
    meta = {
        "vocab_size": len(chars),
        "tokenizer": {"kind": "char", "itos": chars},
        "train_tokens": n,
        "val_tokens": len(ids) - n,
    }
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def tiny_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", *TINY, *extra]


def subprocess_env(drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}


def run_cli(
    args: list[str], timeout: float = 120, drop: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """`python train.py ARGS` from the repository root."""
    return subprocess.run(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=subprocess_env(drop, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_diverging(at: int, factor: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """train.py ARGS in a subprocess whose training loss is multiplied by `factor` at forward pass `at` (DIVERGE)."""
    return subprocess.run(
        [sys.executable, "-c", DIVERGE, str(at), factor, *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def start(args: list[str]) -> subprocess.Popen[str]:
    """`python train.py ARGS`, started in the background."""
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.02)


def n_train_records(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


def records(out_dir: Path, kind: str) -> list[dict]:
    lines = (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def train_losses(out_dir: Path) -> dict[int, float]:
    return {r["iter"]: r["loss"] for r in records(out_dir, "train")}


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
