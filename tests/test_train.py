"""train.py: options and their errors, data errors, learning, checkpoints, exact resume, incompatible checkpoints,
a NaN or an inf loss, Weights & Biases.

Tiny runs (tests/helpers.py) in this process, through train.cli where the exit status and stderr matter (the exit
status a shell sees: test_train_processes.py); a diverging run has the model's loss made NaN or inf at one iteration
(helpers.diverge_at).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import sys
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import train
from helpers import (
    ROOT,
    TEXT,
    TINY,
    VOCAB,
    assert_one_line_error,
    command,
    diverge_at,
    make_dataset,
    python,
    records,
    tiny_args,
    train_losses,
    tree,
)
from machinery import options
from machinery import run as run_state
from machinery.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from machinery.device import Dist

# ---- options ----


def test_help_lists_every_option_with_its_default(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # (one line an option)
    with pytest.raises(SystemExit) as e:
        train.cli(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in fields(options.TrainConfig):
        assert f"--{f.name} {options.type_name(f.name)}" in out, f.name
        assert f"{f.metadata['help']}" in out and f"(default: {f.default})" in out, f.name
    assert f"[{'|'.join(options.VALID_NORMS)}] (default: builtin)" in out  # the norm's choices


@pytest.mark.parametrize(
    ("text", "culprit"),
    [
        ('{"n_layer": 2, "learnig_rate": 1e-3}', "learnig_rate"),
        ('{"batch_size": "12"}', "batch_size"),
        ('{"compile": 1}', "compile"),
        ('{"n_layer": true}', "n_layer"),
        ('{"dropout": "0.1"}', "dropout"),
        ("{n_layer: 2}", "JSON"),
        ("[" * 100_000, "recursion"),
        (None, "not found"),
        ("FOLDER", "folder"),
    ],
    ids=[
        *("unknown-key", "str-for-int", "int-for-bool", "bool-for-int", "str-for-float", "not-json", "nested"),
        *("missing", "a-folder"),
    ],
)
def test_a_bad_config_file_is_one_line_naming_it(tmp_path: Path, capsys, text: str | None, culprit: str) -> None:
    cfg = tmp_path / "c.json"
    if text == "FOLDER":
        cfg.mkdir()
    elif text is not None:
        cfg.write_text(text)
    proc = command(capsys, train.cli, [str(cfg), f"--out_dir={tmp_path / 'out'}"])
    assert_one_line_error(proc, 2, culprit, str(cfg))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        *[(f"--compile={text}", True) for text in ("True", "true", "1")],
        *[(f"--compile={text}", False) for text in ("False", "false", "0")],
        ("--compile", True),  # a bare flag turns a bool on, even before the config file
    ],
)
def test_bool_values(flag: str, value: bool) -> None:
    assert options.parse_args([flag, str(ROOT / "configs/shakespeare_char_cpu.json")])["compile"] is value


def test_flags_override_the_config_file_which_overrides_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"n_layer": 3, "n_embd": 64, "learning_rate": 1}))
    config = options.build_config(options.parse_args([str(cfg), "--n_layer=5", "--data-dir=x"]))
    assert (config.n_layer, config.n_embd, config.learning_rate, config.data_dir) == (5, 64, 1.0, "x")
    assert config.batch_size == options.TrainConfig().batch_size
    assert isinstance(config.learning_rate, float)


@pytest.mark.parametrize(
    ("flags", "culprit"),
    [
        (["--batch_sise=4"], "batch_sise"),
        (["--n_layer"], "n_layer"),  # no value
        (["a.json", "b.json"], "b.json"),  # one config file at most
        (["--batch_size=abc"], "abc"),
        (["--compile=maybe"], "maybe"),
        (["--learning_rate=fast"], "fast"),
        (["--n_layer=2.5"], "2.5"),
        (["--max_wall_s=soon"], "soon"),
        (["--norm=layernorm"], "layernorm"),
        (["--norm_position=mid"], "mid"),
        (["--dropout=1.0"], "dropout"),
        (["--device=gpu"], "gpu"),
        (["--device=cpu:5"], "cpu:5"),
        (["--dtype=fp8"], "fp8"),
        (["--init_from=gpt3"], "gpt3"),
        (["--batch_size=0"], "batch_size"),
        ([f"--seed={2**64}"], "seed"),
        (["--seed=-1"], "seed"),
        (["--learning_rate=inf"], "learning_rate"),
        (["--min_lr=1e309"], "min_lr"),
        (["--warmup_iters=500", "--lr_decay_iters=100"], "lr_decay_iters"),
        (["--resume_from=x.pt"], "resume_from"),
        (["--eval_only=True"], "eval_only"),
        # GPTConfig's own checks of the model's sizes, reported as a bad option
        (["--n_embd=30", "--n_head=4"], "n_head"),
        (["--n_layer=0"], "n_layer"),
        # what this machine cannot serve
        (["--cuda_graphs=True", "--device=cpu"], "cuda_graphs"),
        (["--cuda_graphs=True", "--compile=True"], "compile=True"),
        (["--compile_mode=reduce-overhead"], "compile_mode"),
        (["--compile=True", "--compile_mode=fast"], "fast"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_a_bad_option_is_one_line_naming_it_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], culprit: str
) -> None:
    """Exit status 2, one line naming the culprit, before any data is read (--data_dir names none) or any file is
    written."""
    proc = command(capsys, train.cli, [f"--data_dir={tmp_path / 'no_data'}", f"--out_dir={tmp_path / 'out'}", *flags])
    assert_one_line_error(proc, 2, culprit)
    assert not (tmp_path / "out").exists()


def test_cuda_graphs_capture_the_training_micro_step_and_leave_eval_and_the_dropout_stream_alone(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's own make_graphed_callables on the CPU, only its CUDA calls (streams, synchronize, the graph objects)
    made no-ops, so that the plumbing around the capture is checked here: what is captured, with which static
    inputs, that every micro-step replays it while eval and sampling use the plain model, and that the stream of
    dropout masks (drawn by the capture's eager warm-up passes) is given back, or a resumed run would train on
    shifted masks. The GPU run (bench/gpu.sh) runs the real capture."""

    class Graph:
        def replay(self) -> None:
            pass

    for name, stub in [
        ("synchronize", lambda *a, **k: None),
        ("Stream", lambda *a, **k: None),
        ("stream", lambda s: contextlib.nullcontext()),
        ("CUDAGraph", Graph),
        ("graph", lambda graph, pool=None: contextlib.nullcontext()),
    ]:
        monkeypatch.setattr(torch.cuda, name, stub)
    monkeypatch.setattr(torch.cuda.graphs, "graph_pool_handle", lambda: None)
    # the CUDA generator wrap() saves and restores is the CPU's, which dropout draws from here
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": torch.set_rng_state(state))
    make_graphed_callables = torch.cuda.make_graphed_callables
    captured, replays = [], []

    def capture(module: torch.nn.Module, sample: tuple[torch.Tensor, ...]) -> object:
        before = torch.get_rng_state()
        graphed = make_graphed_callables(module, sample)
        captured.append((module, sample, before, torch.get_rng_state()))
        return lambda *a: replays.append(torch.get_rng_state()) or graphed(*a)

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", capture)
    # cuda_graphs: train.main refuses it on a CPU, train.train is past that check
    flags = ["--max_iters=3", "--gradient_accumulation_steps=2", "--cuda_graphs=True", "--dropout=0.2"]
    cfg = options.build_config(options.parse_args(tiny_args(tiny_data, tmp_path / "out", *flags)))
    run_state.make_out_dir(cfg.out_dir)
    summary = train.train(cfg, {}, "cpu", "float32", None, Dist())
    ((module, sample, before, after),) = captured
    assert isinstance(module.model, train.GPT) and [t.shape for t in sample] == [torch.Size([4, 16])] * 2  # B x T
    # the loss alone (flattened as the capture flattens outputs): every output requiring grad gets a gradient buffer
    # each replay fills, and the logits' would be [B, T, vocab]
    outputs = torch.utils._pytree.tree_flatten(module(*sample))[0]
    assert [o.requires_grad for o in outputs] == [True] and outputs[0].dim() == 0
    assert len(replays) == 3 * 2 and summary["cuda_graphs"]
    # the warm-ups drew dropout masks; the first micro-step draws from where the capture found the stream
    assert not torch.equal(after, before) and torch.equal(replays[0], before)
    # gradients accumulate into buffers of the model's own, zeroed in place, never into the graph's outputs
    assert all(p.grad is not None and not p.grad.any() for p in module.parameters())


