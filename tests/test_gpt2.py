"""GPT-2's weights (model.gpt2_checkpoint) against Hugging Face's own GPT2LMHeadModel: small random GPT-2s, saved as
save_pretrained saves them (config.json, model.safetensors) or in the layout of OpenAI's files on the hub, must give
GPT2LMHeadModel's logits with every LayerNorm, its greedy tokens from GPT.generate with the KV cache and without it,
and its text through sample.py; batch_independence.py passes on them; what this GPT does not compute is refused in
one line. transformers is needed only here (requirements-dev.txt); no weights are downloaded."""

from __future__ import annotations

import fnmatch
import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

import batch_independence
import export_gpt2
import sample
import train
from bench import decoding
from helpers import (
    PAYLOADS,
    ROOT,
    TEXT,
    make_bpe_dataset,
    norm_params,
    randomize_norms,
    records,
    rel_err,
    save_model,
    skip_unless_runs,
    tiny_model,
    train_losses,
)
from layernorm import LAYERNORMS
from machinery.checkpoint import load_checkpoint
from machinery.command import Failure
from machinery.dataset import DataError
from machinery.options import ConfigError
from machinery.tokenizer import GPT2_BPE, TiktokenTokenizer
from model import GPT, gpt2_checkpoint, pad_left

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
    "sharded": dict(vocab_size=90, n_positions=24, n_embd=32, n_head=2),
    "pytorch_model.bin": dict(vocab_size=70, n_positions=40, n_embd=24, n_head=3, activation_function="gelu"),
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


def save(model: transformers.GPT2LMHeadModel, folder: Path, layout: str = "model.safetensors") -> Path:
    """save_pretrained's folder. Layouts: "sharded", shards of at most 20 KB named by model.safetensors.index.json
    (as save_pretrained splits a model past its max_shard_size); "pytorch_model.bin", the state dict torch.save
    wrote (transformers before 4.35); "hub-layout", the weights renamed as OpenAI's files on the hub name them (no
    "transformer." prefix) beside the causal masks they keep as "h.N.attn.bias"."""
    model.save_pretrained(folder, max_shard_size="20KB" if layout == "sharded" else "5GB")
    if layout == "pytorch_model.bin":
        (folder / "model.safetensors").unlink()
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    if layout == "hub-layout":
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
    return save(model, tmp_path_factory.mktemp(request.param), layout=request.param), model


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


def test_loading_takes_the_files_tensors_and_draws_no_init(gpt2_64) -> None:
    """One copy of the weights: the model's parameters are the checkpoint's tensors (no random init drawn, none
    copied in), the head still tied to the token embedding."""
    checkpoint = gpt2_checkpoint(str(gpt2_64[0]))
    rng = torch.get_rng_state()
    model = GPT.from_checkpoint(checkpoint)
    assert torch.equal(torch.get_rng_state(), rng)  # nothing drawn
    params = dict(model.named_parameters(remove_duplicate=False))
    assert all(params[k].data_ptr() == v.data_ptr() for k, v in checkpoint["model"].items())
    assert model.lm_head.weight is model.transformer.wte.weight


def test_a_view_is_copied_not_kept_with_its_whole_storage(gpt2_64) -> None:
    """GPT-2's positions cut to a shorter block (train.py's fine-tune) are a view: the model keeps a tensor of its
    own, so that saving it does not save all 64 positions."""
    checkpoint = gpt2_checkpoint(str(gpt2_64[0]))
    full = checkpoint["model"]["transformer.wpe.weight"]
    checkpoint["model"]["transformer.wpe.weight"] = full[:16]
    model = GPT.from_checkpoint(checkpoint, block_size=16)
    wpe = model.transformer.wpe.weight
    assert torch.equal(wpe, full[:16]) and wpe.untyped_storage().nbytes() == wpe.numel() * 4


@pytest.mark.parametrize(
    ("source", "repo", "layout"),
    [
        ("gpt2", "openai-community/gpt2", "model.safetensors"),
        ("openai-community/gpt2-medium", "openai-community/gpt2-medium", "sharded"),
        ("distilgpt2", "distilgpt2", "pytorch_model.bin"),
    ],
)
def test_hub_ids_download_what_the_loader_reads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, source: str, repo: str, layout: str
) -> None:
    """A hub id is downloaded as huggingface_hub's snapshot_download gives it (here, a fake hub serving a small
    GPT-2 in `layout`): config.json and the safetensors files, else pytorch_model.bin; the model is the hub's."""
    hf = hf_gpt2(**SHAPES["vocab101-block32"])
    hub = save(hf, tmp_path / "hub", layout=layout)
    asked = []

    def snapshot_download(repo_id: str, allow_patterns: list[str]) -> str:
        asked.append(repo_id)
        local = tmp_path / f"cache{len(asked)}"
        local.mkdir()
        for file in hub.iterdir():
            if any(fnmatch.fnmatch(file.name, pattern) for pattern in allow_patterns):
                shutil.copy(file, local)
        return str(local)

    monkeypatch.setattr("huggingface_hub.snapshot_download", snapshot_download)
    model = GPT.from_checkpoint(gpt2_checkpoint(source))
    assert asked == [repo] * (2 if layout == "pytorch_model.bin" else 1)
    assert torch.equal(model.transformer.wte.weight, hf.transformer.wte.weight)  # (every tensor: the tests above)


