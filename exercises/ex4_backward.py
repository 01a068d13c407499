"""Exercise 4 (docs/01-layernorm.md, "The backward derived"): LayerNorm's backward by hand.

Problem: write LayerNormFunction, a torch.autograd.Function whose forward(ctx, x, gamma, beta, eps) is exercise 2's
layer_norm (x of shape [..., C]) and whose backward(ctx, dy) returns (dx, dgamma, dbeta, None) without autograd:

    dbeta  = dy summed over every row                 shape [C]
    dgamma = (dy * xhat) summed over every row        shape [C]
    g      = dy * gamma
    dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))     means over the last dim; rstd = 1 / sqrt(var + eps)

The checker compares your gradients with autograd's through the formula in float64, then runs
torch.autograd.gradcheck.

>>> x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
>>> gamma = torch.ones(8, dtype=torch.float64, requires_grad=True)
>>> beta = torch.zeros(8, dtype=torch.float64, requires_grad=True)
>>> LayerNormFunction.apply(x, gamma, beta, 1e-5).sum().backward()
>>> bool(x.grad.abs().max() < 1e-6), beta.grad.tolist() == [6.0] * 8  # y sums to 0 whatever x; 6 rows
(True, True)

Hints:
- In forward, keep what backward needs: ctx.save_for_backward(xhat, rstd, gamma).
- A row is every index but the last: dy.reshape(-1, C).sum(0) sums over all of them, whatever the leading dims.
- The parameters' gradients are sums over rows, not means: every row's loss adds to them.
- backward returns one gradient per input of forward; eps gets None.

Try it: python -m exercises 4
"""

import torch


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raise NotImplementedError
