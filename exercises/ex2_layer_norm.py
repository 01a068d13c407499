"""Exercise 2 (docs/01-layernorm.md, "The formula"): LayerNorm from scratch, over any leading dimensions.

Problem: normalize each row of x (its last dimension, C features) to zero mean and unit variance, then scale by
gamma and shift by beta, for x of any shape [..., C]:

    mean = 1/C * sum_i x_i
    var  = 1/C * sum_i (x_i - mean)^2       the population variance: divide by C, not C - 1
    y_i  = (x_i - mean) / sqrt(var + eps) * gamma_i + beta_i

>>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
>>> y = layer_norm(x, torch.ones(4), torch.zeros(4), 1e-5)
>>> [round(v, 4) for v in y[0].tolist()]
[-1.3416, -0.4472, 0.4472, 1.3416]
>>> layer_norm(torch.randn(2, 3, 5, 8), torch.ones(8), torch.zeros(8), 1e-5).shape
torch.Size([2, 3, 5, 8])

Hints:
- Reduce over dim -1 only, with keepdim=True, so that the statistics broadcast back over the row; dim 1 is the
  last dim only of a 2-D x.
- x.var(-1) divides by C - 1 (the sample variance); pass correction=0, or compute the mean of the squares of
  x - mean yourself.
- eps goes inside the square root: sqrt(var + eps).

Try it: python -m exercises 2
"""

import torch


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    raise NotImplementedError
