"""train.py under faults: kill -9 then resume, Ctrl-C (SIGINT) and SIGTERM, a NaN or an inf loss.

Each interrupted run is a real subprocess; the uninterrupted reference runs in-process with the same single
thread, and the resumed run must give exactly its losses, iteration by iteration. A diverging run is train.py
itself, started through a wrapper that makes the model's loss NaN or inf at one iteration (helpers.DIVERGE).
"""

from __future__ import annotations

import math
import signal
from pathlib import Path

import pytest
import torch

import train
from checkpoint import load_checkpoint
from helpers import (
    assert_one_line_error,
    make_dataset,
    n_train_records,
    records,
    run_cli,
    run_diverging,
    start,
    tiny_args,
    wait_for,
)
from helpers import train_losses as losses


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "data")


def test_kill_9_then_resume_continues_the_same_run(tmp_path: Path, data_dir: Path) -> None:
    args = tiny_args(data_dir, tmp_path / "run", "--eval_interval=10", "--lr_decay_iters=200")
    proc = start(args + ["--max_iters=100000"])
    wait_for(lambda: (tmp_path / "run" / "ckpt.pt").exists(), proc)
    wait_for(lambda: n_train_records(tmp_path / "run") >= 15, proc)  # well past the checkpoint, mid-run
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    k = load_checkpoint(tmp_path / "run" / "ckpt.pt")["iter_num"]
    assert k >= 10 and k % 10 == 0
    n = k + 6
    resumed = run_cli(args + ["--init_from=resume", f"--max_iters={n}"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {tmp_path / 'run' / 'ckpt.pt'} at iteration {k}" in resumed.stdout
    train.main(tiny_args(data_dir, tmp_path / "whole", "--eval_interval=10", "--lr_decay_iters=200",
                         f"--max_iters={n}"))
    whole = losses(tmp_path / "whole")
    assert sorted(whole) == list(range(n))
    # metrics.jsonl of the killed-and-resumed run reads as one run: the killed tail was replaced.
    assert [r["iter"] for r in records(tmp_path / "run", "train")] == list(range(n))
    assert losses(tmp_path / "run") == whole


@pytest.mark.parametrize("always_save", [True, False])
def test_ctrl_c_saves_a_checkpoint_and_exits_cleanly(tmp_path: Path, data_dir: Path, always_save: bool) -> None:
    args = tiny_args(data_dir, tmp_path / "run", "--eval_interval=1000", "--lr_decay_iters=200",
                     f"--always_save_checkpoint={always_save}")
    proc = start(args + ["--max_iters=100000"])
    wait_for(lambda: n_train_records(tmp_path / "run") >= 5, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out[-1000:], err[-2000:])
    assert "Traceback" not in err
    saved = tmp_path / "run" / ("ckpt.pt" if always_save else "ckpt_interrupted.pt")
    assert f"saved {saved}" in err and "--init_from=resume" in err
    ckpt = load_checkpoint(saved)
    k = ckpt["iter_num"]
    assert k >= 5
    if not always_save:  # best-only mode: ckpt.pt is never overwritten by an interruption
        assert not (tmp_path / "run" / "ckpt.pt").exists()
        return
    n = k + 4
    resumed = run_cli(args + ["--init_from=resume", f"--max_iters={n}"])
    assert resumed.returncode == 0, resumed.stderr
    train.main(tiny_args(data_dir, tmp_path / "whole", "--eval_interval=1000", "--lr_decay_iters=200",
                         f"--max_iters={n}"))
    assert losses(tmp_path / "run") == losses(tmp_path / "whole")


@pytest.mark.parametrize("factor", ["nan", "inf"])
def test_a_non_finite_loss_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, data_dir: Path, factor: str
) -> None:
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, "--max_iters=30", "--eval_interval=5", "--log_interval=5")
    proc = run_diverging(13, factor, args)
    err = assert_one_line_error(proc, 1, f"error: loss is {factor} at iteration 13",
                                f"{out / 'ckpt.pt'} (iteration 10)")
    assert "--init_from=resume" in err and "--learning_rate" in err
    assert [r["iter"] for r in records(out, "train")] == [0, 5, 10]  # stopped at the read-back after it
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 10
    assert all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert math.isfinite(ckpt["best_val_loss"])
    # the run can go on from it
    resumed = run_cli(tiny_args(data_dir, out, "--max_iters=12", "--eval_interval=5", "--init_from=resume"))
    assert resumed.returncode == 0, resumed.stderr


def test_a_nan_before_the_first_checkpoint_says_none_was_written(tmp_path: Path, data_dir: Path) -> None:
    proc = run_diverging(2, "nan", tiny_args(data_dir, tmp_path / "run", "--max_iters=30", "--eval_interval=10"))
    assert_one_line_error(proc, 1, "loss is nan at iteration 2", "no checkpoint had been written by this run")
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_sigterm_saves_a_checkpoint_and_exits_143(tmp_path: Path, data_dir: Path) -> None:
    args = tiny_args(data_dir, tmp_path / "run", "--eval_interval=1000", "--lr_decay_iters=200")
    proc = start(args + ["--max_iters=100000"])
    wait_for(lambda: n_train_records(tmp_path / "run") >= 3, proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out[-1000:], err[-2000:])
    assert "Traceback" not in err and "interrupted (SIGTERM)" in err and "--init_from=resume" in err
    k = load_checkpoint(tmp_path / "run" / "ckpt.pt")["iter_num"]
    assert k >= 3 and f"after {k} iterations" in err
