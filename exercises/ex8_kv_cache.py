"""Exercise 8 (docs/03-batch-independence.md, "The KV cache"): one cached decoding step, and the norm
that breaks it.

Problem
    A model generates one token at a time. Running attention over the whole sequence again at every step repeats
    the work on every earlier token; a KV cache keeps each earlier token's key and value, so a step computes the
    new token's query, key and value alone and attends over the cache. Attention below is a small pre-norm causal
    self-attention layer, one head, with its residual:

        h       = norm(x)                              [B, T, C]
        q, k, v = qkv(h), split in three               each [B, T, C]
        a_t     = softmax(q_t . k_s / sqrt(C), over s = 0..t) @ v
        y       = x + proj(a)

    Write decode_step(layer, x_t, cache): given the new tokens x_t [B, C] (one per sequence) and the keys and
    values of the tokens before them, return the new tokens' outputs and the cache with their keys and values
    appended. Decoded one token at a time from an empty cache, the outputs must be the full pass's, layer(x), row
    by row: gap_to_full_pass (given) measures it. Then swap BatchNorm in for the norm and measure again.

Signature
    decode_step(layer: Attention, x_t: Tensor [B, C], cache: (k [B, T, C], v [B, T, C]) or None)
    -> (y_t: Tensor [B, C], (k [B, T + 1, C], v [B, T + 1, C])); cache is None before the first token;
    x_t and the cache are left as they were.

Examples
    >>> from layernorm import BatchNorm, LayerNorm, RMSNorm
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(2, 6, 16)
    >>> gap_to_full_pass(Attention(16, LayerNorm(16)), x) < 1e-6
    True
    >>> gap_to_full_pass(Attention(16, RMSNorm(16)), x) < 1e-6
    True
    >>> round(gap_to_full_pass(Attention(16, BatchNorm(16)), x), 2)  # training mode: the batch's statistics
    0.69

Step by step
    1. Normalise the new tokens alone, with the layer's own norm: layer.norm(x_t). Why is that row t of norm(x)
       for LayerNorm, and why not for BatchNorm in training mode?
    2. q, k, v of the new tokens: layer.qkv(h).chunk(3, dim=-1), each [B, C].
    3. Append k and v at the end of the cache's keys and values (position t follows 0..t-1), as new tensors.
    4. The new query against every key, its own included: which row of the causal mask is that, and does it need
       masking? Scale by sqrt(C), softmax over the keys, weigh the values.
    5. y_t = x_t + layer.proj(a_t): the residual adds the input, not the normalised h.
    6. Run the examples. With BatchNorm the step is no longer the full pass: what would the cache need to hold for
       it to be, and could it, when token t's statistics include tokens after t?

The usual mistakes
    The new token's key and value left out of the attention, or out of the returned cache; the new key put first;
    (v, k) returned for (k, v); scores divided by sqrt(T) or not at all; the residual left out, or adding h where x_t
    belongs; x_t not normalised, or normalised with a LayerNorm of your own rather than layer.norm (right for one
    norm, wrong for the others); y_t returned as [B, 1, C]; the cache changed in place.

Key functions
    layer.norm, layer.qkv, layer.proj, Tensor.chunk(3, dim=-1), torch.cat(..., dim=1), Tensor.softmax(-1), @.

Try it: python -m exercises 8 (python -m exercises 8 --explain lists what the checker tries).
"""

import math

import torch


def decode_step(
    layer: "Attention", x_t: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    raise NotImplementedError


# ---- given: the layer, and the test the examples run ----


class Attention(torch.nn.Module):
    """Pre-norm causal self-attention with one head and its residual: y = x + proj(softmax(q k^T / sqrt(C)) v)."""

    def __init__(self, dim: int, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm = norm
        self.qkv = torch.nn.Linear(dim, 3 * dim)  # h -> q, k, v, each [..., C]
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The full causal pass over x [B, T, C]: token t attends to tokens 0..t."""
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        T, C = x.shape[-2:]
        scores = q @ k.transpose(-2, -1) / math.sqrt(C)  # [B, T, T]
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return x + self.proj(scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v)


def gap_to_full_pass(layer: Attention, x: torch.Tensor) -> float:
    """x [B, T, C] decoded one token at a time with decode_step, from an empty cache: its largest difference from
    the full pass."""
    with torch.no_grad():
        cache, steps = None, []
        for t in range(x.shape[1]):
            y_t, cache = decode_step(layer, x[:, t], cache)
            steps.append(y_t)
        return (torch.stack(steps, dim=1) - layer(x)).abs().max().item()
