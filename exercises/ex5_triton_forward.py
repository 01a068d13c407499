"""Exercise 5 (docs/02-triton.md, "The kernels"), optional, needs triton (Linux): the forward kernel's statistics.

Problem: layer_norm_fwd_kernel below is layernorm_triton.py's forward kernel cut to its core: one program per row,
the row's C features loaded into one block of BLOCK_SIZE columns (C rounded up to a power of two), y written once.
The columns from C on are padding: loaded as 0.0, and False in mask. Write row_statistics(x, mask, C, eps), which
returns the row's mean and rstd = 1 / sqrt(var + eps), var being the population variance of the C features:

    mean = 1/C * sum_i x_i
    var  = 1/C * sum_i (x_i - mean)^2        over the C features only, not the padding

The checker runs the kernel on CPU tensors through Triton's interpreter (`python -m exercises 5` sets
TRITON_INTERPRET=1 before triton is imported).

>>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])  # C = 5 in a block of 8: three columns of padding
>>> y = layer_norm_triton(x, torch.ones(5), torch.zeros(5), 0.0)
>>> [round(v, 4) for v in y[0].tolist()]
[-1.4142, -0.7071, 0.0, 0.7071, 1.4142]

Hints:
- tl.sum(v, axis=0) sums a block. The padding columns of x are 0.0, so they add nothing to the sum of x; but
  x - mean is -mean there: tl.where(mask, x - mean, 0.0) before squaring.
- Divide by C, the row's features, not by the block's width.
- rstd = 1.0 / tl.sqrt(var + eps); return mean, rstd.
- layernorm_triton.py also shifts each row by its first element, for rows far from 0 (exercise 3); not needed here.

Try it: python -m exercises 5
"""

import torch
import triton
import triton.language as tl


@triton.jit
def row_statistics(x, mask, C, eps):
    raise NotImplementedError


# ---- given: the kernel and its launcher ----


@triton.jit
def layer_norm_fwd_kernel(X, Y, W, B, C, eps, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < C
    x = tl.load(X + row * C + cols, mask=mask, other=0.0).to(tl.float32)
    mean, rstd = row_statistics(x, mask, C, eps)
    w = tl.load(W + cols, mask=mask)
    b = tl.load(B + cols, mask=mask)
    tl.store(Y + row * C + cols, (x - mean) * rstd * w + b, mask=mask)


def layer_norm_triton(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of the rows of a float32 x [N, C]: one program per row."""
    x = x.contiguous()
    y = torch.empty_like(x)
    N, C = x.shape
    layer_norm_fwd_kernel[(N,)](x, y, gamma, beta, C, eps, BLOCK_SIZE=triton.next_power_of_2(C))
    return y
