"""nanoGPT's checkpoints through sample.py and batch_independence.py: a checkpoint in the form nanoGPT's
nanoGPT's train.py saves (a compiled model's "_orig_mod." prefixes, the causal-mask buffers an older PyTorch keeps,
its optimizer and config), beside a meta.pkl written with pickle as nanoGPT's prepare.py writes it, in nanoGPT's
folder layout. The text must be what nanoGPT's sample.py --top_k=1 prints: its loop is written out here (`reference`)
and run on the model the checkpoint was made from."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

import sample
from helpers import (
    CHARS,
    PAYLOADS,
    nanogpt_model,
    norm_params,
    save_nanogpt_checkpoint,
    skip_unless_runs,
    write_meta,
)
from layernorm import LAYERNORMS
from machinery import nanogpt
from machinery.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from machinery.command import Failure
from machinery.run import load_resume
from machinery.tokenizer import GPT2_ENCODING, TiktokenTokenizer
from model import GPT

BLOCK = 32  # nanogpt_model's
CPU = ["--device", "cpu"]


@torch.no_grad()
def reference(
    model: GPT, ids: list[int], n: int, temperature: float = 1.0, top_k: int = 1, vocab_size: int | None = None
) -> list[int]:
    """nanoGPT's GPT.generate, drawing from the global generator: each step the last block_size tokens, recomputed;
    the logits of the first vocab_size tokens (default: all) over the temperature, cut to the top_k (default 1,
    as nanoGPT's sample.py --top_k=1: the likeliest token), softmax, one multinomial draw."""
    idx = torch.tensor([ids])
    for _ in range(n):
        logits = model(idx[:, -model.config.block_size :])[0][:, -1, :vocab_size] / temperature
        kth = torch.topk(logits, top_k).values[:, -1:]
        probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), dim=-1)
        idx = torch.cat([idx, torch.multinomial(probs, 1)], dim=1)
    return idx[0].tolist()


def nanogpt_text(model: GPT, prompt: str, n: int, **sampling: float) -> str:
    return "".join(CHARS[i] for i in reference(model, [CHARS.index(ch) for ch in prompt], n, **sampling))


@pytest.fixture(scope="module", params=[True, False], ids=["bias", "no-bias"])
def nanogpt_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GPT]:
    """nanoGPT's folder: out-shakespeare-char/ckpt.pt and data/shakespeare_char/meta.pkl; and the model saved.
    meta.pkl is in pickle's oldest protocol beside one model, its newest beside the other (prepare.py writes its
    Python's default): read_meta takes every protocol."""
    root = tmp_path_factory.mktemp("nanoGPT")
    model = nanogpt_model(len(CHARS), bias=request.param)
    save_nanogpt_checkpoint(root / "out-shakespeare-char", model)
    protocol = 0 if request.param else pickle.HIGHEST_PROTOCOL
    write_meta(root / "data" / "shakespeare_char" / "meta.pkl", CHARS, protocol)
    return root / "out-shakespeare-char", model


@pytest.fixture
def nanogpt_out(nanogpt_run: tuple[Path, GPT]) -> Path:
    """nanogpt_run's out-shakespeare-char folder, for the tests that read only the files."""
    return nanogpt_run[0]


def greedy(*args: str, prompt: str = "ROMEO:", n: int = 20) -> str:
    return sample.main([*CPU, "--temperature", "0", "--start", prompt, "--max_new_tokens", str(n), *args])[0]


# --- the same text as nanoGPT's sample.py --top_k=1 --------------------------------------------------------------


@pytest.mark.parametrize("norm", norm_params(LAYERNORMS, slow_triton=True))
def test_greedy_text_is_nanogpts_with_every_layernorm(nanogpt_run: tuple[Path, GPT], norm: str) -> None:
    skip_unless_runs(norm)
    out_dir, model = nanogpt_run
    n = BLOCK - len("ROMEO:")  # within block_size the cached and the sliding-window decoding are the same
    expected = nanogpt_text(model, "ROMEO:", n)
    assert greedy("--out_dir", str(out_dir), "--norm", norm, n=n) == expected
    assert greedy("--ckpt", str(out_dir / "ckpt.pt"), "--norm", norm, n=n) == expected


