"""batch_invariant/kernels.py, the mode's kernels for CUDA tensors, run through Triton's interpreter on CPU
tensors (kernels="triton") where there is no GPU: a row's result does not depend on how many rows came, a query from
the KV cache adds as inside the causal pass, a norm's row is the same among any number of rows, the kernels compute the
right functions, and a model decodes bit for bit the same alone, in a batch and uncached. (The interpreter shows the
order of additions is fixed by the code; a GPU run of this file shows the compiled kernels keep it.)"""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
from torch.nn import functional as F

import batch_invariant as bi
from helpers import TRITON_SKIP, needs_triton, tiny_model
from layernorm import make_norm
from model import padding_mask

if TRITON_SKIP is None:  # (without triton every test here is skipped)
    from batch_invariant import kernels as bit

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = needs_triton
DTYPES = (torch.float32, torch.bfloat16)
STOCK_SDPA = F.scaled_dot_product_attention
# The output's rounding, in ulps of its dtype: a GPU rounds float32 to the nearest bfloat16 (half an ulp); Triton's
# interpreter truncates (up to one ulp).
ROUNDING_ULPS = 0.5 if DEVICE == "cuda" else 1.0


def within_rounding(got: torch.Tensor, ref: torch.Tensor, accumulated: float = 1e-5) -> bool:
    """|got - ref| <= the output's rounding (ROUNDING_ULPS of got's dtype) times |ref|, plus what float32
    accumulation over these tiny sums may add (`accumulated`, for unit-sized inputs)."""
    bound = ROUNDING_ULPS * torch.finfo(got.dtype).eps * ref.abs() + accumulated
    return bool(((got.double() - ref).abs() <= bound).all())


