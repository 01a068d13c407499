"""train.py: options and their errors, data errors, learning, checkpoints, exact resume, incompatible checkpoints.

Tiny runs (tests/helpers.py) in this process, through train.cli where the exit status and stderr matter; one test
runs train.py as a process, for the exit status a shell sees.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, fields
from pathlib import Path

import pytest
import torch

import train
from data.common import DataError, PreparedData
from helpers import (
    ROOT,
    TEXT,
    TINY,
    VOCAB,
    assert_one_line_error,
    make_dataset,
    needs_triton,
    python,
    records,
    save_with_payload,
    tiny_args,
    train_cli,
    train_losses,
)
from machinery import checkpoint, options
from machinery.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from machinery.device import Dist

# ---- options ----


def test_help_lists_every_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        train.cli(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for f in fields(options.TrainConfig):
        assert f"--{f.name}={f.default}" in out, f.name
        assert f.metadata["help"] in out
    for norm in options.VALID_NORMS:
        assert norm in out


def test_unknown_flag_is_named_with_a_close_match_and_the_valid_options(capsys: pytest.CaptureFixture[str]) -> None:
    proc = train_cli(capsys, ["--batch_sise=4"])
    err = assert_one_line_error(proc, 2, "'batch_sise'", "on the command line", "Did you mean 'batch_size'")
    assert "learning_rate" in err and "n_layer" in err  # the valid options are listed


@pytest.mark.slow
def test_wrong_type_exits_2_with_one_line() -> None:
    """As a process: the exit status a shell sees, and one line on stderr, no traceback."""
    assert_one_line_error(python("train.py", "--compile=maybe"), 2, "compile", "maybe", "bool")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('{"n_layer": 2, "learnig_rate": 1e-3}', ["unknown option 'learnig_rate' (in ", "'learning_rate'"]),
        ('{"batch_size": "12"}', ["batch_size='12'", "expected int", "got str"]),
        ('{"compile": 1}', ["compile=1", "expected bool"]),
        ('{"n_layer": true}', ["n_layer=True", "expected int"]),
        ('{"dropout": "0.1"}', ["dropout='0.1'", "expected float"]),
        ("{n_layer: 2}", ["not valid JSON"]),
        (None, ["not found"]),
    ],
    ids=["unknown-key", "str-for-int", "int-for-bool", "bool-for-int", "str-for-float", "not-json", "missing"],
)
def test_a_bad_config_file_is_named_with_what_is_wrong(tmp_path: Path, text: str | None, needles: list[str]) -> None:
    cfg = tmp_path / "c.json"
    if text is not None:
        cfg.write_text(text)
    with pytest.raises(options.ConfigError) as e:
        train.main([str(cfg)])
    for needle in [*needles, str(cfg)]:
        assert needle in str(e.value)


@pytest.mark.parametrize(
    ("text", "value"), [("True", True), ("true", True), ("1", True), ("False", False), ("false", False), ("0", False)]
)
def test_bool_values(text: str, value: bool) -> None:
    assert options.parse_args([f"--compile={text}"]) == {"compile": value}


def test_flags_override_the_config_file_which_overrides_defaults(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"n_layer": 3, "n_embd": 64, "learning_rate": 1}))
    config = options.build_config(options.parse_args([str(cfg), "--n_layer=5", "--data-dir=x"]))
    assert (config.n_layer, config.n_embd, config.learning_rate, config.data_dir) == (5, 64, 1.0, "x")
    assert config.batch_size == options.TrainConfig().batch_size
    assert isinstance(config.learning_rate, float)


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--batch_size=abc"], ["--batch_size=abc", "expected int", "'abc'"]),
        (["--compile=maybe"], ["--compile=maybe", "expected bool", "'maybe'"]),
        (["--learning_rate=fast"], ["--learning_rate=fast", "expected float"]),
        (["--n_layer=2.5"], ["--n_layer=2.5", "expected int"]),
        (["--max_wall_s=soon"], ["--max_wall_s=soon", "expected float or None"]),
        (["--norm=layernorm"], ["norm='layernorm'", *options.VALID_NORMS]),
        (["--norm_position=mid"], ["norm_position='mid' is not valid; choose one of pre, post"]),
        (["--dropout=1.0"], ["dropout must be in [0, 1)"]),
        (["--device=gpu"], ["device='gpu'"]),
        (["--dtype=fp8"], ["dtype='fp8'"]),
        (["--init_from=gpt2"], ["init_from='gpt2'"]),
        (["--batch_size=0"], ["batch_size must be a positive integer"]),
        (["--warmup_iters=500", "--lr_decay_iters=100"], ["lr_decay_iters (100) must be greater"]),
    ],
)
def test_wrong_types_and_out_of_range_values(args: list[str], needles: list[str]) -> None:
    with pytest.raises(train.OPTION_ERRORS) as e:
        train.main(args)
    for needle in needles:
        assert needle in str(e.value)


def test_the_models_own_checks_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """GPTConfig checks the model's sizes itself; train.py reports its error as a bad option, before any data."""
    proc = train_cli(capsys, ["--n_embd=30", "--n_head=4", "--data_dir=/nonexistent"])
    assert_one_line_error(proc, 2, "error: n_embd (30) must be divisible by n_head (4)")
    assert_one_line_error(train_cli(capsys, ["--n_layer=0"]), 2, "n_layer must be a positive integer, got 0")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--cuda_graphs=True", "--device=cpu"], ["cuda_graphs=True needs a CUDA device", "device='cpu'"]),
        (["--cuda_graphs=True", "--compile=True"], ["cannot run with compile=True", "--compile_mode=reduce-overhead"]),
        (["--compile_mode=reduce-overhead"], ["compile_mode='reduce-overhead' needs compile=True"]),
        (["--compile=True", "--compile_mode=fast"], ["compile_mode='fast' is not valid", "max-autotune"]),
        pytest.param(
            ["--device=cpu", "--norm=triton"],
            ["error: norm 'triton' cannot run on device cpu", "TRITON_INTERPRET=1", "'builtin'"],
            marks=needs_triton,
        ),
    ],
    ids=["graphs-on-cpu", "graphs-and-compile", "mode-without-compile", "unknown-mode", "triton-without-interpreter"],
)
def test_launch_options_it_cannot_serve_are_one_line_errors(
    tmp_path: Path, args: list[str], needles: list[str], capsys: pytest.CaptureFixture[str], triton_compiled_for_a_gpu
) -> None:
    assert_one_line_error(train_cli(capsys, [f"--out_dir={tmp_path / 'out'}", *args]), 2, *needles)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_cuda_graphs_capture_the_training_micro_step_and_leave_eval_alone(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch, cuda_rng_is_the_cpus: None
) -> None:
    """The capture is a CUDA call; here it is replaced by a recorder that returns a wrapper, so the plumbing
    around it (what is captured, with which static inputs, and that eval and sampling use the plain model) is
    checked on the CPU. The GPU run (bench/gpu.sh) runs the real capture."""
    captured, calls = [], []

    def fake_capture(module: torch.nn.Module, sample: tuple[torch.Tensor, ...]) -> object:
        captured.append((module, sample))
        return lambda *a: calls.append(len(a)) or module(*a)

    monkeypatch.setattr(torch.cuda, "make_graphed_callables", fake_capture)  # (wrap() keeps the CUDA RNG's state)
    cfg = options.build_config(
        options.parse_args(tiny_args(tiny_data, tmp_path / "out", "--max_iters=3", "--gradient_accumulation_steps=2"))
    )
    cfg = dataclasses.replace(cfg, cuda_graphs=True)  # (on the command line it is refused on a CPU)
    checkpoint.make_out_dir(cfg.out_dir)
    summary = train.train(cfg, {}, "cpu", "float32", None, Dist())
    ((module, sample),) = captured
    assert isinstance(module.model, train.GPT) and [t.shape for t in sample] == [torch.Size([4, 16])] * 2  # B x T
    # the loss alone (flattened as the capture flattens outputs): every output requiring grad gets a gradient buffer
    # each replay fills, and the logits' would be [B, T, vocab]
    outputs = torch.utils._pytree.tree_flatten(module(*sample))[0]
    assert [o.requires_grad for o in outputs] == [True] and outputs[0].dim() == 0
    assert len(calls) == 3 * 2 and summary["cuda_graphs"] and math.isfinite(summary["final_val_loss"])
    # gradients accumulate into buffers of the model's own, zeroed in place, never into the graph's outputs
    assert all(p.grad is not None and not p.grad.any() for p in module.parameters())


