"""train.py and Weights & Biases: an offline run records the loss and the config; without wandb, a clear error.

Offline runs write their data under $WANDB_DIR/wandb/offline-run-*/. Older wandb versions materialize
files/config.yaml and files/wandb-summary.json there; newer ones (wandb-core, e.g. 0.31) keep everything in the
run-*.wandb log, a LevelDB-style record log of protobuf records, which `wandb_log_records` reads.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import assert_one_line_error, make_dataset, python, tiny_args, train_cli, train_losses


def wandb_log_records(path: Path) -> Iterator[bytes]:
    """The records of a .wandb file: a 7-byte header, then 32 KiB blocks of chunks (crc32, length, type, data)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:  # FULL
            yield payload
        elif kind == 2:  # FIRST
            parts = payload
        elif kind == 3:  # MIDDLE
            parts += payload
        elif kind == 4:  # LAST
            yield parts + payload


def logged_run(run_dir: Path) -> tuple[dict, list[dict]]:
    """(config, history rows) of an offline run, from whichever files this wandb version wrote."""
    config_yaml = run_dir / "files" / "config.yaml"
    if config_yaml.exists():
        import yaml

        config = {
            k: v["value"]
            for k, v in yaml.safe_load(config_yaml.read_text()).items()
            if isinstance(v, dict) and "value" in v
        }
        history_file = run_dir / "files" / "wandb-history.jsonl"
        history = [json.loads(line) for line in history_file.read_text().splitlines()] if history_file.exists() else []
        summary = run_dir / "files" / "wandb-summary.json"
        if not history and summary.exists():
            history = [json.loads(summary.read_text())]
        return config, history
    from wandb.proto import wandb_internal_pb2 as pb

    (log,) = run_dir.glob("run-*.wandb")
    config, history = {}, []
    for raw in wandb_log_records(log):
        record = pb.Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return config, history


@pytest.mark.slow
def test_offline_run_records_loss_and_config(tmp_path: Path, tiny_data: Path) -> None:
    pytest.importorskip("wandb")
    out = tmp_path / "out"
    flags = ["--max_iters=4", "--eval_interval=2", "--wandb_log=True", "--wandb_run_name=tiny-offline"]
    args = tiny_args(tiny_data, out, *flags, "--wandb_project=tests")
    proc = python("train.py", *args, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    config, history = logged_run(run_dir)
    assert config["n_layer"] == 2 and config["n_embd"] == 32 and config["norm"] == "builtin"
    assert config["wandb_run_name"] == "tiny-offline" and config["max_iters"] == 4
    logged = {row["_step"]: row["train/loss"] for row in history if "train/loss" in row}
    assert logged == train_losses(out)  # every logged iteration, the same values as metrics.jsonl
    assert any("val/loss" in row for row in history)
    assert all("lr" in row and "ms_per_iter" in row and "tokens_per_s" in row for row in history if "train/loss" in row)


@pytest.mark.slow
def test_without_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`import wandb` (and tiktoken, triton) failing, as on a machine without them: in this process for the error
    (None in sys.modules), in a fresh one with a shim on its path for the run that must not import them."""
    data = make_dataset(tmp_path / "data")
    monkeypatch.setitem(sys.modules, "wandb", None)
    asked = train_cli(capsys, tiny_args(data, tmp_path / "a", "--max_iters=2", "--wandb_log=True"))
    assert_one_line_error(asked, 2, "wandb_log=True", "pip install wandb", "drop --wandb_log")
    shim = tmp_path / "shim"
    for name in ("wandb", "tiktoken", "triton"):
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(f'raise ImportError("No module named {name!r} (test shim)")\n')
    # not asking for it needs no wandb (nor tiktoken nor triton, for a character-level builtin-norm run)
    plain = python(
        "train.py", *tiny_args(data, tmp_path / "b", "--max_iters=2", "--sample_at_end=True"), PYTHONPATH=str(shim)
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "--- sample" in plain.stdout
