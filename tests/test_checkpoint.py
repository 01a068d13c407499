"""machinery/checkpoint.py: atomic writes, and a clear CheckpointError for every way a checkpoint can be wrong."""

import io
import os
import pickle
import random
import re
from dataclasses import asdict

import pytest
import torch

import train
from helpers import PAYLOADS, ROOT, assert_one_line_error, command, tiny_model
from machinery import checkpoint
from machinery.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from model import GPT


def _checkpoint(norm: str = "builtin") -> dict:
    model = tiny_model(norm)
    return {"format": FORMAT, "model": model.state_dict(), "model_args": asdict(model.config), "iter_num": 3}


def test_round_trip_gives_the_same_model(tmp_path):
    ckpt = _checkpoint()
    prefixed = {**ckpt, "model": {"_orig_mod.module." + k: v for k, v in ckpt["model"].items()}}  # compiled, DDP
    for i, saved in enumerate((ckpt, prefixed)):
        save_checkpoint(tmp_path / f"{i}.pt", saved)
        model = GPT.from_checkpoint(load_checkpoint(tmp_path / f"{i}.pt"))
        for name, tensor in ckpt["model"].items():
            assert torch.equal(model.state_dict()[name], tensor), name
        assert not model.training


def full_disk_in_torchs_writer():
    raise RuntimeError("[enforce fail at inline_container.cc:672] . file write failed")


def interrupted():  # Ctrl-C outside torch's writer (its flush, the fsync): the interrupt goes on up
    raise KeyboardInterrupt


def full_disk():
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize(
    ("fault", "raised", "message"),
    [
        (interrupted, KeyboardInterrupt, None),
        (full_disk, CheckpointError, r"cannot save .*ckpt.pt \(No space left on device\): any checkpoint"),
        (full_disk_in_torchs_writer, CheckpointError, r"\(\[enforce fail .* file write failed\): any checkpoint"),
    ],
    ids=["interrupted", "disk-full", "disk-full-in-torchs-writer"],
)
def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch, fault, raised, message):
    """(Ctrl-C inside torch's own writer, which turns it into a RuntimeError: the next test.)"""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    before = path.read_bytes()

    def write_part_then_fail(obj, f):
        f.write(b"part of a checkpoint")
        fault()

    monkeypatch.setattr(checkpoint.torch, "save", write_part_then_fail)
    with pytest.raises(raised, match=message):
        save_checkpoint(path, _checkpoint())
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temporary file left behind


def test_a_second_ctrl_c_inside_torchs_own_writer_quits_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """Through torch's real zip writer: a KeyboardInterrupt raised while it writes comes out as a RuntimeError over
    the interrupt; save_checkpoint raises the interrupt (train.py: quit without saving), not a disk error."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class Interrupting(io.RawIOBase):
        def __init__(self, f):
            self.f, self.written = f, 0

        def writable(self):
            return True

        def write(self, data):
            self.written += len(data)
            if self.written > 1000:  # mid-file, as Ctrl-C lands
                raise KeyboardInterrupt
            return self.f.write(data)

        def close(self):
            self.f.close()
            super().close()

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda fd, mode: Interrupting(real_fdopen(fd, mode)))
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, _checkpoint())
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["ckpt.pt"]


def test_the_next_save_removes_what_a_killed_save_left_and_nothing_else(tmp_path):
    """kill -9 mid-save leaves the temporary file (nothing can remove it then): the next save of that path does."""
    left = [tmp_path / "ckpt.pt.k1ll3d_x.tmp", tmp_path / "ckpt.pt.aaaaaaaa.tmp"]
    kept = [tmp_path / "ckpt_interrupted.pt.aaaaaaaa.tmp", tmp_path / "ckpt.pt.notes.tmp", tmp_path / "ckpt.pt.bak"]
    kept.append(tmp_path / "ckpt.pt.Backup01.tmp")  # not mkstemp's alphabet
    for f in left + kept:
        f.write_bytes(b"x")
    save_checkpoint(tmp_path / "ckpt.pt", _checkpoint())
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.pt", *(f.name for f in kept)])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda data: data[: len(data) // 2], ""),  # truncated
        (lambda data: random.Random(0).randbytes(len(data)), ""),  # garbage (seeded: the same bytes every run)
        (lambda data: b"", "EOFError"),  # empty
        (lambda data: pickle.dumps({"a": 1}, protocol=4), "Unsupported operand"),  # a plain pickle
    ],
    ids=["truncated", "garbage", "empty", "plain-pickle"],
)
def test_damaged_files_are_corrupt_in_one_line_that_never_suggests_an_unsafe_load(tmp_path, recwarn, damage, reason):
    """torch's refusal (of a plain pickle) suggests weights_only=False, which runs the file's code: only its reason
    is passed on, and its warning about the pickle's protocol is not printed before the error."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        load_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and "weights_only" not in message and reason in message
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]


def test_a_folder_or_a_device_is_named(tmp_path):
    """(A missing file: test_sample.py's test_bad_arguments.)"""
    (tmp_path / "ckpt.pt").mkdir()
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*ckpt.pt \(a folder\): give --out_dir="):
        load_checkpoint(tmp_path / "ckpt.pt")
    with pytest.raises(CheckpointError, match=r"no checkpoint at /dev/null \(not a regular file\)"):
        load_checkpoint("/dev/null")


