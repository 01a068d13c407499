"""sample.py from checkpoints made here (random tiny GPTs, with a character vocabulary or GPT-2's BPE): the text it
streams, the norm swap, the prompt sources, and one-line errors; and the tokenizers' streaming decode."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import sample
from helpers import (
    assert_one_line_error,
    command,
    randomize_norms,
    save_model,
    sharpen_logits,
    tiny_model,
)
from machinery.command import Failure
from machinery.tokenizer import TiktokenTokenizer
from model import GPT

ITOS = list("\n !',.:;?abcdefghijklmnopqrstuvwxyz")
BLOCK = 32
CPU = ["--device", "cpu"]


def make_checkpoint(out_dir: Path, tokenizer: dict, vocab_size: int, norm: str = "builtin", n_embd: int = 32) -> GPT:
    """A random tiny GPT saved as train.py would save it; norm weights and embeddings moved off their init."""
    model = sharpen_logits(randomize_norms(tiny_model(norm, block_size=BLOCK, vocab_size=vocab_size, n_embd=n_embd)))
    save_model(out_dir / "ckpt.pt", model, tokenizer)
    return model


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sample") / "out"
    make_checkpoint(path, {"kind": "char", "itos": ITOS}, len(ITOS))
    return path


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A GPT-2 BPE checkpoint, its vocabulary padded to 50304 as train.py pads it."""
    path = tmp_path_factory.mktemp("sample") / "bpe"
    make_checkpoint(path, {"kind": "tiktoken", "encoding": "r50k_base"}, vocab_size=50304, n_embd=16)
    return path


def run(out_dir: Path, *args: str) -> list[str]:
    return sample.main(["--out_dir", str(out_dir), *CPU, *args])


def test_the_prompt_by_default_and_from_a_utf8_file(out_dir: Path, tmp_path: Path) -> None:
    """A newline by default; FILE:PATH reads a UTF-8 file, and names one that is not. (A prompt longer than
    block_size: test_kv_cache.py's cached overflow, which sample.py's default decoding is.)"""
    text = run(out_dir, "--max_new_tokens", "5")[0]
    assert text.startswith("\n") and len(text) == 6  # the default prompt is a newline
    prompt = "o romeo, romeo!\nwherefore art thou? "
    (tmp_path / "prompt.txt").write_text(prompt, encoding="utf-8")
    text = run(out_dir, "--start", f"FILE:{tmp_path / 'prompt.txt'}", "--max_new_tokens", "10")[0]
    assert text.startswith(prompt) and len(text) == len(prompt) + 10
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))  # a prompt file that is not UTF-8
    with pytest.raises(Failure, match="latin1.txt is not UTF-8 text"):
        run(out_dir, "--start", f"FILE:{tmp_path / 'latin1.txt'}")


def test_a_padded_vocabulary_never_yields_ids_the_tokenizer_lacks(tmp_path: Path) -> None:
    """A model whose vocabulary is larger than the tokenizer's (padded, as for GPT-2's 50257 -> 50304)."""
    itos = list("abcdefgh")
    model = make_checkpoint(tmp_path, {"kind": "char", "itos": itos}, vocab_size=16)
    with torch.no_grad():  # make the padded ids the likeliest next tokens whatever the context
        ln_f = model.transformer.ln_f
        ln_f.weight.zero_()
        model.lm_head.weight[len(itos) :] = 10 * ln_f.bias / ln_f.bias.square().sum()
        assert model(torch.zeros(1, 1, dtype=torch.long))[0][0, -1].argmax() >= len(itos)
    save_model(tmp_path / "ckpt.pt", model, {"kind": "char", "itos": itos})
    for temperature in ("0", "1"):
        text = run(tmp_path, "--start", "abc", "--max_new_tokens", "20", "--temperature", temperature)[0]
        assert len(text) == 23  # a padded id would not decode: CharTokenizer.decode refuses it


# --- streaming: each token printed as it is generated (the text itself, and num_samples: test_nanogpt.py) ---------


def record_printing(monkeypatch: pytest.MonkeyPatch, ids: list[int] | None = None) -> tuple[io.StringIO, list[str]]:
    """stdout made a StringIO, and GPT.stream made to note what stdout holds as it yields each step (after
    computing it); given `ids`, it yields those token ids instead of the model's. Returns (stdout, the notes)."""
    stdout = io.StringIO()
    printed: list[str] = []
    real = GPT.stream

    def stream(self: GPT, idx: torch.Tensor, max_new_tokens: int, **kwargs: object) -> Iterator:
        for n, (next_tokens, logits) in enumerate(real(self, idx, max_new_tokens, **kwargs)):
            printed.append(stdout.getvalue())
            yield (next_tokens if ids is None else torch.tensor([[ids[n]]])), logits

    monkeypatch.setattr(GPT, "stream", stream)
    monkeypatch.setattr(sys, "stdout", stdout)
    return stdout, printed


