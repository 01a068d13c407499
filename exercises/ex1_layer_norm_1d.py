"""Exercise 1 (docs/01-layernorm.md, "The formula", its side note on the lecture's variance): the lecture's
LayerNorm1d, made to match nn.LayerNorm.

Problem
    The lecture "Let's build GPT" turns makemore's BatchNorm1d into this LayerNorm1d, for x of shape [N, C]:

        class LayerNorm1d:
            def __init__(self, dim, eps=1e-5):
                self.eps = eps
                self.gamma = torch.ones(dim)
                self.beta = torch.zeros(dim)

            def __call__(self, x):
                xmean = x.mean(1, keepdim=True)
                xvar = x.var(1, keepdim=True)
                xhat = (x - xmean) / torch.sqrt(xvar + self.eps)
                return self.gamma * xhat + self.beta

    It does not compute what torch.nn.LayerNorm computes. Make it match: each row normalized with its own mean and
    population variance, then scaled by gamma and shifted by beta. A row's output depends on that row alone, bit
    for bit, whatever the other rows hold.

Signature
    LayerNorm1d(dim: int, eps: float = 1e-5), with attributes eps, gamma (dim ones) and beta (dim zeros);
    __call__(x: Tensor [N, C]) -> Tensor [N, C], what F.layer_norm(x, (C,), gamma, beta, eps) returns.

Examples
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(4, 16)
    >>> layer = LayerNorm1d(16)
    >>> torch.allclose(layer(x), torch.nn.functional.layer_norm(x, (16,)), atol=1e-5)
    True
    >>> others = torch.cat([x[:1], 10 * torch.randn(3, 16)])
    >>> torch.equal(layer(others)[0], layer(x)[0])
    True

Step by step
    1. Start from the class above; keep its attributes as they are.
    2. Each row's mean: over dim 1, the features, with keepdim=True so it broadcasts back over the row.
    3. Each row's variance over dim 1, dividing by C: what does x.var divide by unless told otherwise?
    4. Normalize with eps inside the square root, then scale and shift.

The usual mistakes
    x.var(1) left as it is (it divides by C - 1); dim 0 instead of dim 1 (that is BatchNorm1d: the batch's
    statistics); `x -= mean`, which changes the caller's x; state kept between calls, so a row's output depends on
    earlier batches.

Key functions
    Tensor.mean(dim, keepdim=True), Tensor.var(dim, keepdim=True, correction=...), torch.sqrt.

Try it: python -m exercises 1 (python -m exercises 1 --explain lists what the checker tries).
"""

import torch


class LayerNorm1d:
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError
