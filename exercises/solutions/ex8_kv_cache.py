"""Exercise 8, solved: one cached decoding step, exact for a per-token norm."""

import math

import torch


def decode_step(
    layer: "Attention", x_t: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    # The new tokens alone, [B, C]: for a per-token norm this is row t of norm(x) in the full pass, bit for bit
    # or nearly; for BatchNorm in training mode it is not (its statistics pool the tokens it is given).
    h = layer.norm(x_t)
    q, k, v = layer.qkv(h).chunk(3, dim=-1)  # each [B, C]
    k, v = k[:, None], v[:, None]  # [B, 1, C]: one position
    if cache is not None:  # append at the end: position t follows positions 0..t-1; torch.cat makes new tensors
        k, v = torch.cat([cache[0], k], dim=1), torch.cat([cache[1], v], dim=1)
    # The new query against every cached key, its own included: the last row of the causal mask is all ones, so
    # no mask is needed. [B, 1, C] @ [B, C, T+1] -> [B, 1, T+1]; scaled by sqrt(C), as the full pass.
    scores = q[:, None] @ k.transpose(-2, -1) / math.sqrt(x_t.shape[-1])
    a = (scores.softmax(-1) @ v)[:, 0]  # [B, C]
    return x_t + layer.proj(a), (k, v)  # the residual adds x_t, the input, not h


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