def test_each_token_is_printed_as_soon_as_it_is_generated(out_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stdout, printed = record_printing(monkeypatch)
    n = 12
    text = run(out_dir, "--start", "to be", "--max_new_tokens", str(n))[0]
    # the prompt, then each character before the next step is computed
    assert printed == [text[: len("to be") + step] for step in range(n)]
    assert stdout.getvalue() == f"{text}\n{sample.SEPARATOR}\n"


# r50k_base cuts the emoji and the CJK characters between two tokens (the tests count the cuts); "ï" it keeps whole
TEXT_WITH_CUT_CHARACTERS = " 🙂 naïve 日本語 😀👍!"


def test_bpe_decode_stream_gives_bytes_that_never_make_a_character_as_decode_does(gpt2_bpe: object) -> None:
    """An emoji cut at the end, a lone continuation byte first: U+FFFD, as decode gives them. (A character cut
    between two tokens held back until it is whole: the test below, through sample.py.)"""
    tokenizer = TiktokenTokenizer()
    ids = tokenizer.encode(TEXT_WITH_CUT_CHARACTERS)
    cut = [k for k in range(len(ids)) if tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert len(cut) >= 4  # the case under test here and below: prefixes of ids that end inside a character
    for broken in (ids[: cut[0]], [ids[cut[0]], *ids]):
        assert "\ufffd" in tokenizer.decode(broken)
        assert "".join(tokenizer.decode_stream(broken)) == tokenizer.decode(broken)


def test_sample_prints_a_character_cut_between_bpe_tokens_whole(
    bpe_dir: Path, monkeypatch: pytest.MonkeyPatch, gpt2_bpe: object
) -> None:
    tokenizer = TiktokenTokenizer()
    ids = tokenizer.encode(TEXT_WITH_CUT_CHARACTERS)
    stdout, printed = record_printing(monkeypatch, ids)  # the model "generates" these tokens
    text = run(bpe_dir, "--start", "ROMEO:", "--max_new_tokens", str(len(ids)))[0]
    assert text == "ROMEO:" + TEXT_WITH_CUT_CHARACTERS
    # each step's text less a last character still incomplete (which decode gives as U+FFFD)
    assert printed == ["ROMEO:" + tokenizer.decode(ids[:step]).removesuffix("\ufffd") for step in range(len(ids))]
    assert "\ufffd" not in stdout.getvalue()


# --- errors: one line, no traceback ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "status", "culprit"),
    [
        (["--out_dir", "/nowhere"], 1, "no checkpoint at /nowhere/ckpt.pt"),
        (["--ckpt", "/nowhere/other.pt"], 1, "no checkpoint at /nowhere/other.pt"),
        (["--start", "FILE:/nonexistent/prompt.txt"], 1, "/nonexistent/prompt.txt"),
        (["--num_samples", "0"], 2, "--num_samples"),
        (["--max_new_tokens", "-1"], 2, "--max_new_tokens"),  # GPT.stream's checks, named as flags
        (["--temperature", "-1"], 2, "--temperature"),
        (["--temperature", "nan"], 2, "--temperature"),
        (["--temperature", "1e-45"], 2, "--temperature"),
        (["--temperature", "inf"], 2, "--temperature"),
        (["--seed", str(2**64)], 2, "--seed"),
        (["--top_k", "-3"], 2, "--top_k"),
        (["--device", "tpu"], 2, "'tpu'"),
        (["--start", ""], 2, "--start"),
        (["--start", "the Queen"], 2, "'Q'"),
        (["--norm", "rmsnorm"], 1, "rmsnorm"),
        (["--init_from", "gpt2", "--ckpt", "ckpt.pt"], 2, "--init_from"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else str(v),
)
def test_bad_arguments(out_dir: Path, args: list[str], status: int, culprit: str, capsys):
    """One line naming the culprit and its exit status (2: a bad option), before anything is printed."""
    proc = command(capsys, sample.main, ["--out_dir", str(out_dir), *CPU, *args])
    assert_one_line_error(proc, status, culprit)
    assert proc.stdout == ""
