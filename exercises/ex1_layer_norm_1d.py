"""Exercise 1 (docs/01-layernorm.md, "The textbook version"): the lecture's LayerNorm1d, made to match nn.LayerNorm.

Problem: the lecture's LayerNorm1d (docs/01's first listing) uses x.var(1), the sample variance, so it does not
compute what torch.nn.LayerNorm computes. Write LayerNorm1d(dim, eps=1e-5) for x of shape [N, C]: attributes eps,
gamma (dim ones) and beta (dim zeros), and __call__(x) returning what F.layer_norm(x, (C,), gamma, beta, eps)
returns (to float32 rounding). Each row is normalized with its own statistics only, so row 0's output is the same,
bit for bit, whatever the other rows hold: the checker changes them and looks.

>>> _ = torch.manual_seed(0)
>>> x = torch.randn(4, 16)
>>> layer = LayerNorm1d(16)
>>> torch.allclose(layer(x), torch.nn.functional.layer_norm(x, (16,)), atol=1e-5)
True
>>> others = torch.cat([x[:1], 10 * torch.randn(3, 16)])
>>> torch.equal(layer(others)[0], layer(x)[0])
True

Hints:
- Start from docs/01's class: one argument added to one line makes it match nn.LayerNorm (x.var divides by
  C - 1 unless told otherwise).
- The mean and variance are over dim 1, the features; dim 0 is the batch, where BatchNorm1d reduces.

Try it: python -m exercises 1
"""

import torch


class LayerNorm1d:
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
