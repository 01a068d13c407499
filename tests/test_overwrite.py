"""A new run never silently replaces another run's checkpoint: it is refused in one line that says the three ways
on (another --out_dir, --init_from=resume, --overwrite=True), and --overwrite=True replaces it. And what
a run says at start-up about itself: where its norms sit, and a learning rate that will not decay fully."""

from __future__ import annotations

from pathlib import Path

import pytest

import train
from helpers import assert_one_line_error, command, records, tiny_args
from machinery.checkpoint import CheckpointError, load_checkpoint


def test_a_new_run_into_a_folder_with_a_checkpoint_is_refused_in_one_line_unless_it_overwrites(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")  # a folder without a checkpoint: not refused
    train.main(tiny_args(tiny_data, out, "--max_iters=4", "--eval_interval=4"))
    before = (out / "ckpt.pt").read_bytes()
    proc = command(capsys, train.cli, tiny_args(tiny_data, out, "--max_iters=2"))
    assert_one_line_error(
        proc,
        1,
        f"error: {out / 'ckpt.pt'} holds another run's checkpoint",
        "--out_dir",
        "--init_from=resume",
        "--overwrite=True",
    )
    assert (out / "ckpt.pt").read_bytes() == before  # untouched
    with pytest.raises(CheckpointError):  # the same from train.main, before any data or model is loaded
        train.main(tiny_args(tmp_path / "missing", out, "--max_iters=2"))
    # --overwrite=True replaces it with the new run's (of 2 iterations, not 4), and the old run's interrupted state
    (out / "ckpt_interrupted.pt").write_bytes(before)
    train.main(tiny_args(tiny_data, out, "--max_iters=2", "--eval_interval=2", "--overwrite=True"))
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 2 and not (out / "ckpt_interrupted.pt").exists()


def test_a_resume_from_another_folders_checkpoint_is_a_new_run_where_it_writes(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume_from a file outside --out_dir writes its checkpoints into out_dir: refused a folder holding another
    run, as a new run is, and fine in an empty one."""
    source, other = tmp_path / "source", tmp_path / "other"
    train.main(tiny_args(tiny_data, source, "--max_iters=2", "--eval_interval=2"))
    train.main(tiny_args(tiny_data, other, "--max_iters=2", "--eval_interval=2"))
    before = (other / "ckpt.pt").read_bytes()
    resume = ["--init_from=resume", f"--resume_from={source / 'ckpt.pt'}", "--max_iters=4"]
    proc = command(capsys, train.cli, [f"--out_dir={other}", *resume])
    assert_one_line_error(proc, 1, f"error: {other / 'ckpt.pt'} holds another run's checkpoint", "--out_dir")
    assert (other / "ckpt.pt").read_bytes() == before
    train.main([f"--out_dir={tmp_path / 'new'}", *resume])
    assert load_checkpoint(tmp_path / "new" / "ckpt.pt")["iter_num"] == 4
    train.main([f"--out_dir={other}", *resume, "--overwrite=True"])  # replaced: none of its old records kept
    assert [r["iter"] for r in records(other, "train")] == [2, 3]


def test_start_up_says_post_norm_and_a_learning_rate_that_will_not_decay_fully(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # helpers.TINY decays over 40 iterations: a 3-iteration run ends far above min_lr
    train.main(tiny_args(tiny_data, tmp_path / "post", "--max_iters=3", "--norm_position=post"))
    out = capsys.readouterr().out
    assert "training from scratch: norm=builtin, post-norm," in out
    note = next(line for line in out.splitlines() if line.startswith("note: lr_decay_iters"))
    assert "lr_decay_iters=40 is past max_iters=3" in note and "--lr_decay_iters=3" in note
    ends_at = float(note.split("ends at ")[1].split(",")[0])
    cfg = train.build_config(train.parse_args(tiny_args(tiny_data, tmp_path)))
    assert ends_at == pytest.approx(train.get_lr(2, cfg))  # the last iteration's, far above min_lr (1e-4)
    train.main(tiny_args(tiny_data, tmp_path / "pre", "--max_iters=3", "--lr_decay_iters=3"))
    out = capsys.readouterr().out
    assert "norm=builtin, pre-norm," in out and "note: lr_decay_iters" not in out
