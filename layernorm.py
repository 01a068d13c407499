"""Layer Normalization, three ways: from scratch, PyTorch's built-in, and a fused Triton kernel.

For one row x of C features (a token's activations), LayerNorm is

    mean = 1/C * sum_i x_i
    var  = 1/(C - correction) * sum_i (x_i - mean)^2        (correction=0: population variance, as nn.LayerNorm)
    rstd = 1 / sqrt(var + eps)
    xhat_i = (x_i - mean) * rstd                            (zero mean, unit variance)
    y_i    = xhat_i * weight_i + bias_i                     (a learned scale and shift per feature)

Every row is normalized on its own: no statistic crosses rows, so a token's output does not depend on the other
tokens of the batch. `BatchNorm` at the bottom of the file is the counter-example (statistics per feature over the
batch) and `RMSNorm` the simplification (no mean subtraction, no shift).

The file reads top to bottom:
  1. `layer_norm`: the forward in plain torch ops, with the backward derived by hand next to it;
  2. `layer_norm_triton`: the same forward and backward as two fused Triton kernels, each beside its launcher;
  3. the modules and the registry: `make_norm(name, dim)` and `NORMS`.
Triton is imported only when the Triton norm is built or used; `import layernorm` does not import it.
"""

import os

import torch
import torch.nn.functional as F
from torch import nn

NORMS: tuple[str, ...] = ("custom", "builtin", "triton", "rmsnorm", "batchnorm")


# ----------------------------------------------------------------------------------------------------------------
# Checks shared by every implementation: bad input gets a clear error, never a wrong answer.


def _check_args(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"layer_norm expects a torch.Tensor input, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"layer_norm expects a floating-point input (float32, float64, bfloat16, float16), got {x.dtype}"
        )
    if x.dim() == 0:
        raise ValueError("layer_norm needs at least one dimension to normalize over, got a 0-d tensor")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != tuple(x.shape[-1:]):
            raise ValueError(
                f"{name} has shape {tuple(p.shape)} but x has shape {tuple(x.shape)}: "
                f"{name} must have shape {tuple(x.shape[-1:])}, the size of x's last dimension"
            )
    if not eps > 0:  # also catches NaN
        raise ValueError(f"eps must be > 0 (it keeps 1/sqrt(var + eps) finite for a constant row), got {eps}")


