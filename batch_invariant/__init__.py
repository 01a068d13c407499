"""Batch-invariant mode: the whole model computes a sequence bit for bit the same alone, in a batch, cached or not.

    with batch_invariant():
        logits = model(idx)  # model.py is unchanged: its F.linear and F.scaled_dot_product_attention are swapped,
                             # and its norms' sums and means over a row are taken over

LayerNorm is batch independent: no statistic crosses rows (batch_independence.py, check 3). Bit for bit, three kinds
of operation pick their order of additions from the shapes they get (the README gives the differences measured):
- Matrix products (MKL, cuBLAS): a row gets other bits among 1 row (a decoding step alone) than among 4 or 64.
  The mode sends every row through the same additions, however many rows came.
- Attention (SDPA): a query gets other bits inside a causal pass than alone, and in a batch than alone. The mode
  adds exactly the keys each query sees, in one order, alone, in a batch (left padded too), from the cache or in a
  full pass.
- The reductions over a row that layernorm.py's own norms make (Tensor.sum and Tensor.mean over the last dimension:
  the custom LayerNorm's mean and variance, RMSNorm's mean square). On CUDA torch picks a reduction's block width
  from the number of rows too (torch 2.11, aten/src/ATen/native/cuda/Reduce.cuh), so a cached step of 4 rows and a
  full pass of 188 add a row of 384 in different orders. The mode adds each row in one order, fixed by its length.
  On CUDA tensors only with BATCH_INVARIANT_CUDA_ROW_SUMS=1 set (bench/gpu.sh sets it), until a GPU run has passed
  its kernel; the CPU's PyTorch kernels and Triton's interpreter run it always.
  (F.layer_norm, the built-in, normalizes a row in one CUDA block of a fixed width; the Triton norm in one program.)
Either of the first two fixes alone leaves about 1e-6 in the logits; both give 0 (`linear=False` or
`attention=False` drops one).

Chosen by the tensors' device (kernels="auto"): on the CPU, PyTorch's kernels on fixed shapes ("torch", below; its
cost: python -m bench.decoding); on CUDA, the Triton kernels of kernels.py ("triton"), which Triton's
interpreter also runs on CPU tensors (kernels="triton", TRITON_INTERPRET=1).
Equal shapes give equal bits on one machine, with one build and one thread count: invariance within a process, not
across machines. For inference: attention dropout is refused, as is a device with no implementation.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from types import ModuleType
from typing import Any

import torch
from torch.nn import functional as F

# Rows per matrix product (and per row reduction) on the CPU. 1: every row is its own matrix-vector product, the
# cheapest for decoding one sequence. Any fixed number works: 8 costs more at batch 1 and less at batch 8
# (bench/results/batch_invariant_cpu.md).
ROWS = 1
KERNELS = ("auto", "torch", "triton")
CUDA_ROW_SUMS = os.environ.get("BATCH_INVARIANT_CUDA_ROW_SUMS") == "1"  # the row sums on CUDA tensors (docstring)
_STOCK_LINEAR = F.linear  # the mode swaps F.linear; its CPU version calls the stock one
_STOCK_SUM = torch.Tensor.sum  # and Tensor.sum, with which its CPU row sums add


def refusal(device: torch.device | str, kernels: str = "auto") -> str | None:
    """Why the mode cannot serve tensors on this device with these kernels, or None where it can."""
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        return (
            f"batch_invariant() has no implementation for {device}: it runs on the CPU (PyTorch's kernels) and "
            f"on CUDA (Triton kernels). Run the model on one of them (--device=cpu)"
        )
    if kind == "cuda" and kernels == "torch":
        return f"batch_invariant(kernels='torch') is the CPU implementation, not for {device}: use 'auto' or 'triton'"
    if (kind == "cuda" or kernels == "triton") and find_spec("triton") is None:
        return f"batch_invariant() on {device} needs Triton (pip install triton)"
    if kind == "cpu" and kernels == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
        return "batch_invariant(kernels='triton') runs on CPU tensors only with TRITON_INTERPRET=1 set before start"
    return None


@functools.cache
def triton_kernels(device: torch.device, kernels: str) -> ModuleType | None:
    """batch_invariant.kernels where the mode computes on this device with Triton, None for PyTorch's kernels, a
    ValueError for neither. Imported here, at the first tensor that needs it: it imports triton."""
    if why := refusal(device, kernels):
        raise ValueError(why)
    return importlib.import_module("batch_invariant.kernels") if device.type == "cuda" or kernels == "triton" else None


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kernels: str = "auto"
) -> torch.Tensor:
    """F.linear whose rows do not depend on how many rows came (on the CPU: ROWS rows at a time, in_blocks)."""
    if triton := triton_kernels(x.device, kernels):
        return triton.linear(x, weight, bias)
    rows = x.reshape(-1, x.size(-1)).contiguous()  # [M, K]
    return in_blocks(rows, lambda block: _STOCK_LINEAR(block, weight, bias)).view(*x.shape[:-1], weight.size(0))


def in_blocks(rows: torch.Tensor, compute: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """compute(block) over rows [M, ...] ROWS at a time, zero rows padding the last block, so that a row is computed
    among the same number of rows however many came; the results of the M rows, concatenated."""
    padded = F.pad(rows, (0, 0, 0, -len(rows) % ROWS)) if len(rows) % ROWS else rows  # zero rows up to k * ROWS
    if len(padded) <= ROWS:  # one block (the usual decoding step), or none: no split, no cat
        return compute(padded)[: len(rows)]
    return torch.cat([compute(block) for block in padded.split(ROWS)])[: len(rows)]


def visible_keys(
    B: int, T: int, S: int, attn_mask: torch.Tensor | None, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[first, end) of the S keys each of T queries sees, two [B, T] tensors on the CPU, when each sees a run of
    keys (else ValueError): causal, causal after a cache, and model.py's padding masks ([B, 1, T, S]), under which
    a row's padding is a run of keys at its start."""
    if attn_mask is None:
        end = torch.arange(1, T + 1) if is_causal else torch.full((T,), S)
        return torch.zeros(B, T, dtype=torch.long), end.expand(B, T)
    if attn_mask.dtype != torch.bool:
        raise ValueError(f"batch_invariant() attention takes boolean masks (True: may attend), got {attn_mask.dtype}")
    mask = attn_mask.cpu()
    if mask.dim() == 4 and mask.size(1) != 1:
        raise ValueError("batch_invariant() attention takes masks that are the same for every head ([B, 1, T, S])")
    visible = mask.expand(B, 1, T, S)[:, 0] & (torch.ones(T, S, dtype=torch.bool).tril() if is_causal else True)
    first = visible.int().argmax(-1)  # the first key each query sees
    end = first + visible.sum(-1)
    keys = torch.arange(S)
    if not torch.equal(visible, (keys >= first[..., None]) & (keys < end[..., None])):
        raise ValueError("batch_invariant() attention needs masks under which each query sees a run of keys")
    return first, end


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    *,
    kernels: str = "auto",
) -> torch.Tensor:
    """F.scaled_dot_product_attention for q [B, nh, T, hs] and k, v [B, nh, S, hs], each query over exactly the keys
    it may see, added from the first: alone, in a batch, left padded, cached or not, the same run of keys gives
    the same bits. Masks must let each query see a run of keys (causal, or model.py's masks)."""
    triton = triton_kernels(q.device, kernels)
    if dropout_p > 0:
        raise ValueError(f"batch_invariant() attention runs without dropout, got dropout_p={dropout_p}: use eval()")
    B, nh, T, hs = q.shape
    first, end = visible_keys(B, T, k.size(-2), attn_mask, is_causal)
    scale = 1 / math.sqrt(hs) if scale is None else scale
    if triton:
        return triton.attention(q, k, v, first, end, scale)
    q = (q * scale).transpose(1, 2).contiguous()  # [B, T, nh, hs]
    out = []
    for b in range(B):
        for i, (lo, hi) in enumerate(zip(first[b].tolist(), end[b].tolist(), strict=True)):
            # All heads at once, on the same shapes and memory layout whether cached or not: [nh, 1, hs] queries,
            # [nh, n, hs] keys and values (copies of a run that would otherwise be strided by S)
            keys = k[b, :, lo:hi].contiguous()
            weights = torch.softmax(q[b, i].unsqueeze(1) @ keys.transpose(1, 2), dim=-1)  # [nh, 1, n]
            out.append(weights @ v[b, :, lo:hi].contiguous())  # [nh, 1, hs]
    return torch.stack(out).view(B, T, nh, hs).transpose(1, 2)


