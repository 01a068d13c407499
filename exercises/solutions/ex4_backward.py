"""Exercise 4, solved: LayerNorm's backward, derived by hand.

For one row of C features, with mean, var (divided by C), rstd = 1 / sqrt(var + eps) and xhat = (x - mean) * rstd:

    y_i = xhat_i * gamma_i + beta_i

The parameters. Each row's y uses the same gamma and beta, so their gradients are the sum over rows of each row's
share: dbeta = sum over rows of dy, dgamma = sum over rows of dy * xhat. The gradient reaching xhat is
g = dL/dxhat = dy * gamma.

dx. xhat_i depends on every x_j of its row, through x_i, through the mean and through rstd:

    d mean / d x_j   = 1/C
    d var / d x_j    = 2/C * sum_i (x_i - mean) * (delta_ij - 1/C) = 2 * (x_j - mean) / C
                       (the -1/C term vanishes: sum_i (x_i - mean) = 0)
    d rstd / d x_j   = -1/2 * (var + eps)^(-3/2) * d var / d x_j = -rstd^2 * xhat_j / C
    d xhat_i / d x_j = rstd * (delta_ij - 1/C) + (x_i - mean) * d rstd / d x_j
                     = rstd * (delta_ij - 1/C - xhat_i * xhat_j / C)

and the chain rule sums g_i * d xhat_i / d x_j over i:

    dx_j = rstd * (g_j - mean(g) - xhat_j * mean(g * xhat))

the upstream gradient, less its mean (the mean subtraction's share), less its part along xhat (the division by
the standard deviation's share). Only xhat, rstd and gamma are needed: that is what the forward saves.
"""

import torch


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x - mean).square().mean(-1, keepdim=True) + eps)  # [..., 1]
        xhat = (x - mean) * rstd
        ctx.save_for_backward(xhat, rstd, gamma)  # all that backward needs
        return xhat * gamma + beta

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        xhat, rstd, gamma = ctx.saved_tensors
        C = xhat.shape[-1]
        # Sums over every row, whatever the leading dims: reshape (not view) works for any dy, a transposed one too.
        dbeta = dy.reshape(-1, C).sum(0)
        dgamma = (dy * xhat).reshape(-1, C).sum(0)
        g = dy * gamma  # dL/dxhat; a new tensor: autograd's dy is left as it was
        # rstd * (g - mean(g) - xhat * mean(g * xhat)), the means over each row's C features
        dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx, dgamma, dbeta, None  # eps is a float: no gradient
