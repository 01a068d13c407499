"""GPT-2's weights (model.gpt2_checkpoint) against Hugging Face's own GPT2LMHeadModel: small random GPT-2s, saved as
save_pretrained saves them (config.json, model.safetensors) or in the layout of OpenAI's files on the hub, must give
GPT2LMHeadModel's logits with every LayerNorm, its greedy tokens from GPT.generate with the KV cache and without it,
and its text through sample.py; batch_independence.py passes on them; what this GPT does not compute is refused in
one line. transformers is needed only here (requirements-dev.txt); no weights are downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import batch_independence
import sample
import train
from bench import decoding
from helpers import ROOT, TEXT, norm_params, randomize_norms, records, rel_err, skip_unless_runs, train_losses
from layernorm import LAYERNORMS, NORMS
from machinery.checkpoint import load_checkpoint
from machinery.command import Failure
from machinery.dataset import DataError
from machinery.options import ConfigError
from machinery.tokenizer import TiktokenTokenizer
from model import GPT, gpt2_checkpoint

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

CONFIG = str(ROOT / "configs" / "finetune_shakespeare.json")
TOL = 1e-5  # float32 logits, relative to their largest (seen: up to 2e-6; GELU's other approximation: over 2e-4)
DROPOUT_OFF = {"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
# Weights drawn wider than GPT-2's 0.02, so that every layer (GELU's approximation included) moves the logits beyond
# TOL and the greedy choices are clear-cut (the top two logits at least 0.01 apart) without repeating one token.
SHAPES = {
    "vocab101-block32": dict(vocab_size=101, n_positions=32, n_embd=48, n_head=4),  # gelu_new, GPT-2's
    "block64-erf": dict(vocab_size=128, n_positions=64, n_embd=32, n_head=2, activation_function="gelu"),
    "hub-layout": dict(vocab_size=75, n_positions=48, n_embd=32, n_head=4, activation_function="gelu_pytorch_tanh"),
}


def hf_gpt2(seed: int = 0, **shape: object) -> transformers.GPT2LMHeadModel:
    """A random 2-layer GPT2LMHeadModel of `shape`, in eval mode, its norms and every bias away from their init."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2, initializer_range=0.3, bos_token_id=None, eos_token_id=None, **DROPOUT_OFF, **shape
    )
    model = randomize_norms(transformers.GPT2LMHeadModel(config).eval(), seed + 1)
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias") and ".ln_" not in name:  # the Conv1D biases: zero at init
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


def save(model: transformers.GPT2LMHeadModel, folder: Path, hub_layout: bool = False) -> Path:
    """save_pretrained's folder; with hub_layout, its weights renamed as OpenAI's files on the hub name them (no
    "transformer." prefix) beside the causal masks they keep as "h.N.attn.bias"."""
    model.save_pretrained(folder)
    if hub_layout:
        weights = folder / "model.safetensors"
        state = {k.removeprefix("transformer."): v for k, v in safetensors_torch.load_file(weights).items()}
        n = model.config.n_positions
        state |= {f"h.{i}.attn.bias": torch.ones(1, 1, n, n).tril() for i in range(model.config.n_layer)}
        safetensors_torch.save_file(state, weights)
    return folder


