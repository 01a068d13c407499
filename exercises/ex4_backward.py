"""Exercise 4 (docs/01-layernorm.md, "The backward, from two facts"): LayerNorm's backward, derived by you.

Problem
    Write LayerNormFunction, a torch.autograd.Function: forward(ctx, x, gamma, beta, eps) is exercise 2's
    layer_norm, and backward(ctx, dy) returns the gradients of the loss with respect to x, gamma and beta, given
    dy, its gradient with respect to y, without autograd. Derive them on paper first; docs/01's "The backward,
    from two facts" holds the answer, so read it after, to check yours.

Signature
    forward(ctx, x: Tensor [..., C], gamma: Tensor [C], beta: Tensor [C], eps: float) -> y: Tensor [..., C]
    backward(ctx, dy: Tensor [..., C]) -> (dx [..., C], dgamma [C], dbeta [C], None), one per input of forward.
    Neither changes its inputs; dy may be any view (a transpose after the norm hands back a transposed one).

Examples
    >>> x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    >>> gamma = torch.ones(8, dtype=torch.float64, requires_grad=True)
    >>> beta = torch.zeros(8, dtype=torch.float64, requires_grad=True)
    >>> LayerNormFunction.apply(x, gamma, beta, 1e-5).sum().backward()
    >>> bool(x.grad.abs().max() < 1e-6), beta.grad.tolist() == [6.0] * 8  # y sums to 0 whatever x; 6 rows
    (True, True)
    >>> x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    >>> gamma = torch.randn(8, dtype=torch.float64, requires_grad=True)
    >>> torch.autograd.gradcheck(lambda x, g: LayerNormFunction.apply(x, g, beta, 1e-5), (x, gamma))
    True

Step by step
    1. forward: compute y as in exercise 2, and save with ctx.save_for_backward what backward will need (which of
       the intermediate results appear in your derivatives?).
    2. beta and gamma: every row's y uses the same gamma and beta, so each row's share of their gradient adds up.
       What is one row's share? Then: over which dims do you add, for x of any rank?
    3. Name g = dL/dxhat, the gradient reaching xhat. What is it, in dy and gamma?
    4. One xhat_i depends on every x_j of its row, three ways: through x_i itself, through the mean, and through
       rstd = 1 / sqrt(var + eps). Write d mean / d x_j, then d var / d x_j (one term vanishes: what does
       sum_i (x_i - mean) come to?), then d rstd / d x_j, then d xhat_i / d x_j.
    5. The chain rule: dx_j = sum_i g_i * d xhat_i / d x_j. Write it with row means, in terms of g, xhat and rstd.
    6. Check: y sums to 0 over a row whatever x when gamma is ones and beta zeros, so what must dx be for dy = 1?

The usual mistakes
    dgamma and dbeta as means over rows, or not summed at all (autograd.grad would sum a [..., C] gradient for
    you without a word; the checker calls backward directly, so it sees the shape); dgamma from x where xhat
    belongs; one of dx's terms left out or with its sign flipped; gamma left out of g; dy.mul_(...) or
    `dy *= ...`, which changes autograd's dy; dy.view(...), which fails on a transposed dy; no None for eps.

Key functions
    ctx.save_for_backward / ctx.saved_tensors, Tensor.reshape(-1, C).sum(0), Tensor.mean(-1, keepdim=True),
    torch.rsqrt, torch.autograd.gradcheck (float64 inputs).

Try it: python -m exercises 4 (python -m exercises 4 --explain lists what the checker tries).
"""

import torch


class LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> torch.Tensor:
        raise NotImplementedError

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        raise NotImplementedError
