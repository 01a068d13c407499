"""The grading: one function per exercise, taking the module to grade and returning "PASS" or the first mistake.

A wrong answer is compared, in float64, against the usual wrong variants (sample variance, eps outside the square
root, the wrong dimension reduced, a mean where a sum belongs, ...); the message names the variant it matches and
gives the numbers that show it.
"""

from __future__ import annotations

import math
import os
import traceback
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

from layernorm import BatchNorm, DyT, LayerNorm, RMSNorm

PASS = "PASS"
NOT_STARTED = "not started"
SKIPPED = "skipped"
SAMPLE_VARIANCE = "your variance divides by D-1 (sample variance); LayerNorm divides by D"
EPS_OUTSIDE = "eps is added outside the square root: sqrt(var) + eps, where LayerNorm takes sqrt(var + eps)"
EPS_LEFT_OUT = "eps is left out: sqrt(var), where LayerNorm takes sqrt(var + eps)"
ALL_DIMS = "you reduced over every dim; LayerNorm reduces over the last dim only"
SWAPPED = "gamma and beta are swapped: y = xhat * gamma + beta"
NO_AFFINE = "your output ignores gamma and beta: y = xhat * gamma + beta"
PRECISION = "your variance loses precision far from 0, as the one-pass E[x^2] - E[x]^2 does"
PADDING = "the padding columns add to your variance: x - mean is -mean there; square tl.where(mask, x - mean, 0.0)"
TRITON_EXERCISES = (5,)


class Mistake(Exception):
    """The first mistake found, in words: what a grading function returns instead of PASS."""


def reduced_over(dim: int, norm: str = "LayerNorm") -> str:
    batch = ": the batch" if dim == 0 else ""
    return f"you reduced over dim {dim}{batch}; {norm} reduces over the last dim only"


def off_by_n(name: str, n: int) -> str:
    return f"{name} is off by a factor of N={n}: you took the mean over rows, not the sum"


def unwrapped(error: BaseException) -> BaseException:
    """The error itself: Triton's interpreter wraps an error raised in a kernel in InterpreterErrors."""
    while type(error).__name__ == "InterpreterError" and error.__cause__ is not None:
        error = error.__cause__
    return error


def in_one_line(error: BaseException, module: ModuleType | None) -> str:
    """The error's type and message in one line, and where in the learner's file it was raised."""
    error = unwrapped(error)
    here = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == getattr(module, "__file__", None)]
    where = f" (in {here[-1].name}, line {here[-1].lineno})" if here else ""
    words = " ".join(str(error).split())
    return f"{type(error).__name__}{where}: {words[:300]}"


def graded(check: Callable[[ModuleType], None]) -> Callable[[ModuleType], str]:
    """A check that raises Mistake, made into one that returns PASS, the mistake, "not started", or an exception in
    one line, never a traceback."""

    def grade(module: ModuleType) -> str:
        try:
            check(module)
        except Mistake as mistake:
            return str(mistake)
        except Exception as error:  # the learner's code may raise anything: report it in one line
            return NOT_STARTED if isinstance(unwrapped(error), NotImplementedError) else in_one_line(error, module)
        return PASS

    grade.__doc__ = check.__doc__
    return grade


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().double() - want.double()).abs().max().item()


def compare(name: str, got: Any, right: torch.Tensor, variants: list[tuple[str, torch.Tensor]], tol: float) -> None:
    """Raise the first mistake: got is not a tensor of right's shape, or is off right by more than tol (then which
    variant it matches, if one does, with both errors)."""
    if got is None:
        raise Mistake(f"{name} is None: a return statement missing?")
    if not isinstance(got, torch.Tensor):
        raise Mistake(f"{name} must be a tensor, got {type(got).__name__}")
    if got.shape != right.shape:
        raise Mistake(f"{name} has shape {list(got.shape)}; expected {list(right.shape)}")
    error = max_error(got, right)
    if error <= tol:  # also False for NaN
        return
    for message, variant in variants:
        if max_error(got, variant) <= tol:
            raise Mistake(f"{message} ({name} matches that to {max_error(got, variant):.1e}; it is off by {error:.1e})")
    worst = (got.detach().double() - right.double()).abs().flatten().nan_to_num(float("inf")).argmax().item()
    at = [int(i) for i in torch.unravel_index(torch.tensor(worst), right.shape)]
    raise Mistake(
        f"{name} is off by {error:.1e} at index {at}: expected {right.flatten()[worst].item():.6g}, "
        f"got {got.detach().flatten()[worst].item():.6g} (allowed {tol:.0e})"
    )


