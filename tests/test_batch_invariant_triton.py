"""The batch-invariant mode's two implementations side by side: PyTorch's kernels on CPU tensors (kernels="torch",
the CPU's) and the Triton kernels of batch_invariant/kernels.py (CUDA's; kernels="triton" runs them through Triton's
interpreter on CPU tensors where there is no GPU). In the mode a prompt decodes bit for bit the same alone, in a batch,
cached or not, for every per-token norm at two model sizes; a row's product does not depend on how many rows came;
linear and attention are still the right functions. Then the Triton kernels alone: a query from the KV cache adds as
inside the causal pass, a norm's row is the same among any number of rows, the row sum. (The interpreter shows the
order of additions is fixed by the code; a GPU run of this file, bench/gpu.sh's, shows the compiled kernels keep it.)
What the mode swaps, restores and refuses: tests/test_batch_invariant.py."""

from __future__ import annotations

import json
from contextlib import nullcontext

import pytest
import torch
from torch.nn import functional as F

import batch_invariant as bi
from helpers import DEVICE, ROOT, TRITON_SKIP, needs_triton, tiny_model
from layernorm import make_norm
from model import padding_mask

if TRITON_SKIP is None:  # (without triton every test of the Triton kernels is skipped)
    from batch_invariant import kernels as bit

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
STOCK_SDPA = F.scaled_dot_product_attention
# The output's rounding, in ulps of its dtype: a GPU rounds float32 to the nearest bfloat16 (half an ulp); Triton's
# interpreter truncates (up to one ulp).
ROUNDING_ULPS = 0.5 if DEVICE == "cuda" else 1.0


def within_rounding(got: torch.Tensor, ref: torch.Tensor, accumulated: float = 1e-5) -> bool:
    """|got - ref| <= the output's rounding (ROUNDING_ULPS of got's dtype) times |ref|, plus what float32
    accumulation over these tiny sums may add (`accumulated`, for unit-sized inputs)."""
    bound = ROUNDING_ULPS * torch.finfo(got.dtype).eps * ref.abs() + accumulated
    return bool(((got.double() - ref).abs() <= bound).all())


def randn(
    *shape: int, gen: torch.Generator, dtype: torch.dtype = torch.float32, kernels: str = "triton"
) -> torch.Tensor:
    """Random values on the device the kernels serve: PyTorch's the CPU, Triton's DEVICE."""
    return torch.randn(*shape, generator=gen).to("cpu" if kernels == "torch" else DEVICE, dtype)


CASES = [(n, s) for n in PER_TOKEN_NORMS for s in SIZES if n != "triton" or s == "tiny"]  # the interpreter is slow


@pytest.mark.parametrize(
    ("norm", "size", "kernels", "dtype"),
    # The quick tier decodes the tiny model with every norm and PyTorch's kernels; the full suite adds
    # configs/shakespeare_char.json's size, and the Triton kernels (for norm=triton, its LayerNorm too) in float32 and
    # under bfloat16 autocast.
    [
        pytest.param(n, s, "auto", torch.float32, marks=[needs_triton, pytest.mark.slow])
        if n == "triton"
        else pytest.param(n, s, "auto", torch.float32, marks=[pytest.mark.slow] if s != "tiny" else [])
        for n, s in CASES
    ]
    + [
        pytest.param("triton", "tiny", "triton", torch.float32, marks=[needs_triton, pytest.mark.slow]),
        pytest.param("builtin", "tiny", "triton", torch.bfloat16, marks=[needs_triton, pytest.mark.slow]),
    ],
)
def test_decoding_is_bit_exact_in_the_mode(norm: str, size: str, kernels: str, dtype: torch.dtype) -> None:
    model = tiny_model(norm, vocab_size=65, **SIZES[size]).to(DEVICE)
    prompts = torch.randint(65, (3, 5), generator=torch.Generator().manual_seed(1)).to(DEVICE)  # three prompts
    autocast = torch.autocast(DEVICE, dtype=dtype) if dtype != torch.float32 else nullcontext()
    with autocast, bi.batch_invariant(kernels=kernels):  # the logits of every greedy step, [B, 4, V]; cached, each
        alone = model.generate(prompts[:1], 4, temperature=0, return_logits=True)[1]  # new token fed alone
        tokens, batch = model.generate(prompts, 4, temperature=0, return_logits=True)
        uncached = model.generate(prompts, 4, temperature=0, use_kv_cache=False, return_logits=True)[1]
        with torch.no_grad():  # one full forward pass over the decoded sequences
            full = model(tokens[:, :-1])[0][:, prompts.size(1) - 1 :]
    assert batch.dtype == dtype
    assert torch.equal(alone[0], batch[0])  # alone vs in a batch of other prompts, every step
    assert torch.equal(batch, full)  # cached token by token vs one forward pass
    assert torch.equal(batch, uncached)  # GPT.generate's two paths


