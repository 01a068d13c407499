"""Exercise 1, solved: the textbook's LayerNorm1d with the population variance."""

import torch


class LayerNorm1d:
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        self.eps = eps
        self.gamma = torch.ones(dim)
        self.beta = torch.zeros(dim)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xmean = x.mean(1, keepdim=True)
        xvar = x.var(1, keepdim=True, correction=0)  # the population variance, as nn.LayerNorm
        xhat = (x - xmean) / torch.sqrt(xvar + self.eps)
        return self.gamma * xhat + self.beta