@pytest.mark.parametrize(("overrides", "gelu"), [({}, "gelu"), ({"bias": False, "gelu": "tanh"}, "gelu_new")])
def test_export_py_writes_our_checkpoint_as_transformers_gpt2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: dict, gelu: str
) -> None:
    """A checkpoint of ours (the custom LayerNorm; without biases: written as zeros) through export_gpt2.py:
    GPT2LMHeadModel.from_pretrained computes its logits."""
    model = randomize_norms(tiny_model("custom", **overrides))
    save_model(tmp_path / "ckpt.pt", model, GPT2_BPE)
    folder = export_gpt2.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--to", str(tmp_path / "hf")])
    assert capsys.readouterr().out == f"wrote {folder / 'config.json'} and {folder / 'model.safetensors'}\n"
    hf = transformers.GPT2LMHeadModel.from_pretrained(folder).eval()
    assert hf.config.activation_function == gelu
    idx = torch.randint(
        model.config.vocab_size, (2, model.config.block_size), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        assert rel_err(hf(idx).logits, model(idx)[0].double()) <= TOL


def test_a_checkpoint_in_another_tokenizer_is_not_exported(tmp_path: Path) -> None:
    """A GPT-2 folder is read with GPT-2's BPE: a character model exported would sample as nonsense, silently."""
    save_model(tmp_path / "ckpt.pt", tiny_model(), {"kind": "char", "itos": list("abc")})
    with pytest.raises(Failure, match="is not tokenized in GPT-2's BPE"):
        export_gpt2.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--to", str(tmp_path / "hf")])
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"norm": "rmsnorm"}, "norm='rmsnorm' (only LayerNorm: custom, builtin, triton)"),
        ({"norm_position": "post"}, "norm_position='post' (only 'pre')"),
        ({"embed_scale": True}, "embed_scale=True (no scale of the embeddings)"),
    ],
    ids=["rmsnorm", "post-norm", "embed-scale"],
)
def test_what_transformers_gpt2_does_not_compute_is_not_exported(tmp_path: Path, overrides: dict, named: str) -> None:
    save_model(tmp_path / "ckpt.pt", tiny_model(**overrides), GPT2_BPE)
    with pytest.raises(Failure) as e:
        export_gpt2.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--to", str(tmp_path / "hf")])
    assert (
        str(e.value)
        == f"cannot export {tmp_path / 'ckpt.pt'}: transformers' GPT-2 does not compute this model's {named}"
    )
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("use_kv_cache", [True, False], ids=["kv-cache", "no-cache"])
def test_a_left_padded_batch_decodes_each_row_as_alone_and_as_hf_generates(gpt2_64, use_kv_cache: bool) -> None:
    """4 prompts of 1 to 15 tokens in one left-padded batch with its attention mask: each row's 40 greedy tokens
    are the row's alone, and GPT2LMHeadModel.generate's for the same padded batch and mask; the logits of each
    step within TOL of its."""
    folder, hf = gpt2_64
    model = GPT.from_checkpoint(gpt2_checkpoint(str(folder)), norm="custom")
    lengths = [1, 15, 6, 11]
    rows = [prompts(hf.config.vocab_size, 1, n)[0].tolist() for n in lengths]
    idx, mask = pad_left(rows, pad_token=7)
    ref = hf.generate(
        idx,
        attention_mask=mask,
        max_new_tokens=40,
        do_sample=False,
        pad_token_id=7,
        output_logits=True,
        return_dict_in_generate=True,
    )
    decode = partial(model.generate, max_new_tokens=40, temperature=0, use_kv_cache=use_kv_cache, return_logits=True)
    tokens, logits = decode(idx, attention_mask=mask)
    assert torch.equal(tokens, ref.sequences)
    assert rel_err(logits, torch.stack(ref.logits, dim=1).double()) <= TOL
    for row, n in zip(range(4), lengths, strict=True):
        alone = decode(torch.tensor([rows[row]]))[0]
        assert torch.equal(alone[0, n:], tokens[row, 15:])


def test_decoding_stops_where_hf_generate_stops_at_its_eos(gpt2_64) -> None:
    """stop_token as transformers' eos_token_id: a row that picks it has ended (its later tokens are the stop token
    again, as generate pads with pad_token_id) and decoding ends when every row has."""
    folder, hf = gpt2_64
    model = GPT.from_checkpoint(gpt2_checkpoint(str(folder)))
    idx = prompts(hf.config.vocab_size, 2, 8)
    free = model.generate(idx, 40, temperature=0)
    stop = int(free[0, 8 + 5])  # row 0 picks it at step 5; row 1 later, or never
    ours = model.generate(idx, 40, temperature=0, stop_token=stop)
    ref = hf.generate(
        idx,
        attention_mask=torch.ones_like(idx),
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=stop,
        pad_token_id=stop,
    )
    assert torch.equal(ours, ref) and ours.size(1) < 8 + 40 and (ours[0, 8 + 5 :] == stop).all()


