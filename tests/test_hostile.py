"""Hostile input through the real commands: every kind of bad option, environment, resource, prepared data,
checkpoint and fault ends in one line naming what is wrong, a defined exit status and nothing changed on disk.

The quick cases run train.cli and sample.main in this process; those that need a process of their own (a console,
a full disk under stdout, a device as input, the commands' own exit paths) start one and are marked slow. The
behaviours themselves are tested where they live (test_checkpoint.py, test_data.py); here each kind is seen
through a command.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import batch_independence
import sample
import train
from helpers import (
    ROOT,
    TEXT,
    VOCAB,
    assert_one_line_error,
    command,
    python,
    start,
    subprocess_env,
    tiny_args,
    tiny_model,
    tree,
    wait_for,
)
from machinery.checkpoint import load_checkpoint, save_checkpoint
from machinery.device import TORCHRUN_VARIABLES
from machinery.runlog import read_metrics
from model import gpt2_export

SAMPLE = ["--device=cpu", "--max_new_tokens=5"]


@pytest.fixture
def run_copy(tmp_path: Path, trained: tuple[Path, dict]) -> Path:
    """A copy of the trained tiny run's folder (ckpt.pt, metrics.jsonl), to damage."""
    return Path(shutil.copytree(trained[0], tmp_path / "run"))


def sample_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    proc = command(capsys, sample.main, argv)
    assert proc.stdout == ""  # refused before any text was printed
    return assert_one_line_error(proc, proc.returncode)


# ---- options against the ranges of what consumes them, and the environment ----


def test_infinity_means_no_clip_and_no_time_limit(tmp_path, tiny_data):
    summary = train.main(tiny_args(tiny_data, tmp_path / "out", "--max_iters=2", "--grad_clip=inf", "--max_wall_s=inf"))
    assert summary["iters"] == 2 and summary["stop_reason"] == "max_iters"


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(
    ("env", "culprit"),
    [
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE"),
        ({"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2", **MASTER}, "RANK='x'"),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", **MASTER, "MASTER_PORT": "abc"}, "MASTER_PORT='abc'"),
        ({"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2", **MASTER}, "RANK=2"),
        (
            {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", **MASTER, "MASTER_ADDR": "no.such.host.invalid"},
            "no.such.host.invalid",
        ),
        # tiny_args' one micro-batch a step cannot be shared by two processes
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", **MASTER}, "gradient_accumulation_steps=1"),
    ],
    ids=[
        *("world-size-alone", "rank-not-a-number", "port-not-a-number", "rank-past-the-world", "addr-unknown"),
        "steps-not-divisible",
    ],
)
def test_torchruns_variables_are_checked_as_a_set(tmp_path, tiny_data, capsys, monkeypatch, env, culprit):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    proc = command(capsys, train.cli, tiny_args(tiny_data, tmp_path / "out"))
    assert_one_line_error(proc, 2, culprit)
    assert not (tmp_path / "out").exists()


def test_wandb_failing_to_start_is_one_line(tmp_path, tiny_data, capsys, monkeypatch):
    """wandb's own init without a key, where it cannot ask for one (a key refused, no network: the same path):
    one line, and no metrics.jsonl or checkpoint written."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setattr(sys, "stdin", io.StringIO())  # not a terminal: wandb cannot ask for a key
    proc = command(capsys, train.cli, tiny_args(tiny_data, tmp_path / "out", "--wandb_log=True"))
    assert_one_line_error(proc, 1, "error: wandb could not start a run (", "WANDB_MODE=offline")
    assert list((tmp_path / "out").iterdir()) == []


# ---- resources: memory, names, the disk ----


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--n_layer=1", "--n_head=1", "--n_embd=400000"], "error: out of memory (an allocation of"),
        ([f"--gradient_accumulation_steps={10**18}"], "error: out of memory: lower"),  # batches past size_t
    ],
    ids=["a-wide-model", "a-batch-past-any-size"],
)
def test_what_cannot_fit_in_memory_is_one_line(tmp_path, tiny_data, capsys, flags, named):
    out = tmp_path / "out"
    out.mkdir()
    proc = command(capsys, train.cli, tiny_args(tiny_data, out, *flags))
    assert_one_line_error(proc, 1, named, "lower --batch_size")
    assert "ckpt.pt" not in tree(out)  # (the batch's draw fails after the first evaluation's record)


def test_a_metrics_file_that_is_a_folder_is_one_line(tmp_path, tiny_data, capsys):
    (tmp_path / "out" / "metrics.jsonl").mkdir(parents=True)
    proc = command(capsys, train.cli, tiny_args(tiny_data, tmp_path / "out", "--overwrite=True", "--max_iters=2"))
    assert_one_line_error(proc, 1, "error: Is a directory on", "metrics.jsonl")


# ---- what is read back: metrics, checkpoints ----


def test_a_damaged_metrics_file_is_read_with_its_damaged_lines_named_and_the_rest_kept(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"kind": "train", "iter": 0}\n\xff\xfe\n[1, 2]\n{"kind": "eval", "iter": 1}\n{"kind": "tr')
    assert read_metrics(path) == [{"kind": "train", "iter": 0}, {"kind": "eval", "iter": 1}]
    assert capsys.readouterr().err == f"note: {path}: skipped damaged line(s) 2, 3\n"  # not 5: a kill cut it short


def test_a_record_appended_after_a_line_a_kill_cut_short_is_a_line_of_its_own(run_copy, capsys):
    with open(run_copy / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"kind": "tra')  # as a kill leaves it
    n = len(read_metrics(run_copy / "metrics.jsonl"))
    assert (
        command(capsys, train.cli, [f"--out_dir={run_copy}", "--init_from=resume", "--eval_only=True"]).returncode == 0
    )
    records = read_metrics(run_copy / "metrics.jsonl")
    assert len(records) == n + 2 and [r["kind"] for r in records[-2:]] == ["eval", "summary"]


@pytest.mark.parametrize("main", [sample.main, batch_independence.main], ids=["sample", "batch_independence"])
def test_a_sealed_checkpoint_whose_model_args_deny_its_weights_is_one_line(run_copy, capsys, main):
    """Edited and sealed again (docs/06's edit_checkpoint) with a block_size its position table does not have."""
    ckpt = load_checkpoint(run_copy / "ckpt.pt")
    ckpt["model_args"]["block_size"] //= 2
    save_checkpoint(run_copy / "ckpt.pt", ckpt)
    before = tree(run_copy)
    flags = ["--max_new_tokens=5"] if main is sample.main else []
    proc = command(capsys, main, [f"--out_dir={run_copy}", "--device=cpu", *flags])
    assert_one_line_error(proc, 1, "transformer.wpe.weight")
    assert tree(run_copy) == before


def nan_weight(path: Path) -> str:
    ckpt = load_checkpoint(path)
    ckpt["model"]["transformer.h.0.ln_1.weight"][0] = float("nan")
    save_checkpoint(path, ckpt)  # as a run that wrote NaN by a path that skipped the check would
    return "holds weights that are not finite (NaN or inf) in 1 tensors"


def no_checksum(path: Path) -> str:
    unsealed = torch.load(path, weights_only=True)
    del unsealed["checksum"]  # as a tool that rebuilds the dict would: every later change would go unseen
    torch.save(unsealed, path)
    return "is damaged: its contents no longer match the checksum saved with them"


@pytest.mark.parametrize("damage", [nan_weight, no_checksum], ids=["nan-weight", "no-checksum"])
@pytest.mark.parametrize("reader", ["train", "sample"])
def test_a_checkpoint_a_reader_cannot_trust_is_refused_by_every_reader(run_copy, capsys, reader, damage):
    named = f"error: {run_copy / 'ckpt.pt'} {damage(run_copy / 'ckpt.pt')}"
    before = tree(run_copy)
    if reader == "train":
        assert_one_line_error(command(capsys, train.cli, [f"--out_dir={run_copy}", "--init_from=resume"]), 1, named)
    else:
        assert sample_error(capsys, [*SAMPLE, f"--out_dir={run_copy}"]).startswith(named)
    assert tree(run_copy) == before


def change_one_id(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100] ^= 1  # one token id, still within the vocabulary
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        (lambda d: change_one_id(d / "val.bin"), "val.bin is not the file prepared with"),
        (
            lambda d: (d / "train.bin").write_bytes(bytes((d / "train.bin").stat().st_size)),  # zero-filled
            "train.bin is not the file prepared with",
        ),
    ],
    ids=["val-one-id-changed", "train-zero-filled"],
)
def test_prepared_data_of_the_right_size_but_other_ids_stops_train_py(tmp_path, tiny_data, capsys, damage, named):
    data = Path(shutil.copytree(tiny_data, tmp_path / "data"))
    damage(data)
    before = tree(tmp_path)
    proc = command(capsys, train.cli, tiny_args(data, tmp_path / "out"))
    assert_one_line_error(proc, 1, f"error: {data}/{named} {data / 'meta.json'}", "sha256")
    assert tree(tmp_path) == before


def test_an_explicit_dataset_on_the_resume_of_a_data_dir_run_is_the_one_read(run_copy, capsys):
    """The trained run read --data_dir; --dataset on its resume names data/<dataset>/, not ignored for the saved
    data_dir: here a dataset that is not prepared, refused in one line naming it."""
    before = tree(run_copy)
    proc = command(capsys, train.cli, [f"--out_dir={run_copy}", "--init_from=resume", "--dataset=not_prepared_here"])
    assert_one_line_error(proc, 1, f"error: no train.bin in {ROOT / 'data' / 'not_prepared_here'}")
    assert tree(run_copy) == before


