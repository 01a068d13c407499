"""Exercise 2, solved: LayerNorm over the last dimension."""

import torch


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = (x - mean).square().mean(-1, keepdim=True)  # population variance: divide by C
    xhat = (x - mean) / torch.sqrt(var + eps)
    return xhat * gamma + beta
