"""Batch-invariant mode: the whole model computes a sequence bit for bit the same alone, in a batch, cached or not.

    with batch_invariant():
        logits = model(idx)  # model.py is unchanged: its F.linear and F.scaled_dot_product_attention are swapped

LayerNorm is batch independent in exact arithmetic, and on a computer too: each token's statistics come from its
own features, added in the same order however many tokens there are (batch_independence.py, check 3). The rest of
the model is not, in float32, because two of its operations pick their order of additions from the shapes they get
(measured on a 2-core x86 CPU, torch 2.13 with MKL; bench/results/batch_invariant_cpu.md):

- Matrix products (every nn.Linear). MKL's sgemm gives a row other bits when the product has 1-3 rows, and with 2
  threads also 5-7 or 9-11 rows, than among 64 (up to 1.9e-6 at 384 -> 1152): a decoding step alone has 1 row, in
  a batch of 4, 4. Here every product is cut into blocks of exactly ROWS rows (the last padded with zeros), so
  every row goes through the same call on the same shape; with ROWS > 1, where a row sits inside its block was
  measured not to matter (tests/test_batch_invariant.py runs ROWS = 1 and 8).
- Attention. scaled_dot_product_attention gives a query other bits inside a causal pass over the whole sequence
  than alone over its visible keys (1.1e-6), and a decoding step of one sequence other bits than the same step in a
  batch of 4 (4.5e-8). Here each query attends, one (batch row, query) at a time with all heads at once, over
  exactly the keys it sees: the same calls on the same shapes and memory layout whether it is decoded alone, in a
  batch, from the cache or in a full forward pass.

Either fix alone leaves differences of about 1e-6 in the logits; both give 0. Equal shapes give equal bits on one
machine, with one build and one thread count: the mode promises invariance within a process, not across machines.
It is shown on the CPU only and refuses other devices. It costs 1.2-1.6x stock's time per token decoding one
sequence, 2.4-3.9x at batch 8 (bench/bench_invariant.py), and is for inference: attention dropout is refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.nn import functional as F

# Rows per matrix product. 1: every row is its own matrix-vector product, the cheapest for decoding one sequence.
# Any fixed number works: 8 costs more at batch 1 and less at batch 8 (bench/results/batch_invariant_cpu.md).
ROWS = 1
_STOCK = {"linear": F.linear, "scaled_dot_product_attention": F.scaled_dot_product_attention}


def refusal(device: torch.device | str) -> str | None:
    """Why the mode refuses this device, or None where it has been shown to hold (the CPU)."""
    if torch.device(device).type == "cpu":
        return None
    return (f"batch_invariant() is shown bit-exact on the CPU only, not on {device}: on a GPU the matrix products "
            f"also choose their kernels and their order of additions by shape, and that has not been measured here. "
            f"Run it with the model on the CPU (--device=cpu)")


def check_device(device: torch.device) -> None:
    if why := refusal(device):
        raise ValueError(why)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, computed ROWS rows at a time, so that a row's result does not depend on how many rows came."""
    check_device(x.device)
    rows = x.reshape(-1, x.size(-1)).contiguous()  # [M, K]
    padded = F.pad(rows, (0, 0, 0, -len(rows) % ROWS)) if len(rows) % ROWS else rows  # zero rows up to k * ROWS
    if len(padded) <= ROWS:  # one block (the usual decoding step): no split, no cat
        out = _STOCK["linear"](padded, weight, bias)
    else:
        out = torch.cat([_STOCK["linear"](block, weight, bias) for block in padded.split(ROWS)])
    return out[: len(rows)].view(*x.shape[:-1], weight.size(0))


def visible_keys(T: int, S: int, attn_mask: torch.Tensor | None, is_causal: bool) -> list[int]:
    """How many keys each of T queries sees, when each sees a prefix of the S keys (else ValueError)."""
    if attn_mask is None:
        return [i + 1 for i in range(T)] if is_causal else [S] * T  # is_causal: query i sees keys 0..i
    if attn_mask.dtype != torch.bool:
        raise ValueError(f"batch_invariant() attention takes boolean masks (True: may attend), got {attn_mask.dtype}")
    visible = attn_mask.cpu().expand(T, S) & (torch.ones(T, S, dtype=torch.bool).tril() if is_causal else True)
    counts = visible.sum(-1)
    if not torch.equal(visible, torch.arange(S) < counts[:, None]):
        raise ValueError("batch_invariant() attention needs masks under which each query sees a prefix of the keys")
    return counts.tolist()


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """F.scaled_dot_product_attention for q [B, nh, T, hs] and k, v [B, nh, S, hs], each query over exactly the keys
    it may see. Masks must let query i see a prefix of the keys (causal, or model.py's mask after a cache)."""
    check_device(q.device)
    if dropout_p > 0:
        raise ValueError(f"batch_invariant() attention runs without dropout, got dropout_p={dropout_p}: use eval()")
    B, nh, T, hs = q.shape
    counts = visible_keys(T, k.size(-2), attn_mask, is_causal)
    q = (q * (1 / math.sqrt(hs) if scale is None else scale)).transpose(1, 2).contiguous()  # [B, T, nh, hs]
    out = []
    for b in range(B):
        for i, n in enumerate(counts):
            # All heads at once, on the same shapes and memory layout whether cached or not: [nh, 1, hs] queries,
            # [nh, n, hs] keys and values (copies of a prefix that would otherwise be strided by S)
            keys, values = k[b, :, :n].contiguous(), v[b, :, :n].contiguous()
            weights = torch.softmax(q[b, i].unsqueeze(1) @ keys.transpose(1, 2), dim=-1)  # [nh, 1, n]
            out.append(weights @ values)  # [nh, 1, hs]
    return torch.stack(out).view(B, T, nh, hs).transpose(1, 2)


@contextmanager
def batch_invariant(enabled: bool = True) -> Iterator[None]:
    """Within the block, F.linear and F.scaled_dot_product_attention are the batch-invariant versions above."""
    saved = F.linear, F.scaled_dot_product_attention
    if enabled:
        F.linear, F.scaled_dot_product_attention = linear, attention
    try:
        yield
    finally:
        F.linear, F.scaled_dot_product_attention = saved