def test_a_metrics_record_whose_iter_is_a_string_does_not_block_the_resume_of_an_intact_checkpoint(run_copy, capsys):
    lines = (run_copy / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps({**json.loads(lines[1]), "iter": "one"})  # a record edited by hand
    (run_copy / "metrics.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = command(capsys, train.cli, [f"--out_dir={run_copy}", "--init_from=resume", "--max_iters=14"])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert load_checkpoint(run_copy / "ckpt.pt")["iter_num"] == 14
    assert [r["iter"] for r in read_metrics(run_copy / "metrics.jsonl") if r["kind"] == "train"][-2:] == [12, 13]


# ---- a GPT-2 folder, checked where it enters: config.json, the safetensors file, the tensors ----


def cut_in_half(folder: Path) -> None:
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])


def set_config(folder: Path, **change: object) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps(config | change), encoding="utf-8")


def write_tensors(folder: Path, tensors: dict) -> None:
    from safetensors.torch import save_file

    save_file(tensors, folder / "model.safetensors")


def nan_tensor(folder: Path) -> None:
    from safetensors.torch import load_file

    tensors = load_file(folder / "model.safetensors")
    tensors["transformer.h.0.ln_1.weight"][0] = float("nan")
    write_tensors(folder, tensors)


GPT2_DAMAGE = {
    "truncated": (cut_in_half, "model.safetensors: tensor transformer."),
    "random-bytes": (lambda f: (f / "model.safetensors").write_bytes(bytes(range(256)) * 64), "is not a safetensors"),
    "oversized-header": (
        lambda f: (f / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}"),
        "its header would be 4,611,686,018,427,387,904 bytes of a 10-byte file",
    ),
    "config-a-list": (lambda f: (f / "config.json").write_text("[1, 2]"), "config.json is not GPT-2's config.json"),
    "no-gpt2-tensors": (
        lambda f: write_tensors(f, {"encoder.weight": torch.zeros(2, 2)}),
        'Missing key(s) in state_dict: "transformer.wte.weight"',
    ),
    "nan-weight": (nan_tensor, "are not finite (NaN or inf) in 1 tensors (h.0.ln_1.weight): the weights are damaged"),
    "vocab-disagrees": (
        lambda f: set_config(f, vocab_size=VOCAB + 1),
        "size mismatch for transformer.wte.weight",
    ),
}


@pytest.mark.parametrize("damage", list(GPT2_DAMAGE))
@pytest.mark.parametrize("reader", ["train", "sample"])
def test_a_damaged_gpt2_folder_is_one_line_naming_the_file_and_the_cause(tmp_path, tiny_data, capsys, reader, damage):
    pytest.importorskip("safetensors")
    folder = gpt2_export(tiny_model(), tmp_path / "gpt2")
    damage_it, named = GPT2_DAMAGE[damage]
    damage_it(folder)
    before = tree(tmp_path)
    if reader == "train":
        err = assert_one_line_error(
            command(capsys, train.cli, tiny_args(tiny_data, tmp_path / "out", f"--init_from={folder}")), 1
        )
    else:
        err = sample_error(capsys, [*SAMPLE, f"--init_from={folder}"])
    assert err.startswith(f"error: --init_from={folder}: ") and named in err and str(folder) in err, err
    assert len(err) < 1000, err  # a line to read: not every key of a model the weights are not (thousands)
    assert tree(tmp_path) == before


# ---- through the commands' own processes ----


@pytest.mark.slow
@pytest.mark.parametrize(
    ("limit", "named"),
    [
        (60_000, "cannot save OUT/ckpt.pt: it is larger than this process's file size limit (60,000 bytes"),
        (100, "cannot write a file: larger than the file size limit (`ulimit -f`"),  # metrics.jsonl's first record
    ],
    ids=["checkpoint", "metrics"],
)
def test_a_write_past_the_file_size_limit_is_named_as_that_limit_not_a_full_disk(tmp_path, tiny_data, limit, named):
    """Under `ulimit -f` (RLIMIT_FSIZE) a write fails with EFBIG, which torch's writer reports without its errno."""
    import resource

    def ulimit_f() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    argv = [sys.executable, "train.py", *tiny_args(tiny_data, tmp_path / "out", "--max_iters=3", "--eval_interval=2")]
    proc = subprocess.run(
        argv, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, preexec_fn=ulimit_f, timeout=120
    )
    assert_one_line_error(proc, 1, "error: " + named.replace("OUT", str(tmp_path / "out")))
    assert "free" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["metrics.jsonl"]  # no temporary file left


