"""experiments/remove_layernorm.py: a LayerNorm frozen to its linear part is that LayerNorm for a token at the frozen
scale, folding it into the Linear that reads it leaves the logits as they were, and the experiment runs end to end
on a tiny checkpoint of ours and on a random GPT-2 folder, leaving a checkpoint that sample.py and
batch_independence.py run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_experiments import load_script, run_experiment
from torch import nn

import sample
from helpers import TINY, assert_one_line_error, command, make_bpe_dataset, randomize_norms, save_model, tiny_model
from layernorm import FROZEN, FrozenLayerNorm, LayerNorm
from machinery.checkpoint import load_checkpoint
from machinery.command import Failure
from machinery.tokenizer import tokenizer_from_meta
from model import GPT

rl = load_script("remove_layernorm")


def float64_model(**overrides: object) -> GPT:
    """TINY in float64, its norms' weights and biases away from 1 and 0, and wider embeddings (a stream whose
    per-token scale varies, as in a trained model)."""
    model = randomize_norms(tiny_model(**overrides)).double()
    with torch.no_grad():
        model.transformer.wte.weight.mul_(20)
    return model


def test_a_frozen_norm_is_its_layernorm_for_a_token_at_its_scale_and_linear_for_every_token() -> None:
    norm = randomize_norms(LayerNorm(16)).double()
    x = torch.randn(5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 3 + 1
    scale = rl.token_scale(x, norm.eps)  # [5]
    frozen = rl.frozen_like(norm, scale[2].item())
    with torch.no_grad():
        y, want = frozen(x), norm(x)
        assert torch.allclose(y[2], want[2], rtol=0, atol=1e-13)
        other = (scale - scale[2]).abs() > 1e-3  # tokens at another scale: scaled by theirs over the frozen one
        assert other.sum() >= 3 and not torch.allclose(y[other], want[other], atol=1e-3)
        ratio = (scale[other] / scale[2])[:, None]
        assert torch.allclose(y[other] - norm.bias, (want[other] - norm.bias) * ratio, atol=1e-12)
        assert torch.allclose(frozen(x[0] + x[1]) - norm.bias, y[0] + y[1] - 2 * norm.bias, atol=1e-12)
    assert frozen.weight is norm.weight and frozen.bias is norm.bias  # the optimizer's own parameters


@pytest.mark.parametrize("kind", rl.ORDER)
def test_freezing_leaves_the_logits_of_the_token_it_was_measured_on(kind: str) -> None:
    """Each kind frozen on a batch of one token: its constants are that token's scales, so that token's logits
    stay as they were (float64), another token's do not; only that kind's norms are replaced."""
    model = float64_model()
    token, other = torch.tensor([[3]]), torch.tensor([[7]])
    with torch.no_grad():
        before, other_before = model(token)[0], model(other)[0]
        constants = rl.freeze(model, kind, [(token, None)])
        assert torch.allclose(model(token)[0], before, rtol=0, atol=1e-12 * before.abs().max().item())
        assert not torch.allclose(model(other)[0], other_before, atol=1e-4)
    frozen = {name for name, m in rl.named_norms(model).items() if isinstance(m, FrozenLayerNorm)}
    assert frozen == set(constants) == set(rl.named_norms(model, kind)) and len(frozen) == (1 if kind == "ln_f" else 2)


@pytest.mark.parametrize("bias", [True, False])
def test_folding_the_block_norms_leaves_the_logits_and_keeps_ln_f(bias: bool) -> None:
    model = float64_model(bias=bias)
    batch = [(torch.randint(TINY.vocab_size, (3, TINY.block_size), generator=torch.Generator().manual_seed(1)), None)]
    for kind in rl.ORDER:
        rl.freeze(model, kind, batch)
    folded = rl.fold(model)
    x = torch.randint(TINY.vocab_size, (2, TINY.block_size), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, got = model(x)[0], folded(x)[0]
    assert (got - want).abs().max() <= 1e-12 * want.abs().max()
    assert [type(b.ln_1) for b in folded.transformer.h] == [nn.Identity] * TINY.n_layer
    assert [type(b.ln_2) for b in folded.transformer.h] == [nn.Identity] * TINY.n_layer
    assert isinstance(folded.transformer.ln_f, FrozenLayerNorm)  # the tied head cannot take it
    assert folded.lm_head.weight is folded.transformer.wte.weight
    assert not torch.equal(folded.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].attn.c_attn.weight)


def assert_removed_and_batch_independent(result: dict, ln_free: Path) -> None:
    """Every norm frozen in ORDER at SMOKE's iterations, the fold within its tolerance, batch_independence.py's
    checks passed on the checkpoint, and the checkpoint's norms frozen at the constants measured."""
    (r,) = result["runs"]
    removed = [(m["kind"], m["iter"]) for m in r["ln_free"]["removals"]]
    assert removed == list(zip(rl.ORDER, rl.SMOKE["remove_at"], strict=True))
    assert [e[0] for e in r["control"]["evals"]] == [e[0] for e in r["ln_free"]["evals"]] == [0, 2, 4, 6]
    for dtype, tol in rl.FOLD_TOL.items():
        assert result["fold"][dtype]["relative"] <= tol, dtype
    assert result["fold"]["norms_left"] == ["FrozenLayerNorm", "Identity"]
    bi = result["batch_independence"]
    assert bi["exit"] == 0 and [row["name"] for row in bi["rows"]] == [FROZEN] and bi["rows"][0]["passed"]
    ckpt = load_checkpoint(ln_free / "ckpt.pt")
    assert ckpt["model_args"]["norm"] == FROZEN
    model = GPT.from_checkpoint(ckpt)
    last = r["ln_free"]["removals"][-1]["scales"]["ln_f"]
    assert model.transformer.ln_f.scale.item() == pytest.approx(last)  # (norm=FROZEN: every norm a FrozenLayerNorm)


