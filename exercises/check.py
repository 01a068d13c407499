"""The grading: one function per exercise, taking the module to grade and returning "PASS" or the first mistake.

Every call into the learner's code goes through `call`: the inputs are cloned before it and compared after it (an
input changed in place is named), and whatever it raises, sys.exit included, comes back as one line. What it returns
is checked as a tensor first (type, shape, dtype, device, each named), then in value against float64, over a table
of cases per exercise (non-contiguous inputs among them). A wrong value is compared with the usual wrong variants
(sample variance, eps outside the square root, the wrong dimension reduced, a mean where a sum belongs, ...): the
message names the variant it matches and gives the numbers that show it; else it says which output is off, where,
and in how many rows. `python -m exercises N --explain` prints what each check tries.
"""

from __future__ import annotations

import math
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from layernorm import BatchNorm, DyT, LayerNorm, RMSNorm

PASS = "PASS"
NOT_STARTED = "not started"
SKIPPED = "skipped"
SAMPLE_VARIANCE = "your variance divides by C-1 (sample variance); LayerNorm divides by C, the number of features"
EPS_OUTSIDE = "eps is added outside the square root: sqrt(var) + eps, where LayerNorm takes sqrt(var + eps)"
EPS_LEFT_OUT = "eps is left out: sqrt(var), where LayerNorm takes sqrt(var + eps)"
STD_PLUS_EPS = "x.std(...) + eps: the sample std (it divides by C-1) with eps outside the root; use sqrt(var + eps)"
NO_SQRT = "you divided by var + eps; LayerNorm divides by its square root, sqrt(var + eps)"
ALL_DIMS = "you reduced over every dim; LayerNorm reduces over the last dim only"
SWAPPED = "gamma and beta are swapped: y = xhat * gamma + beta"
NO_AFFINE = "your output ignores gamma and beta: y = xhat * gamma + beta"
IN_PLACE = "changed its input {name} in place ({name} -= ..., {name}.sub_(...)): compute into new tensors"
BROADCAST = "did you keep the reduced dim? x.mean(-1, keepdim=True) is [..., 1], which broadcasts against x [..., C]"
VIEW = "view needs memory laid out in order, and this input is not (a transpose or a slice): use reshape"
ONE_PASS = (
    "the one-pass E[x^2] - E[x]^2 cancels far from 0 (squares near 1e8, where float32 steps by 8): take two passes"
)
MEAN_FAR = "float32's mean of numbers near 1e4 is off by about 1e-3; shift each row by its first element first"
ONE_SHIFT = "right when all rows sit at one offset, wrong when they differ: shift each row by its own x[..., :1]"
FIRST_ROW = "x - x[:1] subtracts the first row from every row; the shift is each row's first element, x[..., :1]"
STAY_FLOAT32 = "it computes in torch.float64 (a .double() or dtype=torch.float64 inside): stay in float32"
LEFT_TORCH = "it leaves torch (.numpy(), .tolist(), .item()): numpy and Python compute in float64: stay in torch"
PADDING = "the padding columns add to your variance: x - mean is -mean there; square tl.where(mask, x - mean, 0.0)"
BLOCK_WIDTH = "you divided by the block's width (padding included); the row has C features: divide by C"
ONE_PASS_NEAR_100 = "right near 0, wrong at 100: the one-pass E[x^2] - E[x]^2 cancels; take two passes (x - mean)"
STD_NOT_RSTD = "row_statistics returns the std, sqrt(var + eps); the kernel multiplies by rstd = 1 / sqrt(var + eps)"
TRITON_EXERCISES = (5,)


class Mistake(Exception):
    """The first mistake found, in words: what a grading function returns instead of PASS."""


def reduced_over(dim: int, norm: str = "LayerNorm") -> str:
    batch = ": the batch" if dim == 0 else ""
    return f"you reduced over dim {dim}{batch}; {norm} reduces over the last dim only"


def off_by_n(name: str, n: int) -> str:
    return f"{name} is off by a factor of N={n}: you took the mean over rows, not the sum"


# ----------------------------------------------------------------------------------------------------------------
# Running the learner's code: nothing escapes as a traceback, nothing it changes goes unnoticed.


def unwrapped(error: BaseException) -> BaseException:
    """The error itself: Triton's interpreter wraps an error raised in a kernel in InterpreterErrors."""
    while type(error).__name__ == "InterpreterError" and error.__cause__ is not None:
        error = error.__cause__
    return error


def library_dirs() -> tuple[str, ...]:
    """torch's, triton's and this checker's folders: a frame outside them is the learner's."""
    dirs = [os.path.dirname(torch.__file__), os.path.abspath(__file__)]
    if (triton := sys.modules.get("triton")) is not None:
        dirs.append(os.path.dirname(triton.__file__))
    return tuple(dirs)


