"""machinery/checkpoint.py: atomic writes, and a clear CheckpointError for every way a checkpoint can be wrong."""

import os
import pickle
import random
from dataclasses import asdict

import pytest
import torch

from helpers import TINY, save_with_payload, tiny_model
from machinery import checkpoint
from machinery.checkpoint import FORMAT, CheckpointError, load_checkpoint, model_from_checkpoint, save_checkpoint


def _checkpoint(norm: str = "builtin") -> dict:
    model = tiny_model(norm)
    return {"format": FORMAT, "model": model.state_dict(), "model_args": asdict(model.config), "iter_num": 3}


def test_round_trip_gives_the_same_model(tmp_path):
    ckpt = _checkpoint()
    save_checkpoint(tmp_path / "ckpt.pt", ckpt)
    loaded = load_checkpoint(tmp_path / "ckpt.pt")
    assert loaded["iter_num"] == 3
    prefixed = {**loaded, "model": {"_orig_mod.module." + k: v for k, v in loaded["model"].items()}}
    for model in (model_from_checkpoint(loaded), model_from_checkpoint(prefixed)):  # compiled and DDP's stripped
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
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: random.Random(0).randbytes(len(data)),  # garbage (seeded: the same bytes every run)
        lambda data: b"",  # empty
    ],
    ids=["truncated", "garbage", "empty"],
)
def test_damaged_files_are_reported_as_corrupt(tmp_path, damage):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path, _checkpoint())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(path)


def test_a_plain_pickle_is_corrupt_in_one_line_that_never_suggests_an_unsafe_load(tmp_path, recwarn):
    """torch's refusal suggests weights_only=False (which runs the file's code): only its reason is passed on, and
    its warning about the pickle's protocol is not printed before the error."""
    path = tmp_path / "ckpt.pt"
    path.write_bytes(pickle.dumps({"a": 1}, protocol=4))
    with pytest.raises(CheckpointError, match="truncated or corrupt") as error:
        load_checkpoint(path)
    message = str(error.value)
    assert "\n" not in message and "weights_only" not in message and "Unsupported operand" in message
    assert not [w for w in recwarn if "pickle protocol" in str(w.message)]


def test_missing_file_says_how_to_get_one(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint at .*train one first"):
        load_checkpoint(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("payload", ["Path.touch", "os.system"])  # os.system: torch's "blocked" message
def test_a_payload_that_would_run_code_is_refused_and_never_runs(tmp_path, payload):
    # The payload is live: unpickled without weights_only, it writes its marker file.
    save_with_payload(tmp_path / "live.pt", _checkpoint(), tmp_path / "live_marker", payload)
    torch.load(tmp_path / "live.pt", weights_only=False)
    assert (tmp_path / "live_marker").exists()
    # load_checkpoint refuses it and the code never runs; the error says the file is not this project's.
    marker = tmp_path / "marker"
    save_with_payload(tmp_path / "ckpt.pt", _checkpoint(), marker, payload)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path / "ckpt.pt")
    assert not marker.exists()
    assert "objects other than tensors" in str(e.value) and "weights_only=True" in str(e.value)
    assert "not written by this project's train.py" in str(e.value)


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
    with pytest.raises(CheckpointError, match="do not fit"):
        model_from_checkpoint(ckpt)