def ln(
    x: torch.Tensor,
    gamma: torch.Tensor | float,
    beta: torch.Tensor | float,
    eps: float,
    dims: tuple[int, ...] = (-1,),
    correction: int = 0,
    eps_outside: bool = False,
) -> torch.Tensor:
    """LayerNorm and its wrong variants, in x's dtype: statistics over dims, variance over n - correction."""
    mean = x.mean(dims, keepdim=True)
    n = math.prod(x.shape[d] for d in dims)
    var = (x - mean).square().sum(dims, keepdim=True) / (n - correction)
    std = var.sqrt() + eps if eps_outside else (var + eps).sqrt()
    return (x - mean) / std * gamma + beta


def ln_variants(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> list[tuple[str, torch.Tensor]]:
    """The usual wrong LayerNorms of x (float64), each with what it gets wrong."""
    variants = [
        (SAMPLE_VARIANCE, ln(x, gamma, beta, eps, correction=1)),
        (EPS_OUTSIDE, ln(x, gamma, beta, eps, eps_outside=True)),
        (EPS_LEFT_OUT, ln(x, gamma, beta, 0.0)),
        (SWAPPED, ln(x, beta, gamma, eps)),
        (NO_AFFINE, ln(x, 1.0, 0.0, eps)),
    ]
    if x.dim() > 1:  # for a 1-D x the last dim is every dim: nothing else to reduce over
        variants += [(reduced_over(d), ln(x, gamma, beta, eps, dims=(d,))) for d in range(x.dim() - 1)]
        variants += [(ALL_DIMS, ln(x, gamma, beta, eps, dims=tuple(range(x.dim()))))]
    return variants


def rows(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Random rows of different means and spreads (0.1 to 3), so that each wrong variant is told apart."""
    g = torch.Generator().manual_seed(seed)
    spread = torch.linspace(0.1, 3.0, shape[0], dtype=torch.float64).reshape(-1, *[1] * (len(shape) - 1))
    mean = torch.randn(shape[:-1], generator=g, dtype=torch.float64).unsqueeze(-1)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * spread + mean).to(dtype)


def params(dim: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    gamma = 1 + 0.5 * torch.randn(dim, generator=g, dtype=torch.float64)
    beta = torch.randn(dim, generator=g, dtype=torch.float64)
    return gamma.to(dtype), beta.to(dtype)


# ----------------------------------------------------------------------------------------------------------------
# 1. The lecture's LayerNorm1d, made to match nn.LayerNorm; a row's output never depends on the other rows.


@graded
def check_ex1(module: ModuleType) -> None:
    """LayerNorm1d(16): ones and zeros, eps 1e-5 by default; with eps=1e-2 and random gamma and beta, in float32,
    F.layer_norm's output to 1e-5; row 0 bit for bit the same when the other rows change."""
    layer = module.LayerNorm1d(16)
    if layer.eps != 1e-5:
        raise Mistake(f"LayerNorm1d(16).eps is {layer.eps}; the default is 1e-5, as nn.LayerNorm's")
    for name, start, want in (
        ("gamma", "torch.ones(16)", torch.ones(16)),
        ("beta", "torch.zeros(16)", torch.zeros(16)),
    ):
        got = getattr(layer, name)
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)):
            raise Mistake(f"LayerNorm1d(16).{name} must start as {start}")
    layer = module.LayerNorm1d(16, eps=1e-2)
    gamma, beta = params(16, torch.float32, seed=1)
    layer.gamma = gamma
    layer.beta = beta
    x = rows((12, 16), torch.float32, seed=2)
    try:
        got = layer(x)
    except NotImplementedError:
        raise Mistake("not finished: __init__ runs; __call__ still raises NotImplementedError") from None
    want = F.layer_norm(x, (16,), gamma, beta, 1e-2)
    compare("LayerNorm1d's output", got, want, ln_variants(x.double(), gamma.double(), beta.double(), 1e-2), tol=1e-5)
    others = x.clone()
    others[1:] = rows((11, 16), torch.float32, seed=3) * 10
    row0 = layer(others)[0]
    if not torch.equal(row0, got[0]):
        raise Mistake(f"row 0's output changed by {max_error(row0, got[0]):.1e} when only the other rows changed")