@pytest.mark.slow
@pytest.mark.parametrize(
    ("damage", "named"), [("deleted", "ImportError: cannot import name 'check'"), ("broken", "SyntaxError")]
)
def test_a_learners_tree_without_a_working_checker_is_one_line(tmp_path, damage, named):
    shutil.copytree(ROOT / "exercises", tmp_path / "exercises", ignore=shutil.ignore_patterns("__pycache__"))
    if damage == "deleted":
        (tmp_path / "exercises" / "check.py").unlink()
    else:
        (tmp_path / "exercises" / "check.py").write_text("x = (\n", encoding="utf-8")
    before = tree(tmp_path)
    proc = python("-m", "exercises", "1", cwd=tmp_path)
    assert_one_line_error(proc, 1, "error: exercises/check.py, the checker, cannot be imported (", named)
    assert {k: v for k, v in tree(tmp_path).items() if "__pycache__" not in k} == before


@pytest.mark.slow
def test_ctrl_c_stops_a_process_waiting_for_the_others_of_its_run(tmp_path, tiny_data):
    """A process started by hand as rank 0 of 2, the other never started: torch's rendezvous waits in C++, where
    Python's handler never runs. Once it listens on MASTER_PORT, Ctrl-C ends it at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = tiny_args(tiny_data, tmp_path / "out", "--gradient_accumulation_steps=2")
    proc = start(
        "train.py", *args, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        wait_for(lambda: socket.socket().connect_ex(("127.0.0.1", port)) == 0, proc, timeout=60)  # (fresh sockets)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=5) == -signal.SIGINT
    finally:
        proc.kill()  # (a process that did not stop is not left behind)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["sample.py", "OUT", *SAMPLE], "error: No space left on device"),
        (["data/shakespeare_char/prepare.py", "--input", "TEXT", "--out_dir", "PREPARED"], "the report cannot be"),
        (["-m", "exercises", "2"], "error: the results cannot be printed (No space left on device)"),
        (["-m", "bench.kernels", "--sizes=32", "--rows=16", "--reps=1", "--impls=builtin"], "error: No space left"),
    ],
    ids=["sample", "prepare", "exercises", "a-benchmark"],
)
def test_printing_into_a_full_disk_is_one_line(trained, tmp_path, command, named):
    (tmp_path / "text.txt").write_text(TEXT, encoding="utf-8")
    names = {"OUT": f"--out_dir={trained[0]}", "TEXT": str(tmp_path / "text.txt"), "PREPARED": str(tmp_path / "p")}
    before = tree(trained[0])
    with open("/dev/full", "w") as full:
        argv = [sys.executable, *(names.get(word, word) for word in command)]
        proc = subprocess.run(argv, cwd=ROOT, env=subprocess_env(), stdout=full, stderr=subprocess.PIPE, text=True)
    proc.stdout = ""
    assert_one_line_error(proc, 1, named)
    assert tree(trained[0]) == before


@pytest.mark.slow
def test_a_console_that_cannot_show_the_text_gets_escapes(tmp_path, trained):
    ckpt = load_checkpoint(trained[0] / "ckpt.pt")
    ckpt["tokenizer"] = {**ckpt["tokenizer"], "itos": ["é", *ckpt["tokenizer"]["itos"][1:]]}  # id 0: not ASCII
    save_checkpoint(tmp_path / "ckpt.pt", ckpt)
    proc = python("sample.py", f"--ckpt={tmp_path / 'ckpt.pt'}", *SAMPLE, "--start=é", PYTHONIOENCODING="ascii")
    assert proc.returncode == 0 and proc.stderr == "" and proc.stdout.startswith("\\xe9")


@pytest.mark.slow
def test_a_reader_that_goes_away_ends_sampling_quietly(trained):
    argv = [sys.executable, "sample.py", f"--out_dir={trained[0]}", "--device=cpu", "--max_new_tokens=2000"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # as `| head -c 10` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 1 and err == "", err


@pytest.mark.slow
@pytest.mark.parametrize("command", ["train.py", "sample.py", "batch_independence.py"])
def test_ctrl_c_while_torch_loads_ends_the_command_at_once_and_quietly(command):
    """Signalled once a module of torch's has loaded (-X importtime names each as it finishes), that is mid-import:
    the command ends by SIGINT (a shell's 130), printing nothing, with no KeyboardInterrupt's traceback."""
    argv = [sys.executable, "-X", "importtime", command, "--help"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in proc.stderr:
        if re.search(rb"\|\s+torch\.", line):  # "import time: self | cumulative |   torch.NAME"
            proc.send_signal(signal.SIGINT)
            break
    err = [line for line in proc.stderr.read().decode().splitlines() if not line.startswith("import time:")]
    assert proc.wait(timeout=60) == -signal.SIGINT and err == [] and proc.stdout.read() == b"", err