def in_one_line(error: BaseException) -> str:
    """The error's type and message in one line, and the learner's line that raised it."""
    error = unwrapped(error)
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(library_dirs())]
    where = f" (in {frames[-1].name}, line {frames[-1].lineno})" if frames else ""
    words = " ".join(str(error).split())
    return f"{type(error).__name__}{where}: {words[:300]}"


def explained(error: BaseException) -> str:
    """An error raised by the learner's code in one line, with what it usually means where torch's words do not."""
    words = str(unwrapped(error))
    if "must match the size of tensor" in words:
        return f"shapes that do not broadcast, {in_one_line(error)}: {BROADCAST}"
    if "view size is not compatible" in words:
        return f"{VIEW}; {in_one_line(error)}"
    return in_one_line(error)


def call(what: str, function: Callable, inputs: dict[str, Any], unfinished: str | None = None) -> Any:
    """function(*inputs.values()), the learner's code, run on a case the words `what` describe. Its inputs are
    cloned before and compared after; an exception, SystemExit and other BaseExceptions included, becomes a Mistake
    in one line.
    NotImplementedError is "not started", or the Mistake `unfinished` when part of the exercise already runs.
    KeyboardInterrupt (Ctrl-C) is let through: the grader stops, saying so."""
    before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    try:
        out = function(*inputs.values())
    except NotImplementedError:
        if unfinished is None:
            raise
        raise Mistake(unfinished) from None
    except Mistake:
        raise
    except SystemExit as stop:
        raise Mistake(f"{what}: your code called sys.exit({stop.code!r}); return the result instead") from None
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # the learner's code may raise anything (GeneratorExit too)
        if isinstance(unwrapped(error), NotImplementedError):  # Triton's interpreter wraps it
            raise unwrapped(error) from None
        raise Mistake(f"{what}: {explained(error)}") from None
    for name, was in before.items():
        if not torch.equal(inputs[name], was):
            raise Mistake(f"{what}: it {IN_PLACE.format(name=name)}; the caller's {name} must be as it was")
    return out


class Watched(TorchFunctionMode):
    """Records every torch function called while it is on, and the dtype of every tensor they take or return: the
    rules an exercise states (stay in float32, no autograd in a backward) checked, not trusted."""

    def __init__(self) -> None:
        super().__init__()
        self.functions: set[Callable] = set()
        self.dtypes: set[torch.dtype] = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.functions.add(func)
        out = func(*args, **(kwargs or {}))
        for t in (*args, *(kwargs or {}).values(), *(out if isinstance(out, tuple | list) else (out,))):
            if isinstance(t, torch.Tensor):
                self.dtypes.add(t.dtype)
        return out

    def used_autograd(self) -> bool:
        return bool(self.functions & {torch.autograd.grad, torch.Tensor.backward})


def graded(check: Callable[[ModuleType], None]) -> Callable[[ModuleType], str]:
    """A check that raises Mistake, made into one that returns PASS, the mistake, or "not started"."""

    def grade(module: ModuleType) -> str:
        try:
            check(module)
        except Mistake as mistake:
            return str(mistake)
        except NotImplementedError:
            return NOT_STARTED
        except Exception as error:  # a name the exercise asks for is missing, or what came back breaks the check
            return in_one_line(error)
        return PASS

    grade.__doc__ = check.__doc__
    return grade


# ----------------------------------------------------------------------------------------------------------------
# Comparing what came back with what is right.


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().double() - want.double()).abs().max().item()


def check_tensor(name: str, got: Any, want: torch.Tensor) -> None:
    """Raise a Mistake unless got is a tensor of want's shape, dtype and device."""
    if got is None:
        raise Mistake(f"{name} is None: a return statement missing?")
    if not isinstance(got, torch.Tensor):
        raise Mistake(f"{name} must be a tensor, got {type(got).__name__}")
    if got.shape != want.shape:
        raise Mistake(f"{name} has shape {list(got.shape)}; expected {list(want.shape)}")
    if got.dtype != want.dtype:
        raise Mistake(
            f"{name} is {got.dtype}; expected {want.dtype}, the input's (a .float() or .double(), or a tensor made "
            "without dtype=x.dtype?)"
        )
    if got.device != want.device:
        raise Mistake(
            f"{name} is on {got.device}; the input is on {want.device} (a tensor made without device=x.device?)"
        )


def where_off(name: str, got: torch.Tensor, right: torch.Tensor, tol: float) -> str:
    """Where got is off right: the largest error, its index and values, and how many rows are off."""
    diff = (got.detach().double() - right.double()).abs().nan_to_num(float("inf"))
    worst = diff.flatten().argmax().item()
    at = [int(i) for i in torch.unravel_index(torch.tensor(worst), right.shape)]
    rows = ""
    if right.dim() > 1:
        off = diff.reshape(-1, right.shape[-1]).amax(-1) > tol
        rows = f"; {int(off.sum())} of {off.numel()} rows off"
    return (
        f"{name} is off by {diff.max().item():.1e} at index {at}: expected {right.flatten()[worst].item():.6g}, "
        f"got {got.detach().flatten()[worst].item():.6g} (allowed {tol:.0e}){rows}"
    )


