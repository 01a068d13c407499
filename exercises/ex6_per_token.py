"""Exercise 6 (docs/03-batch-independence.md): is a norm per token?

Problem
    A norm is per token when a token's output does not depend on the other tokens of the batch: norm(x)[i]
    equals norm(x[i:i+1]) for every row i, the demo's column (3). Write is_per_token(norm, dim), a test that
    says whether it is, for any norm. LayerNorm, RMSNorm and DyT are per token; BatchNorm in training mode is
    not (at batch 1 a token is its own batch mean, so it comes out as the bias alone). Some of the norms the
    checker hands your test are made to fool a weak test: write it so that no norm that mixes tokens gets past it.

Signature
    is_per_token(norm: torch.nn.Module, dim: int) -> bool; the norm takes x [N, dim]. Judge the norm as it is
    given: leave its mode (training or eval) and its weights as they are.

Examples
    >>> from layernorm import BatchNorm, LayerNorm
    >>> is_per_token(LayerNorm(16), 16)
    True
    >>> is_per_token(BatchNorm(16), 16)
    False

Step by step
    1. Make a batch of N different random tokens, x [N, dim] (N = 8, say).
    2. Run the norm on the whole batch, once.
    3. Run it on each token alone, x[i:i+1], and put the rows together.
    4. Compare the two, every row of them, and return a Python bool.
    5. Ask of your test: which norm that mixes tokens would still pass it? A batch of copies of one token, only
       row 0 compared, a loose tolerance: each lets one through.

The usual mistakes
    Comparing the batch with itself, or with a shuffled copy of itself (BatchNorm's statistics do not change);
    copies of one token (nothing to differ by); comparing row 0 only; a tolerance looser than 1e-3 (a per-token
    norm gives the same bits here, or within a few float32 roundings: 1e-6); norm.eval() (BatchNorm then uses its
    running averages); returning a tensor, not a bool.

Key functions
    torch.randn, torch.cat, torch.equal or torch.allclose(a, b, rtol=0, atol=1e-6), torch.no_grad.

Try it: python -m exercises 6 (python -m exercises 6 --explain lists what the checker tries).
"""

import torch


def is_per_token(norm: torch.nn.Module, dim: int) -> bool:
    raise NotImplementedError