# ----------------------------------------------------------------------------------------------------------------
# 1. From scratch: forward in torch ops, backward by hand.
#
# Forward, per row (C features, D = C - correction):
#     xs   = x - x_0                  shift by the row's first element: the sums below then see small numbers
#                                     even when the row sits at 1e4 (no cancellation), and a constant row is
#                                     exactly 0 (so y is exactly bias)
#     xc   = xs - mean(xs)            centred row (two passes: never E[x^2] - E[x]^2)
#     var  = |xc|^2 / D,  rstd = 1/sqrt(var + eps)
#     xhat = xc * rstd,   y = xhat * w + b
#
# Backward. Given dy = dL/dy:
#     db = sum over rows of dy                    y = ... + b
#     dw = sum over rows of dy * xhat             y = xhat * w + ...
#     g  = dy * w                                 g = dL/dxhat
# and for one row, xhat_i = (x_i - mean) * rstd depends on x_j through x_i, mean and rstd:
#     d xhat_i / d x_j = rstd * (delta_ij - 1/C - xhat_i * xhat_j / D)
# (d mean/d x_j = 1/C; d rstd/d x_j = -rstd^3 * (x_j - mean)/D = -rstd^2 * xhat_j / D). Summing g_i over i:
#     dx_j = rstd * (g_j - mean(g) - xhat_j * sum_i(g_i * xhat_i) / D)
# Three terms: the upstream gradient, minus its mean (the mean subtraction), minus its component along xhat
# (the division by the standard deviation). Only xhat and rstd are needed: they are what forward saves.


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, correction):
        C = x.shape[-1]
        compute = torch.promote_types(x.dtype, torch.float32)  # float32 stats for half/bfloat16 inputs
        x2 = x.reshape(-1, C)  # all leading dims are rows; a view when x is contiguous
        if x2.dtype != compute:
            x2 = x2.to(compute)
        xc = x2 - x2[:, :1]  # shift (a fresh tensor, so the in-place ops below touch nothing of the caller)
        xc.sub_(xc.mean(-1, keepdim=True))  # centre
        # |xc|^2 through vector_norm: one fused reduction (torch.var is Welford, several times slower on CPU)
        var = torch.linalg.vector_norm(xc, dim=-1, keepdim=True).square_().div_(C - correction)
        rstd = var.add_(eps).rsqrt_()  # [N, 1]
        xhat = xc.mul_(rstd)  # [N, C]
        w = weight.to(compute)
        y = xhat * w if bias is None else torch.addcmul(bias.to(compute), xhat, w)
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.has_bias = bias is not None
        ctx.D = C - correction
        ctx.x_shape, ctx.x_dtype = x.shape, x.dtype
        return y.to(x.dtype).view(x.shape)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        N, C = xhat.shape
        dy2 = dy.reshape(-1, C).to(xhat.dtype)  # copies only when dy is non-contiguous/expanded or half
        dx = dweight = dbias = None
        if ctx.needs_input_grad[0]:
            g = dy2 * weight.to(xhat.dtype)  # dL/dxhat
            mean_g = g.mean(-1, keepdim=True)
            proj = torch.linalg.vecdot(g, xhat, dim=-1).unsqueeze_(-1).div_(ctx.D)  # sum_i g_i xhat_i / D
            dx = g.sub_(mean_g).addcmul_(xhat, proj, value=-1).mul_(rstd)
            dx = dx.to(ctx.x_dtype).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dweight = (dy2 * xhat).sum(0).to(weight.dtype)  # reduce over every row (all leading dims)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            dbias = dy2.sum(0).to(weight.dtype)
        return dx, dweight, dbias, None, None


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    correction: int = 0,
) -> torch.Tensor:
    """LayerNorm over the last dimension of x, from scratch, with a hand-derived backward.

    x has any shape [..., C]; weight and bias (optional) have shape [C]. correction=0 uses the population
    variance (as nn.LayerNorm); correction=1 the sample variance (as the chapter's LayerNorm1d, x.var(1)).
    Half and bfloat16 inputs are normalized in float32 and returned in their own dtype.

    >>> x = torch.randn(2, 3, 8)
    >>> y = layer_norm(x, torch.ones(8), torch.zeros(8))
    >>> y.shape
    torch.Size([2, 3, 8])
    >>> bool(y.mean(-1).abs().max() < 1e-5)
    True
    """
    _check_args(x, weight, bias, eps)
    C = x.shape[-1]
    if not 0 <= correction < C:
        raise ValueError(f"correction must be in [0, C) = [0, {C}) for C={C} features, got {correction}")
    return _LayerNormFunction.apply(x, weight, bias, float(eps), int(correction))


def layer_norm_naive(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    correction: int = 0,
) -> torch.Tensor:
    """The formula op by op, differentiated by autograd: the baseline the hand-written backward must beat."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / (x.shape[-1] - correction)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias


# ----------------------------------------------------------------------------------------------------------------
# 2. Triton (fused kernels). Imported lazily.


class TritonUnavailableError(RuntimeError):
    """The Triton norm was chosen where Triton cannot run."""


_WHAT_TO_DO = (
    "use a machine with a CUDA GPU, or set TRITON_INTERPRET=1 in the environment before starting Python to run the "
    "Triton kernels on the CPU through Triton's (slow) interpreter, or choose another norm such as 'builtin' or "
    "'custom'"
)


def _require_triton() -> None:
    """Raise TritonUnavailableError, saying why and what to do, when triton cannot be imported."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise TritonUnavailableError(
            f"norm 'triton' needs the triton package, which cannot be imported here ({e}); triton ships for "
            f"Linux only (not macOS or Windows). To fix: pip install triton on Linux, or {_WHAT_TO_DO}"
        ) from None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def layer_norm_triton(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5
) -> torch.Tensor:
    raise TritonUnavailableError("the Triton LayerNorm is not written yet; " + _WHAT_TO_DO)