def compare(name: str, got: Any, right: torch.Tensor, variants: list[tuple[str, torch.Tensor]], tol: float) -> None:
    """Raise a Mistake if got (a tensor of right's shape) is off right (float64) by more than tol: the variant it
    matches, if one does, with both errors, else where it is off."""
    error = max_error(got, right)
    if error <= tol:  # also False for NaN
        return
    for message, variant in variants:
        if variant.shape == right.shape and max_error(got, variant) <= tol:
            raise Mistake(f"{message} ({name} matches that to {max_error(got, variant):.1e}; it is off by {error:.1e})")
    raise Mistake(where_off(name, got, right, tol))


def checked(name: str, got: Any, like: torch.Tensor, right: torch.Tensor, variants: list, tol: float) -> None:
    """got checked as a tensor like `like` (shape, dtype, device), then in value against right."""
    check_tensor(name, got, like)
    compare(name, got, right, variants, tol)


# ----------------------------------------------------------------------------------------------------------------
# Inputs: rows that tell the wrong variants apart, laid out in memory as the case says.


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


def laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    """x's values in the layout a case names: "contiguous", "transposed" (the last two dims stored swapped),
    or "sliced" (every other column of a tensor twice as wide)."""
    if layout == "transposed":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


def ln(
    x: torch.Tensor,
    gamma: torch.Tensor | float,
    beta: torch.Tensor | float,
    eps: float,
    dims: tuple[int, ...] = (-1,),
    correction: int = 0,
    eps_outside: bool = False,
    root: bool = True,
) -> torch.Tensor:
    """LayerNorm and its wrong variants, in x's dtype: statistics over dims, variance over n - correction."""
    mean = x.mean(dims, keepdim=True)
    n = math.prod(x.shape[d] for d in dims)
    var = (x - mean).square().sum(dims, keepdim=True) / (n - correction)
    std = var.sqrt() + eps if eps_outside else (var + eps).sqrt() if root else var + eps
    return (x - mean) / std * gamma + beta


def ln_variants(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float) -> list[tuple[str, torch.Tensor]]:
    """The usual wrong LayerNorms of x (float64), each with what it gets wrong."""
    variants = [
        (SAMPLE_VARIANCE, ln(x, gamma, beta, eps, correction=1)),
        (EPS_OUTSIDE, ln(x, gamma, beta, eps, eps_outside=True)),
        (EPS_LEFT_OUT, ln(x, gamma, beta, 0.0)),
        (STD_PLUS_EPS, ln(x, gamma, beta, eps, correction=1, eps_outside=True)),
        (NO_SQRT, ln(x, gamma, beta, eps, root=False)),
        (SWAPPED, ln(x, beta, gamma, eps)),
        (NO_AFFINE, ln(x, 1.0, 0.0, eps)),
    ]
    if x.dim() > 1:  # for a 1-D x the last dim is every dim: nothing else to reduce over
        variants += [(reduced_over(d), ln(x, gamma, beta, eps, dims=(d,))) for d in range(x.dim() - 1)]
        variants += [(ALL_DIMS, ln(x, gamma, beta, eps, dims=tuple(range(x.dim()))))]
    return variants


@dataclass(frozen=True)
class Case:
    """One input the checker tries: x of this shape, dtype and layout, with eps."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float64
    layout: str = "contiguous"
    eps: float = 1e-5
    offset: float = 0.0  # added to every row: rows far from 0

    def __str__(self) -> str:
        layout = "" if self.layout == "contiguous" else f", {self.layout} (not contiguous)"
        offset = f", rows at offset {self.offset:g}" if self.offset else ""
        eps = f"{self.eps:g}".replace("e-0", "e-")
        return f"x {list(self.shape)} {str(self.dtype).removeprefix('torch.')}{layout}{offset}, eps {eps}"

    def x(self, seed: int) -> torch.Tensor:
        return laid_out((rows(self.shape, torch.float64, seed) + self.offset).to(self.dtype), self.layout)


def tolerance(dtype: torch.dtype) -> float:
    return 1e-5 if dtype == torch.float32 else 1e-8


# ----------------------------------------------------------------------------------------------------------------
# 1. The lecture's LayerNorm1d, made to match nn.LayerNorm; a row's output never depends on the other rows.

EX1_CASES = [Case((12, 16), torch.float32, eps=1e-2), Case((12, 16), torch.float32, "transposed", eps=1e-2)]


@graded
def check_ex1(module: ModuleType) -> None:
    """LayerNorm1d(16): eps 1e-5, gamma ones and beta zeros by default; then, a fresh one per case with random
    gamma and beta, F.layer_norm's output in float64 to 1e-5; row 0 bit for bit the same when the other rows
    change."""
    layer = call("LayerNorm1d(16)", module.LayerNorm1d, {"dim": 16})
    if not hasattr(layer, "eps"):
        raise Mistake("LayerNorm1d(16) has no attribute eps: keep the lecture's self.eps")
    if layer.eps != 1e-5:
        raise Mistake(f"LayerNorm1d(16).eps is {layer.eps}; the default is 1e-5, as nn.LayerNorm's")
    for name, start, want in (
        ("gamma", "torch.ones(16)", torch.ones(16)),
        ("beta", "torch.zeros(16)", torch.zeros(16)),
    ):
        got = getattr(layer, name, None)
        if not (isinstance(got, torch.Tensor) and got.shape == want.shape and torch.equal(got, want)):
            raise Mistake(f"LayerNorm1d(16).{name} must start as {start}")
        if got.dtype != want.dtype:  # a float32 x would come out float64
            raise Mistake(f"LayerNorm1d(16).{name} is {got.dtype}; start it as {start}, float32 as x is")
    unfinished = "not finished: __init__ runs; __call__ still raises NotImplementedError"
    for case in EX1_CASES:
        layer = call(f"LayerNorm1d(16, eps={case.eps:g})", module.LayerNorm1d, {"dim": 16, "eps": case.eps})
        layer.gamma, layer.beta = params(16, torch.float32, seed=1)
        x = case.x(seed=2)
        got = call(f"LayerNorm1d on {case}", layer, {"x": x}, unfinished)
        want = F.layer_norm(x.double(), (16,), layer.gamma.double(), layer.beta.double(), case.eps)
        variants = ln_variants(x.double(), layer.gamma.double(), layer.beta.double(), case.eps)
        checked(f"LayerNorm1d's output on {case}", got, x, want, variants, tol=1e-5)
    others = x.clone()
    others[1:] = rows((11, 16), torch.float32, seed=3) * 10
    row0 = call("LayerNorm1d on other rows", layer, {"x": others})[0]
    if not torch.equal(row0, got[0]):
        raise Mistake(f"row 0's output changed by {max_error(row0, got[0]):.1e} when only the other rows changed")


# ----------------------------------------------------------------------------------------------------------------
# 2. layer_norm(x, gamma, beta, eps) over any leading dims.

EX2_CASES = [
    Case((4, 3, 8), eps=1e-2),
    Case((8,)),
    Case((2, 3, 2, 8)),
    Case((4, 3, 8), layout="transposed"),
    Case((4, 3, 8), layout="sliced"),
    Case((4, 3, 8), torch.float32, eps=1e-2),
]


@graded
def check_ex2(module: ModuleType) -> None:
    """layer_norm on each case against the float64 formula (to 1e-8 in float64, 1e-5 in float32): the output's
    shape, dtype and device those of x, and x unchanged."""
    for i, case in enumerate(EX2_CASES):
        x = case.x(seed=i)
        gamma, beta = params(case.shape[-1], case.dtype, seed=10 + i)
        got = call(f"layer_norm on {case}", module.layer_norm, {"x": x, "gamma": gamma, "beta": beta, "eps": case.eps})
        x64, gamma64, beta64 = x.double(), gamma.double(), beta.double()
        right, variants = ln(x64, gamma64, beta64, case.eps), ln_variants(x64, gamma64, beta64, case.eps)
        checked(f"layer_norm on {case}", got, x, right, variants, tolerance(case.dtype))


# ----------------------------------------------------------------------------------------------------------------
# 3. Float32 row statistics that stay accurate far from 0: x - mean and the variance.


@dataclass(frozen=True)
class RowsAt:
    """Rows of unit spread in float32, each at one of `offsets` (in turn), and what a mistake that only these rows
    show usually is."""

    shape: tuple[int, ...]
    offsets: tuple[float, ...]
    layout: str = "contiguous"
    explains: tuple[tuple[str, str], ...] = ()  # (output, why it is wrong here, when right on the cases before)

    def __str__(self) -> str:
        at = " and ".join(f"{o:g}" if abs(o) < 1e3 else f"{o:.0e}".replace("e+0", "e") for o in self.offsets)
        mixed = " in one batch" if len(self.offsets) > 1 else ""
        layout = "" if self.layout == "contiguous" else f", {self.layout} (not contiguous)"
        return f"x {list(self.shape)} float32, rows at offset {at}{mixed}{layout}"

    def x(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(9)
        n = math.prod(self.shape[:-1])
        offset = torch.tensor(self.offsets, dtype=torch.float64).repeat(n)[:n].reshape(*self.shape[:-1], 1)
        return laid_out((torch.randn(self.shape, generator=g, dtype=torch.float64) + offset).float(), self.layout)


EX3_CASES = [
    RowsAt((64, 384), (0.0,)),
    RowsAt((64, 384), (1e4,), explains=(("x - mean", MEAN_FAR), ("the variance", ONE_PASS))),
    RowsAt((4, 16, 384), (0.0, 1e4), explains=(("x - mean", ONE_SHIFT), ("the variance", ONE_SHIFT))),
    RowsAt((64, 384), (1e4,), "transposed"),
]


@graded
def check_ex3(module: ModuleType) -> None:
    """centre_and_variance on each case: two float32 tensors, x - mean to 1e-5 and the population variance to
    1e-4 of float64's (the variance is about 1), no float64 anywhere inside, and x unchanged."""
    for case in EX3_CASES:
        x = case.x()
        with Watched() as watched:
            out = call(f"centre_and_variance on {case}", module.centre_and_variance, {"x": x})
        if torch.float64 in watched.dtypes:
            raise Mistake(f"centre_and_variance on {case}: {STAY_FLOAT32}")
        if watched.functions & {torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.item}:
            raise Mistake(f"centre_and_variance on {case}: {LEFT_TORCH}")
        if not (isinstance(out, tuple | list) and len(out) == 2):
            got = f"{len(out)} values" if isinstance(out, tuple | list) else f"a {type(out).__name__}"
            raise Mistake(f"centre_and_variance must return two tensors, (x - mean, the variance); got {got}")
        x64 = x.double()
        want = {"x - mean": x64 - x64.mean(-1, keepdim=True), "the variance": x64.var(-1, correction=0)}
        if [tuple(t.shape) for t in out if isinstance(t, torch.Tensor)] == [x.shape[:-1], x.shape]:
            raise Mistake("centre_and_variance returned (the variance, x - mean); the order is (x - mean, variance)")
        wrong = []
        for (name, right), got, tol in zip(want.items(), out, (1e-5, 1e-4), strict=True):
            check_tensor(f"{name} on {case}", got, right.float())
            if max_error(got, right) > tol:
                wrong.append((name, got, right, tol))
        if not wrong:
            continue
        if not case.explains:
            shifted = x64 - x64[:1]  # the first row subtracted from each, for the shift by each row's first element
            variants = {
                "x - mean": [(FIRST_ROW, shifted - shifted.mean(-1, keepdim=True))],
                "the variance": [(SAMPLE_VARIANCE, x64.var(-1)), (FIRST_ROW, shifted.var(-1, correction=0))],
            }
            name, got, right, tol = wrong[0]
            compare(f"{name} on {case}", got, right, variants[name], tol)  # raises: got is off
        why: dict[str, list[str]] = {}  # each explanation once, with every output it explains
        for name, got, right, tol in wrong:
            why.setdefault(dict(case.explains)[name], []).append(
                f"{name} is off by {max_error(got, right):.1e}, allowed {tol:.0e}"
            )
        raise Mistake("; and ".join(f"{w} ({', '.join(off)}, on {case})" for w, off in why.items()))


