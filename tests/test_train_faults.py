"""train.py under faults: kill -9 then resume, Ctrl-C (SIGINT) and SIGTERM then resume, a NaN or an inf loss.

Each interrupted run is a real process (the point is what a signal does to one); the resumed run and the
uninterrupted reference run in this process with the same single thread, and the resumed run must give exactly
the reference's losses, iteration by iteration. A diverging run is train.py in this process with the model's loss
made NaN or inf at one iteration (helpers.diverge_at).
"""

from __future__ import annotations

import math
import shlex
import shutil
import signal
from pathlib import Path

import pytest
import torch

import train
from helpers import (
    assert_one_line_error,
    diverge_at,
    n_train_records,
    records,
    start,
    tiny_args,
    train_cli,
    train_losses,
    wait_for,
)
from machinery.checkpoint import load_checkpoint


# dropout > 0: the dropout masks draw from the torch RNG, whose state must come back from the checkpoint too.
# (Every norm's exact resume: test_train.py::test_every_norm_resumes_with_the_losses_of_an_uninterrupted_run.)
@pytest.mark.slow
def test_kill_9_then_resume_continues_the_same_run(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = tiny_args(tiny_data, tmp_path / "run", "--eval_interval=10", "--lr_decay_iters=200", "--dropout=0.1")
    proc = start(args + ["--max_iters=100000"])
    wait_for(lambda: (tmp_path / "run" / "ckpt.pt").exists(), proc)
    wait_for(lambda: n_train_records(tmp_path / "run") >= 15, proc)  # well past the checkpoint, mid-run
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    k = load_checkpoint(tmp_path / "run" / "ckpt.pt")["iter_num"]
    assert k >= 10 and k % 10 == 0
    n = k + 6
    resumed = train_cli(capsys, args + ["--init_from=resume", f"--max_iters={n}"])
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {tmp_path / 'run' / 'ckpt.pt'} at iteration {k}" in resumed.stdout
    train.main([*args, f"--out_dir={tmp_path / 'whole'}", f"--max_iters={n}"])  # (a later flag wins)
    whole = train_losses(tmp_path / "whole")
    assert sorted(whole) == list(range(n))
    # metrics.jsonl of the killed-and-resumed run reads as one run: the killed tail was replaced.
    assert [r["iter"] for r in records(tmp_path / "run", "train")] == list(range(n))
    assert train_losses(tmp_path / "run") == whole


def run_printed_command(capsys: pytest.CaptureFixture[str], command: str, *extra: str) -> str:
    """The resume command train.py printed, `[mv A B && ]python train.py ARGS`, with EXTRA appended: the move made,
    train.py ARGS run in this process. Returns its stdout."""
    *moves, python = command.split(" && ")
    for move in moves:
        mv, source, target = shlex.split(move)
        assert mv == "mv", command
        shutil.move(source, target)
    words = shlex.split(python)
    assert words[:2] == ["python", "train.py"], command
    resumed = train_cli(capsys, [*words[2:], *extra])
    assert resumed.returncode == 0, resumed.stderr
    return resumed.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "always_save"),
    [(signal.SIGINT, True), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "ctrl-c-best-only", "sigterm"],
)
def test_a_signal_saves_a_checkpoint_exits_and_the_printed_command_resumes_it(
    tmp_path: Path, tiny_data: Path, sig: signal.Signals, always_save: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C exits 130, SIGTERM 143, each after saving a checkpoint; the command the message prints continues the
    run with exactly the losses of an uninterrupted one."""
    out = tmp_path / "run"
    flags = ["--eval_interval=1000", "--lr_decay_iters=200", "--dropout=0.1", f"--always_save_checkpoint={always_save}"]
    args = tiny_args(tiny_data, out, *flags)
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
    resumed = run_printed_command(capsys, command, f"--max_iters={n}")
    assert f"resuming {out / 'ckpt.pt'} at iteration {k}" in resumed
    train.main([*args, f"--out_dir={tmp_path / 'whole'}", "--always_save_checkpoint=True", f"--max_iters={n}"])
    assert sorted(train_losses(tmp_path / "whole")) == list(range(n))
    assert train_losses(out) == train_losses(tmp_path / "whole")


@pytest.mark.parametrize("factor", ["nan", "inf"])
def test_a_non_finite_loss_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, tiny_data: Path, factor: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = tiny_args(tiny_data, out, "--max_iters=30", "--eval_interval=5", "--log_interval=5")
    with monkeypatch.context() as patch:
        diverge_at(patch, 13, float(factor))
        proc = train_cli(capsys, args)
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
    resumed = train_cli(capsys, tiny_args(tiny_data, out, "--max_iters=12", "--eval_interval=5", "--init_from=resume"))
    assert resumed.returncode == 0, resumed.stderr


def test_a_nan_before_the_first_checkpoint_says_none_was_written(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    diverge_at(monkeypatch, 2, math.nan)
    proc = train_cli(capsys, tiny_args(tiny_data, tmp_path / "run", "--max_iters=30", "--eval_interval=10"))
    assert_one_line_error(proc, 1, "loss is nan at iteration 2", "no checkpoint had been written by this run")
    assert not (tmp_path / "run" / "ckpt.pt").exists()
