"""Exercise 2 (docs/01-layernorm.md, "The formula"): LayerNorm from scratch, over any leading dimensions.

Problem
    Normalize each row of x (its last dimension, C features) to zero mean and unit variance, then scale by gamma
    and shift by beta, for x of any shape [..., C]: a batch [B, C], a sequence [B, T, C], or one row [C]. x may
    be any view: a transpose, or a slice whose rows are not laid out in order in memory.

        mean = 1/C * sum_i x_i
        var  = 1/C * sum_i (x_i - mean)^2       the population variance: divide by C, not C - 1
        y_i  = (x_i - mean) / sqrt(var + eps) * gamma_i + beta_i

Signature
    layer_norm(x: Tensor [..., C], gamma: Tensor [C], beta: Tensor [C], eps: float) -> Tensor [..., C],
    of x's dtype and device; x is left as it was.

Examples
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    >>> y = layer_norm(x, torch.ones(4), torch.zeros(4), 1e-5)
    >>> [round(v, 4) for v in y[0].tolist()]
    [-1.3416, -0.4472, 0.4472, 1.3416]
    >>> layer_norm(torch.randn(2, 3, 5, 8), torch.ones(8), torch.zeros(8), 1e-5).shape
    torch.Size([2, 3, 5, 8])
    >>> layer_norm(torch.randn(8, 3).t(), torch.ones(8), torch.zeros(8), 1e-5).shape  # a transpose
    torch.Size([3, 8])

Step by step
    1. The mean over dim -1, the last, with keepdim=True: shape [..., 1], which broadcasts against x.
    2. The variance over dim -1, dividing by C: the mean of the squares of x - mean.
    3. xhat = (x - mean) / sqrt(var + eps).
    4. y = xhat * gamma + beta: gamma and beta [C] broadcast over every leading dim.

The usual mistakes
    dim 1 where dim -1 belongs (right for a 2-D x only); keepdim left out (a broadcasting error); x.var(-1), the
    sample variance; x.std(-1) + eps (eps outside the root); `x -= mean`, which changes the caller's x; x.view(...),
    which fails on a transpose (reshape does not); a result made with torch.zeros(x.shape), float32 whatever x's
    dtype.

Key functions
    Tensor.mean(-1, keepdim=True), Tensor.square, torch.sqrt or torch.rsqrt, Tensor.var(-1, correction=0).

Try it: python -m exercises 2 (python -m exercises 2 --explain lists what the checker tries).
"""

import torch


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    raise NotImplementedError