def test_compile_mode_reaches_torch_compile(tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    train.main(tiny_args(tiny_data, tmp_path / "out", "--max_iters=1", "--compile=True", "--compile_mode=max-autotune"))
    assert modes == ["max-autotune"]


@pytest.mark.parametrize(
    ("out_dir", "error"),
    [
        ("taken", "cannot be created (File exists)"),
        ("/proc/x", "cannot be created (No such file or directory)"),
        ("taken/out", "cannot be created (Not a directory)"),
        ("x" * 300, "cannot be created (File name too long)"),
    ],
    ids=["a-file", "cannot-be-made", "in-a-file", "name-too-long"],
)
def test_an_out_dir_that_is_a_file_or_cannot_be_created_is_a_one_line_error(
    tmp_path: Path, tiny_data: Path, out_dir: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").write_text("not a folder")
    proc = command(capsys, train.cli, tiny_args(tiny_data, tmp_path / out_dir, "--max_iters=1"))  # (/proc/x: absolute)
    assert_one_line_error(proc, 1, f"error: out_dir '{tmp_path / out_dir}' {error}")
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_shipped_configs_are_valid_and_read_as_written() -> None:
    """Every config file builds a valid config holding exactly the file's values (of the option's type); the CPU
    config decays its learning rate over the whole run."""
    configs = sorted((ROOT / "configs").glob("*.json"))
    assert {p.stem for p in configs} >= {"shakespeare_char_cpu", "shakespeare_char", "shakespeare"}
    types = {f.name: f.type for f in fields(options.TrainConfig)}
    for path in configs:
        written = json.loads(path.read_text(encoding="utf-8"))
        cfg = options.build_config(options.parse_args([str(path)]))
        read = {k: getattr(cfg, k) for k in written}
        assert read == written, path.name
        assert all(type(v).__name__ in types[k] for k, v in read.items() if v is not None), path.name
    cpu = options.build_config(options.parse_args([str(ROOT / "configs/shakespeare_char_cpu.json")]))
    assert cpu.lr_decay_iters == cpu.max_iters


# ---- data ----


def test_missing_data_says_how_to_prepare_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proc = command(
        capsys, train.cli, [f"--data_dir={tmp_path / 'empty'}", f"--out_dir={tmp_path / 'out'}", "--device=cpu"]
    )
    assert_one_line_error(proc, 1, "no train.bin", "python data/shakespeare_char/prepare.py")


# ---- training ----


def test_loss_goes_down_and_the_end_prints_a_sample(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--max_iters=40", "--eval_interval=40", "--learning_rate=3e-3", "--log_interval=10"]
    summary = train.main(tiny_args(tiny_data, tmp_path / "out", *flags, "--sample_at_end=True", "--sample_tokens=30"))
    evals = records(tmp_path / "out", "eval")
    assert [r["iter"] for r in evals] == [0, 40]
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.8
    assert summary["final_val_loss"] == evals[-1]["val_loss"]
    meta = json.loads((tiny_data / "meta.json").read_text(encoding="utf-8"))  # bits per byte of val's text:
    per_token = meta["val_tokens"] / meta["val_bytes"] / math.log(2)  # nats per token / ln 2 * tokens / bytes
    assert [r["val_bpb"] for r in evals] == pytest.approx([r["val_loss"] * per_token for r in evals], rel=1e-12)
    assert summary["best_val_bpb"] == pytest.approx(summary["best_val_loss"] * per_token, rel=1e-12)
    sample = capsys.readouterr().out.split("--- sample (30 tokens")[1].split("\n", 1)[1]
    assert len(sample) >= 30 and set(sample) <= set(TEXT)


def test_run_writes_checkpoint_and_metrics(trained: tuple[Path, dict], tiny_data: Path) -> None:
    out, summary = trained
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["format"] == FORMAT and ckpt["iter_num"] == 12
    assert ckpt["model_args"] == asdict(TINY)  # the model the flags asked for, every field
    assert ckpt["config"]["max_iters"] == 12 and ckpt["config"]["data_dir"] == str(tiny_data)
    assert ckpt["tokenizer"]["kind"] == "char"
    trains = records(out, "train")  # one per iteration at log_interval=1, and best_val_loss: test_loop.py, below
    assert set(trains[0]) == {"kind", "iter", "loss", "lr", "ms_per_iter", "tokens_per_s"}
    assert [r["iter"] for r in records(out, "eval")] == [0, 5, 10, 12]
    (rec,) = records(out, "summary")
    assert rec == summary
    assert rec["iters"] == 12 and rec["norm"] == "builtin" and rec["device"] == "cpu"
    assert rec["peak_memory_bytes"] > 10_000_000  # bytes, not Linux's kB
    # the speeds are of the tokens of an iteration (batch_size 4, one micro-step); the median leaves out the first
    # line's time, start-up included
    ms = [r["ms_per_iter"] for r in trains]
    tokens_per_iter = 4 * TINY.block_size
    assert [r["tokens_per_s"] for r in trains] == pytest.approx([tokens_per_iter * 1000 / t for t in ms])
    assert rec["median_ms_per_iter"] == statistics.median(ms[1:])
    assert rec["median_tokens_per_s"] == pytest.approx(tokens_per_iter * 1000 / rec["median_ms_per_iter"])


def test_best_only_mode_saves_each_improvement_and_a_resume_keeps_the_best_val_loss(tmp_path: Path, tiny_data: Path):
    """always_save_checkpoint=False: a checkpoint at each new best only, and a resume keeps the best it read; set to
    True, every evaluation after the start saves, better or not. eval_only=True evaluates the checkpoint's weights
    (the numbers of the evaluation that saved them: the evaluation batches are the same each time), trains nothing
    and saves nothing. (That evaluation neither varies with nor disturbs training: test_loop.py's reference loop.)"""
    out = tmp_path / "run"
    train.main(tiny_args(tiny_data, out, "--max_iters=6", "--eval_interval=3", "--always_save_checkpoint=False"))
    best = min(records(out, "eval"), key=lambda r: r["val_loss"])  # the last new best: the one saved, if after 0
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert best["iter"] > 0 and ckpt["iter_num"] == best["iter"] and ckpt["best_val_loss"] == best["val_loss"]
    ckpt["best_val_loss"] = 0.0  # a best no later evaluation can beat: the resumed run must never save
    save_checkpoint(out / "ckpt.pt", ckpt)
    summary = train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=9"])
    assert summary["best_val_loss"] == 0.0 and load_checkpoint(out / "ckpt.pt")["iter_num"] == best["iter"]
    train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=12", "--always_save_checkpoint=True"])
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["iter_num"] == 12 and ckpt["best_val_loss"] == 0.0
    saved_at = records(out, "eval")[-1]
    again = train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=20", "--eval_only=True"])
    assert again["final_val_loss"] == saved_at["val_loss"] and again["iters"] == 12
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 12


# The exact resume of train.py (bench/resume.py's, tests/test_bench.py, is the benchmark's plumbing).
@pytest.mark.parametrize(
    ("norm", "position"),
    [
        ("builtin", "pre"),
        ("custom", "pre"),
        ("rmsnorm", "pre"),
        ("batchnorm", "pre"),
        ("none", "pre"),
        ("builtin", "post"),
    ],
)
def test_every_norm_resumes_with_the_losses_of_an_uninterrupted_run(
    tmp_path: Path, tiny_data: Path, norm: str, position: str
) -> None:
    # dropout > 0 so that the torch RNG state matters too, not only the data stream
    args = tiny_args(
        tiny_data, tmp_path / "x", f"--norm={norm}", f"--norm_position={position}", "--dropout=0.1", "--eval_interval=4"
    )
    train.main(args + [f"--out_dir={tmp_path / 'whole'}", "--max_iters=10"])
    train.main(args + [f"--out_dir={tmp_path / 'cut'}", "--max_iters=6"])
    # No other option: the norm, where it sits, the dropout and the rest come from the checkpoint.
    summary = train.main([f"--out_dir={tmp_path / 'cut'}", "--init_from=resume", "--max_iters=10"])
    assert summary["norm"] == norm
    cut, uncut = train_losses(tmp_path / "cut"), train_losses(tmp_path / "whole")
    assert sorted(uncut) == list(range(10))
    assert cut == uncut  # exactly
    assert records(tmp_path / "cut", "eval")[-1] == records(tmp_path / "whole", "eval")[-1]


def test_an_older_versions_checkpoint_resumes_as_todays(
    trained: tuple[Path, dict],
) -> None:
    """Saved before norm_position was an option: it resumes as pre-norm. Saved by torch's per-parameter AdamW loop
    (as runs were before the optimizer was fused; its step counters float64 where it ran under a float64 default
    dtype): it resumes fused, the saved groups given today's kernel before loading, so that torch moves each step
    counter onto its parameter's device in float32, as a fused optimizer keeps its own. (An optimizer state of
    another model: test_checkpoint.py's test_a_sealed_checkpoint_that_cannot_be_resumed_is_one_line_naming_it.)"""
    out, _ = trained
    ckpt = load_checkpoint(out / "ckpt.pt")
    del ckpt["model_args"]["norm_position"], ckpt["config"]["norm_position"]
    for group in ckpt["optimizer"]["param_groups"]:
        group.update(fused=False, foreach=False)
    for state in ckpt["optimizer"]["state"].values():
        state["step"] = state["step"].double()
    explicit = {"norm_position": "pre"}
    cfg = options.build_config(explicit, ckpt["config"])
    run = train.setup(cfg, explicit, ckpt, "cpu", "float32", Dist())  # as train.main sets up a resume
    assert run.model.config.norm_position == "pre"
    assert all(group["fused"] for group in run.optimizer.param_groups)
    steps = {(s["step"].dtype, s["step"].device, s["step"].item()) for s in run.optimizer.state.values()}
    assert steps == {(torch.float32, torch.device("cpu"), 12.0)}


# ---- checkpoints that cannot be resumed ----


# (a checkpoint whose unpickling would run code: test_checkpoint.py)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--n_layer=3", "--n_embd=64"], ["n_layer: 2 -> 3", "n_embd: 32 -> 64"]),
        (["--embed_scale=true"], ["embed_scale: False -> True"]),  # a parameter more: refused, not silently dropped
        (["--norm=rmsnorm"], ["trained with norm='builtin'", "but not with 'rmsnorm'"]),
        (["--data_dir=OTHER"], [f"vocab_size: {VOCAB} -> 18", "tokenizer"]),  # OTHER: a dataset of 18 characters
        (["--norm_position=post"], ["norm_position: 'pre' -> 'post'"]),  # where the norms sit can't change
    ],
    ids=["size", "embed_scale", "norm", "vocabulary", "norm_position"],
)
def test_a_checkpoint_of_another_model_is_refused_and_left_untouched(
    trained: tuple[Path, dict], tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    out, _ = trained
    other = make_dataset(tmp_path / "other", text="ABCDEFGH abcdefgh\n" * 200)
    args = [arg.replace("OTHER", str(other)) for arg in args]
    with pytest.raises(CheckpointError) as e:
        train.main([f"--out_dir={out}", "--init_from=resume", *args, "--max_iters=13"])
    assert all(needle in str(e.value) for needle in needles) and "n_head" not in str(e.value)
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 12


def test_max_wall_s_stops_with_an_evaluation_and_a_checkpoint(tmp_path: Path, tiny_data: Path) -> None:
    flags = ["--max_iters=1000000", "--eval_interval=1000000", "--log_interval=1000000", "--max_wall_s=1.0"]
    summary = train.main(tiny_args(tiny_data, tmp_path / "out", *flags))
    # checked at every iteration, not only at a log line (none comes after iteration 0 here)
    assert summary["stop_reason"] == "max_wall_s" and 0 < summary["iters"] < 1000000
    assert records(tmp_path / "out", "eval")[-1]["iter"] == summary["iters"]
    assert load_checkpoint(tmp_path / "out" / "ckpt.pt")["iter_num"] == summary["iters"]


# ---- a loss that is not finite ----


@pytest.mark.parametrize("factor", ["nan", "inf"])
def test_a_non_finite_loss_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, tiny_data: Path, factor: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    args = tiny_args(tiny_data, out, "--max_iters=30", "--eval_interval=5", "--log_interval=5")
    with monkeypatch.context() as patch:
        diverge_at(patch, 13, float(factor))
        proc = command(capsys, train.cli, args)
    assert_one_line_error(
        proc,
        1,
        f"error: loss is {factor} at iteration 13",
        f"{out / 'ckpt.pt'} (iteration 10)",
        "--init_from=resume",
        "--learning_rate",
    )
    assert [r["iter"] for r in records(out, "train")] == [0, 5, 10]  # stopped at the read-back after it
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 10  # the one before the NaN, not overwritten
    # the run can go on from it; a resumed run that diverges keeps the checkpoint it resumed from
    resumed = command(
        capsys, train.cli, tiny_args(tiny_data, out, "--max_iters=12", "--eval_interval=5", "--init_from=resume")
    )
    assert resumed.returncode == 0, resumed.stderr
    with monkeypatch.context() as patch:
        diverge_at(patch, 0, float(factor))
        proc = command(
            capsys, train.cli, tiny_args(tiny_data, out, "--max_iters=30", "--eval_interval=5", "--init_from=resume")
        )
    assert_one_line_error(proc, 1, f"error: loss is {factor} at iteration 12", f"{out / 'ckpt.pt'} (iteration 12)")


def test_weights_made_not_finite_by_the_last_step_are_never_saved_over_the_last_good_checkpoint(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step whose loss was finite but whose update left a weight NaN, then SIGINT: the save that the signal asks
    for is the only one no evaluation comes before, and it must keep ckpt.pt (iteration 5) as it was."""
    out = tmp_path / "run"
    real_step = train.train_step

    def step_then_nan_then_signal(model, optimizer, *args, **kwargs):
        loss = real_step(model, optimizer, *args, **kwargs)
        if optimizer.state and next(iter(optimizer.state.values()))["step"] == 7:  # the update of iteration 6
            with torch.no_grad():
                optimizer.param_groups[0]["params"][0][0, 0] = math.nan
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(train, "train_step", step_then_nan_then_signal)
    proc = command(capsys, train.cli, tiny_args(tiny_data, out, "--max_iters=30", "--eval_interval=5"))
    assert_one_line_error(
        proc, 1, "error: the weights are not finite at iteration 7", f"{out / 'ckpt.pt'} (iteration 5)"
    )
    assert load_checkpoint(out / "ckpt.pt")["iter_num"] == 5


@pytest.mark.parametrize(
    ("during", "flags", "said", "kept"),
    [
        (
            "print_sample",
            ["--sample_at_end=True"],
            "interrupted (SIGINT) during the sample at the end; the run is done (4 iterations) and its checkpoint is",
            ["ckpt.pt", "metrics.jsonl"],
        ),
        (
            "estimate_loss",
            ["--init_from=resume", "--eval_only=True"],
            "interrupted: quit without saving",
            ["ckpt.pt", "metrics.jsonl"],
        ),
        (
            "train_step",
            ["--save_checkpoint=False"],
            "interrupted (SIGINT) after 1 iterations; saved nothing (save_checkpoint=False)",
            ["metrics.jsonl"],
        ),
    ],
    ids=["the-sample-at-the-end", "eval_only", "save_checkpoint=False"],
)
def test_ctrl_c_where_there_is_nothing_to_save_says_what_was_kept(
    tmp_path: Path,
    tiny_data: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    during: str,
    flags: list[str],
    said: str,
    kept: list[str],
) -> None:
    """Ctrl-C (SIGINT to this process) where no checkpoint is saved for it, exit status 130 each time: during the
    sample at the end the run is done and saved, and the message says so; eval_only saves nothing, and its first
    Ctrl-C quits saying just that, not that it will save a checkpoint (the run trained first is left as it was); a
    timing run (save_checkpoint=False, as bench.training runs it) writes no file but metrics.jsonl."""
    out = tmp_path / "run"
    args = tiny_args(tiny_data, out, "--max_iters=4", "--eval_interval=2")
    if "--eval_only=True" in flags:
        train.main(args)  # the run it evaluates
    before = tree(out) if out.exists() else {}
    real = getattr(train, during)

    def ctrl_c_then(*a: object, **k: object) -> object:
        os.kill(os.getpid(), signal.SIGINT)
        return real(*a, **k)

    monkeypatch.setattr(train, during, ctrl_c_then)
    assert assert_one_line_error(command(capsys, train.cli, [*args, *flags]), 130).startswith(said)  # no 'error:'
    after = tree(out)
    assert sorted(after) == kept
    assert "ckpt.pt" not in before or after["ckpt.pt"] == before["ckpt.pt"]  # eval_only's run, as it was


@pytest.mark.parametrize("before", ["nothing", "a-run-it-overwrites"])
def test_a_nan_before_the_first_checkpoint_says_none_was_written_and_the_command_that_starts_again(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    """Nothing to resume: the advice is the same command, replacing what the run left (metrics.jsonl) with half the
    learning rate; after --overwrite=True it never resumes the run being replaced. The command, as printed, runs."""
    out = tmp_path / "run"
    flags = ["--max_iters=30", "--eval_interval=10"]
    if before == "a-run-it-overwrites":
        train.main(tiny_args(tiny_data, out, "--max_iters=4"))
        flags.append("--overwrite=True")
    with monkeypatch.context() as patch:
        diverge_at(patch, 2, math.nan)
        proc = command(capsys, train.cli, tiny_args(tiny_data, out, *flags))
    err = assert_one_line_error(proc, 1, "loss is nan at iteration 2", "no checkpoint had been written by this run")
    assert "--init_from=resume" not in err
    again = shlex.split(err.split("To start it again with a lower learning rate (or a longer --warmup_iters): ")[1])
    assert again[:2] == ["python", "train.py"] and again[-1] == "--learning_rate=0.0005"  # tiny_args' 1e-3, halved
    assert train.main([*again[2:], "--max_iters=3"])["iters"] == 3
    assert [r["iter"] for r in records(out, "train")] == [0, 1, 2]  # a run of its own, from the start


# ---- Weights & Biases ----


def test_wandb_gets_the_options_every_logged_figure_at_its_iteration_and_the_summary(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """wandb as train.py calls it, a stand-in in sys.modules that records the calls (the real one, offline:
    test_an_offline_wandb_run)."""
    inits, logged, finished = [], [], []
    run = SimpleNamespace(
        log=lambda data, step: logged.append((step, data)), summary={}, finish=lambda: finished.append(1)
    )
    wandb = SimpleNamespace(init=lambda project, name, config: inits.append((project, name, config)) or run)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.setenv("WANDB_API_KEY", "a-key")  # (without one, build_config refuses before training)
    out = tmp_path / "out"
    flags = ["--max_iters=4", "--eval_interval=2", "--wandb_log=True", "--wandb_run_name=tiny", "--wandb_project=tests"]
    summary = train.main(tiny_args(tiny_data, out, *flags))
    ((project, name, config),) = inits
    assert (project, name) == ("tests", "tiny")
    assert config == load_checkpoint(out / "ckpt.pt")["config"]  # every option
    steps = [step for step, _ in logged]
    assert steps == sorted(steps)  # wandb drops a row whose step goes back
    train_rows = {step: row for step, row in logged if "train/loss" in row}
    assert {step: row["train/loss"] for step, row in train_rows.items()} == train_losses(out)
    assert all(set(row) == {"train/loss", "lr", "ms_per_iter", "tokens_per_s"} for row in train_rows.values())
    val = {step: row["val/loss"] for step, row in logged if "val/loss" in row}
    assert val == {r["iter"]: r["val_loss"] for r in records(out, "eval")}
    assert run.summary == summary
    assert finished == [1]


@pytest.mark.slow
def test_an_offline_wandb_run(tmp_path: Path, tiny_data: Path) -> None:
    """The real wandb takes train.py's calls: an offline run, saved under $WANDB_DIR."""
    pytest.importorskip("wandb")
    args = tiny_args(tiny_data, tmp_path / "out", "--max_iters=2", "--wandb_log=True", "--wandb_project=tests")
    proc = python("train.py", *args, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), WANDB_SILENT="true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 1, proc.stderr[-3000:]


@pytest.mark.slow
def test_without_wandb(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`import wandb` (and tiktoken, triton) failing, as on a machine without them: in this process for the error
    (None in sys.modules), in a fresh one with a shim on its path for the run that must not import them."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    asked = command(capsys, train.cli, tiny_args(tiny_data, tmp_path / "a", "--max_iters=2", "--wandb_log=True"))
    assert_one_line_error(asked, 2, "wandb_log=True", "pip install wandb", "drop --wandb_log")
    shim = tmp_path / "shim"
    for name in ("wandb", "tiktoken", "triton"):
        (shim / name).mkdir(parents=True)
        (shim / name / "__init__.py").write_text(f'raise ImportError("No module named {name!r} (test shim)")\n')
    # not asking for it needs no wandb (nor tiktoken nor triton, for a character-level builtin-norm run)
    plain = python(
        "train.py", *tiny_args(tiny_data, tmp_path / "b", "--max_iters=2", "--sample_at_end=True"), PYTHONPATH=str(shim)
    )
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "--- sample" in plain.stdout
