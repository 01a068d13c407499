"""The experiments in experiments/: each runs end to end in a smoke mode on a tiny model."""

import json
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

from checkpoint import save_checkpoint, training_checkpoint
from helpers import ROOT, make_dataset, subprocess_env
from model import GPT, GPTConfig

POSITIONS = ["pre", "post"] if "norm_position" in {f.name for f in fields(GPTConfig)} else ["pre"]


@pytest.mark.parametrize("norm_position", POSITIONS)
def test_inside_norms_smoke(tmp_path, norm_position):
    data = make_dataset(tmp_path / "data")
    extra = {"norm_position": norm_position} if norm_position != "pre" else {}
    model = GPT(GPTConfig(block_size=16, vocab_size=30, n_layer=3, n_head=2, n_embd=32, **extra))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    ckpt = training_checkpoint(model=model, optimizer=optimizer, scaler=torch.amp.GradScaler("cpu", enabled=False),
                               iter_num=0, best_val_loss=float("inf"),
                               config={"dataset": "tiny", "data_dir": str(data)},
                               tokenizer=json.loads((data / "meta.json").read_text())["tokenizer"],
                               data_gen=torch.Generator().manual_seed(0))
    save_checkpoint(tmp_path / "run" / "ckpt.pt", ckpt)
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, "experiments/inside_norms.py", f"--out_dir={tmp_path / 'run'}", "--smoke",
                           f"--results_dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=subprocess_env(MPLBACKEND="Agg"))
    assert proc.returncode == 0, proc.stderr
    assert "total time" in proc.stdout
    assert (out / "inside_norms.png").stat().st_size > 0
    result = json.loads((out / "inside_norms.json").read_text())
    for key in ("resid_in", "ln_1_out", "ln_2_out"):
        assert len(result["token_rms"][key]) == 3, key
    assert result["model_args"]["n_layer"] == 3 and result["run_time_s"] > 0
    assert {"weight", "bias"} <= result["params"]["0.ln_1"].keys()
    assert ("ln_f" in result["params"]) == (norm_position == "pre")
    if norm_position == "pre":  # at init (weight 1, bias 0): RMS 1 (a little less: eps)
        assert result["token_rms"]["ln_1_out"][0]["p50"] == pytest.approx(1, abs=0.02)


def test_norm_placement_smoke(tmp_path):
    """Both parts end to end on a 2-layer model: gradient norms per block, four short train.py runs, two plots."""
    data, out = make_dataset(tmp_path / "data"), tmp_path / "results"
    proc = subprocess.run([sys.executable, "experiments/norm_placement.py", "--smoke", f"--data_dir={data}",
                           f"--results_dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=subprocess_env(MPLBACKEND="Agg"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert "total time" in proc.stdout
    assert (out / "grad_norms.png").stat().st_size > 0 and (out / "training.png").stat().st_size > 0
    result = json.loads((out / "norm_placement.json").read_text())
    assert result["run_time_s"] > 0 and "--smoke" in result["command"] and result["machine"]["cpu_count"]
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
    "script, args, message",
    [
        ("inside_norms.py", ["--out_dir", "nowhere"], "error: no checkpoint at nowhere/ckpt.pt"),
        ("norm_placement.py", ["--data_dir", "nowhere", "--smoke"], "error: no train.bin in nowhere"),
    ],
)
def test_missing_input_is_a_one_line_error(script, args, message):
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / script), *args], cwd=ROOT, capture_output=True,
                          text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