# ----------------------------------------------------------------------------------------------------------------
# 4. The backward by hand: forward and backward of an autograd.Function, called directly, against float64.


class Ctx:
    """What autograd hands forward and backward as ctx: the tensors saved, and any attribute set on it."""

    def __init__(self, inputs: int) -> None:
        self.needs_input_grad = (True,) * (inputs - 1) + (False,)  # eps, the last input, needs none
        self.saved_tensors: tuple[torch.Tensor, ...] = ()

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        self.saved_tensors = tensors


@dataclass(frozen=True)
class GradCase:
    """x as a Case gives it, with a random dy laid out as `dy` says (a transposed dy: what a transpose after the
    norm hands back)."""

    x: Case
    dy: str = "contiguous"

    def __str__(self) -> str:
        return str(self.x) if self.dy == "contiguous" else f"{self.x}, dy {self.dy} (not contiguous)"


GRAD_CASES = [
    GradCase(Case((3, 4, 8), eps=1e-2)),
    GradCase(Case((3, 4, 8), layout="transposed", eps=1e-2), dy="transposed"),
]


def parameter_grad_shape(name: str, got: Any, C: int) -> None:
    """A parameter's gradient not summed over the rows, or summed with its dims kept, named: autograd.grad sums
    or reshapes it silently, a backward must."""
    if not isinstance(got, torch.Tensor) or got.shape == (C,) or got.dim() < 2 or got.shape[-1] != C:
        return
    if got.numel() == C:
        raise Mistake(
            f"{name} has shape {list(got.shape)}; expected [{C}]: summed with keepdim=True; drop the kept dims"
        )
    raise Mistake(
        f"{name} has shape {list(got.shape)}; expected [{C}]: sum it over every row, every dim but the last "
        "(.reshape(-1, C).sum(0)); autograd would sum it for you without a word, a backward must"
    )