@pytest.mark.parametrize("payload", ["Path.touch", "os.system"])  # os.system: torch's "blocked" message
def test_a_payload_that_would_run_code_is_refused_and_never_runs(tmp_path, payload, capsys):
    """train.py's resume (load_checkpoint) refuses it in one line and the code never runs; the error says the file
    is not this project's."""
    path, marker = tmp_path / "out" / "ckpt.pt", tmp_path / "marker"
    path.parent.mkdir()
    torch.save({**_checkpoint(), "note": PAYLOADS[payload](marker)}, path)  # otherwise valid
    proc = command(capsys, train.cli, [f"--out_dir={path.parent}", "--init_from=resume"])
    assert not marker.exists()
    assert_one_line_error(
        proc,
        1,
        f"error: {path} holds objects other than tensors",
        "weights_only=True",
        "not written by this project's train.py",
    )


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda c: c.pop("model_args"), "KeyError: 'model_args'"),
        (lambda c: c.pop("model"), "KeyError: 'model'"),
        (lambda c: c.update(model_args="n_layer=1"), "TypeError"),
        (lambda c: c.update(model=[1, 2]), "AttributeError"),
        (lambda c: c["model_args"].update(n_head=3), "ValueError: n_embd (32) must be divisible by n_head (3)"),
    ],
    ids=["no-model_args", "no-model", "model_args-not-a-dict", "model-not-a-dict", "model_args-impossible"],
)
def test_a_checkpoint_of_this_format_with_a_malformed_entry_is_refused_at_load(tmp_path, damage, named):
    ckpt = _checkpoint()
    damage(ckpt)
    save_checkpoint(tmp_path / "ckpt.pt", ckpt)
    with pytest.raises(CheckpointError, match="is incomplete or malformed") as e:
        load_checkpoint(tmp_path / "ckpt.pt")
    assert named in str(e.value) and str(tmp_path / "ckpt.pt") in str(e.value) and "\n" not in str(e.value)


# ---- what is read back: the checksum, the weights, the resume state ----


def test_the_docs_edit_checkpoint_seals_an_edit_and_a_change_already_made(tmp_path):
    """docs/06-running.md's edit_checkpoint: an edit through it loads; a change made by another tool is damage to
    load_checkpoint until edit_checkpoint(path, no edit) seals it again."""
    doc = (ROOT / "docs" / "06-running.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"### Editing a checkpoint\n.*?```python\n(.*?)```", doc, re.S)
    edit_checkpoint = {}
    exec(block, edit_checkpoint)
    edit_checkpoint = edit_checkpoint["edit_checkpoint"]
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    edit_checkpoint(path, lambda ckpt: ckpt.update(iter_num=9))
    assert load_checkpoint(path)["iter_num"] == 9
    torch.save(torch.load(path, weights_only=True) | {"iter_num": 7}, path)  # another tool's change
    with pytest.raises(CheckpointError, match="is damaged"):
        load_checkpoint(path)
    edit_checkpoint(path, lambda ckpt: None)
    assert load_checkpoint(path)["iter_num"] == 7


def test_the_checksum_sees_each_kind_of_value():
    ckpt = {**_checkpoint(), "best_val_loss": 1.5, "config": {"seed": 1}, "rng": {"torch": torch.get_rng_state()}}
    before = checkpoint.checksum(ckpt)
    changed = [
        {**ckpt, "best_val_loss": 1.5000000000000002},
        {**ckpt, "config": {"seed": True}},  # the type too: True == 1
        {**ckpt, "model_args": {**ckpt["model_args"], "bias": False}},
        {**ckpt, "model": {**ckpt["model"], "lm_head.weight": ckpt["model"]["lm_head.weight"].double()}},
        {**ckpt, "model": {**ckpt["model"], "lm_head.weight": ckpt["model"]["lm_head.weight"].t()}},
        {**ckpt, "model": {**ckpt["model"], "lm_head.weight": ckpt["model"]["lm_head.weight"].clone().fill_(0.5)}},
    ]
    assert all(checkpoint.checksum(c) != before for c in changed)
    assert checkpoint.checksum({**ckpt, "checksum": "anything"}) == before


@pytest.mark.parametrize(
    "damage",
    [
        lambda c: c["rng"].update(torch="abc"),
        lambda c: c["rng"].update(data=c["rng"]["data"][:100]),
        lambda c: c.update(rng=[1]),
        lambda c: c["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)),
        lambda c: c["optimizer"].update(state=7),
        lambda c: c.update(iter_num="twelve"),
        lambda c: c.update(config=[1]),
        lambda c: c.update(iter_num=-5),  # else the schedule would run from it: a negative learning rate
        lambda c: c.update(best_val_loss=float("nan")),  # else no val loss would ever be better
    ],
    ids=[
        *("rng-a-string", "rng-short", "rng-not-a-dict", "moment-shape", "state-not-a-dict", "iter-a-word"),
        *("config-a-list", "iter-below-0", "best-nan"),
    ],
)
def test_a_sealed_checkpoint_that_cannot_be_resumed_is_one_line_naming_it(tmp_path, trained, capsys, damage):
    """A checkpoint that train.py did not write (damaged before save_checkpoint, so its checksum is right): one
    boundary (Run.restore, load_resume) names the file and torch's reason; nothing on disk changes."""
    out = tmp_path / "out"
    ckpt = load_checkpoint(trained[0] / "ckpt.pt")
    damage(ckpt)
    save_checkpoint(out / "ckpt.pt", ckpt)
    before = (out / "ckpt.pt").read_bytes()
    proc = command(capsys, train.cli, [f"--out_dir={out}", "--init_from=resume", "--max_iters=14"])
    assert_one_line_error(proc, 1, f"{out / 'ckpt.pt'} cannot be resumed")
    assert (out / "ckpt.pt").read_bytes() == before and sorted(os.listdir(out)) == ["ckpt.pt"]