def test_sampled_text_is_nanogpts_for_its_seed_past_block_size_and_within_it_with_the_cache(
    nanogpt_run: tuple[Path, GPT], capsys: pytest.CaptureFixture[str]
) -> None:
    """Sampled as nanoGPT's sample.py samples: the seed set once, then each sample drawn on from where the last one
    left the generator, at the temperature, from the top_k; each printed and followed by the separator line. Past
    block_size without the cache the window slides as nanoGPT's does; within it the cached path draws the same
    tokens; and GPT.generate, given a generator seeded alike, draws them from that generator."""
    out_dir, model = nanogpt_run
    n = 4 * BLOCK
    torch.manual_seed(3)
    expected = [nanogpt_text(model, "ROMEO:", n, temperature=0.8, top_k=6) for _ in range(2)]
    flags = [*CPU, "--out_dir", str(out_dir), "--start", "ROMEO:", "--seed", "3", "--temperature", "0.8", "--top_k=6"]
    capsys.readouterr()
    assert sample.main([*flags, "--max_new_tokens", str(n), "--num_samples", "2", "--no_kv_cache"]) == expected
    assert capsys.readouterr().out == "".join(f"{text}\n{sample.SEPARATOR}\n" for text in expected)
    assert sample.main([*flags, "--max_new_tokens", str(BLOCK - len("ROMEO:"))]) == [expected[0][:BLOCK]]
    prompt = torch.tensor([[CHARS.index(ch) for ch in "ROMEO:"]])
    drawn = model.generate(prompt, n, 0.8, 6, use_kv_cache=False, generator=torch.Generator().manual_seed(3))
    assert "".join(CHARS[i] for i in drawn[0].tolist()) == expected[0]


def test_the_checkpoints_weights_are_loaded_as_saved(nanogpt_run: tuple[Path, GPT]) -> None:
    out_dir, model = nanogpt_run
    ckpt = load_checkpoint(out_dir / "ckpt.pt")
    assert ckpt["format"] == nanogpt.FORMAT and ckpt["model_args"]["norm"] == "builtin"
    loaded = sample.load(sample.parse_args(["--out_dir", str(out_dir)]), "cpu")[0]
    for name, tensor in model.state_dict().items():  # (loaded strictly: no mask buffers, no prefixes)
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_meta_beside_the_checkpoint_comes_first_and_meta_names_one(nanogpt_run: tuple[Path, GPT], tmp_path: Path):
    out_dir, model = nanogpt_run
    folder = tmp_path / "copied"
    folder.mkdir()
    (folder / "ckpt.pt").write_bytes((out_dir / "ckpt.pt").read_bytes())  # no data/ folder near it
    with pytest.raises(Failure, match="needs the meta.pkl of its dataset"):
        greedy("--out_dir", str(folder))
    reversed_chars = CHARS[::-1]  # another vocabulary of the same size: the text shows which file was read
    write_meta(tmp_path / "elsewhere.pkl", reversed_chars)
    ids = reference(model, [reversed_chars.index(ch) for ch in "ROMEO:"], 10)
    expected = "".join(reversed_chars[i] for i in ids)
    assert greedy("--out_dir", str(folder), "--meta", str(tmp_path / "elsewhere.pkl"), n=10) == expected
    write_meta(folder / "meta.pkl", reversed_chars)
    assert greedy("--out_dir", str(folder), n=10) == expected


def test_without_meta_a_gpt2_sized_model_is_decoded_with_gpt2s_bpe(tmp_path: Path, gpt2_bpe: object) -> None:
    model = nanogpt_model(50304, bias=False, n_embd=16)  # nanoGPT pads GPT-2's 50257 tokens to 50304
    save_nanogpt_checkpoint(tmp_path / "out", model)
    bpe = TiktokenTokenizer()
    prompt = "ROMEO: Shall I"
    ids = reference(model, bpe.encode(prompt), 6, vocab_size=bpe.vocab_size)  # sample.py never picks a padded id
    assert greedy("--out_dir", str(tmp_path / "out"), prompt=prompt, n=6) == bpe.decode(ids)


def test_without_meta_bpe_is_taken_from_gpt2s_vocabulary_size_up(tmp_path: Path) -> None:
    ckpt = {"model_args": {"vocab_size": nanogpt.GPT2_VOCAB_SIZE}, "config": {}}  # no dataset, no meta.pkl beside it
    assert nanogpt.tokenizer_meta(tmp_path / "ckpt.pt", ckpt) == {"kind": "tiktoken", "encoding": GPT2_ENCODING}
    ckpt["model_args"]["vocab_size"] -= 1
    with pytest.raises(nanogpt.MetaError, match=f"of {nanogpt.GPT2_VOCAB_SIZE - 1} tokens, fewer") as e:
        nanogpt.tokenizer_meta(tmp_path / "ckpt.pt", ckpt)
    assert str(tmp_path / "meta.pkl") in str(e.value) and "\n" not in str(e.value)  # where it looked, in one line


# --- bad input: one line, and no pickled code runs -----------------------------------------------------------------


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_a_meta_pkl_with_code_is_refused_and_nothing_runs(nanogpt_out: Path, tmp_path: Path, payload: str) -> None:
    marker = tmp_path / "marker"
    meta = {"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)), "note": PAYLOADS[payload](marker)}
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(meta))  # the payload is live: test_checkpoint.py
    with pytest.raises(Failure, match="nothing in the file ran"):
        sample.main([*CPU, "--out_dir", str(nanogpt_out), "--meta", str(tmp_path / "meta.pkl")])
    assert not marker.exists()


@pytest.mark.parametrize(
    ("meta", "fragment"),
    [
        (b"\x80\x04\x95", "pickle data was truncated"),
        (pickle.dumps(["a", "b"]), "list indices"),
        (pickle.dumps({"itos": {0: "a", 2: "b"}}), "no 'itos' dict of the token ids"),
        (pickle.dumps({"itos": {0: "a", 1: "bc"}}), "must be a single character"),
        (pickle.dumps({"itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}}), "'stoi' is not the inverse"),
        (pickle.dumps({"itos": {0: "a", 1: "b"}}), "holds 2 characters, but the checkpoint's vocabulary is"),
        (None, "no such file"),
    ],
    ids=["truncated", "not-a-dict", "ids-with-a-gap", "two-characters", "stoi-not-inverse", "another-size", "missing"],
)
def test_a_meta_pkl_that_is_not_this_checkpoints_is_refused(
    nanogpt_out: Path, tmp_path: Path, meta: bytes | None, fragment: str
) -> None:
    if meta is not None:
        (tmp_path / "meta.pkl").write_bytes(meta)
    with pytest.raises(Failure, match="^") as e:
        sample.main([*CPU, "--out_dir", str(nanogpt_out), "--meta", str(tmp_path / "meta.pkl")])
    assert fragment in str(e.value) and str(tmp_path / "meta.pkl") in str(e.value)
    assert "\n" not in str(e.value)


def test_meta_for_this_projects_checkpoint_is_refused(nanogpt_out: Path, tmp_path: Path) -> None:
    ckpt = load_checkpoint(nanogpt_out / "ckpt.pt")
    ours = {**ckpt, "format": "layernorm-gpt/1", "tokenizer": {"kind": "char", "itos": CHARS}}
    save_checkpoint(tmp_path / "ckpt.pt", ours)
    with pytest.raises(Failure, match="^--meta is for a nanoGPT checkpoint"):
        sample.main([*CPU, "--out_dir", str(tmp_path), "--meta", str(nanogpt_out.parent / "data" / "x.pkl")])


def test_a_checkpoint_of_neither_format_names_both(tmp_path: Path) -> None:
    torch.save({"model": {}, "model_args": {}}, tmp_path / "ckpt.pt")  # nanoGPT's keys, but not all of them
    with pytest.raises(CheckpointError, match="nanoGPT's"):
        load_checkpoint(tmp_path / "ckpt.pt")


def test_train_py_does_not_resume_a_nanogpt_checkpoint(nanogpt_out: Path) -> None:
    with pytest.raises(CheckpointError, match="is nanoGPT's checkpoint: .* train.py resumes only its own"):
        load_resume(nanogpt_out / "ckpt.pt")
