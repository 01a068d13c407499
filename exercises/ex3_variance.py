"""Exercise 3 (docs/01-layernorm.md, "Float32: two failures, two fixes"): float32 row statistics that stay
accurate far from 0.

Problem
    LayerNorm needs two things of each row: x - mean, and the variance. In float32 both go wrong when a row's mean
    is large against its spread, as on rows near 1e4 with unit spread, and each for its own reason:
    - the variance: the one-pass E[x^2] - E[x]^2 is exact in arithmetic, but E[x^2] is near 1e8 there, where
      float32 steps by 8, and the difference of two such numbers is about 1;
    - x - mean: even two passes (the mean first, then the squares of x - mean) start from a float32 mean of
      numbers near 1e4, which is off by about 1e-3, and every x - mean inherits that.
    Write centre_and_variance(x) that gets both right, in float32 throughout, for rows at any offsets: one batch
    may hold rows near 0 and rows near 1e4.

Signature
    centre_and_variance(x: Tensor [..., C] float32) -> (x - mean: Tensor [..., C], var: Tensor [...]), both
    float32; var the population variance (divided by C); x left as it was.

Examples
    >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    >>> xc, var = centre_and_variance(x)
    >>> xc.tolist(), var.tolist()
    ([[-1.5, -0.5, 0.5, 1.5]], [1.25])
    >>> _ = torch.manual_seed(0)
    >>> x = torch.cat([torch.randn(4, 384), 1e4 + torch.randn(4, 384)])  # rows near 0 and near 1e4
    >>> xc, var = centre_and_variance(x)
    >>> exact = x.double() - x.double().mean(-1, keepdim=True)
    >>> bool((xc.double() - exact).abs().max() < 1e-5), xc.dtype, var.dtype
    (True, torch.float32, torch.float32)

Step by step
    1. Find a number you can subtract from a row that changes neither its variance nor x - mean, and makes the
       row small. How exact is that subtraction in float32, for two numbers near 1e4?
    2. It has to be the row's own: a batch holds rows at different offsets.
    3. On the shifted row, which is small, compute its mean, then x - mean, then the variance: two passes.
    4. Check yourself on rows at 1e4 against float64, then on a batch with rows at 0 and at 1e4.

The usual mistakes
    One shift for the whole batch (x[0, 0], x.mean()): right when every row sits at one offset, wrong when they
    differ; x - x[:1], which subtracts the first row from every row; x.double() and a cast back (the point is to
    stay in float32, as a GPU kernel does: the checker watches the dtypes); `x -= shift`, which changes the
    caller's x; x.var(-1), the sample variance.

Key functions
    x[..., :1] (each row's first element, [..., 1]), Tensor.mean(-1, keepdim=True), Tensor.square.

Try it: python -m exercises 3 (python -m exercises 3 --explain lists what the checker tries).
"""

import torch


def centre_and_variance(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError
