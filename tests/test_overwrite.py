"""A new run never silently replaces another run's checkpoint: it is refused in one line that says the three ways
on (another --out_dir, --init_from=resume, --overwrite=True), and --overwrite=True replaces it. And what
a run says at start-up about itself: where its norms sit, and a learning rate that will not decay fully."""

from __future__ import annotations

from pathlib import Path

import pytest

import train
from helpers import assert_one_line_error, command, records, tiny_args, tree
from machinery.checkpoint import load_checkpoint


@pytest.mark.parametrize("culprit", ["ckpt.pt", "ckpt_interrupted.pt", "metrics.jsonl"])
def test_a_new_run_into_a_folder_holding_another_runs_files_is_refused_unless_it_overwrites(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str], culprit: str
) -> None:
    """Refused before any data is read (--data_dir names none here), in one line naming the file; a file of no run's
    (notes.txt) is not in the way, and --overwrite=True replaces the other run's files."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    (out / culprit).write_text("another run's", encoding="utf-8")
    before = tree(out)
    proc = command(capsys, train.cli, tiny_args(tmp_path / "missing", out, "--max_iters=2"))
    assert_one_line_error(proc, 1, culprit)
    assert tree(out) == before
    train.main(tiny_args(tiny_data, out, "--max_iters=2", "--eval_interval=2", "--overwrite=True"))
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 2 and [r["iter"] for r in records(out, "train")] == [0, 1]
    assert not (out / "ckpt_interrupted.pt").exists() and (out / "notes.txt").read_text(encoding="utf-8") == "mine"


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