def check_function(
    function: Any,
    weights: tuple[str, ...],
    forward_right: Callable,
    grads_right: Callable,
) -> None:
    """function.forward and .backward called directly on each GradCase: forward_right(x, weights, eps) gives
    (right, variants) for y; grads_right(x, weights, eps, dy) gives (name, right, variants) per gradient. Then
    function.apply through autograd, with torch.autograd.gradcheck on float64."""
    names = ("x", *weights, "eps")
    for i, case in enumerate(GRAD_CASES):
        x = case.x.x(seed=4 + i)
        ws = dict(zip(weights, params(x.shape[-1], x.dtype, seed=5 + i), strict=False))
        ctx = Ctx(len(names))
        y = call(f"forward on {case}", function.forward, {"ctx": ctx, "x": x, **ws, "eps": case.x.eps})
        checked(f"the forward's output on {case}", y, x, *forward_right(x, *ws.values(), case.x.eps), tol=1e-8)
        dy = laid_out(torch.randn(x.shape, generator=torch.Generator().manual_seed(7), dtype=x.dtype), case.dy)
        unfinished = "not finished: the forward runs; backward still raises NotImplementedError"
        with Watched() as watched:
            grads = call(f"backward on {case}", function.backward, {"ctx": ctx, "dy": dy}, unfinished)
        if watched.used_autograd():
            raise Mistake("backward calls autograd (torch.autograd.grad or .backward()): derive the gradients by hand")
        if not isinstance(grads, tuple | list) or len(grads) != len(names):
            got = f"{len(grads)} values" if isinstance(grads, tuple | list) else f"a {type(grads).__name__}"
            raise Mistake(
                f"backward returned {got}; it returns one gradient per input of forward ({', '.join(names)}), "
                "None for eps"
            )
        for name, right, variants in grads_right(x, *ws.values(), case.x.eps, dy):
            got = grads[["dx", *(f"d{w}" for w in weights)].index(name)]
            if got is None:
                raise Mistake(f"backward returned None for {name}")
            if name != "dx":
                parameter_grad_shape(name, got, x.shape[-1])
            checked(f"{name} on {case}", got, right, right, variants, tol=1e-8)
    inputs = tuple(t.detach().clone().requires_grad_() for t in (x, *ws.values()))

    def gradcheck() -> bool:
        return torch.autograd.gradcheck(lambda *t: function.apply(*t, 1e-2), inputs, raise_exception=False)

    if not call("apply, through autograd", gradcheck, {}):
        raise Mistake("torch.autograd.gradcheck fails: the backward does not match finite differences")


def ln_grads(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float, dy: torch.Tensor) -> list:
    """LayerNorm's dbeta, dgamma and dx in float64, each with the usual wrong ones."""
    N = x[..., 0].numel()
    rstd = (x.var(-1, correction=0, keepdim=True) + eps).rsqrt()
    xhat = (x - x.mean(-1, keepdim=True)) * rstd
    dbeta = dy.sum(tuple(range(x.dim() - 1)))
    dgamma = (dy * xhat).sum(tuple(range(x.dim() - 1)))
    g = dy * gamma
    mean_g = g.mean(-1, keepdim=True)
    along = xhat * (g * xhat).mean(-1, keepdim=True)
    dx_no_gamma = rstd * (dy - dy.mean(-1, keepdim=True) - xhat * (dy * xhat).mean(-1, keepdim=True))
    rows_sum = tuple(range(x.dim() - 1))
    return [
        ("dbeta", dbeta, [(off_by_n("dbeta", N), dbeta / N)]),
        (
            "dgamma",
            dgamma,
            [
                (off_by_n("dgamma", N), dgamma / N),
                ("dgamma sums dy alone, which is dbeta; dgamma sums dy * xhat", dbeta),
                ("dgamma sums dy * (x - mean); dgamma sums dy * xhat", (dy * xhat / rstd).sum(rows_sum)),
                ("dgamma sums dy * x, the raw input; dgamma sums dy * xhat, the normalized x", (dy * x).sum(rows_sum)),
            ],
        ),
        (
            "dx",
            rstd * (g - mean_g - along),
            [
                ("dx leaves out the -mean(g) term (g = dy * gamma): the mean subtraction's share", rstd * (g - along)),
                ("dx leaves out the -xhat * mean(g * xhat) term: the division by the std's share", rstd * (g - mean_g)),
                ("dx leaves out both terms: it is only rstd * dy * gamma", rstd * g),
                ("dx adds the xhat * mean(g * xhat) term; the std's share is subtracted", rstd * (g - mean_g + along)),
                ("dx leaves out the factor rstd = 1 / sqrt(var + eps)", g - mean_g - along),
                ("dx leaves out gamma: the gradient reaching xhat is g = dy * gamma", dx_no_gamma),
            ],
        ),
    ]


@graded
def check_ex4(module: ModuleType) -> None:
    """LayerNormFunction's forward and backward called directly on each case (as autograd calls them, with a ctx):
    y, then dx, dgamma, dbeta to 1e-8 of float64, each of its input's shape and dtype, dy unchanged, no autograd
    inside backward; then through LayerNormFunction.apply, torch.autograd.gradcheck."""
    forward = lambda x, gamma, beta, eps: (ln(x, gamma, beta, eps), ln_variants(x, gamma, beta, eps))  # noqa: E731
    check_function(module.LayerNormFunction, ("gamma", "beta"), forward, ln_grads)


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


