"""Layer Normalization, from the formula to the code, with the backward derived by hand.

Read it top to bottom: the formula; `layer_norm`, its forward in plain torch ops and its backward derived beside
the code; PyTorch's built-in and the fused Triton kernels (layernorm_triton.py) as drop-in equals; RMSNorm and
BatchNorm as contrasts; the registry `make_norm(name, dim)` / `NORMS` that model.py asks for a norm.

For one row x of C features (a token's activations), LayerNorm is

    mean = 1/C * sum_i x_i
    var  = 1/(C - correction) * sum_i (x_i - mean)^2        (correction=0: population variance, as nn.LayerNorm;
                                                             correction=1: the sample variance, as x.var(1) in
                                                             the textbook LayerNorm1d, docs/01-layernorm.md)
    rstd = 1 / sqrt(var + eps)
    xhat_i = (x_i - mean) * rstd                            (zero mean, unit variance)
    y_i    = xhat_i * weight_i + bias_i                     (a learned scale and shift per feature)

Every row is normalized on its own: no statistic crosses rows, so a token's output does not depend on the other
tokens of the batch. `BatchNorm` below is the counter-example (statistics per feature over the batch), `RMSNorm`
the simplification (no mean subtraction, no shift) and `DyT` the question whether statistics are needed at all.
"""

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# The three LayerNorms compute one function from the same parameters, so a checkpoint trained with one runs with
# any other; the contrasts compute other functions.
LAYERNORMS: tuple[str, ...] = ("custom", "builtin", "triton")
NORMS: tuple[str, ...] = (*LAYERNORMS, "rmsnorm", "batchnorm", "dyt")
# Not a norm: make_norm("none", dim) is the identity, the no-normalization baseline of the norm comparison.
NO_NORM = "none"
# Not one to train with: make_norm("frozen", dim) is a trained LayerNorm's linear part (FrozenLayerNorm), what
# experiments/remove_layernorm.py leaves in a model once its LayerNorms are removed.
FROZEN = "frozen"


# ----------------------------------------------------------------------------------------------------------------
# 1. From scratch: the forward in torch ops, the backward by hand.