def test_compile_mode_reaches_torch_compile(tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    train.main(tiny_args(tiny_data, tmp_path / "out", "--max_iters=1", "--compile=True", "--compile_mode=max-autotune"))
    assert modes == ["max-autotune"]


def test_an_out_dir_that_is_a_file_or_cannot_be_created_is_a_one_line_error(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "taken").write_text("not a folder")
    proc = train_cli(capsys, tiny_args(tiny_data, tmp_path / "taken", "--max_iters=1"))
    assert_one_line_error(proc, 1, f"error: out_dir '{tmp_path / 'taken'}' is a file, not a folder")
    assert (tmp_path / "taken").read_text() == "not a folder"
    proc = train_cli(capsys, tiny_args(tiny_data, Path("/proc/x"), "--max_iters=1"))
    assert_one_line_error(proc, 1, "error: out_dir '/proc/x' cannot be created (No such file or directory)")
    proc = train_cli(capsys, tiny_args(tiny_data, tmp_path / "taken" / "out", "--max_iters=1"))
    assert_one_line_error(proc, 1, "cannot be created (Not a directory)")


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
    proc = train_cli(capsys, [f"--data_dir={tmp_path / 'empty'}", f"--out_dir={tmp_path / 'out'}", "--device=cpu"])
    assert_one_line_error(proc, 1, "no train.bin", "python data/shakespeare_char/prepare.py")


def test_data_shorter_than_a_block_is_refused(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "d", text="abcdefghij" * 10, val_fraction=0.1)  # val.bin: 10 tokens
    with pytest.raises(DataError) as e:
        train.main(tiny_args(data, tmp_path / "out"))
    assert "val.bin" in str(e.value) and "has 10 tokens but block_size is 16" in str(e.value)
    assert "--block_size" in str(e.value)


# ---- training ----


def test_loss_goes_down(tmp_path: Path, tiny_data: Path) -> None:
    flags = ["--max_iters=40", "--eval_interval=40", "--learning_rate=3e-3", "--log_interval=10"]
    summary = train.main(tiny_args(tiny_data, tmp_path / "out", *flags))
    evals = records(tmp_path / "out", "eval")
    assert [r["iter"] for r in evals] == [0, 40]
    assert evals[0]["val_loss"] == pytest.approx(math.log(VOCAB), abs=0.3)  # uniform over the characters
    assert evals[-1]["val_loss"] < evals[0]["val_loss"] - 0.8
    assert summary["final_val_loss"] == evals[-1]["val_loss"]


def test_run_writes_checkpoint_and_metrics(trained: tuple[Path, dict], tiny_data: Path) -> None:
    out, summary = trained
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["format"] == FORMAT and ckpt["iter_num"] == 12
    assert ckpt["model_args"] == asdict(TINY)  # the model the flags asked for, every field
    assert not any(k.startswith(("_orig_mod.", "module.")) for k in ckpt["model"])
    assert ckpt["config"]["max_iters"] == 12 and ckpt["config"]["data_dir"] == str(tiny_data)
    assert ckpt["tokenizer"]["kind"] == "char"
    assert set(ckpt["rng"]) - {"cuda"} == {"torch", "data"}  # "cuda" where CUDA was initialized
    assert ckpt["best_val_loss"] == min(r["val_loss"] for r in records(out, "eval"))
    assert sorted(train_losses(out)) == list(range(12))
    train_rec = records(out, "train")[0]
    assert set(train_rec) == {"kind", "iter", "loss", "lr", "ms_per_iter", "tokens_per_s"}
    assert [r["iter"] for r in records(out, "eval")] == [0, 5, 10, 12]
    (rec,) = records(out, "summary")
    assert rec == summary
    assert rec["iters"] == 12 and rec["norm"] == "builtin" and rec["device"] == "cpu"
    assert rec["peak_memory_bytes"] > 10_000_000 and rec["median_ms_per_iter"] > 0 and rec["wall_s"] > 0


def test_the_checkpoint_holds_the_data_streams_position(trained: tuple[Path, dict]) -> None:
    """The batches come from the data stream's own generator, seeded by seed (not from the global RNG, which
    dropout and each process's seed + rank share): after N iterations it has drawn N global batches of starts."""
    out, _ = trained
    ckpt = load_checkpoint(out / "ckpt.pt")
    cfg = ckpt["config"]
    data = PreparedData(cfg["data_dir"], cfg["dataset"], cfg["block_size"])
    stream = torch.Generator().manual_seed(cfg["seed"])
    global_batch = (cfg["gradient_accumulation_steps"], cfg["batch_size"])
    for _ in range(ckpt["iter_num"]):
        torch.randint(data.num_starts("train"), global_batch, generator=stream)
    assert torch.equal(ckpt["rng"]["data"], stream.get_state())


def test_best_only_mode_saves_each_improvement_and_a_resume_keeps_the_best_val_loss(tmp_path: Path, tiny_data: Path):
    out = tmp_path / "run"
    train.main(tiny_args(tiny_data, out, "--max_iters=6", "--eval_interval=3", "--always_save_checkpoint=False"))
    best, saved = math.inf, None
    for r in records(out, "eval"):  # saved: the last iteration after 0 whose val loss was a new best
        if r["val_loss"] < best:
            best = r["val_loss"]
            saved = r["iter"] if r["iter"] > 0 else saved
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert saved is not None and ckpt["iter_num"] == saved and ckpt["best_val_loss"] == best
    ckpt["best_val_loss"] = 0.0  # a best no later evaluation can beat: the resumed run must never save
    torch.save(ckpt, out / "ckpt.pt")
    summary = train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=9"])
    assert summary["best_val_loss"] == 0.0 and load_checkpoint(out / "ckpt.pt")["iter_num"] == saved


@pytest.mark.parametrize("norm", ["builtin", "custom", "rmsnorm", "batchnorm", "none"])
def test_every_norm_resumes_with_the_losses_of_an_uninterrupted_run(tmp_path: Path, tiny_data: Path, norm: str) -> None:
    # dropout > 0 so that the torch RNG state matters too, not only the data stream
    args = [*tiny_args(tiny_data, tmp_path / "x"), f"--norm={norm}", "--dropout=0.1", "--eval_interval=4"]
    whole = train.main(args + [f"--out_dir={tmp_path / 'whole'}", "--max_iters=10"])
    train.main(args + [f"--out_dir={tmp_path / 'cut'}", "--max_iters=6"])
    # No other option: the norm, the dropout and the rest come from the checkpoint.
    summary = train.main([f"--out_dir={tmp_path / 'cut'}", "--init_from=resume", "--max_iters=10"])
    assert summary["norm"] == norm
    cut, uncut = train_losses(tmp_path / "cut"), train_losses(tmp_path / "whole")
    assert sorted(uncut) == list(range(10))
    assert cut == uncut  # exactly
    assert records(tmp_path / "cut", "eval")[-1] == records(tmp_path / "whole", "eval")[-1]
    assert summary["final_val_loss"] == whole["final_val_loss"] and math.isfinite(whole["final_val_loss"])


def test_post_norm_trains_and_resumes_as_post(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "cut"
    train.main(tiny_args(tiny_data, out, "--norm_position=post", "--max_iters=6"))
    ckpt = load_checkpoint(out / "ckpt.pt")
    assert ckpt["model_args"]["norm_position"] == "post" and not [k for k in ckpt["model"] if "ln_f" in k]
    with pytest.raises(CheckpointError, match="norm_position: 'post' -> 'pre'"):  # placement can't change
        train.main([f"--out_dir={out}", "--init_from=resume", "--norm_position=pre"])
    summary = train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=10"])
    assert summary["iters"] == 10 and math.isfinite(summary["final_val_loss"])
    assert load_checkpoint(out / "ckpt.pt")["model_args"]["norm_position"] == "post"


def test_an_old_checkpoint_without_norm_position_resumes_as_pre(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "run"
    train.main(tiny_args(tiny_data, out, "--max_iters=4"))
    ckpt = load_checkpoint(out / "ckpt.pt")
    del ckpt["model_args"]["norm_position"], ckpt["config"]["norm_position"]  # as written before the option
    torch.save(ckpt, out / "ckpt.pt")
    summary = train.main([f"--out_dir={out}", "--init_from=resume", "--max_iters=6", "--norm_position=pre"])
    assert summary["iters"] == 6 and load_checkpoint(out / "ckpt.pt")["model_args"]["norm_position"] == "pre"


def test_evaluation_neither_varies_nor_disturbs_training(tmp_path: Path, tiny_data: Path) -> None:
    often = train.main(tiny_args(tiny_data, tmp_path / "often", "--max_iters=6", "--eval_interval=1"))
    rarely = train.main(tiny_args(tiny_data, tmp_path / "rarely", "--max_iters=6", "--eval_interval=100"))
    assert train_losses(tmp_path / "often") == train_losses(tmp_path / "rarely")
    assert often["final_val_loss"] == rarely["final_val_loss"]
    # The same batches at every evaluation: re-evaluating the same weights gives the same numbers.
    again = train.main([f"--out_dir={tmp_path / 'rarely'}", "--init_from=resume", "--eval_only=True"])
    assert again["final_val_loss"] == rarely["final_val_loss"]


def test_sample_at_end_prints_text(tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train.main(tiny_args(tiny_data, tmp_path / "out", "--max_iters=2", "--sample_at_end=True", "--sample_tokens=30"))
    out = capsys.readouterr().out
    sample = out.split("--- sample (30 tokens")[1].split("\n", 1)[1]
    assert len(sample) >= 30 and set(sample) <= set(TEXT)


# ---- checkpoints that cannot be resumed ----


def test_a_checkpoint_whose_unpickling_would_run_code_is_refused_and_runs_nothing(
    trained: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, _ = trained
    bad, marker = tmp_path / "bad", tmp_path / "marker"
    save_with_payload(bad / "ckpt.pt", load_checkpoint(out / "ckpt.pt"), marker)  # a resumable checkpoint, plus code
    blob = (bad / "ckpt.pt").read_bytes()
    proc = train_cli(capsys, [f"--out_dir={bad}", "--init_from=resume", "--max_iters=13"])
    assert not marker.exists()
    assert_one_line_error(
        proc,
        1,
        f"error: {bad / 'ckpt.pt'} holds objects other than tensors",
        "weights_only=True",
        "not written by this project's train.py",
    )
    assert (bad / "ckpt.pt").read_bytes() == blob and sorted(p.name for p in bad.iterdir()) == ["ckpt.pt"]


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--n_layer=3", "--n_embd=64"], ["n_layer: 2 -> 3", "n_embd: 32 -> 64"]),
        (["--embed_scale=true"], ["embed_scale: False -> True"]),  # a parameter more: refused, not silently dropped
        (["--norm=rmsnorm"], ["trained with norm='builtin'", "but not with 'rmsnorm'"]),
        (["--data_dir=OTHER"], [f"vocab_size: {VOCAB} -> 18", "tokenizer"]),  # OTHER: a dataset of 18 characters
    ],
    ids=["size", "embed_scale", "norm", "vocabulary"],
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


def test_checkpoint_whose_optimizer_state_does_not_fit(trained: tuple[Path, dict], tmp_path: Path) -> None:
    out, _ = trained
    ckpt = load_checkpoint(out / "ckpt.pt")
    ckpt["optimizer"] = {"state": {}, "param_groups": []}
    save_checkpoint(tmp_path / "ckpt.pt", ckpt)
    with pytest.raises(CheckpointError, match="cannot be resumed: its optimizer or RNG state does not fit"):
        train.main([f"--out_dir={tmp_path}", "--init_from=resume", "--max_iters=13"])
