"""batch_invariant/: in the mode, a prompt decodes bit for bit the same alone or in a batch, cached or
not, for every per-token norm at two model sizes; the mode's products are still correct; outside it nothing changes."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn import functional as F

import batch_invariant as bi
from helpers import ROOT, needs_triton, python, tiny_model
from model import GPT

PER_TOKEN_NORMS = ("custom", "builtin", "triton", "rmsnorm", "dyt")
# TINY, and the size of configs/shakespeare_char.json, whose larger products are where stock kernels round a row
# differently by its company (the mode's reason to exist)
SIZES = {
    "tiny": {},
    "shakespeare_char": {
        k: json.loads((ROOT / "configs" / "shakespeare_char.json").read_text())[k]
        for k in ("n_layer", "n_head", "n_embd")
    },
}
STOCK_LINEAR, STOCK_SDPA = F.linear, F.scaled_dot_product_attention
STOCK_SUM, STOCK_MEAN = torch.Tensor.sum, torch.Tensor.mean


def make_model(norm: str, size: str) -> GPT:
    return tiny_model(norm, vocab_size=65, **SIZES[size])


CASES = [(n, s) for n in PER_TOKEN_NORMS for s in SIZES if n != "triton" or s == "tiny"]  # the interpreter is slow


@pytest.mark.parametrize(
    ("norm", "size"),
    # The quick tier decodes the tiny model with every norm; the full suite adds configs/shakespeare_char.json's size.
    [
        pytest.param(n, s, marks=[needs_triton, pytest.mark.slow])
        if n == "triton"
        else pytest.param(n, s, marks=[pytest.mark.slow] if s != "tiny" else [])
        for n, s in CASES
    ],
)
def test_decoding_is_bit_exact_in_the_mode(norm: str, size: str) -> None:
    model = make_model(norm, size)
    prompts = torch.randint(65, (4, 8), generator=torch.Generator().manual_seed(1))  # four different prompts
    with bi.batch_invariant():  # the logits of every greedy step, [B, 8, V]; cached, each new token fed alone
        alone = model.generate(prompts[:1], 8, temperature=0, return_logits=True)[1]
        tokens, batch = model.generate(prompts, 8, temperature=0, return_logits=True)
        uncached = model.generate(prompts, 8, temperature=0, use_kv_cache=False, return_logits=True)[1]
        with torch.no_grad():  # one full forward pass over the decoded sequences
            full = model(tokens[:, :-1])[0][:, prompts.size(1) - 1 :]
    assert torch.equal(alone[0], batch[0])  # alone vs in a batch of other prompts, every step
    assert torch.equal(batch, full)  # cached token by token vs one forward pass
    assert torch.equal(batch, uncached)  # GPT.generate's two paths


@pytest.mark.parametrize("rows", [1, 8])
def test_linear_rows_do_not_depend_on_how_many_rows_came(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bi, "ROWS", rows)
    torch.manual_seed(0)
    weight, bias, x = torch.randn(96, 384) * 0.05, torch.randn(96), torch.randn(40, 384)
    with bi.batch_invariant():
        reference = F.linear(x, weight, bias)  # 40 rows: 40 products of 1 row, or 5 of 8
        for m in range(1, 40):
            assert torch.equal(F.linear(x[:m], weight, bias), reference[:m]), m
        assert torch.equal(F.linear(x.view(5, 8, 384), weight, bias), reference.view(5, 8, 96))  # any leading dims


@pytest.mark.parametrize("rows", [1, 8])
def test_row_sums_do_not_depend_on_how_many_rows_came(rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The norms' sums and means over a row, as the mode takes them over (ROWS rows at a time, zero rows padding)."""
    monkeypatch.setattr(bi, "ROWS", rows)
    taken = []  # the reductions the mode took over
    monkeypatch.setattr(bi, "row_sum", lambda x, real=bi.row_sum, **kw: taken.append(x.shape) or real(x, **kw))
    x = torch.randn(3, 13, 384, generator=torch.Generator().manual_seed(0)) * 3 + 1
    with bi.batch_invariant():
        sums, means = x.sum(-1), x.mean(dim=(-1,), keepdim=True)
        assert torch.equal(x[1:2, 5:12].sum(dim=2), sums[1:2, 5:12]) and torch.equal(x[2, 3].mean(-1), means[2, 3, 0])
        across = x.sum(0)  # another dimension: left to torch
    assert taken == [(3, 13, 384), (3, 13, 384), (1, 7, 384), (384,)]
    assert torch.equal(across, x.sum(0)) and (sums - x.double().sum(-1)).abs().max() < 1e-3
    assert torch.equal(means, sums.unsqueeze(-1) / 384)


