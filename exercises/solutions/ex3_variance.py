"""Exercise 3, solved: a shifted one-pass variance in float32."""

import torch


def variance(x: torch.Tensor) -> torch.Tensor:
    s = x - x[..., :1]  # shift each row by its first element: small numbers, the same variance
    mean = s.mean(-1)
    return s.square().mean(-1) - mean.square()