def _normalize(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, correction: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward: (y in x's dtype, xhat and rstd, what the backward needs)."""
    # Three numerical choices, a line each: float32 statistics for half types; shift each row by its first
    # element, so the sums see small numbers even for a row at 1e4 (and a constant row is exactly 0, y exactly
    # bias); two passes, mean then squares of the centred row, never the cancelling E[x^2] - E[x]^2.
    xf = x.to(torch.promote_types(x.dtype, torch.float32))  # [..., C]
    xs = xf - xf[..., :1]  # [..., C]  x - x_0
    xc = xs - xs.mean(-1, keepdim=True)  # [..., C]  x - mean
    var = xc.square().sum(-1, keepdim=True) / (x.shape[-1] - correction)  # [..., 1]
    rstd = torch.rsqrt(var + eps)  # [..., 1]
    xhat = xc * rstd  # [..., C]
    y = xhat * weight if bias is None else torch.addcmul(bias, xhat, weight)  # [..., C], float32 math
    return y.to(x.dtype), xhat, rstd  # y rounded once to x's dtype


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, correction):
        y, xhat, rstd = _normalize(x, weight, bias, eps, correction)
        ctx.save_for_backward(xhat, rstd, weight)
        ctx.correction = correction
        ctx.x_dtype = x.dtype
        return y

    # Backward. Given dy = dL/dy, for one row (C features, D = C - correction):
    #     db = sum over rows of dy                    y = ... + b
    #     dw = sum over rows of dy * xhat             y = xhat * w + ...
    #     g  = dy * w                                 g = dL/dxhat
    # xhat_i = (x_i - mean) * rstd depends on every x_j of its row, through x_i, mean and rstd:
    #     d mean / d x_j = 1/C
    #     d var / d x_j  = 2/D * sum_i (x_i - mean) * (delta_ij - 1/C) = 2 * (x_j - mean) / D
    #                      (the mean's term drops out: sum_i (x_i - mean) = 0)
    #     d rstd / d x_j = -1/2 * rstd^3 * d var / d x_j = -rstd^3 * (x_j - mean) / D = -rstd^2 * xhat_j / D
    #     d xhat_i / d x_j = rstd * (delta_ij - 1/C - xhat_i * xhat_j / D)
    # and summing g_i * d xhat_i / d x_j over i:
    #     dx_j = rstd * (g_j - mean(g) - xhat_j * sum_i(g_i * xhat_i) / D)
    # Three terms: the upstream gradient, minus its mean (the mean subtraction), minus its component along xhat
    # (the division by the standard deviation). Only xhat and rstd are needed: they are what forward saved.
    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        C = xhat.shape[-1]
        dy = dy.to(xhat.dtype)  # [..., C]
        g = dy * weight  # [..., C]
        proj = (g * xhat).sum(-1, keepdim=True) / (C - ctx.correction)  # [..., 1]
        dx = (rstd * (g - g.mean(-1, keepdim=True) - xhat * proj)).to(ctx.x_dtype)  # [..., C]
        dweight = (dy * xhat).reshape(-1, C).sum(0).to(weight.dtype)  # [C]
        dbias = dy.reshape(-1, C).sum(0).to(weight.dtype) if ctx.needs_input_grad[2] else None  # [C]
        return dx, dweight, dbias, None, None


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, correction: int = 0
) -> torch.Tensor:
    """LayerNorm over the last dimension of x [..., C], from scratch, with the hand-derived backward above.

    weight and bias (optional) have shape [C]; `correction` is the module docstring's. Half and bfloat16 inputs are
    normalized in float32 and returned in their own dtype.

    >>> x = torch.randn(2, 3, 8)
    >>> y = layer_norm(x, torch.ones(8), torch.zeros(8))
    >>> y.shape
    torch.Size([2, 3, 8])
    >>> bool(y.mean(-1).abs().max() < 1e-5)
    True
    """
    # bad input gets a clear error, never a wrong answer (a module checks its own x: Norm._check_input)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"layer_norm expects a torch.Tensor input, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(
            f"layer_norm expects a floating-point input (float32, float64, bfloat16, float16), got {x.dtype}"
        )
    if x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"layer_norm needs a last dimension of size >= 1 to normalize over, got shape {tuple(x.shape)}"
        )
    for name, p in (("weight", weight), ("bias", bias)):
        if not isinstance(p, torch.Tensor) and not (name == "bias" and p is None):
            raise TypeError(
                f"{name} must be a tensor of shape {tuple(x.shape[-1:])}, the size of x's last dimension"
                f"{' (or None)' if name == 'bias' else ''}, got {'None' if p is None else type(p).__name__}"
            )
        if p is not None and tuple(p.shape) != tuple(x.shape[-1:]):
            raise ValueError(
                f"{name} has shape {tuple(p.shape)} but x has shape {tuple(x.shape)}: "
                f"{name} must have shape {tuple(x.shape[-1:])}, the size of x's last dimension"
            )
    if not eps > 0:  # also catches NaN
        raise ValueError(f"eps must be > 0 (it keeps 1/sqrt(var + eps) finite for a constant row), got {eps}")
    C = x.shape[-1]
    if not 0 <= correction < C:
        raise ValueError(f"correction must be in [0, C) = [0, {C}) for C={C} features, got {correction}")
    return _LayerNormFunction.apply(x, weight, bias, float(eps), int(correction))


