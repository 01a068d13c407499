"""Exercise 7 (docs/04-why-layernorm.md): RMSNorm, forward and backward, derived by you.

Problem
    RMSNorm rescales each row to unit root-mean-square and does not centre it: no mean subtracted, no beta.

        rrms = 1 / sqrt(mean(x^2) + eps)        the mean over the last dim
        xn   = x * rrms
        y    = xn * gamma

    Write RMSNormFunction, a torch.autograd.Function, forward and backward, the backward without autograd.
    Derive its dx as you derived LayerNorm's in exercise 4: RMSNorm is LayerNorm with one path fewer.

Signature
    forward(ctx, x: Tensor [..., C], gamma: Tensor [C], eps: float) -> y: Tensor [..., C]
    backward(ctx, dy: Tensor [..., C]) -> (dx [..., C], dgamma [C], None), one per input of forward.
    Neither changes its inputs; dy may be any view (a transpose after the norm hands back a transposed one).

Examples
    >>> x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    >>> y = RMSNormFunction.apply(x, torch.ones(2, dtype=torch.float64), 0.0)
    >>> [round(v, 4) for v in y[0].tolist()]  # rms = sqrt((9 + 16) / 2)
    [0.8485, 1.1314]
    >>> x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    >>> gamma = torch.randn(8, dtype=torch.float64, requires_grad=True)
    >>> torch.autograd.gradcheck(lambda x, g: RMSNormFunction.apply(x, g, 1e-5), (x, gamma))
    True

Step by step
    1. forward: y as above; save what your derivatives will use.
    2. dgamma: each row's share, summed over every row.
    3. g = dL/dxn, the gradient reaching xn, in dy and gamma.
    4. xn_i depends on every x_j of its row two ways: through x_i itself and through rrms. Which of LayerNorm's
       three paths is gone, and why? Write d mean(x^2) / d x_j, then d rrms / d x_j, then d xn_i / d x_j.
    5. The chain rule: dx_j = sum_i g_i * d xn_i / d x_j, written with row means in terms of g, xn and rrms.
    6. Compare with exercise 4's dx: which term is missing, and which stayed?

The usual mistakes
    The mean subtracted (that is LayerNorm); eps outside the square root; the sum of squares where their mean
    belongs; dgamma as a mean over rows, or not summed at all (the checker calls backward directly and sees the
    shape); LayerNorm's -mean(g) term carried over; the rrms path left out, or with its sign flipped; dy changed
    in place.

Key functions
    torch.rsqrt, Tensor.square().mean(-1, keepdim=True), Tensor.reshape(-1, C).sum(0), ctx.save_for_backward.

Try it: python -m exercises 7 (python -m exercises 7 --explain lists what the checker tries).
"""

import torch


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raise NotImplementedError