@pytest.fixture(scope="module", params=list(SHAPES))
def gpt2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(the saved folder, the GPT2LMHeadModel saved there), for each of SHAPES."""
    model = hf_gpt2(**SHAPES[request.param])
    return save(model, tmp_path_factory.mktemp(request.param), hub_layout=request.param == "hub-layout"), model


@pytest.fixture(scope="module")
def gpt2_64(tmp_path_factory: pytest.TempPathFactory):
    """The block-64 GPT-2 of SHAPES (a prompt and 40 tokens fit in it), and its folder."""
    model = hf_gpt2(**SHAPES["block64-erf"])
    return save(model, tmp_path_factory.mktemp("gpt2_64")), model


def prompts(vocab_size: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(vocab_size, (batch, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("norm", norm_params(LAYERNORMS, slow_triton=True))
def test_logits_are_gpt2lmheadmodels_with_every_layernorm(gpt2, norm: str) -> None:
    skip_unless_runs(norm)
    folder, hf = gpt2
    model = GPT.from_checkpoint(gpt2_checkpoint(str(folder)), norm=norm)
    idx = prompts(hf.config.vocab_size, 3, hf.config.n_positions)  # every position
    with torch.no_grad():
        assert rel_err(model(idx)[0], hf(idx).logits.double()) <= TOL


@pytest.mark.parametrize("use_kv_cache", [True, False], ids=["kv-cache", "no-cache"])
def test_greedy_decoding_is_hf_generates(gpt2_64, use_kv_cache: bool) -> None:
    """40 greedy tokens after an 8-token prompt, two rows: the same tokens as GPT2LMHeadModel.generate (with its own
    cache), each step's logits within TOL of its logits."""
    folder, hf = gpt2_64
    model = GPT.from_checkpoint(gpt2_checkpoint(str(folder)), norm="custom")
    idx = prompts(hf.config.vocab_size, 2, 8)
    ref = hf.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        max_new_tokens=40,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens, logits = model.generate(idx, 40, temperature=0, use_kv_cache=use_kv_cache, return_logits=True)
    assert torch.equal(tokens, ref.sequences)
    assert len(set(tokens[:, 8:].flatten().tolist())) > 5  # a continuation, not one token over and over
    assert rel_err(logits, torch.stack(ref.logits, dim=1).double()) <= TOL


def test_batch_independence_passes_on_gpt2s_weights(gpt2_64, capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = gpt2_64
    argv = ["--json", "--init_from", str(folder), "--norms", "custom", "builtin", "--prompt_len", "6"]
    status = batch_independence.main([*argv, "--new_tokens", "6", "--device", "cpu"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["source"] == f"GPT-2's weights from {folder}"
    assert [r["name"] for r in result["rows"]] == ["custom", "builtin"] and all(r["passed"] for r in result["rows"])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"activation_function": "relu"}, "activation_function='relu' (only gelu_new, gelu_pytorch_tanh, gelu)"),
        ({"n_inner": 64}, "n_inner=64 (only None)"),
        (None, "nor a folder holding config.json and model.safetensors"),  # no model.safetensors
    ],
    ids=["relu", "n_inner", "no-weights"],
)
def test_what_this_gpt_does_not_compute_is_one_line_naming_it(gpt2_64, tmp_path: Path, change, named: str) -> None:
    folder = Path(shutil.copytree(gpt2_64[0], tmp_path / "gpt2"))
    if change is None:
        (folder / "model.safetensors").unlink()
    else:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        (folder / "config.json").write_text(json.dumps(config | change), encoding="utf-8")
    with pytest.raises(ValueError) as e:
        gpt2_checkpoint(str(folder))
    assert named in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("norm", [n for n in NORMS if n not in LAYERNORMS])
def test_a_norm_of_another_function_is_refused(gpt2_64, norm: str) -> None:
    with pytest.raises(Failure) as e:
        sample.main(["--init_from", str(gpt2_64[0]), "--norm", norm, "--device", "cpu", "--max_new_tokens", "1"])
    assert f"error: {e.value}" == (
        f"error: cannot build the model from {gpt2_64[0]}: this checkpoint was trained with norm='builtin'; it can "
        f"run with custom, builtin, triton but not with {norm!r}, which computes a different function"
    )