# ----------------------------------------------------------------------------------------------------------------
# 2. layer_norm(x, gamma, beta, eps) over any leading dims.


@graded
def check_ex2(module: ModuleType) -> None:
    """layer_norm over the last dim of a 3-D, a 1-D and a 4-D float64 input, to 1e-6."""
    for i, (shape, eps) in enumerate([((4, 3, 8), 1e-2), ((8,), 1e-5), ((2, 3, 2, 8), 1e-5)]):
        x = rows(shape, torch.float64, seed=i)
        gamma, beta = params(shape[-1], torch.float64, seed=10 + i)
        got = module.layer_norm(x, gamma, beta, eps)
        name = f"layer_norm of x of shape {list(shape)} (eps={eps:g})"
        compare(name, got, ln(x, gamma, beta, eps), ln_variants(x, gamma, beta, eps), tol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# 3. A float32 variance that stays accurate on rows offset by 1e4.


@graded
def check_ex3(module: ModuleType) -> None:
    """variance(x) of [64, 384] float32 rows of unit spread, at offset 0 and then at offset 1e4: float32 out, each
    within 1e-4 of the float64 population variance (about 1)."""
    g = torch.Generator().manual_seed(9)
    spread = torch.randn(64, 384, generator=g, dtype=torch.float64)
    for offset in (0.0, 1e4):
        x = (spread + offset).float()
        got = module.variance(x)
        if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
            raise Mistake(f"variance returned {got.dtype}; it must compute and return float32")
        right = x.double().var(-1, correction=0)
        if offset == 0.0:
            compare("variance at offset 0", got, right, [(SAMPLE_VARIANCE, x.double().var(-1))], tol=1e-4)
        elif max_error(got, right) > 1e-4:  # right at offset 0 (same shape), wrong far from it
            raise Mistake(
                f"{PRECISION}: right at offset 0, off by {max_error(got, right):.1e} at offset 1e4 (allowed 1e-4; "
                f"the variance is about 1). Shift each row by its first element, or take two passes"
            )


# ----------------------------------------------------------------------------------------------------------------
# 4. The backward by hand: dx, dgamma, dbeta of an autograd.Function, against the formula in float64.


def check_grads(
    function: Any, x: torch.Tensor, weights: tuple[torch.Tensor, ...], eps: float, expected: Callable
) -> None:
    """function.apply(x, *weights, eps)'s gradients against expected(dy): (name, right, variants) per gradient,
    then torch.autograd.gradcheck."""
    leaves = [t.clone().requires_grad_() for t in (x, *weights)]
    y = function.apply(*leaves, eps)
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    try:
        got = torch.autograd.grad(y, leaves, dy, allow_unused=True)
    except NotImplementedError:
        raise Mistake("not finished: the forward runs; backward still raises NotImplementedError") from None
    by_name = dict(zip(["dx", *(f"d{n}" for n in ("gamma", "beta")[: len(weights)])], got, strict=True))
    for name, right, variants in expected(dy):
        if by_name[name] is None:
            raise Mistake(f"backward returned None for {name}")
        compare(name, by_name[name], right, variants, tol=1e-8)
    inputs = tuple(t.detach().clone().requires_grad_() for t in (x, *weights))
    if not torch.autograd.gradcheck(lambda *t: function.apply(*t, eps), inputs, raise_exception=False):
        raise Mistake("torch.autograd.gradcheck fails: the backward does not match finite differences")


@graded
def check_ex4(module: ModuleType) -> None:
    """LayerNormFunction on [3, 4, 8] in float64: the forward to 1e-8, dbeta, dgamma, dx to 1e-8, then gradcheck."""
    x = rows((3, 4, 8), torch.float64, seed=4)
    gamma, beta = params(8, torch.float64, seed=5)
    eps = 1e-5
    y = module.LayerNormFunction.apply(x, gamma, beta, eps)
    compare("the forward's output", y, ln(x, gamma, beta, eps), ln_variants(x, gamma, beta, eps), tol=1e-8)
    N = x[..., 0].numel()
    rstd = (x.var(-1, correction=0, keepdim=True) + eps).rsqrt()
    xhat = (x - x.mean(-1, keepdim=True)) * rstd

    def expected(dy: torch.Tensor) -> list:
        dbeta = dy.sum((0, 1))
        dgamma = (dy * xhat).sum((0, 1))
        g = dy * gamma
        mean_g = g.mean(-1, keepdim=True)
        along = xhat * (g * xhat).mean(-1, keepdim=True)
        dx_without_gamma = rstd * (dy - dy.mean(-1, keepdim=True) - xhat * (dy * xhat).mean(-1, keepdim=True))
        return [
            ("dbeta", dbeta, [(off_by_n("dbeta", N), dbeta / N)]),
            (
                "dgamma",
                dgamma,
                [
                    (off_by_n("dgamma", N), dgamma / N),
                    ("dgamma sums dy alone, which is dbeta; dgamma sums dy * xhat", dbeta),
                    ("dgamma sums dy * (x - mean); dgamma sums dy * xhat", (dy * xhat / rstd).sum((0, 1))),
                ],
            ),
            (
                "dx",
                rstd * (g - mean_g - along),
                [
                    (
                        "dx leaves out the -mean(g) term (g = dy * gamma): the mean subtraction's share",
                        rstd * (g - along),
                    ),
                    (
                        "dx leaves out the -xhat * mean(g * xhat) term: the division by the std's share",
                        rstd * (g - mean_g),
                    ),
                    ("dx leaves out both terms: it is only rstd * dy * gamma", rstd * g),
                    ("dx leaves out gamma: the gradient reaching xhat is g = dy * gamma", dx_without_gamma),
                ],
            ),
        ]

    check_grads(module.LayerNormFunction, x, (gamma, beta), eps, expected)


# ----------------------------------------------------------------------------------------------------------------
# 5. The Triton forward kernel's statistics, run through Triton's interpreter.


def triton_unavailable() -> str | None:
    """Why the Triton exercise cannot be graded here, or None. It runs CPU tensors through Triton's interpreter,
    which TRITON_INTERPRET=1 switches on before triton is imported (python -m exercises sets it)."""
    try:
        import triton  # noqa: F401
    except ImportError as error:
        return f"triton cannot be imported here ({error}); it ships for Linux: pip install triton"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return "it runs under Triton's interpreter, and TRITON_INTERPRET is not 1 here: run python -m exercises 5"
    return None


@graded
def check_ex5(module: ModuleType) -> None:
    """layer_norm_triton on [6, 10] float32 rows (blocks of 16 columns, 6 of them padding), eps 1e-2, to 1e-5."""
    x = rows((6, 10), torch.float32, seed=11)
    gamma, beta = params(10, torch.float32, seed=12)
    got = module.layer_norm_triton(x, gamma, beta, 1e-2)
    x64, gamma64, beta64 = x.double(), gamma.double(), beta.double()
    xc = x64 - x64.mean(-1, keepdim=True)
    padded_var = (xc.square().sum(-1, keepdim=True) + 6 * x64.mean(-1, keepdim=True).square()) / 10
    padded = xc / (padded_var + 1e-2).sqrt() * gamma64 + beta64
    variants = [
        (PADDING, padded),
        (SAMPLE_VARIANCE, ln(x64, gamma64, beta64, 1e-2, correction=1)),
        (EPS_OUTSIDE, ln(x64, gamma64, beta64, 1e-2, eps_outside=True)),
    ]
    compare("layer_norm_triton's output", got, ln(x64, gamma64, beta64, 1e-2), variants, tol=1e-5)


# ----------------------------------------------------------------------------------------------------------------
# 6. Is a norm per token?


def norms_to_judge() -> list[tuple[str, torch.nn.Module, bool]]:
    """(what it is, the norm, whether it is per token): fresh modules, with random weights and biases."""
    judged = [
        ("LayerNorm", LayerNorm(16), True),
        ("RMSNorm", RMSNorm(16), True),
        ("DyT", DyT(16), True),
        ("BatchNorm in training mode, which normalizes with the batch's statistics", BatchNorm(16), False),
        ("BatchNorm in eval mode, which normalizes with its running averages", BatchNorm(16).eval(), True),
    ]
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for _, norm, _ in judged:
            norm.weight.copy_(1 + 0.5 * torch.randn(16, generator=g))
            norm.bias.copy_(torch.randn(16, generator=g))
    return judged


@graded
def check_ex6(module: ModuleType) -> None:
    """is_per_token(norm, 16) on LayerNorm, RMSNorm, DyT, BatchNorm in eval mode (True) and in training mode (False)."""
    for what, norm, per_token in norms_to_judge():
        said = module.is_per_token(norm, 16)
        if not isinstance(said, bool):
            raise Mistake(f"is_per_token must return True or False, got {type(said).__name__} {said!r}")
        if said != per_token:
            raise Mistake(f"is_per_token said {said} for {what}; it is {per_token}")


# ----------------------------------------------------------------------------------------------------------------
# 7. RMSNorm, forward and backward.


def rms(
    x: torch.Tensor,
    gamma: torch.Tensor | float,
    eps: float,
    dims: tuple[int, ...] = (-1,),
    mean_of_squares: bool = True,
    eps_outside: bool = False,
    centred: bool = False,
) -> torch.Tensor:
    """RMSNorm and its wrong variants: y = x / sqrt(mean(x^2) + eps) * gamma."""
    x = x - x.mean(dims, keepdim=True) if centred else x
    squares = x.square().mean(dims, keepdim=True) if mean_of_squares else x.square().sum(dims, keepdim=True)
    root = squares.sqrt() + eps if eps_outside else (squares + eps).sqrt()
    return x / root * gamma


@graded
def check_ex7(module: ModuleType) -> None:
    """RMSNormFunction on [3, 4, 8] in float64: the forward, dgamma, dx to 1e-8, then gradcheck."""
    x = rows((3, 4, 8), torch.float64, seed=6)
    gamma, _ = params(8, torch.float64, seed=7)
    eps = 1e-2
    y = module.RMSNormFunction.apply(x, gamma, eps)
    variants = [
        (
            "you subtracted the mean: RMSNorm does not centre the row (that is LayerNorm)",
            rms(x, gamma, eps, centred=True),
        ),
        (
            "eps is added outside the square root: sqrt(mean(x^2)) + eps, not sqrt(mean(x^2) + eps)",
            rms(x, gamma, eps, eps_outside=True),
        ),
        (
            "you divided by the root of the sum of squares; RMS is the root of their mean",
            rms(x, gamma, eps, mean_of_squares=False),
        ),
        (reduced_over(0, "RMSNorm"), rms(x, gamma, eps, dims=(0,))),
        ("your output ignores gamma: y = x * rrms * gamma", rms(x, 1.0, eps)),
    ]
    compare("the forward's output", y, rms(x, gamma, eps), variants, tol=1e-8)
    N = x[..., 0].numel()
    rrms = (x.square().mean(-1, keepdim=True) + eps).rsqrt()
    xn = x * rrms

    def expected(dy: torch.Tensor) -> list:
        dgamma = (dy * xn).sum((0, 1))
        g = dy * gamma
        along = xn * (g * xn).mean(-1, keepdim=True)
        return [
            (
                "dgamma",
                dgamma,
                [(off_by_n("dgamma", N), dgamma / N), ("dgamma sums dy alone; it sums dy * x * rrms", dy.sum((0, 1)))],
            ),
            (
                "dx",
                rrms * (g - along),
                [
                    (
                        "dx leaves out the -xn * mean(g * xn) term (xn = x * rrms): the division by the RMS's share",
                        rrms * g,
                    ),
                    (
                        "dx subtracts mean(g): that term is LayerNorm's, from its mean subtraction; RMSNorm has none",
                        rrms * (g - g.mean(-1, keepdim=True) - along),
                    ),
                    (
                        "dx leaves out gamma: the gradient reaching xn is g = dy * gamma",
                        rrms * (dy - xn * (dy * xn).mean(-1, keepdim=True)),
                    ),
                ],
            ),
        ]

    check_grads(module.RMSNormFunction, x, (gamma,), eps, expected)


CHECKS: dict[int, Callable[[ModuleType], str]] = {
    1: check_ex1,
    2: check_ex2,
    3: check_ex3,
    4: check_ex4,
    5: check_ex5,
    6: check_ex6,
    7: check_ex7,
}
