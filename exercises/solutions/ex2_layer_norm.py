"""Exercise 2, solved: LayerNorm over the last dimension, for x of any shape [..., C]."""

import torch


def layer_norm(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    # dim -1 is the last dim whatever x's rank; keepdim=True leaves the statistics [..., 1], so they broadcast
    # back over each row. Every operation here makes a new tensor of x's dtype and device, and none needs x laid
    # out in order in memory (no view): a transpose or a slice works as well as a fresh tensor.
    mean = x.mean(-1, keepdim=True)
    xc = x - mean  # a new tensor: the caller's x is untouched
    var = xc.square().mean(-1, keepdim=True)  # the population variance: the mean, so divided by C
    xhat = xc / torch.sqrt(var + eps)  # eps inside the root: finite for a constant row
    # gamma and beta [C] broadcast over every leading dim. Float32 gamma and beta beside a bfloat16 x (a model
    # trained in mixed precision) promote the product to float32: .to(x.dtype) returns x's dtype, as promised.
    return (xhat * gamma + beta).to(x.dtype)
