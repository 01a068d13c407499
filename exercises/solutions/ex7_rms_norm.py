"""Exercise 7, solved: RMSNorm's forward and its backward, derived by hand.

For one row of C features, with ms = mean(x^2), rrms = 1 / sqrt(ms + eps) and xn = x * rrms:

    y_i = xn_i * gamma_i

dgamma is the sum over rows of dy * xn, and the gradient reaching xn is g = dL/dxn = dy * gamma.

dx. xn_i depends on every x_j of its row through x_i and through rrms. LayerNorm's third path, through the mean,
is gone: nothing is subtracted.

    d ms / d x_j   = 2 * x_j / C
    d rrms / d x_j = -1/2 * (ms + eps)^(-3/2) * d ms / d x_j = -rrms^3 * x_j / C = -rrms^2 * xn_j / C
    d xn_i / d x_j = delta_ij * rrms + x_i * d rrms / d x_j = rrms * (delta_ij - xn_i * xn_j / C)

and the chain rule sums g_i * d xn_i / d x_j over i:

    dx_j = rrms * (g_j - xn_j * mean(g * xn))

LayerNorm's dx less its -mean(g) term: the rescaling's share stays, the centring's is gone.
"""

import torch


class RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, eps: float) -> torch.Tensor:
        rrms = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)  # eps inside the root, [..., 1]
        xn = x * rrms
        ctx.save_for_backward(xn, rrms, gamma)
        return xn * gamma

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xn, rrms, gamma = ctx.saved_tensors
        C = xn.shape[-1]
        dgamma = (dy * xn).reshape(-1, C).sum(0)  # every row's share, summed; reshape works for any dy
        g = dy * gamma  # dL/dxn; a new tensor, dy stays as it was
        dx = rrms * (g - xn * (g * xn).mean(-1, keepdim=True))
        return dx, dgamma, None  # eps is a float: no gradient