# ----------------------------------------------------------------------------------------------------------------
# 3. Modules and the registry. The three LayerNorms share one parameter layout: `weight` [dim] and `bias` [dim]
# (or None), so a state_dict saved with one loads into any other.


def _init_affine(module: nn.Module, dim: int, bias: bool, eps: float) -> None:
    """The parameter layout every norm here shares: weight [dim] (ones), bias [dim] (zeros) or None."""
    if isinstance(dim, bool) or not (isinstance(dim, int) and dim >= 1):
        raise ValueError(f"dim must be a positive int (the number of features), got {dim!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    module.dim, module.eps = dim, float(eps)
    module.weight = nn.Parameter(torch.ones(dim))
    module.bias = nn.Parameter(torch.zeros(dim)) if bias else None


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, from scratch (`layer_norm`). The base of the three LayerNorms."""

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, bias={self.bias is not None}, eps={self.eps}"

    def _check_input(self, x: torch.Tensor) -> None:
        if x.dim() == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__}({self.dim}) expects an input whose last dimension is {self.dim}, "
                f"got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} expects a floating-point input, got {x.dtype}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)


class BuiltinLayerNorm(LayerNorm):
    """PyTorch's own fused kernel, torch.nn.functional.layer_norm, with the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


class TritonLayerNorm(LayerNorm):
    """The fused Triton kernels (`layer_norm_triton`), with the same parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_triton(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019; Gopher, Chinchilla): y = x / sqrt(mean(x^2) + eps) * weight [+ bias].

    No mean subtraction: the row is rescaled to unit root-mean-square, not centred. `bias` is off in those models;
    it is kept optional here for a layout compatible with the LayerNorms. Statistics in float32.
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)

    extra_repr = LayerNorm.extra_repr
    _check_input = LayerNorm._check_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        rms_inv = torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        y = xf * rms_inv * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


class BatchNorm(nn.Module):
    """BatchNorm over every token of the batch, per feature: the counter-example to LayerNorm.

    For x of shape [..., C], all leading dims are pooled: mean and var of feature c come from every token in the
    batch, so one token's output depends on the others. Training mode normalizes with the batch statistics and
    updates running_mean/running_var (momentum 0.1, unbiased variance, as nn.BatchNorm1d); eval mode uses the
    running statistics, so its output is per token again.
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        _init_affine(self, dim, bias, eps)
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    extra_repr = LayerNorm.extra_repr
    _check_input = LayerNorm._check_input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x2 = x.reshape(-1, self.dim).to(self.weight.dtype)  # every token of the batch is one sample
        if self.training:
            if x2.shape[0] < 2:
                raise ValueError(
                    f"BatchNorm in training mode needs more than one token to take statistics over, got input "
                    f"shape {tuple(x.shape)}; call .eval() to use the running statistics"
                )
            self.num_batches_tracked.add_(1)
        y = F.batch_norm(
            x2, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps
        )
        return y.to(x.dtype).view(x.shape)


_CLASSES: dict[str, type[nn.Module]] = {
    "custom": LayerNorm,
    "builtin": BuiltinLayerNorm,
    "triton": TritonLayerNorm,
    "rmsnorm": RMSNorm,
    "batchnorm": BatchNorm,
}


def make_norm(name: str, dim: int, *, bias: bool = True, eps: float = 1e-5) -> nn.Module:
    """Build the norm called `name` (one of NORMS) over `dim` features.

    custom, builtin and triton are the same LayerNorm (same function, same parameters `weight` and `bias`);
    rmsnorm and batchnorm are the two contrasts. bias=False drops the additive `bias` parameter.
    """
    if name not in _CLASSES:
        raise ValueError(f"unknown norm {name!r}; valid names are {', '.join(NORMS)}")
    if name == "triton":
        _require_triton()
    return _CLASSES[name](dim, bias=bias, eps=eps)

