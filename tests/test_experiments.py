"""The experiments in experiments/: each runs end to end in a smoke mode on a tiny model."""

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import train
from helpers import ROOT, assert_one_line_error, command, save_model, tiny_model, tree
from layernorm import DyT


@pytest.mark.slow
@pytest.mark.parametrize("norm_position", ["pre", "post"])
def test_inside_norms_smoke(tmp_path, tiny_data, monkeypatch, capsys, norm_position):
    model = tiny_model(n_layer=3, norm_position=norm_position)
    tokenizer = json.loads((tiny_data / "meta.json").read_text())["tokenizer"]
    save_model(tmp_path / "run" / "ckpt.pt", model, tokenizer, config={"dataset": "tiny", "data_dir": str(tiny_data)})
    out = tmp_path / "results"
    run_experiment(
        monkeypatch, capsys, "inside_norms", f"--out_dir={tmp_path / 'run'}", "--smoke", f"--results_dir={out}"
    )
    assert (out / "inside_norms.png").stat().st_size > 0
    result = json.loads((out / "inside_norms.json").read_text())
    for key in ("resid_in", "ln_1_out", "ln_2_out"):
        assert len(result["token_rms"][key]) == 3, key
    assert {"weight", "bias"} <= result["params"]["0.ln_1"].keys()
    assert ("ln_f" in result["params"]) == (norm_position == "pre")
    if norm_position == "pre":  # at init (weight 1, bias 0): RMS 1 (a little less: eps)
        assert result["token_rms"]["ln_1_out"][0]["p50"] == pytest.approx(1, abs=0.02)