def row_sum(x: torch.Tensor, *, kernels: str = "auto") -> torch.Tensor:
    """x [..., C] -> [...]: each row's sum, added in one order whatever the number of rows (on the CPU: in_blocks,
    as linear)."""
    if triton := triton_kernels(x.device, kernels):
        if torch.is_grad_enabled() and x.requires_grad:
            raise ValueError("batch_invariant()'s Triton row sums record no gradient: run under torch.no_grad()")
        return triton.row_sum(x)
    rows = x.reshape(-1, x.size(-1))  # [M, C]
    return in_blocks(rows, lambda block: _STOCK_SUM(block, -1)).view(x.shape[:-1])


def row_reduction(stock: Callable[..., torch.Tensor], mean: bool, kernels: str) -> Callable[..., torch.Tensor]:
    """Tensor.sum (mean=False) or Tensor.mean in the mode: over the last dimension of a floating-point tensor of some
    rows, as the norms call it, through row_sum (a mean divides the row's sum by its length); any other call as
    `stock`, the method it replaces."""

    def reduce(x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> torch.Tensor:
        dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
        rows = x.is_floating_point() and x.dim() >= 1 and x.numel() > 0 and dtype is None  # (else: left to torch)
        if not (rows and len(dims) == 1 and dims[0] in (-1, x.dim() - 1)) or (x.is_cuda and not CUDA_ROW_SUMS):
            return stock(x, dim, keepdim, dtype=dtype)
        sums = row_sum(x, kernels=kernels)
        out = sums / x.size(-1) if mean else sums
        return out.unsqueeze(-1) if keepdim else out

    return reduce


FIXES = {"linear": linear, "scaled_dot_product_attention": attention}


@contextlib.contextmanager
def batch_invariant(
    enabled: bool = True, *, linear: bool = True, attention: bool = True, kernels: str = "auto"
) -> Iterator[None]:
    """Within the block, F.linear and F.scaled_dot_product_attention (or only the one asked for) are the
    batch-invariant versions above, and so are Tensor.sum and Tensor.mean over a row (row_reduction), computed with
    `kernels`: "auto" (by the tensors' device), "torch" or "triton"."""
    if kernels not in KERNELS:
        raise ValueError(f"batch_invariant(kernels={kernels!r}): choose one of {', '.join(KERNELS)}")
    saved = F.linear, F.scaled_dot_product_attention, torch.Tensor.sum, torch.Tensor.mean
    for name, fixed in zip(FIXES, (linear, attention), strict=True):
        if enabled and fixed:
            setattr(F, name, functools.partial(FIXES[name], kernels=kernels))
    if enabled:
        torch.Tensor.sum = row_reduction(torch.Tensor.sum, mean=False, kernels=kernels)
        torch.Tensor.mean = row_reduction(torch.Tensor.mean, mean=True, kernels=kernels)
    try:
        yield
    finally:
        F.linear, F.scaled_dot_product_attention, torch.Tensor.sum, torch.Tensor.mean = saved
