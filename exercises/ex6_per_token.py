"""Exercise 6 (docs/03-batch-independence.md): is a norm per token?

Problem: a norm is per token when a token's output does not depend on the other tokens of the batch: norm(x)[i]
equals norm(x[i:i+1]) for every row i, the demo's column (3). Write is_per_token(norm, dim): run the norm on a
batch of random tokens of shape [N, dim] and on each token alone, and say whether they agree. LayerNorm, RMSNorm
and DyT are per token; BatchNorm in training mode is not: at batch 1 a token is its own batch mean, so it comes out
as the bias alone.

>>> from layernorm import BatchNorm, LayerNorm
>>> is_per_token(LayerNorm(16), 16)
True
>>> is_per_token(BatchNorm(16), 16)
False

Hints:
- Compare with torch.equal, or a tolerance of a few float32 roundings (1e-6): a per-token norm gives the same
  bits here.
- Use several different tokens (N = 4 or more): a batch of copies of one token has nothing to differ by.
- Return a Python bool: bool(...) of a comparison.
- Judge the norm as it is given: calling norm.eval() would make BatchNorm use its running averages.

Try it: python -m exercises 6
"""

import torch


def is_per_token(norm: torch.nn.Module, dim: int) -> bool:
    raise NotImplementedError