def layer_norm_naive(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5, correction: int = 0
) -> torch.Tensor:
    """The formula op by op, differentiated by autograd: the check on the hand-written backward (in float64 the
    tests hold them to 1e-10), and the baseline it must beat in speed (python -m bench.kernels)."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).sum(-1, keepdim=True) / (x.shape[-1] - correction)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias


# ----------------------------------------------------------------------------------------------------------------
# 2. Modules and the registry.


class Norm(nn.Module):
    """The base of every norm here: weight [dim] (ones) and bias [dim] (zeros) or None, one layout, so a state_dict
    saved with one LayerNorm loads into any other; eps; and one check of its input per call."""

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(dim, bool) or not (isinstance(dim, int) and dim >= 1):
            raise ValueError(f"dim must be a positive int (the number of features), got {dim!r}")
        if not eps > 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        self.dim = dim
        self.eps = float(eps)
        self.feeds_linear = False  # make_norm's feeds_linear: a Linear alone reads the output (the model says so)
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def extra_repr(self) -> str:
        return f"{self.dim}, bias={self.bias is not None}, eps={self.eps}"

    def _check_input(self, x: torch.Tensor) -> None:
        """What layer_norm checks of x; weight, bias and eps are the module's own, checked when it was built."""
        if x.dim() == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__}({self.dim}) expects an input whose last dimension is {self.dim}, "
                f"got shape {tuple(x.shape)}"
            )
        if not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} expects a floating-point input, got {x.dtype}")

    def _scale_shift(self, xhat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """xhat * weight (+ bias), the learned scale and shift every norm here ends with, rounded to x's dtype."""
        y = xhat * self.weight
        return (y if self.bias is None else y + self.bias).to(x.dtype)


class LayerNorm(Norm):
    """LayerNorm over the last dimension, from scratch (`layer_norm`'s autograd Function)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        # autograd records the Function only where grad mode is on and an input requires a gradient (training)
        if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, self.weight, self.bias)):
            return _LayerNormFunction.apply(x, self.weight, self.bias, self.eps, 0)
        return _normalize(x, self.weight, self.bias, self.eps, 0)[0]  # (decoding, evaluation): the forward alone


class BuiltinLayerNorm(LayerNorm):
    """PyTorch's own fused kernel, torch.nn.functional.layer_norm, with the same parameters. An x of another dtype
    than the parameters (bfloat16 activations, float32 parameters) is normalized in the wider of the two and the
    output rounded back to x's: torch's CPU backward of that mixed call returns dweight and dbias some 6-7% off
    (docs/01-layernorm.md)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if x.dtype == self.weight.dtype:  # the usual call: torch's kernel as it is (autocast chooses its dtype)
            return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
        wide = torch.promote_types(x.dtype, self.weight.dtype)
        bias = None if self.bias is None else self.bias.to(wide)
        return F.layer_norm(x.to(wide), (self.dim,), self.weight.to(wide), bias, self.eps).to(x.dtype)


# ---- where the Triton norm can run (layernorm_triton.py is imported on first use: `import layernorm` never does) ----


class TritonUnavailableError(RuntimeError):
    """The Triton norm was chosen where Triton cannot run."""


# the LayerNorms that compute what the Triton norm does, on every device: "'custom' or 'builtin'"
OTHER_LAYERNORMS = " or ".join(repr(n) for n in LAYERNORMS if n != "triton")


def check_triton_device(device: torch.device | str) -> None:
    """The kernels run on a CUDA GPU, or on CPU tensors through the interpreter: anything else gets told why.
    Scripts call it to refuse before loading a model; TritonLayerNorm calls it for an input not on a GPU."""
    device = torch.device(device)
    kernels = import_layernorm_triton()  # without triton, that is the cause on every device
    # on the CPU, the mode the kernels were defined in decides (triton.jit fixes it when layernorm_triton is imported)
    if device.type == "cuda" or (device.type == "cpu" and kernels.INTERPRET):
        return
    setting = repr(os.environ["TRITON_INTERPRET"]) if "TRITON_INTERPRET" in os.environ else "unset"
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1":
        setting = "'1', but only after this process had compiled the kernels for a GPU"
    raise TritonUnavailableError(
        f"norm 'triton' cannot run on device {device}: its kernels run on a CUDA GPU, or on the CPU only "
        f"through Triton's interpreter (TRITON_INTERPRET=1; here it is {setting}). To fix: move the model and "
        f"data to a CUDA device, or use a machine with a CUDA GPU, or run on the CPU (--device=cpu) with "
        f"TRITON_INTERPRET=1 set in the environment before starting Python, through Triton's (slow) interpreter, "
        f"or choose another norm such as {OTHER_LAYERNORMS}"
    )


def import_layernorm_triton() -> Any:
    """layernorm_triton, imported on first use; TritonUnavailableError, saying what to do, without triton."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        raise TritonUnavailableError(
            f"norm 'triton' needs the triton package, which cannot be imported here ({e}): triton ships for "
            f"Linux only, not macOS or Windows. To fix: choose {OTHER_LAYERNORMS}, the same LayerNorm on every "
            f"device, or run on Linux with triton installed (pip install triton)"
        ) from None
    import layernorm_triton

    return layernorm_triton


class TritonLayerNorm(LayerNorm):
    """The two fused Triton kernels of layernorm_triton.py, imported when the first one is built (check_triton_device
    says where they can run: `import layernorm` never imports triton)."""

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__(dim, bias=bias, eps=eps)
        self._layer_norm_triton = import_layernorm_triton().layer_norm_triton

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        if not x.is_cuda:  # the CPU through Triton's interpreter; elsewhere it raises, saying why and what to do
            check_triton_device(x.device)
        return self._layer_norm_triton(x, self.weight, self.bias, self.eps, feeds_linear=self.feeds_linear)


class RMSNorm(Norm):
    """RMSNorm (Zhang & Sennrich 2019; Gopher, Chinchilla): y = x / sqrt(mean(x^2) + eps) * weight [+ bias].

    No mean subtraction: the row is rescaled to unit root-mean-square, not centred. `bias` is off in those models;
    it is kept optional here for a layout compatible with the LayerNorms. Statistics in float32.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        rms_inv = torch.rsqrt(xf.square().mean(-1, keepdim=True) + self.eps)
        return self._scale_shift(xf * rms_inv, x)


class BatchNorm(Norm):
    """BatchNorm over every token of the batch, per feature: the counter-example to LayerNorm.

    For x [..., C], all leading dims are pooled: feature c's mean and var come from every token in the batch, so
    one token's output depends on the others. Training mode normalizes with the batch statistics and updates
    running_mean/running_var (momentum 0.1, unbiased variance, as nn.BatchNorm1d); eval mode uses the running
    statistics, so its output is per token again. A training-mode batch of one token (decoding one token for one
    user) is computed, where nn.BatchNorm1d raises (forward).
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__(dim, bias=bias, eps=eps)
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("num_batches_tracked", torch.tensor(0, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        x2 = x.reshape(-1, self.dim).to(self.weight.dtype)  # every token of the batch is one sample
        if self.training:
            if x2.shape[0] < 2:
                # One token (or none): the ordinary formula with population variance. For one token x - mean is
                # exactly 0 (and var 0), so y == bias (or 0): the token's own information is erased; x and weight
                # get no gradient, bias the upstream one. Running stats stay as they are (one sample has no
                # unbiased variance). An empty batch gives [0, C].
                xc = x2 - x2.mean(dim=0, keepdim=True)
                var = (xc * xc).mean(dim=0, keepdim=True)
                return self._scale_shift(xc * torch.rsqrt(var + self.eps), x).view(x.shape)
            self.num_batches_tracked.add_(1)
        y = F.batch_norm(
            x2, self.running_mean, self.running_var, self.weight, self.bias, self.training, self.momentum, self.eps
        )
        return y.to(x.dtype).view(x.shape)


class DyT(Norm):
    """Dynamic Tanh (Zhu, Chen, He, LeCun and Liu 2025, "Transformers without Normalization"):

        y = tanh(alpha * x) * weight + bias,    alpha one learned scalar

    No statistics at all: each element is squashed on its own, so it is batch independent like LayerNorm but does
    not centre or rescale a token; alpha is the gain that LayerNorm's 1/std would be (the paper: trained LayerNorms
    map their inputs along tanh-like S curves). alpha starts as in its language models (with model.py's
    embed_scale, on with DyT): lower the wider the model, `initial_alpha(dim)`; an `alpha` given starts there
    instead (0.5, the paper's default, stalls this GPT: experiments/results/dyt_recipe/probes.md,
    experiments/dyt_stall.py). `eps` is unused.
    """

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5, alpha: float | None = None) -> None:
        super().__init__(dim, bias=bias, eps=eps)
        start = self.initial_alpha(dim) if alpha is None else float(alpha)
        if not start > 0:  # also catches NaN
            raise ValueError(f"alpha must be > 0 (the gain tanh starts at), got {alpha}")
        self.alpha = nn.Parameter(torch.tensor(start))

    @staticmethod
    def initial_alpha(dim: int) -> float:
        """4 at 128 features (the probes: experiments/results/dyt_recipe/probes.md, docs/record.md), as 1/sqrt(dim):
        with embed_scale, alpha * x starts at RMS 1.3."""
        return 4.0 * (128 / dim) ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return self._scale_shift(torch.tanh(self.alpha * xf), x)


class FrozenLayerNorm(Norm):
    """A LayerNorm frozen to its linear part: y = (x - mean(x)) / scale * weight + bias, where LayerNorm divides by
    each token's own sqrt(var + eps) and this by one constant, the buffer `scale` (measured on data when the norm is
    frozen). For a token whose sqrt(var + eps) is `scale` it is that LayerNorm exactly; for every token it is linear
    in x, so the Linear that reads it can absorb it (experiments/remove_layernorm.py folds it there), and it has no
    statistic at all, of the token or of the batch. Same weight and bias as the LayerNorms, plus `scale`."""

    def __init__(self, dim: int, *, bias: bool = True, eps: float = 1e-5) -> None:
        super().__init__(dim, bias=bias, eps=eps)
        self.register_buffer("scale", torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input(x)
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return self._scale_shift((xf - xf.mean(-1, keepdim=True)) / self.scale, x)


_CLASSES = {
    "custom": LayerNorm,
    "builtin": BuiltinLayerNorm,
    "triton": TritonLayerNorm,
    "rmsnorm": RMSNorm,
    "batchnorm": BatchNorm,
    "dyt": DyT,
    FROZEN: FrozenLayerNorm,
}


def make_norm(
    name: str, dim: int, *, bias: bool = True, eps: float = 1e-5, alpha: float | None = None, feeds_linear: bool = False
) -> nn.Module:
    """Build the norm called `name` (one of NORMS, or FROZEN) over `dim` features; bias=False drops its `bias`.
    `alpha` is DyT's starting alpha (None: its recipe by width); no other norm has one. feeds_linear=True says that
    only a Linear reads the output (a pre-norm block's norms, the final one): under autocast the Triton norm then
    writes it in autocast's dtype, the cast that Linear makes; elsewhere in its input's dtype, as the others do."""
    if alpha is not None and name != "dyt":
        raise ValueError(f"alpha={alpha} is DyT's starting alpha, and norm {name!r} has none")
    if name == NO_NORM:
        return nn.Identity()
    if name not in _CLASSES:
        raise ValueError(
            f"unknown norm {name!r}; valid names are {', '.join(NORMS)} (or {NO_NORM!r} for no normalization, "
            f"{FROZEN!r} for a trained LayerNorm's linear part)"
        )
    norm = DyT(dim, bias=bias, eps=eps, alpha=alpha) if name == "dyt" else _CLASSES[name](dim, bias=bias, eps=eps)
    norm.feeds_linear = feeds_linear
    return norm