def randn(*shape: int, dtype: torch.dtype = torch.float32, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_rows_do_not_depend_on_how_many_rows_came(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = randn(40, 96, dtype=dtype, gen=gen), randn(72, 96, dtype=dtype, gen=gen), randn(72, gen=gen)
    with bi.batch_invariant(kernels="triton"):
        reference = F.linear(x, weight, bias.to(dtype))  # 40 rows: three tiles of BLOCK_M
        for m in (1, 2, 3, 7, 16, 17, 33):  # fewer rows, and rows that sit elsewhere in their tile than among 40
            assert torch.equal(F.linear(x[:m], weight, bias.to(dtype)), reference[:m]), m
            assert torch.equal(F.linear(x[m : m + 1], weight, bias.to(dtype)), reference[m : m + 1]), m
        assert torch.equal(F.linear(x.view(5, 8, 96), weight, bias.to(dtype)), reference.view(5, 8, 72))
        strided = torch.empty(96, 40, dtype=dtype, device=DEVICE).copy_(x.T).T  # x read through its strides
        assert torch.equal(F.linear(strided, weight, bias.to(dtype)), reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_against_float64(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x, weight, bias = randn(3, 5, 80, dtype=dtype, gen=gen), randn(48, 80, dtype=dtype, gen=gen) / 9, randn(48, gen=gen)
    with bi.batch_invariant(kernels="triton"):
        got, no_bias = F.linear(x, weight, bias.to(dtype)), F.linear(x, weight)
    assert got.dtype == dtype and got.shape == (3, 5, 48)
    ref = x.double() @ weight.double().T
    assert within_rounding(no_bias, ref) and within_rounding(got, ref + bias.to(dtype).double())


def cached_decoding(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefill: int, chunk: int) -> torch.Tensor:
    """Attention as model.py computes it with a KVCache: keys and values written into a preallocated buffer (NaN
    beyond what is written, so a read past the prefix would show), the first `prefill` queries causal, then `chunk`
    queries with model.py's mask, then one query at a time, each over a strided prefix view of the buffer."""
    B, H, T, D = q.shape
    keys, values = (torch.full((B, H, T + 8, D), float("nan"), dtype=q.dtype, device=q.device) for _ in range(2))
    out, past = [], 0
    for n in (prefill, chunk, *[1] * (T - prefill - chunk)):
        keys[:, :, past : past + n], values[:, :, past : past + n] = k[:, :, past : past + n], v[:, :, past : past + n]
        mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)
        out.append(
            F.scaled_dot_product_attention(
                q[:, :, past : past + n],
                keys[:, :, : past + n],
                values[:, :, : past + n],
                attn_mask=mask if past and n > 1 else None,
                is_causal=not past,
            )
        )
        past += n
    return torch.cat(out, dim=2)


@pytest.mark.slow  # many launches through Triton's interpreter
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_query_from_the_cache_adds_as_inside_the_causal_pass(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (randn(3, 2, 40, 16, dtype=dtype, gen=gen) for _ in range(3))  # 40 keys: past one block of them
    with bi.batch_invariant(kernels="triton"):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.equal(cached_decoding(q, k, v, prefill=5, chunk=3), causal)  # every query, every batch row
        assert torch.equal(cached_decoding(q[1:2], k[1:2], v[1:2], prefill=30, chunk=4), causal[1:2])  # alone
    ref = STOCK_SDPA(*(t.double() for t in (q, k, v)), is_causal=True)
    assert causal.dtype == dtype and within_rounding(causal, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_against_float64(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    q, k, v = randn(2, 3, 6, 8, dtype=dtype, gen=gen), *(randn(2, 3, 9, 8, dtype=dtype, gen=gen) for _ in range(2))
    d = [t.double() for t in (q, k, v)]
    past = torch.ones(6, 9, dtype=torch.bool, device=DEVICE).tril(diagonal=3)  # model.py's mask: 3 cached keys
    with bi.batch_invariant(kernels="triton"):
        for kwargs in ({"attn_mask": past}, {"scale": 0.5}):  # with a mask; over every key (T > 1, no mask)
            assert within_rounding(F.scaled_dot_product_attention(q, k, v, **kwargs), STOCK_SDPA(*d, **kwargs))
        step = F.scaled_dot_product_attention(q[:, :, -1:], k, v)  # a decoding step: one query, every key
        assert within_rounding(step, STOCK_SDPA(d[0][:, :, -1:], *d[1:]))
        runs = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool, device=DEVICE)  # 2, 2, 3 keys
        got = F.scaled_dot_product_attention(q[:, :, :3], k[:, :, :3], v[:, :, :3], attn_mask=runs)
        assert within_rounding(got, STOCK_SDPA(*(t[:, :, :3] for t in d), attn_mask=runs))
        padded = padding_mask(torch.tensor([4, 0], device=DEVICE), 3, 6)  # row 0 left padded: its first 4 keys unseen
        got = F.scaled_dot_product_attention(q, k, v, attn_mask=padded)
        assert within_rounding(got, STOCK_SDPA(*d, attn_mask=padded))
        with pytest.raises(ValueError, match="linear takes .* inputs of one dtype, got x torch.float64"):
            F.linear(d[0], d[1][0, 0])


@pytest.mark.slow  # a program per row through Triton's interpreter
@pytest.mark.parametrize("C", [384, 768])  # where a stock CUDA reduction adds a row by how many rows came
@pytest.mark.parametrize(("norm", "reductions"), [("custom", 2), ("rmsnorm", 1)])
def test_the_norms_rows_do_not_depend_on_how_many_rows_came(
    norm: str, reductions: int, C: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """layernorm.py's own norms reduce each row with torch (the custom LayerNorm its mean and variance, RMSNorm its
    mean square): in the mode every one of those reductions goes through the row-sum kernel, and a row comes out the
    same bits in an uncached pass (B x T rows), a cached step (B rows), one sequence alone and one row alone."""
    sums = []
    monkeypatch.setattr(bi, "CUDA_ROW_SUMS", True)  # (off by default on CUDA tensors)
    monkeypatch.setattr(bit, "row_sum", lambda x, real=bit.row_sum: sums.append(x.shape) or real(x))
    gen = torch.Generator().manual_seed(4)
    x = randn(3, 7, C, gen=gen) * 3 + 1
    module = make_norm(norm, C).to(DEVICE)
    with torch.no_grad():
        module.weight.copy_(randn(C, gen=gen))
        with bi.batch_invariant(kernels="triton"):
            uncached = module(x)
            assert sums == [(3, 7, C)] * reductions  # each reduction over the whole pass, through the kernel
            for part in (lambda t: t[:, -1:], lambda t: t[1:2], lambda t: t[2:3, 4:5]):  # a step, a sequence, a row
                assert torch.equal(module(part(x)), part(uncached))
        reference = module.double()(x.double())
    assert within_rounding(uncached, reference)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_row_sum_against_float64(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every column counts once (a row wider than one block too), accumulated in float32 (float64 for float64)."""
    monkeypatch.setattr(bi, "CUDA_ROW_SUMS", True)  # (off by default on CUDA tensors: the mode's refusal below)
    gen = torch.Generator().manual_seed(5)
    x = randn(3, 2, bit.MAX_SUM_BLOCK + 37, dtype=dtype, gen=gen)
    got = bit.row_sum(x)
    assert got.dtype == dtype and got.shape == (3, 2)
    assert within_rounding(got, x.double().sum(-1), accumulated=1e-12 if dtype == torch.float64 else 1e-3)
    with bi.batch_invariant(kernels="triton"), pytest.raises(ValueError, match="record no gradient"):
        x.float().requires_grad_().sum(-1)


@pytest.mark.slow  # many launches through Triton's interpreter
@pytest.mark.parametrize(("norm", "dtype"), [("triton", torch.float32), ("builtin", torch.bfloat16)])
def test_greedy_decoding_is_bit_exact_through_the_kernels(norm: str, dtype: torch.dtype) -> None:
    """A tiny model's greedy decoding, alone, in a batch of other prompts, and uncached: the same logits, bit for
    bit, in float32 and under bfloat16 autocast, through the Triton kernels (and, for norm=triton, its LayerNorm)."""
    model = tiny_model(norm, vocab_size=65).to(DEVICE)
    prompts = torch.randint(65, (3, 4), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    autocast = torch.autocast(DEVICE, dtype=dtype) if dtype != torch.float32 else nullcontext()
    with autocast, bi.batch_invariant(kernels="triton"):
        alone = model.generate(prompts[:1], 3, temperature=0, return_logits=True)[1]
        tokens, batch = model.generate(prompts, 3, temperature=0, return_logits=True)
        uncached = model.generate(prompts, 3, temperature=0, use_kv_cache=False, return_logits=True)[1]
    assert batch.dtype == dtype
    assert torch.equal(alone[0], batch[0]) and torch.equal(batch, uncached)
    with autocast, torch.no_grad():  # the function PyTorch's kernels compute, on the same tokens: within rounding
        stock = model(tokens[:, :-1])[0][:, prompts.size(1) - 1 :].float()
    assert (stock - batch.float()).abs().max() <= 4 * torch.finfo(dtype).eps * stock.abs().max()