def test_batch_independence_passes_on_gpt2s_weights(gpt2_64, capsys: pytest.CaptureFixture[str]) -> None:
    folder, _ = gpt2_64
    argv = ["--json", "--init_from", str(folder), "--norms", "custom", "builtin", "--prompt_len", "6"]
    status = batch_independence.main([*argv, "--new_tokens", "6", "--device", "cpu"])
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and result["source"] == f"GPT-2's weights from {folder}"
    assert [r["name"] for r in result["rows"]] == ["custom", "builtin"] and all(r["passed"] for r in result["rows"])


def config_with(folder: Path, **change: object) -> str:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps(config | change), encoding="utf-8")
    return str(folder)


def without_weights(folder: Path) -> str:
    (folder / "model.safetensors").unlink()
    return str(folder)


def emptied(folder: Path) -> str:
    shutil.rmtree(folder)
    folder.mkdir()
    return str(folder)


def pickled_with_code(folder: Path) -> str:
    """pytorch_model.bin in place of model.safetensors, holding an object whose unpickling would write `ran`."""
    state = safetensors_torch.load_file(folder / "model.safetensors")
    without_weights(folder)
    torch.save({**state, "note": PAYLOADS["Path.touch"](folder / "ran")}, folder / "pytorch_model.bin")
    return str(folder)


# What the loader cannot read, and the word its one line names it by. Downloads fail here (offline).
UNREADABLE = {
    "relu": (lambda folder: config_with(folder, activation_function="relu"), "activation_function='relu'"),
    "n_inner": (lambda folder: config_with(folder, n_inner=64), "n_inner=64"),
    "llama": (lambda folder: config_with(folder, model_type="llama"), "model_type='llama'"),
    "no-weights": (without_weights, "there is no model.safetensors"),
    "empty-folder": (emptied, "there is no config.json"),
    "pickled-code": (pickled_with_code, "pytorch_model.bin holds objects other than tensors"),
    "a-file": (lambda folder: str(folder / "config.json"), "is a file"),
    "typo": (lambda folder: "gtp2", "gtp2"),
    "offline-hub-id": (lambda folder: "gpt2-medium", "hf download openai-community/gpt2-medium"),
}


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_what_the_loader_cannot_read_is_one_line_naming_it(
    gpt2_64, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    def offline(repo_id: str, allow_patterns: list[str]) -> str:
        raise OSError("no network")

    monkeypatch.setattr("huggingface_hub.snapshot_download", offline)
    folder = Path(shutil.copytree(gpt2_64[0], tmp_path / "gpt2"))
    make, named = UNREADABLE[case]
    with pytest.raises(ValueError) as e:
        gpt2_checkpoint(make(folder))
    assert named in str(e.value) and "\n" not in str(e.value)
    assert not (folder / "ran").exists()  # the pickled code never ran


def test_sample_py_decodes_a_file_of_prompts_as_hf_generates_them_left_padded(
    tmp_path: Path, gpt2_bpe: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """--prompts: one prompt a line, decoded in one left-padded batch; each sample is the prompt followed by the
    tokens GPT2LMHeadModel.generate gives that row in the same batch with its attention mask."""
    hf = hf_gpt2(vocab_size=50257, n_positions=32, n_embd=16, n_head=2)
    folder = save(hf, tmp_path / "gpt2")
    bpe = TiktokenTokenizer()
    lines = ["ROMEO: Shall I", "O", "To be, or not to be, that is"]
    (tmp_path / "prompts.txt").write_text("\n".join(lines) + "\n\n", encoding="utf-8")  # (an empty line: none)
    idx, mask = pad_left([bpe.encode(line) for line in lines], pad_token=bpe.eot_token)
    ref = hf.generate(idx, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=bpe.eot_token)
    flags = ["--init_from", str(folder), "--temperature", "0", "--max_new_tokens", "12", "--device", "cpu"]
    capsys.readouterr()
    texts = sample.main([*flags, "--prompts", str(tmp_path / "prompts.txt")])
    assert texts == [line + bpe.decode(row[idx.size(1) :].tolist()) for line, row in zip(lines, ref, strict=True)]
    assert capsys.readouterr().out == "".join(f"{text}\n{sample.SEPARATOR}\n" for text in texts)


@pytest.fixture(scope="module")
def bpe_run(tmp_path_factory: pytest.TempPathFactory, gpt2_bpe: object) -> tuple[Path, Path]:
    """A GPT-2 of GPT-2's vocabulary (gelu_new, 32 positions), and helpers.TEXT prepared in GPT-2's BPE."""
    folder = save(hf_gpt2(vocab_size=50257, n_positions=32, n_embd=16, n_head=2), tmp_path_factory.mktemp("gpt2"))
    return folder, make_bpe_dataset(tmp_path_factory.mktemp("bpe"), np.array(gpt2_bpe.encode(TEXT)))


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
