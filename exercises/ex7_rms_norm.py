"""Exercise 7 (docs/04-why-layernorm.md): RMSNorm, forward and backward by hand.

Problem: RMSNorm rescales each row to unit root-mean-square and does not centre it (no mean, no beta):

    rrms = 1 / sqrt(mean(x^2) + eps)        the mean over the last dim
    xn   = x * rrms
    y    = xn * gamma

Write RMSNormFunction, a torch.autograd.Function with forward(ctx, x, gamma, eps) for x of shape [..., C] and
backward(ctx, dy) returning (dx, dgamma, None), without autograd. Derive dx as docs/01 derives LayerNorm's: the
mean's term is gone, the variance's stays.

>>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
>>> y = RMSNormFunction.apply(x, torch.ones(2, dtype=torch.float64), 0.0)
>>> [round(v, 4) for v in y[0].tolist()]  # rms = sqrt((9 + 16) / 2)
[0.8485, 1.1314]
>>> x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
>>> gamma = torch.randn(8, dtype=torch.float64, requires_grad=True)
>>> torch.autograd.gradcheck(lambda x, g: RMSNormFunction.apply(x, g, 1e-5), (x, gamma))
True

Hints:
- With g = dy * gamma: dx = rrms * (g - xn * mean(g * xn)); dgamma sums dy * xn over every row.
- LayerNorm's dx has one term more, -mean(g), from its mean subtraction; RMSNorm has none.

Try it: python -m exercises 7
"""

import torch


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raise NotImplementedError
