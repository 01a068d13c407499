"""batch_invariant/: what the mode swaps in and takes over (a row's sums and means, ROWS rows at a time), and puts
back; what it refuses, said clearly; its Triton kernels imported only when asked for. That a sequence decodes bit for
bit the same alone or in a batch, and that the mode's products are still correct, with each implementation:
tests/test_batch_invariant_triton.py."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import batch_invariant as bi
from helpers import needs_triton, python, tiny_model

STOCK_LINEAR, STOCK_SDPA = F.linear, F.scaled_dot_product_attention
STOCK_SUM, STOCK_MEAN = torch.Tensor.sum, torch.Tensor.mean


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


def test_outside_the_mode_nothing_changes() -> None:
    model, idx = tiny_model("custom", vocab_size=65), torch.randint(65, (2, 12))
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
