"""Exercise 5 (docs/02-triton.md, "Reading the kernel"), optional, needs triton (Linux): the forward kernel's
statistics.

Problem
    layer_norm_fwd_kernel below is layernorm_triton.py's forward kernel cut to its core: one program per row,
    the row's C features loaded into one block of BLOCK_SIZE columns (C rounded up to a power of two), y written
    once. The columns from C on are padding: loaded as 0.0, and False in mask. Write row_statistics, which returns
    the row's mean and rstd = 1 / sqrt(var + eps), var being the population variance of the C features:

        mean = 1/C * sum_i x_i
        var  = 1/C * sum_i (x_i - mean)^2        over the C features only, not the padding

    The checker runs the kernel on CPU tensors through Triton's interpreter (`python -m exercises 5` sets
    TRITON_INTERPRET=1 before triton is imported).

Signature
    row_statistics(x: block [BLOCK_SIZE] float32, mask: block [BLOCK_SIZE] of bool, C: int, eps: float)
    -> (mean, rstd), two scalars.

Examples
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])  # C = 5 in a block of 8: three columns of padding
    >>> y = layer_norm_triton(x, torch.ones(5), torch.zeros(5), 0.0)
    >>> [round(v, 4) for v in y[0].tolist()]
    [-1.4142, -0.7071, 0.0, 0.7071, 1.4142]

Step by step
    1. The mean: tl.sum(v, axis=0) sums a block. The padding columns are 0.0: what do they add to the sum?
    2. x - mean: what is it in the padding columns? Make it 0 there before squaring, with tl.where and mask.
    3. The variance: the sum of the squares over C, the row's features, not the block's width.
    4. rstd = 1.0 / tl.sqrt(var + eps); return mean, rstd.

The usual mistakes
    The padding's (0 - mean)^2 left in the variance; the one-pass E[x^2] - E[x]^2, which cancels on rows away
    from 0 (the checker tries rows at 100); dividing by the block's width (BLOCK_SIZE, x.shape[0]) where C
    belongs; returning the std, sqrt(var + eps), where the kernel multiplies by rstd; eps outside the root; C - 1.
    (layernorm_triton.py also shifts each row by its first element, for rows at 1e4, as in exercise 3; rows
    within 100 of 0 do not need it.)

Key functions
    tl.sum(v, axis=0), tl.where(mask, a, b), tl.sqrt.

Try it: python -m exercises 5 (python -m exercises 5 --explain lists what the checker tries).
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
    row = tl.program_id(0).to(tl.int64)  # 64-bit: row * C cannot wrap past 2**31 elements
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