@pytest.mark.parametrize(
    ("kernels", "rows", "dtype"),
    [
        ("torch", 1, torch.float32),
        ("torch", 8, torch.float32),
        pytest.param("triton", 1, torch.float32, marks=needs_triton),
        pytest.param("triton", 1, torch.bfloat16, marks=needs_triton),
    ],
)
def test_linear_rows_do_not_depend_on_how_many_rows_came(
    kernels: str, rows: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the CPU ROWS rows at a time (zero rows padding); in the Triton kernel, tiles of BLOCK_M rows."""
    monkeypatch.setattr(bi, "ROWS", rows)
    gen = torch.Generator().manual_seed(0)
    x, weight, bias = (randn(*shape, gen=gen, dtype=dtype, kernels=kernels) for shape in ((40, 96), (72, 96), (72,)))
    with bi.batch_invariant(kernels=kernels):
        reference = F.linear(x, weight, bias)  # 40 rows: 40 products of 1 row, or 5 of 8, or three Triton tiles
        for m in (1, 2, 3, 7, 16, 17, 33):  # fewer rows, and rows that sit elsewhere in their block than among 40
            assert torch.equal(F.linear(x[:m], weight, bias), reference[:m]), m
            assert torch.equal(F.linear(x[m : m + 1], weight, bias), reference[m : m + 1]), m
        assert torch.equal(F.linear(x.view(5, 8, 96), weight, bias), reference.view(5, 8, 72))  # any leading dims
        strided = torch.empty(96, 40, dtype=dtype, device=x.device).copy_(x.T).T  # x read through its strides
        assert torch.equal(F.linear(strided, weight, bias), reference)


@pytest.mark.parametrize(
    ("kernels", "dtype"),  # PyTorch's kernels in float32, Triton's in float32 and bfloat16
    [
        ("torch", torch.float32),
        pytest.param("triton", torch.float32, marks=needs_triton),
        pytest.param("triton", torch.bfloat16, marks=needs_triton),
    ],
)
def test_the_mode_computes_the_same_functions(kernels: str, dtype: torch.dtype) -> None:
    """Invariant and still right: linear and attention against float64, within the output's rounding, for each
    mask the model gives (causal, causal after a cache, a decoding step, left padding), a run of keys and a scale."""
    gen = torch.Generator().manual_seed(1)
    x, weight, bias = (randn(*shape, gen=gen, dtype=dtype, kernels=kernels) for shape in ((3, 5, 80), (48, 80), (48,)))
    weight = weight / 9  # outputs of about unit size
    q, k, v = (randn(2, 3, n, 8, gen=gen, dtype=dtype, kernels=kernels) for n in (6, 9, 9))
    d = [t.double() for t in (q, k, v)]
    past = torch.ones(6, 9, dtype=torch.bool, device=q.device).tril(diagonal=3)  # model.py's mask: 3 cached keys
    runs = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool, device=q.device)  # 2, 2, 3 keys
    padded = padding_mask(torch.tensor([4, 0], device=q.device), 3, 6)  # row 0 left padded: its first 4 keys unseen
    every = slice(None)
    cases = [  # (queries, keys, how)
        (every, slice(None, 6), {"is_causal": True}),
        (every, every, {"attn_mask": past}),
        (slice(-1, None), every, {}),  # a decoding step: one query, every key
        (every, every, {"scale": 0.5}),  # T > 1, no mask: every key
        (slice(None, 3), slice(None, 3), {"attn_mask": runs}),
        (every, every, {"attn_mask": padded}),
    ]
    with bi.batch_invariant(kernels=kernels):
        assert within_rounding(F.linear(x, weight), x.double() @ weight.double().T)
        got = F.linear(x, weight, bias)
        assert got.dtype == dtype and within_rounding(got, x.double() @ weight.double().T + bias.double())
        for queries, keys, how in cases:
            got = F.scaled_dot_product_attention(q[:, :, queries], k[:, :, keys], v[:, :, keys], **how)
            ref = STOCK_SDPA(d[0][:, :, queries], d[1][:, :, keys], d[2][:, :, keys], **how)
            assert got.dtype == dtype and within_rounding(got, ref), how


# ---- the Triton kernels alone ----


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
@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_query_from_the_cache_adds_as_inside_the_causal_pass(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    q, k, v = (randn(3, 2, 40, 16, dtype=dtype, gen=gen) for _ in range(3))  # 40 keys: past one block of them
    with bi.batch_invariant(kernels="triton"):
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert torch.equal(cached_decoding(q, k, v, prefill=5, chunk=3), causal)  # every query, every batch row
        assert torch.equal(cached_decoding(q[1:2], k[1:2], v[1:2], prefill=30, chunk=4), causal[1:2])  # alone
    ref = STOCK_SDPA(*(t.double() for t in (q, k, v)), is_causal=True)
    assert causal.dtype == dtype and within_rounding(causal, ref)


@needs_triton
def test_the_triton_linear_takes_inputs_of_one_dtype() -> None:
    x, weight = torch.ones(2, 4, dtype=torch.float64, device=DEVICE), torch.ones(3, 4, device=DEVICE)
    with (
        bi.batch_invariant(kernels="triton"),
        pytest.raises(ValueError, match="inputs of one dtype, got x torch.float64"),
    ):
        F.linear(x, weight)


@pytest.mark.slow  # a program per row through Triton's interpreter
@needs_triton
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


@needs_triton
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
