"""machinery/checkpoint.py: atomic writes, and a clear CheckpointError for every way a checkpoint can be wrong."""

import os
import pickle
import random
from dataclasses import asdict

import pytest
import torch

from helpers import TINY, assert_one_line_error, save_with_payload, tiny_model, train_cli
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
        loaded = load_checkpoint(tmp_path / f"{i}.pt")
        assert loaded["iter_num"] == 3
        model = GPT.from_checkpoint(loaded)
        for name, tensor in ckpt["model"].items():
            assert torch.equal(model.state_dict()[name], tensor), name
        assert not model.training


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    before = path.read_bytes()

    def write_half_then_die(obj, f):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.torch, "save", write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, {"format": FORMAT, "iter_num": 99})
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.pt"]  # no temporary file left behind


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


def test_missing_file_says_how_to_get_one(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at .*train one first"):
        load_checkpoint(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("payload", ["Path.touch", "os.system"])  # os.system: torch's "blocked" message
def test_a_payload_that_would_run_code_is_refused_and_never_runs(tmp_path, payload, capsys):
    # The payload is live: unpickled without weights_only, it writes its marker file.
    save_with_payload(tmp_path / "live.pt", _checkpoint(), tmp_path / "live_marker", payload)
    torch.load(tmp_path / "live.pt", weights_only=False)
    assert (tmp_path / "live_marker").exists()
    # train.py's resume (load_checkpoint) refuses it in one line and the code never runs; the error says the file
    # is not this project's.
    path, marker = tmp_path / "out" / "ckpt.pt", tmp_path / "marker"
    save_with_payload(path, _checkpoint(), marker, payload)
    proc = train_cli(capsys, [f"--out_dir={path.parent}", "--init_from=resume"])
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


def test_weights_that_do_not_fit_are_reported():
    ckpt = _checkpoint()
    ckpt["model_args"]["n_embd"] = 2 * TINY.n_embd
    with pytest.raises(ValueError, match="do not fit"):
        GPT.from_checkpoint(ckpt)
