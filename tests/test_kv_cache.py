"""Decoding with the KV cache: the same computation as without it, and past block_size exactly the window model.py
documents for the cached path (it refills the last block_size // 2 tokens; the uncached path's sliding window is
nanoGPT's, and so is sampling for a seed, with the cache and without it: test_nanogpt.py). A row decodes the same
alone and in a batch: batch_independence.py's check (1), every norm, in test_batch_independence.py."""

from __future__ import annotations

import pytest
import torch

from helpers import TINY, randomize_norms, sharpen_logits, tiny_model
from model import GPT, KVCache, pad_left

BLOCK = TINY.block_size
TOL = 1e-5  # float32


def tiny(norm: str = "custom", position: str = "pre", seed: int = 0) -> GPT:
    """helpers.TINY with its norms' weights off their init and its greedy choices clear-cut."""
    return sharpen_logits(randomize_norms(tiny_model(norm, seed, norm_position=position), seed + 1))


def prompts(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(TINY.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))


def cached_windows(prompt_len: int, steps: int, block: int) -> list[tuple[int, int]]:
    """(start, end) of the context each cached step computes on, per model.py's documented policy.

    Before the first step as much of the prompt as fits (the last block tokens) is prefilled; when the cache is
    full, the last block // 2 tokens are prefilled afresh at positions 0.. and the window grows again from there.
    """
    start, windows = 0, []
    for step in range(steps):
        end = prompt_len + step
        if end - start > block:
            start = end - (block if step == 0 else block // 2)
        windows.append((start, end))
    return windows


# --- within block_size: the cache changes nothing --------------------------------------------------------------------


@pytest.mark.parametrize(("norm", "position"), [("custom", "pre"), ("rmsnorm", "post")])
def test_prefill_then_single_tokens_equal_one_full_forward(norm: str, position: str) -> None:
    """A prefill, chunks on top of it and single tokens: each position's logits are the full forward's, pre-norm and
    post-norm. A single token on top of the cache sees no later token, so the full forward is causal too."""
    model = tiny(norm, position)
    idx = prompts(3, BLOCK, seed=1)
    with torch.no_grad():
        full = model(idx)[0]
        cache = KVCache(model.config, 3, idx.device, torch.float32)
        pieces = [model(idx[:, :4], kv_cache=cache)[0]]  # prefill
        pieces.append(model(idx[:, 4:6], kv_cache=cache)[0])  # chunks on top of a filled cache (masked): of two,
        pieces.append(model(idx[:, 6:9], kv_cache=cache)[0])  # then of three tokens
        pieces += [model(idx[:, t : t + 1], kv_cache=cache)[0] for t in range(9, BLOCK)]  # one token at a time
    assert cache.length == BLOCK
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=0, atol=TOL)


# --- past block_size: each path computes exactly the window it documents -------------------------------------------


@pytest.mark.parametrize("prompt_len", [6, BLOCK + 4])  # a short prompt; one longer than block_size
def test_cached_overflow_refills_the_last_half_block(prompt_len: int) -> None:
    model = tiny()
    idx = prompts(2, prompt_len, seed=4)
    steps = 2 * BLOCK + 3  # several refills
    out, logits = model.generate(idx, steps, temperature=0, return_logits=True)
    windows = cached_windows(prompt_len, steps, BLOCK)
    for step, (start, end) in enumerate(windows):
        with torch.no_grad():  # one full forward pass over the window; its last position's logits
            want = model(out[:, start:end])[0][:, -1]
        torch.testing.assert_close(logits[:, step], want, rtol=0, atol=TOL, msg=f"step {step}, window {start}:{end}")


def test_left_padded_rows_past_block_size_decode_as_alone_without_the_cache() -> None:
    """Without the cache every step sees the last block_size tokens: a left-padded row's window is its own last
    tokens, its positions its own, past block_size too. (With the cache a padded batch refills its window when its
    longest row fills it: rows decode as alone within block_size, tests/test_gpt2.py.)"""
    model = tiny()
    rows = [prompts(1, n, seed=5)[0].tolist() for n in (2, 9, 5)]
    idx, mask = pad_left(rows)
    out, logits = model.generate(
        idx, BLOCK + 6, temperature=0, use_kv_cache=False, attention_mask=mask, return_logits=True
    )
    for row, prompt in enumerate(rows):
        alone, alone_logits = model.generate(
            torch.tensor([prompt]), BLOCK + 6, temperature=0, use_kv_cache=False, return_logits=True
        )
        assert torch.equal(alone[0, len(prompt) :], out[row, idx.size(1) :])
        torch.testing.assert_close(alone_logits[0], logits[row], rtol=0, atol=TOL)


# --- bad input -------------------------------------------------------------------------------------------------------


def test_generate_rejects_bad_input_with_clear_errors() -> None:
    """The prompt's shape and the cache's room; the sampling settings' checks (raised by GPT.stream's call itself,
    before any step) are test_sample.py's test_bad_arguments, through the flags that name them."""
    model = tiny()
    idx = prompts(1, 3)
    with pytest.raises(ValueError, match=r"shape \[B, T\]"):
        model.generate(idx[0], 2)  # 1-D
    with pytest.raises(ValueError, match="T >= 1"):
        model.generate(idx[:, :0], 2)  # empty prompt
    for mask in ([[1, 1, 0]], [[0, 0, 0]], [[1, 0, 1]], [[1, 1]]):  # right padding; no token; a hole; a shape
        with pytest.raises(ValueError, match="attention_mask must (be left padding|have idx's shape)"):
            model.generate(idx, 2, attention_mask=torch.tensor(mask))
    out, logits = model.generate(idx, 0, return_logits=True)
    assert torch.equal(out, idx) and logits.shape == (1, 0, TINY.vocab_size)
    cache = KVCache(model.config, 1, idx.device, torch.float32)
    with torch.no_grad():
        model(prompts(1, BLOCK), kv_cache=cache)
        with pytest.raises(ValueError, match="block_size"):
            model(idx[:, :1], kv_cache=cache)  # the cache is full
