"""train.py with several processes: torchrun, DistributedDataParallel over gloo on the CPU.

A 2-process run and a 1-process run with the same global batch (gradient_accumulation_steps is the global number
of micro-batches) see the same data and must give the same losses, to float tolerance (the gradient all-reduce
sums in another order).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from checkpoint import load_checkpoint
from helpers import ROOT, make_dataset, records, subprocess_env, tiny_args, train_losses
from options import ConfigError


def test_two_gloo_processes_match_one_process(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    args = ["--gradient_accumulation_steps=4", "--max_iters=4", "--eval_interval=2", "--dropout=0.0"]
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py",
         *tiny_args(data, tmp_path / "ddp", *args)],
        cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "processes=2" in proc.stdout
    assert proc.stdout.count("iter 3: loss") == 1  # only rank 0 prints
    single = train.main(tiny_args(data, tmp_path / "one", *args))

    ddp_losses, one_losses = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "one")
    assert sorted(ddp_losses) == sorted(one_losses) == [0, 1, 2, 3]  # one record per iteration: rank 0 writes
    for it in one_losses:
        assert ddp_losses[it] == pytest.approx(one_losses[it], abs=1e-5), it
    ddp_evals, one_evals = records(tmp_path / "ddp", "eval"), records(tmp_path / "one", "eval")
    assert [r["iter"] for r in ddp_evals] == [r["iter"] for r in one_evals] == [0, 2, 4]
    for a, b in zip(ddp_evals, one_evals, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    (summary,) = records(tmp_path / "ddp", "summary")
    assert summary["world_size"] == 2 and summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=1e-5)

    # The checkpoint is rank 0's unwrapped model (no "module." prefixes), and one process can resume it.
    ckpt = load_checkpoint(tmp_path / "ddp" / "ckpt.pt")
    assert ckpt["iter_num"] == 4 and not any(k.startswith("module.") for k in ckpt["model"])
    one = load_checkpoint(tmp_path / "one" / "ckpt.pt")
    for key, value in one["model"].items():
        torch.testing.assert_close(ckpt["model"][key], value, atol=1e-5, rtol=1e-4)


def test_accumulation_steps_must_divide_among_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as e:
        train.main(tiny_args(data, tmp_path / "out", "--gradient_accumulation_steps=3"))
    assert "gradient_accumulation_steps=3" in str(e.value) and "processes (2)" in str(e.value)