# Blocks of 16 columns, 6 of them padding. At offset 100 two passes hold to 1.2e-5, the one-pass E[x^2] - E[x]^2
# is off by 1.9e-3: the second case is held to 1e-4.
EX5_CASES = [Case((6, 10), torch.float32, eps=1e-2), Case((6, 10), torch.float32, eps=1e-2, offset=100.0)]


@graded
def check_ex5(module: ModuleType) -> None:
    """layer_norm_triton on each case, C not a power of two (so the block has padding columns), to 1e-5 of
    float64 (1e-4 for rows at offset 100, which float32 rounds more coarsely)."""
    for case in EX5_CASES:
        x = case.x(seed=11)
        gamma, beta = params(case.shape[-1], torch.float32, seed=12)
        inputs = {"x": x, "gamma": gamma, "beta": beta, "eps": case.eps}
        got = call(f"layer_norm_triton on {case}", module.layer_norm_triton, inputs)
        x64, w, b, eps = x.double(), gamma.double(), beta.double(), case.eps
        C, width = x.shape[-1], 1 << (x.shape[-1] - 1).bit_length()
        xc = x64 - x64.mean(-1, keepdim=True)
        padded_var = (xc.square().sum(-1, keepdim=True) + (width - C) * x64.mean(-1, keepdim=True).square()) / C
        wide_xc = x64 - x64.sum(-1, keepdim=True) / width
        wide_var = wide_xc.square().sum(-1, keepdim=True) / width
        variants = [
            (PADDING, xc / (padded_var + eps).sqrt() * w + b),
            (BLOCK_WIDTH, wide_xc / (wide_var + eps).sqrt() * w + b),
            (STD_NOT_RSTD, xc * (xc.square().mean(-1, keepdim=True) + eps).sqrt() * w + b),
            (SAMPLE_VARIANCE, ln(x64, w, b, eps, correction=1)),
            (EPS_OUTSIDE, ln(x64, w, b, eps, eps_outside=True)),
        ]
        name, right = f"layer_norm_triton's output on {case}", ln(x64, w, b, eps)
        if case.offset and max_error(got, right) > 1e-4:  # right on the rows near 0 (the case before)
            raise Mistake(f"{ONE_PASS_NEAR_100} ({name} is off by {max_error(got, right):.1e}, allowed 1e-4)")
        checked(name, got, x, right, variants, tol=1e-4 if case.offset else 1e-5)


# ----------------------------------------------------------------------------------------------------------------
# 6. Is a norm per token? Graded on norms that weak tests misjudge.


class BatchCentred(LayerNorm):
    """LayerNorm of each token minus the batch's mean token: not per token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x - x.reshape(-1, x.shape[-1]).mean(0))


class ByPosition(LayerNorm):
    """LayerNorm plus 0.1 times each token's position in the batch: not per token."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = torch.arange(math.prod(x.shape[:-1]), dtype=x.dtype).reshape(*x.shape[:-1], 1)
        return super().forward(x) + 0.1 * position