@pytest.mark.slow
def test_smoke_run_on_a_checkpoint_of_ours_and_its_ln_free_model_samples(tiny_data, tmp_path, monkeypatch, capsys):
    tokenizer = json.loads((tiny_data / "meta.json").read_text())["tokenizer"]
    config = {"dataset": "tiny", "data_dir": str(tiny_data), "batch_size": 4, "block_size": 16}
    save_model(tmp_path / "run" / "ckpt.pt", randomize_norms(tiny_model()), tokenizer, config=config)
    ln_free = tmp_path / "ln_free"
    args = [f"--out_dir={tmp_path / 'run'}", "--smoke", f"--results_dir={tmp_path / 'r'}", f"--ln_free_dir={ln_free}"]
    run_experiment(monkeypatch, capsys, "remove_layernorm", *args)
    result = json.loads((tmp_path / "r" / "remove_layernorm.json").read_text(encoding="utf-8"))
    assert_removed_and_batch_independent(result, ln_free)
    assert (tmp_path / "r" / "remove_layernorm.png").stat().st_size > 0
    assert set(result["scales_before"]) == set(result["scales_after"]) == set(rl.named_norms(tiny_model()))
    # sample.py's greedy text from the checkpoint is the frozen model's own greedy decoding
    model, chars = GPT.from_checkpoint(load_checkpoint(ln_free / "ckpt.pt")), tokenizer_from_meta(tokenizer)
    ids = model.generate(torch.tensor([chars.encode("the ")]), 12, temperature=0)[0].tolist()
    flags = ["--out_dir", str(ln_free), "--start", "the ", "--temperature", "0", "--max_new_tokens", "12"]
    assert sample.main([*flags, "--device", "cpu"]) == [chars.decode(ids)]


@pytest.mark.slow
def test_smoke_run_on_a_random_gpt2_folder(tmp_path, monkeypatch, capsys) -> None:
    """A random GPT-2 of GPT-2's vocabulary saved by save_pretrained, on token ids written as GPT-2's BPE."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=32))
    hf.save_pretrained(tmp_path / "gpt2")
    data = make_bpe_dataset(tmp_path / "bpe", np.random.default_rng(0).integers(0, 50257, 4000))
    ln_free = tmp_path / "ln_free"
    args = [f"--init_from={tmp_path / 'gpt2'}", f"--data_dir={data}", "--smoke", f"--results_dir={tmp_path / 'r'}"]
    run_experiment(monkeypatch, capsys, "remove_layernorm", *args, f"--ln_free_dir={ln_free}")
    result = json.loads((tmp_path / "r" / "remove_layernorm.json").read_text(encoding="utf-8"))
    assert_removed_and_batch_independent(result, ln_free)
    assert result["model_args"]["n_embd"] == 16 and result["original"]["bits_per_byte"] is None  # no byte count


@pytest.mark.parametrize(
    ("change", "named"),
    [({"norm": "rmsnorm"}, "norm='rmsnorm'"), ({"norm_position": "post"}, "post-norm")],
    ids=["rmsnorm", "post-norm"],
)
def test_what_it_cannot_remove_is_one_line(tiny_data, tmp_path, change: dict, named: str) -> None:
    tokenizer = json.loads((tiny_data / "meta.json").read_text())["tokenizer"]
    model = GPT(replace(TINY, **change))
    save_model(tmp_path / "ckpt.pt", model, tokenizer, config={"data_dir": str(tiny_data)})
    with pytest.raises(Failure) as e:
        rl.main([f"--ckpt={tmp_path / 'ckpt.pt'}", "--smoke", f"--results_dir={tmp_path / 'r'}"])
    assert named in str(e.value) and "removes the LayerNorms" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--eval_batches", "0"], "argument --eval_batches: must be >= 1, got 0"),
        (["--remove_at", "0", "500", "100"], "--remove_at must be 3 iterations in order within 0..--iters (480)"),
    ],
    ids=["eval_batches", "remove_at"],
)
def test_bad_options_are_one_line(args: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(command(capsys, rl.main, args), 2, named)