@pytest.mark.slow
def test_norm_placement_smoke(tmp_path, tiny_data, monkeypatch, capsys):
    """Both parts end to end on a 2-layer model: gradient norms per block, four short train.py runs, two plots."""
    out = tmp_path / "results"
    run_experiment(monkeypatch, capsys, "norm_placement", "--smoke", f"--data_dir={tiny_data}", f"--results_dir={out}")
    assert (out / "grad_norms.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    result = json.loads((out / "norm_placement.json").read_text())
    assert "--smoke" in result["command"] and result["machine"]["cpu_count"]
    for position in ("pre", "post"):
        for part in ("attn", "mlp"):
            norms = result["grad_norms_at_init"][position][part]
            assert len(norms) == 2 and all(n > 0 for n in norms), (position, part)
    assert len(result["runs"]) == 4 and {r["norm_position"] for r in result["runs"].values()} == {"pre", "post"}
    assert sorted(r["warmup_iters"] for r in result["runs"].values()) == [0, 0, 2, 2]
    for name, run in result["runs"].items():
        assert run["returncode"] == 0 and [e["iter"] for e in run["evals"]] == [0, 3, 6], name
        assert result["final_val_loss"][name] == run["summary"]["final_val_loss"]


@pytest.mark.parametrize(
    "script, args, code, message",
    [
        ("inside_norms", ["--out_dir", "nowhere"], 1, "error: no checkpoint at nowhere/ckpt.pt"),
        ("norm_placement", ["--data_dir", "nowhere", "--smoke"], 1, "error: no train.bin in nowhere"),
        ("dyt_stall", ["--data_dir", "nowhere", "--smoke"], 1, "error: no train.bin in nowhere"),
        ("centre_and_rescale", ["--data_dir", "nowhere", "--smoke"], 1, "error: no train.bin in nowhere"),
        ("remove_layernorm", ["--out_dir", "nowhere", "--smoke"], 1, "error: no checkpoint at nowhere/ckpt.pt"),
        ("inside_norms", ["--batches=0"], 2, "error: argument --batches: must be >= 1, got 0"),
        ("dyt_stall", ["--iters=-1"], 2, "error: argument --iters: must be >= 1, got -1"),
        ("dyt_stall", ["--batches=0"], 2, "error: argument --batches: must be >= 1, got 0"),
    ],
)
def test_a_missing_input_or_a_count_below_one_is_one_line_naming_it(
    tmp_path, monkeypatch, capsys, script, args, code, message
):
    """Through the front door `python experiments/SCRIPT.py` exits by, in this process; nothing written."""
    monkeypatch.chdir(tmp_path)
    run = command(capsys, load_script(script).main, [*args, "--results_dir=results"])
    assert_one_line_error(run, code, message)
    assert tree(tmp_path) == {}


RUN = subprocess.run


def run_experiment(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, *args: str) -> str:
    """experiments/NAME.py's main(args) in this process, and the train.py runs it starts too (train_in_process); what
    it printed. A fresh interpreter adds nothing here: the one-line errors above are checked in one."""
    monkeypatch.setattr(subprocess, "run", train_in_process)
    monkeypatch.chdir(ROOT)  # where train.py's runs start, so that their relative paths mean the same
    capsys.readouterr()
    load_script(name).main(list(args))
    stdout = capsys.readouterr().out
    assert "total time" in stdout, stdout[-2000:]
    return stdout


def train_in_process(cmd: list[str], **how: object) -> subprocess.CompletedProcess[str]:
    """subprocess.run, but an experiment's `python train.py ARGS` (from the repository's root, text captured, stderr
    apart or into stdout) runs as train.cli(ARGS) here: its exit status and what it printed, without a torch import.
    Any other command (git, for the machine facts) runs as it would."""
    if cmd[:2] != [sys.executable, "train.py"]:
        return RUN(cmd, **how)
    assert Path(how["cwd"]) == ROOT == Path.cwd() and how.get("text"), how
    assert how.get("capture_output") or how.get("stdout") == subprocess.PIPE, how
    out = io.StringIO()
    err = out if how.get("stderr") == subprocess.STDOUT else io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = train.cli(cmd[2:])
    return subprocess.CompletedProcess(cmd, code, out.getvalue(), None if err is out else err.getvalue())


@pytest.mark.slow
def test_dyt_stall_smoke(tmp_path, tiny_data, monkeypatch, capsys):
    """Three 2-layer models measured at init and after 4 iterations of train.py: every norm, the logits, the
    gradient per block; at init the old DyT hands its sublayer far less than LayerNorm's unit RMS, the recipe
    about as much, and each DyT's alpha starts where its flags say."""
    out = tmp_path / "results"
    run_experiment(monkeypatch, capsys, "dyt_stall", "--smoke", f"--data_dir={tiny_data}", f"--results_dir={out}")
    assert (out / "dyt_stall.png").stat().st_size > 0
    result = json.loads((out / "dyt_stall.json").read_text())
    assert set(result["train_commands"]) == set(result["results"])
    ln, old, new = result["results"].values()
    norms = ["h.0.ln_1", "h.0.ln_2", "h.1.ln_1", "h.1.ln_2", "ln_f"]
    for r in (ln, old, new):
        for when in ("init", "trained"):
            m = r[when]
            assert list(m["norm_in"]) == list(m["norm_out"]) == norms and m["logits"] > 0
            assert len(m["grad"]) == 2 and all(g > 0 for g in m["grad"])
            assert list(m["saturated"]) == (norms if r is not ln else [])
    assert ln["init"]["norm_out"]["h.0.ln_1"] == pytest.approx(1, abs=0.02)
    assert old["init"]["norm_out"]["h.0.ln_1"] < 0.05 < 0.5 < new["init"]["norm_out"]["h.0.ln_1"]
    assert set(old["init"]["alpha"].values()) == {0.5}
    assert new["init"]["alpha"]["ln_f"] == pytest.approx(DyT.initial_alpha(32))


def load_script(name: str):
    if str(ROOT / "experiments") not in sys.path:  # as when run: the script's folder on the path (common.py)
        sys.path.insert(0, str(ROOT / "experiments"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "experiments" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_centre_only_against_float64_and_swapped_in_for_every_norm(tiny_data):
    car = load_script("centre_and_rescale")
    m = car.CentreOnly(8)
    with torch.no_grad():
        m.weight.normal_(), m.bias.normal_()
    x = torch.randn(3, 5, 8)
    x64, w64, b64 = x.double(), m.weight.double(), m.bias.double()
    torch.testing.assert_close(m(x).double(), (x64 - x64.mean(-1, keepdim=True)) * w64 + b64, rtol=0, atol=1e-6)
    args = car.parse(["--smoke", f"--data_dir={tiny_data}"])
    run = car.new_row_run("centre", car.row_config("centre", 0, args))
    norms = [run.model.transformer.ln_f] + [n for b in run.model.transformer.h for n in (b.ln_1, b.ln_2)]
    assert all(type(n) is car.CentreOnly for n in norms)
    optimized = {id(p) for group in run.optimizer.param_groups for p in group["params"]}
    assert optimized == {id(p) for p in run.model.parameters()}  # the CentreOnly weights are trained too
    assert car.row_config("dyt", 0, args).embed_scale and not car.row_config("rmsnorm", 0, args).embed_scale


@pytest.mark.slow
def test_centre_and_rescale_smoke(tmp_path, tiny_data, monkeypatch, capsys):
    """Five rows, two seeds of one of them, 6 iterations each; a second call finds every run done and only
    rewrites the table."""
    out = tmp_path / "results"
    common = ["--smoke", f"--data_dir={tiny_data}", f"--results_dir={out}"]
    first = run_experiment(monkeypatch, capsys, "centre_and_rescale", *common)
    run_experiment(monkeypatch, capsys, "centre_and_rescale", *common, "--rows", "rmsnorm", "--seeds", "1337", "7")
    assert "5 runs of 6 iterations to go" in first and "s left" in first
    result = json.loads((out / "centre_and_rescale.json").read_text())
    assert len(result["runs"]) == 6 and {r["row"] for r in result["runs"]} == set(result["table"])
    for run in result["runs"]:
        assert [it for it, _ in run["evals"]] == [0, 3, 6] and run["final_val_loss"] == run["evals"][-1][1]
    rms = result["table"]["rmsnorm"]
    assert sorted(rms["seeds"]) == [7, 1337] and rms["std"] is not None
    assert rms["mean"] == pytest.approx(sum(rms["final_val_loss"]) / 2)
    table = (out / "centre_and_rescale.md").read_text()
    assert all(f"| {row} |" in table for row in result["table"]) and (out / "centre_and_rescale.png").exists()
    again = run_experiment(monkeypatch, capsys, "centre_and_rescale", *common)
    assert "0 runs of 6 iterations to go" in again