class LeaksTheBatch(LayerNorm):
    """LayerNorm plus 1e-3 of the batch's mean token: not per token, by a little."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1e-3 * x.reshape(-1, x.shape[-1]).mean(0)


@dataclass(frozen=True)
class Judged:
    """A norm is_per_token is asked about: what it is, whether it is per token, and why a test says otherwise."""

    what: str
    make: Callable[[int], torch.nn.Module]
    per_token: bool
    why: str


NORMS = [
    Judged("LayerNorm", LayerNorm, True, "compare norm(x)[i] with norm(x[i:i+1]) for every row i of a random x"),
    Judged("RMSNorm", RMSNorm, True, "compare norm(x)[i] with norm(x[i:i+1]) for every row i of a random x"),
    Judged("DyT", DyT, True, "it is elementwise: compare norm(x)[i] with norm(x[i:i+1]) for every row i"),
    Judged(
        "BatchNorm in eval mode",
        lambda dim: BatchNorm(dim).eval(),
        True,
        "in eval mode it uses its running averages, not the batch: judge what the norm does, not its class",
    ),
    Judged(
        "BatchNorm in training mode",
        BatchNorm,
        False,
        "its statistics are the batch's, which a test of the batch against itself, a shuffled copy of it or copies "
        "of one token cannot show; run each of N different tokens alone, norm(x[i:i+1]), and compare",
    ),
    Judged(
        "a norm that subtracts the batch's mean token",
        BatchCentred,
        False,
        "a batch of copies of one token cannot show it (each copy is the batch's mean): use different tokens",
    ),
    Judged(
        "a norm that adds each token's position in the batch",
        ByPosition,
        False,
        "row 0 alone and in the batch agree: compare every row i with norm(x[i:i+1]), not only the first",
    ),
    Judged(
        "a norm that adds 1e-3 of the batch's mean token",
        LeaksTheBatch,
        False,
        "a row alone and in the batch differ by a few 1e-3: a tolerance that loose hides it; use 1e-6 or torch.equal",
    ),
]


def judged_norm(judged: Judged, dim: int) -> torch.nn.Module:
    """A fresh norm with random weight and bias."""
    norm = judged.make(dim)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(dim, generator=g))
        norm.bias.copy_(torch.randn(dim, generator=g))
    return norm


@graded
def check_ex6(module: ModuleType) -> None:
    """is_per_token(norm, 16) on each norm below, each judged right (True or False, a bool), the norm's mode
    (training or eval) and weights left as they were. Some are made to fool a weak test."""
    for judged in NORMS:
        norm = judged_norm(judged, 16)
        mode, weights = norm.training, [p.detach().clone() for p in norm.parameters()]
        said = call(f"is_per_token on {judged.what}", module.is_per_token, {"norm": norm, "dim": 16})
        if norm.training != mode:
            raise Mistake(
                f"is_per_token switched {judged.what} to {'training' if norm.training else 'eval'} mode: judge the "
                "norm as it is given (norm.eval() makes BatchNorm use its running averages)"
            )
        if not all(torch.equal(p, w) for p, w in zip(norm.parameters(), weights, strict=True)):
            raise Mistake(f"is_per_token changed the weights of {judged.what}: judge the norm as it is given")
        if not isinstance(said, bool):
            raise Mistake(f"is_per_token must return True or False, got {type(said).__name__} {said!r:.40}")
        if said != judged.per_token:
            raise Mistake(f"is_per_token said {said} for {judged.what}; it is {judged.per_token}: {judged.why}")


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


def rms_forward(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, list]:
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
    return rms(x, gamma, eps), variants


def rms_grads(x: torch.Tensor, gamma: torch.Tensor, eps: float, dy: torch.Tensor) -> list:
    """RMSNorm's dgamma and dx in float64, each with the usual wrong ones."""
    N = x[..., 0].numel()
    rrms = (x.square().mean(-1, keepdim=True) + eps).rsqrt()
    xn = x * rrms
    rows_sum = tuple(range(x.dim() - 1))
    dgamma = (dy * xn).sum(rows_sum)
    g = dy * gamma
    along = xn * (g * xn).mean(-1, keepdim=True)
    return [
        (
            "dgamma",
            dgamma,
            [
                (off_by_n("dgamma", N), dgamma / N),
                ("dgamma sums dy alone; it sums dy * x * rrms", dy.sum(rows_sum)),
                ("dgamma sums dy * x; it sums dy * x * rrms, the normalized x", (dy * x).sum(rows_sum)),
            ],
        ),
        (
            "dx",
            rrms * (g - along),
            [
                ("dx leaves out the term from rrms's dependence on x: it is only rrms * dy * gamma", rrms * g),
                (
                    "dx subtracts mean(g): that term is LayerNorm's, from its mean subtraction; RMSNorm has none",
                    rrms * (g - g.mean(-1, keepdim=True) - along),
                ),
                ("dx adds the term from rrms's dependence on x; it is subtracted", rrms * (g + along)),
                ("dx's second term lacks a factor rrms: both terms are multiplied by it", rrms * g - along),
                (
                    "dx leaves out gamma: the gradient reaching xn is g = dy * gamma",
                    rrms * (dy - xn * (dy * xn).mean(-1, keepdim=True)),
                ),
            ],
        ),
    ]


@graded
def check_ex7(module: ModuleType) -> None:
    """RMSNormFunction's forward and backward called directly on each case (as autograd calls them, with a ctx):
    y, then dx and dgamma to 1e-8 of float64, each of its input's shape and dtype, dy unchanged, no autograd
    inside backward; then through RMSNormFunction.apply, torch.autograd.gradcheck."""
    check_function(module.RMSNormFunction, ("gamma",), rms_forward, rms_grads)


CHECKS: dict[int, Callable[[ModuleType], str]] = {
    1: check_ex1,
    2: check_ex2,
    3: check_ex3,
    4: check_ex4,
    5: check_ex5,
    6: check_ex6,
    7: check_ex7,
}
CASES: dict[int, list] = {
    1: EX1_CASES,
    2: EX2_CASES,
    3: EX3_CASES,
    4: GRAD_CASES,
    5: EX5_CASES,
    6: NORMS,
    7: GRAD_CASES,
}


EVERY_CASE = (
    "on every case, your code's inputs are compared after the call with copies taken before it (a change in place "
    "is a mistake), and what it returns must be of the type, shape, dtype and device asked for"
)


def explain(n: int) -> str:
    """What exercise n's check tries, in words: its docstring, then its cases one a line."""
    cases = [f"  - {c.what}: per token {c.per_token}" if isinstance(c, Judged) else f"  - {c}" for c in CASES[n]]
    summary = " ".join(CHECKS[n].__doc__.split())
    return "\n".join([f"what it checks: {summary}", f"  ({EVERY_CASE})", "the cases it tries:", *cases])