def test_the_mode_computes_the_same_functions() -> None:
    """Invariant and still right: linear and attention against float64, within float32 rounding."""
    torch.manual_seed(0)
    x, weight, bias = torch.randn(3, 5, 64), torch.randn(48, 64) / 8, torch.randn(48)
    q, k, v = torch.randn(2, 3, 6, 16), torch.randn(2, 3, 9, 16), torch.randn(2, 3, 9, 16)
    past = torch.ones(6, 9, dtype=torch.bool).tril(diagonal=3)  # model.py's mask: 3 cached keys, then causal
    d = [t.double() for t in (q, k, v)]
    with bi.batch_invariant():
        assert (F.linear(x, weight, bias) - F.linear(x.double(), weight.double(), bias.double())).abs().max() < 1e-5
        assert (F.linear(x, weight) - x.double() @ weight.double().T).abs().max() < 1e-5
        for kwargs, qq in (({"is_causal": True}, q[:, :, :6]), ({"attn_mask": past}, q), ({}, q)):
            keys = slice(None, 6) if "is_causal" in kwargs else slice(None)
            got = F.scaled_dot_product_attention(qq, k[:, :, keys], v[:, :, keys], **kwargs)
            ref = STOCK_SDPA(qq.double(), d[1][:, :, keys], d[2][:, :, keys], **kwargs)
            assert (got - ref).abs().max() < 1e-6, kwargs
        scaled = F.scaled_dot_product_attention(q, k, v, scale=0.5)
        assert (scaled - STOCK_SDPA(*d, scale=0.5)).abs().max() < 1e-6


def test_outside_the_mode_nothing_changes() -> None:
    model, idx = make_model("custom", "tiny"), torch.randint(65, (2, 12))
    with torch.no_grad():
        before = model(idx)[0]
        with bi.batch_invariant():
            assert F.linear.func is bi.linear and F.scaled_dot_product_attention.func is bi.attention
            inside = model(idx)[0]
        after = model(idx)[0]
    assert torch.equal(before, after) and (before - inside).abs().max() < 1e-5
    assert F.linear is STOCK_LINEAR and F.scaled_dot_product_attention is STOCK_SDPA
    assert torch.Tensor.sum is STOCK_SUM and torch.Tensor.mean is STOCK_MEAN
    with pytest.raises(RuntimeError, match="boom"), bi.batch_invariant():  # restored after an error too
        raise RuntimeError("boom")
    assert F.linear is STOCK_LINEAR and F.scaled_dot_product_attention is STOCK_SDPA
    assert torch.Tensor.sum is STOCK_SUM and torch.Tensor.mean is STOCK_MEAN
    with bi.batch_invariant(enabled=False):
        assert F.linear is STOCK_LINEAR
    with bi.batch_invariant(attention=False):  # one fix alone, as bench/ measures each
        assert F.linear.func is bi.linear and F.scaled_dot_product_attention is STOCK_SDPA
    with bi.batch_invariant(linear=False, kernels="torch"):
        assert F.linear is STOCK_LINEAR and F.scaled_dot_product_attention.keywords == {"kernels": "torch"}


def test_what_the_mode_refuses_is_said_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    assert bi.refusal("cpu") is None and bi.refusal(torch.device("cpu"), "torch") is None
    for device in ("mps", "mps:0", "meta"):
        assert f"no implementation for {device}" in bi.refusal(device) and "--device=cpu" in bi.refusal(device)
    assert "kernels='torch') is the CPU implementation, not for cuda:1" in bi.refusal("cuda:1", "torch")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # Triton on CPU tensors needs the interpreter
    assert "TRITON_INTERPRET=1" in bi.refusal("cpu", "triton")
    with pytest.raises(ValueError, match=r"batch_invariant\(kernels='cuda'\): choose one of auto, torch, triton"):
        bi.batch_invariant(kernels="cuda").__enter__()


Q = torch.ones(1, 1, 4, 8)
SCATTERED = torch.tensor([[True, False, True, True]]).expand(4, 4)  # keys 0, 2, 3: not a prefix


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: F.linear(torch.empty(2, 4, device="meta"), torch.empty(3, 4, device="meta")),
            "no implementation for meta",
        ),
        (lambda: F.scaled_dot_product_attention(Q, Q, Q, dropout_p=0.1), "without dropout, got dropout_p=0.1"),
        (lambda: F.scaled_dot_product_attention(Q, Q, Q, attn_mask=SCATTERED), "a run of keys"),
        # a float mask, not read as a bool: refused
        (
            lambda: F.scaled_dot_product_attention(Q, Q, Q, attn_mask=torch.zeros(4, 4)),
            "boolean masks .* got torch.float32",
        ),
    ],
    ids=["meta", "dropout", "scattered-mask", "float-mask"],
)
def test_what_the_mode_refuses_to_compute_is_said_clearly(call, message: str) -> None:
    with bi.batch_invariant(), pytest.raises(ValueError, match=message):
        call()


@pytest.mark.slow  # a fresh interpreter
@needs_triton
def test_the_kernel_module_is_imported_only_when_asked_for() -> None:
    """Importing the mode and running it on CPU tensors with PyTorch's kernels leaves the Triton kernels (and so
    triton) unimported: they are for CUDA tensors, or kernels="triton"."""
    code = (
        "import sys, torch\nimport batch_invariant as bi\n"
        "x, w, F = torch.ones(2, 3), torch.ones(4, 3), torch.nn.functional\n"
        "with bi.batch_invariant(): F.linear(x, w)\n"
        "print('batch_invariant.kernels' in sys.modules)\n"
        "with bi.batch_invariant(kernels='triton'): F.linear(x, w)\n"
        "print('batch_invariant.kernels' in sys.modules)"
    )
    proc = python("-c", code, TRITON_INTERPRET="1")
    assert proc.stdout.split() == ["False", "True"], proc.stdout + proc.stderr
