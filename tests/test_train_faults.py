"""train.py under faults: kill -9 then resume, Ctrl-C (SIGINT) and SIGTERM then resume, a NaN or an inf loss.

Each interrupted run is a real subprocess; the uninterrupted reference runs in-process with the same single
thread, and the resumed run must give exactly its losses, iteration by iteration. A diverging run is train.py
itself, started through a wrapper that makes the model's loss NaN or inf at one iteration (helpers.DIVERGE).
"""

from __future__ import annotations

import math
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from checkpoint import load_checkpoint
from helpers import (
    ROOT,
    assert_one_line_error,
    make_dataset,
    n_train_records,
    records,
    run_cli,
    run_diverging,
    start,
    subprocess_env,
    tiny_args,
    wait_for,
)
from helpers import train_losses as losses


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "data")


# dropout > 0: the dropout masks draw from the torch RNG, whose state must come back from the checkpoint too
@pytest.mark.parametrize("norm", ["builtin", "custom"])
def test_kill_9_then_resume_continues_the_same_run(tmp_path: Path, data_dir: Path, norm: str) -> None:
    args = tiny_args(
        data_dir, tmp_path / "run", "--eval_interval=10", "--lr_decay_iters=200", f"--norm={norm}", "--dropout=0.1"
    )
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
    train.main(
        tiny_args(
            data_dir,
            tmp_path / "whole",
            "--eval_interval=10",
            "--lr_decay_iters=200",
            f"--norm={norm}",
            "--dropout=0.1",
            f"--max_iters={n}",
        )
    )
    whole = losses(tmp_path / "whole")
    assert sorted(whole) == list(range(n))
    # metrics.jsonl of the killed-and-resumed run reads as one run: the killed tail was replaced.
    assert [r["iter"] for r in records(tmp_path / "run", "train")] == list(range(n))
    assert losses(tmp_path / "run") == whole


@pytest.mark.parametrize(
    ("sig", "always_save"),
    [(signal.SIGINT, True), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "ctrl-c-best-only", "sigterm"],
)
def test_a_signal_saves_a_checkpoint_exits_and_the_printed_command_resumes_it(
    tmp_path: Path, data_dir: Path, sig: signal.Signals, always_save: bool
) -> None:
    """Ctrl-C exits 130, SIGTERM 143, each after saving a checkpoint; the command the message prints continues the
    run with exactly the losses of an uninterrupted one."""
    out = tmp_path / "run"
    args = tiny_args(
        data_dir,
        out,
        "--eval_interval=1000",
        "--lr_decay_iters=200",
        "--dropout=0.1",
        f"--always_save_checkpoint={always_save}",
    )
    proc = start(args + ["--max_iters=100000"])
    wait_for(lambda: n_train_records(out) >= 5, proc)
    proc.send_signal(sig)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (stdout[-1000:], err[-2000:])
    assert "Traceback" not in err
    # In best-only mode ckpt.pt is never overwritten by an interruption: the state goes beside it.
    saved = out / ("ckpt.pt" if always_save else "ckpt_interrupted.pt")
    assert (out / "ckpt.pt").exists() == always_save
    k = load_checkpoint(saved)["iter_num"]  # eval_interval=1000: only the interruption saved one
    assert k >= 5
    assert f"interrupted ({sig.name}) after {k} iterations; saved {saved}. To continue the run: " in err
    command = err.split("To continue the run: ")[1].strip()
    assert "--init_from=resume" in command and ("mv " in command) != always_save
    n = k + 4
    command = command.replace("python train.py", f"{shlex.quote(sys.executable)} train.py") + f" --max_iters={n}"
    resumed = subprocess.run(
        command, shell=True, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out / 'ckpt.pt'} at iteration {k}" in resumed.stdout
    train.main(
        tiny_args(
            data_dir,
            tmp_path / "whole",
            "--eval_interval=1000",
            "--lr_decay_iters=200",
            "--dropout=0.1",
            f"--max_iters={n}",
        )
    )
    assert sorted(losses(tmp_path / "whole")) == list(range(n))
    assert losses(out) == losses(tmp_path / "whole")


@pytest.mark.parametrize("factor", ["nan", "inf"])
def test_a_non_finite_loss_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, data_dir: Path, factor: str
) -> None:
    out = tmp_path / "run"
    args = tiny_args(data_dir, out, "--max_iters=30", "--eval_interval=5", "--log_interval=5")
    proc = run_diverging(13, factor, args)
    err = assert_one_line_error(
        proc, 1, f"error: loss is {factor} at iteration 13", f"{out / 'ckpt.pt'} (iteration 10)"
    )
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