def test_sample_py_prints_the_text_gpt2lmheadmodel_generates(
    tmp_path: Path, gpt2_bpe: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """GPT-2's vocabulary, so that the tokens are text: sample.py's greedy text (--norm=custom) is the prompt
    followed by GPT2LMHeadModel.generate's tokens, decoded with GPT-2's BPE."""
    hf = hf_gpt2(vocab_size=50257, n_positions=32, n_embd=16, n_head=2)
    folder = save(hf, tmp_path / "gpt2")
    bpe = TiktokenTokenizer()
    prompt = "ROMEO: Shall I"
    idx = torch.tensor([bpe.encode(prompt)])
    ids = hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=16, do_sample=False, pad_token_id=0)
    flags = ["--init_from", str(folder), "--norm", "custom", "--temperature", "0", "--max_new_tokens", "16"]
    capsys.readouterr()
    assert sample.main([*flags, "--start", prompt, "--device", "cpu"]) == [text := bpe.decode(ids[0].tolist())]
    assert capsys.readouterr().out == f"{text}\n{sample.SEPARATOR}\n"


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory, gpt2_bpe: object) -> tuple[Path, Path]:
    """A GPT-2 of GPT-2's vocabulary (gelu_new, 32 positions), and helpers.TEXT prepared in GPT-2's BPE."""
    folder = save(hf_gpt2(vocab_size=50257, n_positions=32, n_embd=16, n_head=2), tmp_path_factory.mktemp("gpt2"))
    data = tmp_path_factory.mktemp("bpe")
    ids = np.array(gpt2_bpe.encode(TEXT), dtype=np.uint16)
    n = len(ids) * 9 // 10
    ids[:n].tofile(data / "train.bin")
    ids[n:].tofile(data / "val.bin")
    meta = {"vocab_size": 50257, "tokenizer": {"kind": "tiktoken", "encoding": "r50k_base"}}
    (data / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder, data


def fine_tune(folder: Path, data: Path, out: Path, *flags: str) -> dict:
    small = "--block_size=16 --batch_size=2 --gradient_accumulation_steps=1 --eval_interval=2 --eval_iters=1"
    argv = [CONFIG, f"--init_from={folder}", f"--data_dir={data}", f"--out_dir={out}", *small.split()]
    return train.main([*argv, "--device=cpu", "--sample_at_end=False", "--always_save_checkpoint=True", *flags])


def test_fine_tuning_gpt2_keeps_its_shape_and_resumes_exactly(bpe_run, tmp_path: Path) -> None:
    """configs/finetune_shakespeare.json from a GPT-2 folder: the model is GPT-2's (its shape, its GELU, its
    positions cut to --block_size); 2 iterations, then --init_from=resume to 4, give the losses of 4 in one run."""
    folder, data = bpe_run
    fine_tune(folder, data, tmp_path / "a", "--max_iters=2")
    args = load_checkpoint(tmp_path / "a" / "ckpt.pt")["model_args"]
    shape = {k: args[k] for k in ("n_layer", "n_embd", "vocab_size", "block_size", "gelu")}
    assert shape == {"n_layer": 2, "n_embd": 16, "vocab_size": 50257, "block_size": 16, "gelu": "tanh"}
    train.main([f"--out_dir={tmp_path / 'a'}", "--init_from=resume", "--max_iters=4"])
    fine_tune(folder, data, tmp_path / "b", "--max_iters=4")
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b") and len(train_losses(tmp_path / "b")) == 4
    assert records(tmp_path / "a", "eval") == records(tmp_path / "b", "eval")


@pytest.mark.parametrize(
    ("flags", "error", "named"),
    [
        (["--n_layer=3"], ConfigError, "has a shape of its own: drop or lower n_layer=3 (it has 2)"),
        (["--block_size=64"], ConfigError, "block_size=64 (it has 32 positions)"),
        (["--data_dir=CHARS"], DataError, "needs a dataset in GPT-2's BPE of 50257 tokens"),
    ],
    ids=["n_layer", "block_size", "char-data"],
)
def test_fine_tuning_refuses_another_shape_or_tokenizer(bpe_run, tiny_data: Path, tmp_path: Path, flags, error, named):
    folder, data = bpe_run
    flags = [f.replace("CHARS", str(tiny_data)) for f in flags]
    with pytest.raises(error) as e:
        fine_tune(folder, data, tmp_path / "out", "--max_iters=1", *flags)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_bench_decoding_decodes_gpt2s_weights_with_each_layernorm(gpt2_64) -> None:
    folder, _ = gpt2_64
    flags = "--norms builtin,custom --paths cached --batches 1 --new_tokens 8 --repeats 1 --device cpu".split()
    result = decoding.main(["--init_from", str(folder), *flags])
    assert [r["model"] for r in result["runs"]] == [f"{folder} norm=builtin", f"{folder} norm=custom"]
    assert [r["same_tokens_as_first"] for r in result["runs"]] == [True, True]
