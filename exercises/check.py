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

import ast
import contextlib
import doctest
import io
import math
import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
NO_BETA = "beta is never added: y = xhat * gamma + beta"
IN_PLACE = "changed its input {name} in place ({name} -= ..., {name}.sub_(...)): compute into new tensors"
BROADCAST = (
    "did you keep the reduced dim? x.mean(-1, keepdim=True) is [..., 1], which broadcasts against x [..., C]; or does "
    "your code assume a width (a fixed C, a power of two)?"
)
VIEW = "view needs memory laid out in order, and this input is not (a transpose or a slice): use reshape"
ONE_PASS = (
    "the one-pass E[x^2] - E[x]^2 cancels far from 0 (squares near 1e8, where float32 steps by 8): take two passes"
)
MEAN_FAR = (
    "x - mean subtracts a mean near 1e4 held in float32, off by up to 5e-4 however it is computed (float32 steps by "
    "1e-3 there): centre the shifted row instead, s - s.mean(-1, keepdim=True) with s = x - x[..., :1]"
)
ONE_SHIFT = "right when all rows sit at one offset, wrong when they differ: shift each row by its own x[..., :1]"
FIRST_ROW = "x - x[:1] subtracts the first row from every row; the shift is each row's first element, x[..., :1]"
STAY_FLOAT32 = "it computes in torch.float64 (a .double() or dtype=torch.float64 inside): stay in float32"
LEFT_TORCH = "it leaves torch (.numpy(), .tolist(), .item()): numpy and Python compute in float64: stay in torch"
PADDING = "the padding columns add to your variance: x - mean is -mean there; square tl.where(mask, x - mean, 0.0)"
BLOCK_WIDTH = "you divided by the block's width (padding included); the row has C features: divide by C"
ONE_PASS_NEAR_100 = (
    "right near 0, wrong at 100: your variance subtracts two large numbers, which cancels in float32 (the one-pass "
    "E[x^2] - E[x]^2, or the padding's share taken off after squaring); square tl.where(mask, x - mean, 0.0)"
)
ONE_PASS_FAR = (
    "right near 0, wrong on rows far from 0: the one-pass E[x^2] - E[x]^2 cancels there in float32 (squares near "
    "1e6, where float32 steps by 0.06); take two passes, the mean of (x - mean)^2 (exercise 3 shows why)"
)
ONE_PASS_SHIFTED = (
    "the one-pass E[s^2] - E[s]^2 on the shifted row s = x - x[..., :1]: a row whose first element is an outlier "
    "sits far from 0 even shifted, and the squares cancel again; take the second pass, the mean of (s - mean)^2"
)
FIRST_TOKEN = (
    "x[:, :1] is each row's first element only for a 2-D x; for x [B, T, C] it is the first token's whole row: "
    "shift by x[..., :1]"
)
SHIFTED_NOT_CENTRED = "x - mean is the shifted row x - x[..., :1] itself: subtract the shifted row's mean too"
INVERTED_WHERE = (
    "tl.where(mask, a, b) takes a where mask is True: tl.where(mask, 0.0, x - mean) zeroes the features and keeps "
    "the padding; write tl.where(mask, x - mean, 0.0)"
)
FLOOR_DIVISION = (
    "Triton refuses an integer operation on a float block (// is integer division, as % and >> are integer "
    "operations): divide with /"
)
PROMOTED = (
    "x times float32 gamma is float32 (torch promotes), and the signature promises x's dtype: compute as you like, "
    "return the result .to(x.dtype)"
)
FIXED_WIDTH = (
    "your statistics divide by {width}, the statement's width, whatever x's: divide by x.shape[-1] (take the mean)"
)
EPS_FIXED = "eps is taken as 1e-5 whatever eps it is given: use {eps}"
FLOAT32_PRECISION = (
    "x is float64, and your output holds only float32's precision: computed in float32 (.float()) and cast back; "
    "compute in x's own dtype when it is float64 (float32 is for bfloat16 and float16 inputs)"
)
AFFINE_FIRST = "gamma and beta are applied before normalising, so normalising undoes them: y = xhat * gamma + beta"
LEADING_DIMS = (
    "you reduced over every dim but the last (each feature's statistics over the batch, as BatchNorm); LayerNorm "
    "reduces over the last dim only"
)
PER_SAMPLE = (
    "you reduced over every dim but the first (each sample's features flattened, x.reshape(x.shape[0], -1)); "
    "LayerNorm reduces over each token's last dim only"
)
WRONG_RANK = (
    "a dim that x of this rank does not have: for x [..., C] of any rank, reduce over dim -1 (or reshape(-1, C))"
)
BACKWARD_NO_EPS = (
    "the backward recomputes rstd without eps, 1 / sqrt(var), where the forward used 1 / sqrt(var + eps): save "
    "rstd (or xhat) in forward and reuse it"
)
DGAMMA_FROM_Y = "dgamma sums dy * y, the output; it sums dy * xhat, the normalized x (y = xhat * gamma + beta)"
BUILT_IN = (
    "{what} calls torch's own {norm} ({functions}): this exercise writes it from scratch; compute the statistics "
    "yourself"
)
STD_NOT_RSTD = "row_statistics returns the std, sqrt(var + eps); the kernel multiplies by rstd = 1 / sqrt(var + eps)"
TRITON_EXERCISES = (5,)
EXAMPLE = "<the statement's example>"  # the file name of an example's code, run by failing_example


class Mistake(Exception):
    """The first mistake found, in words: what a grading function returns instead of PASS."""


class WrongShape(Mistake):
    """An output of the wrong shape: it says why the statement's examples fail, so it is reported alone."""


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
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if not f.filename.startswith(library_dirs()) and f.filename != EXAMPLE
    ]
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
    if "unexpected type fp32" in words:  # Triton's words for an integer operation on a float block
        return f"{FLOOR_DIVISION}; {in_one_line(error)}"
    if "Dimension out of range" in words or "too many indices for tensor" in words:
        return f"{WRONG_RANK}; {in_one_line(error)}"
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


def statement_examples(statement: str) -> list[doctest.Example]:
    """The doctest examples of an exercise's statement: the docstring of exercises/STATEMENT.py, the file beside
    this one, as the learner reads it."""
    source = Path(__file__).with_name(f"{statement}.py").read_text(encoding="utf-8")
    return doctest.DocTestParser().get_examples(ast.get_docstring(ast.parse(source)) or "")


def failing_example(module: ModuleType, statement: str) -> str | None:
    """The statement's examples run in order against the learner's module, as doctest runs them: the first that
    fails, in words (what it printed or raised, and what the statement shows), or None when all hold. An example
    that reaches a NotImplementedError ends the run with None: the work is unfinished, and the check says where."""
    names = {"torch": torch, **vars(module)}
    checker = doctest.OutputChecker()
    for example in statement_examples(statement):
        printed = io.StringIO()
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(example.source, EXAMPLE, "single"), names)
        except KeyboardInterrupt:
            raise
        except SystemExit as stop:
            got = f"called sys.exit({stop.code!r}) (return the result instead)"
        except BaseException as error:  # the learner's code may raise anything
            if isinstance(unwrapped(error), NotImplementedError):
                return None
            got = f"raised {explained(error)}"
        else:
            if checker.check_output(example.want, printed.getvalue(), 0):
                continue
            got = f"printed {in_words(printed.getvalue())}"
        shows = f"; the statement shows {in_words(example.want)}" if example.want or got.startswith("printed") else ""
        return f"the statement's example >>> {in_words(example.source)} {got}{shows}"
    return None


def in_words(text: str) -> str:
    """Printed text on one line: its lines joined by ' | ', nothing printed said so."""
    lines = [line.strip() for line in text.strip().splitlines()]
    return " | ".join(lines)[:300] if lines else "nothing"


def graded(statement: str) -> Callable[[Callable[[ModuleType], None]], Callable[[ModuleType], str]]:
    """A check that raises Mistake, made into one that returns PASS, the mistake, or "not started". The examples of
    exercises/STATEMENT.py run first: the first that fails leads the result, followed by the mistake the check
    names, if it finds one."""

    def decorate(check: Callable[[ModuleType], None]) -> Callable[[ModuleType], str]:
        def grade(module: ModuleType) -> str:
            example = failing_example(module, statement)
            try:
                check(module)
            except WrongShape as mistake:
                return str(mistake)
            except Mistake as mistake:
                found = str(mistake)
            except NotImplementedError:
                found = NOT_STARTED
            except Exception as error:  # a name the exercise asks for is missing, or what came back breaks the check
                found = in_one_line(error)
            else:
                found = PASS
            if example is None:
                return found
            return example if found in (PASS, NOT_STARTED) else f"{example}; {found}"

        grade.__doc__ = check.__doc__
        return grade

    return decorate


def from_scratch(watched: Watched, what: str, norm: str = "layer_norm") -> None:
    """Refuse a from-scratch exercise whose code called torch's own norm."""
    builtins = {
        "layer_norm": {F.layer_norm: "F.layer_norm", torch.layer_norm: "torch.layer_norm"},
        "rms_norm": {F.rms_norm: "F.rms_norm", torch.rms_norm: "torch.rms_norm"},
    }[norm]
    builtins[torch.native_layer_norm] = "torch.native_layer_norm"
    called = sorted(name for function, name in builtins.items() if function in watched.functions)
    if called:
        raise Mistake(BUILT_IN.format(what=what, norm=norm, functions=", ".join(called)))


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
        raise WrongShape(f"{name} has shape {list(got.shape)}; expected {list(want.shape)}")
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
    width: int | None = None,
) -> torch.Tensor:
    """LayerNorm and its wrong variants, in x's dtype: statistics over dims, variance over n - correction (n a fixed
    width if given, the mean's divisor too)."""
    n = width or math.prod(x.shape[d] for d in dims)
    mean = x.sum(dims, keepdim=True) / n
    var = (x - mean).square().sum(dims, keepdim=True) / (n - correction)
    std = var.sqrt() + eps if eps_outside else (var + eps).sqrt() if root else var + eps
    return (x - mean) / std * gamma + beta


def ln_variants(
    x: torch.Tensor,
    gamma: torch.Tensor,
    beta: torch.Tensor,
    eps: float,
    eps_name: str = "the eps argument",
    widths: tuple[int, ...] = (),
) -> list[tuple[str, torch.Tensor]]:
    """The usual wrong LayerNorms of x (float64), each with what it gets wrong; eps_name says where eps comes from,
    widths are those of the statement's examples, which a learner may have written in."""
    variants = [
        (SAMPLE_VARIANCE, ln(x, gamma, beta, eps, correction=1)),
        (EPS_OUTSIDE, ln(x, gamma, beta, eps, eps_outside=True)),
        (EPS_LEFT_OUT, ln(x, gamma, beta, 0.0)),
        (STD_PLUS_EPS, ln(x, gamma, beta, eps, correction=1, eps_outside=True)),
        (NO_SQRT, ln(x, gamma, beta, eps, root=False)),
        (SWAPPED, ln(x, beta, gamma, eps)),
        (NO_AFFINE, ln(x, 1.0, 0.0, eps)),
        (NO_BETA, ln(x, gamma, 0.0, eps)),
        (AFFINE_FIRST, ln(x * gamma + beta, 1.0, 0.0, eps)),
    ]
    if eps != 1e-5:
        variants += [(EPS_FIXED.format(eps=eps_name), ln(x, gamma, beta, 1e-5))]
    variants += [(FIXED_WIDTH.format(width=w), ln(x, gamma, beta, eps, width=w)) for w in widths if w != x.shape[-1]]
    if x.dim() > 2:  # every leading dim: BatchNorm's statistics over a batch of sequences; every dim but the first
        variants += [(LEADING_DIMS, ln(x, gamma, beta, eps, dims=tuple(range(x.dim() - 1))))]
        variants += [(PER_SAMPLE, ln(x, gamma, beta, eps, dims=tuple(range(1, x.dim()))))]
    if x.dim() > 1:  # for a 1-D x the last dim is every dim: nothing else to reduce over
        variants += [(reduced_over(d), ln(x, gamma, beta, eps, dims=(d,))) for d in range(x.dim() - 1)]
        variants += [(ALL_DIMS, ln(x, gamma, beta, eps, dims=tuple(range(x.dim()))))]
    return variants


@dataclass(frozen=True)
class Case:
    """One input the checker tries: x of this shape, dtype and layout, with eps; gamma and beta of x's dtype unless
    `weights` names another (a mixed-precision model's float32 weights beside a bfloat16 x)."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float64
    layout: str = "contiguous"
    eps: float = 1e-5
    offset: float = 0.0  # added to every row: rows far from 0
    weights: torch.dtype | None = None

    def __str__(self) -> str:
        layout = "" if self.layout == "contiguous" else f", {self.layout} (not contiguous)"
        offset = f", rows at offset {self.offset:g}" if self.offset else ""
        weights = f", gamma and beta {str(self.weights).removeprefix('torch.')}" if self.weights else ""
        eps = f"{self.eps:g}".replace("e-0", "e-")
        return f"x {list(self.shape)} {str(self.dtype).removeprefix('torch.')}{layout}{offset}{weights}, eps {eps}"

    def x(self, seed: int) -> torch.Tensor:
        return laid_out((rows(self.shape, torch.float64, seed) + self.offset).to(self.dtype), self.layout)

    def params(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        return params(self.shape[-1], self.weights or self.dtype, seed)

    def tolerance(self) -> float:
        """float32 rounds x - mean of rows at offset 1e3 to about 5e-4 (two passes; the one-pass variance is off
        by 1 or NaN there), bfloat16 keeps 8 bits: about 1e-2 on outputs near 3."""
        if self.dtype == torch.bfloat16:
            return 5e-2
        if self.offset:
            return 5e-3
        return 1e-5 if self.dtype == torch.float32 else 1e-8


# ----------------------------------------------------------------------------------------------------------------
# 1. The lecture's LayerNorm1d, made to match nn.LayerNorm; a row's output never depends on the other rows.

# Widths 12 and 20 about the statement's 16; rows at offset 1e3 last, where only the one-pass variance fails.
EX1_CASES = [
    Case((12, 16), torch.float32, eps=1e-2),
    Case((12, 16), torch.float32, "transposed", eps=1e-2),
    Case((7, 12), torch.float32, eps=1e-2),
    Case((5, 20), torch.float32, eps=1e-2),
    Case((6, 20), torch.float32, eps=1e-2, offset=1e3),
]


@graded("ex1_layer_norm_1d")
def check_ex1(module: ModuleType) -> None:
    """The statement's examples; LayerNorm1d(16): eps 1e-5, gamma ones and beta zeros by default; then one layer
    called on a first batch and a second: the second's output a fresh layer's; then, a fresh one per case with
    random gamma and beta, F.layer_norm's output in float64 to 1e-5 (5e-3 for rows at 1e3), without torch's own
    layer_norm; then each row bit for bit the same when the other rows change."""
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
    no_state_between_calls(module)
    for case in EX1_CASES:
        layer, x = ex1_layer(module, case.shape[-1], case.eps), case.x(seed=2)
        name = f"LayerNorm1d({case.shape[-1]}, eps={case.eps:g}) on {case}"
        with Watched() as watched:
            got = call(name, layer, {"x": x}, EX1_UNFINISHED)
        from_scratch(watched, "LayerNorm1d")
        checked_case(name, got, x, *ex1_right(layer, x, case.eps), case)
    rows_alone(module)


EX1_UNFINISHED = "not finished: __init__ runs; __call__ still raises NotImplementedError"


def ex1_layer(module: ModuleType, dim: int, eps: float) -> Any:
    """A fresh LayerNorm1d(dim, eps) with random gamma and beta."""
    layer = call(f"LayerNorm1d({dim}, eps={eps:g})", module.LayerNorm1d, {"dim": dim, "eps": eps})
    if getattr(layer, "eps", None) != eps:
        raise Mistake(f"LayerNorm1d({dim}, eps={eps:g}).eps is {getattr(layer, 'eps', None)}: keep the eps it is given")
    layer.gamma, layer.beta = params(dim, torch.float32, seed=1)
    return layer


def ex1_right(layer: Any, x: torch.Tensor, eps: float) -> tuple[torch.Tensor, list]:
    gamma, beta = layer.gamma.double(), layer.beta.double()
    return ln(x.double(), gamma, beta, eps), ln_variants(x.double(), gamma, beta, eps, "self.eps", widths=(16,))


def no_state_between_calls(module: ModuleType) -> None:
    """One layer called on two different batches of the same shape: the second's output, row by row, that of a fresh
    layer on it. Checked before the values: a layer that keeps a statistic of its first call is wrong on that call
    too, and its value alone would not say why. A call that fails here is left to the cases, which say on what."""
    first, second = rows((10, 12), torch.float32, seed=3), rows((10, 12), torch.float32, seed=4) * 10 + 5
    try:
        fresh = call("LayerNorm1d on a batch", ex1_layer(module, 12, 1e-2), {"x": second}, EX1_UNFINISHED)
        layer = ex1_layer(module, 12, 1e-2)
        call("LayerNorm1d on a first batch", layer, {"x": first}, EX1_UNFINISHED)
        got = call("LayerNorm1d on a second, different batch", layer, {"x": second}, EX1_UNFINISHED)
    except Mistake:
        return
    if not all(isinstance(t, torch.Tensor) and t.shape == second.shape for t in (fresh, got)):
        return
    same = torch.isclose(got.detach().double(), fresh.detach().double(), rtol=0, atol=1e-5, equal_nan=True)
    off = ~same.all(-1)
    if off.any():
        raise Mistake(
            f"called again on a second, different batch, {int(off.sum())} of {len(off)} rows are off (by up to "
            f"{max_error(got, fresh):.1e} from a fresh layer's output on that batch): __call__ keeps something from "
            "an earlier call; each call's statistics come from its own x alone"
        )


def rows_alone(module: ModuleType) -> None:
    """One layer called on a batch, then on the batch with every other row changed: the rows kept, bit for bit the
    same."""
    layer = ex1_layer(module, 12, 1e-2)
    x = rows((10, 12), torch.float32, seed=4) * 10 + 5
    got = call("LayerNorm1d on a batch", layer, {"x": x})
    others = x.clone()
    others[1::2] = rows((5, 12), torch.float32, seed=5) * 3
    again = call("LayerNorm1d on the same batch, every other row changed", layer, {"x": others})
    for i in range(0, len(x), 2):
        if not torch.equal(again[i], got[i]):
            raise Mistake(
                f"row {i}'s output changed by {max_error(again[i], got[i]):.1e} when only the other rows changed: "
                "a row's output depends on that row alone"
            )


# ----------------------------------------------------------------------------------------------------------------
# 2. layer_norm(x, gamma, beta, eps) over any leading dims.

# Ranks 1 to 4; widths 6 and 12 about the statement's 4 and 8; rows at offset 1e3, where only the one-pass variance
# fails; a bfloat16 x with float32 gamma and beta, whose output is bfloat16, as the signature says.
EX2_CASES = [
    Case((4, 3, 8), eps=1e-2),
    Case((8,)),
    Case((6,), eps=1e-2),
    Case((5, 12), eps=1e-2),
    Case((2, 3, 2, 6)),
    Case((4, 3, 8), layout="transposed"),
    Case((4, 3, 8), layout="sliced"),
    Case((4, 3, 8), torch.float32, eps=1e-2),
    Case((3, 2, 12), torch.float32, eps=1e-2, offset=1e3),
    Case((4, 6), torch.bfloat16, eps=1e-2, weights=torch.float32),
]


@graded("ex2_layer_norm")
def check_ex2(module: ModuleType) -> None:
    """The statement's examples; then layer_norm on each case against the float64 formula (to 1e-8 in float64,
    1e-5 in float32, 5e-3 for rows at 1e3, 5e-2 in bfloat16), without torch's own layer_norm: the output's shape,
    dtype and device those of x, and x unchanged."""
    for i, case in enumerate(EX2_CASES):
        x = case.x(seed=i)
        gamma, beta = case.params(seed=10 + i)
        name = f"layer_norm on {case}"
        with Watched() as watched:
            got = call(name, module.layer_norm, {"x": x, "gamma": gamma, "beta": beta, "eps": case.eps})
        from_scratch(watched, "layer_norm")
        x64, gamma64, beta64 = x.double(), gamma.double(), beta.double()
        variants = ln_variants(x64, gamma64, beta64, case.eps, widths=(4, 8))
        checked_case(name, got, x, ln(x64, gamma64, beta64, case.eps), variants, case)


def checked_case(name: str, got: Any, x: torch.Tensor, right: torch.Tensor, variants: list, case: Case) -> None:
    """got checked as a tensor like x, then in value against right to the case's tolerance; on rows far from 0
    (right on the cases before), a wrong value is the one-pass variance's. A float64 output off by float32's
    rounding, each of its values a float32, was computed in float32."""
    if case.weights and isinstance(got, torch.Tensor) and got.dtype == case.weights != x.dtype:
        raise Mistake(f"{name} is {got.dtype}; expected {x.dtype}: {PROMOTED}")
    check_tensor(name, got, x)
    error = max_error(got, right)  # float32 rounds outputs near 3 by about 1e-6: a larger error is another mistake
    if x.dtype == torch.float64 and case.tolerance() < error < 1e-4 and torch.equal(got, got.float().double()):
        raise Mistake(f"{FLOAT32_PRECISION} ({name} is off by {error:.1e}, allowed {case.tolerance():.0e})")
    if case.offset and error > case.tolerance():
        raise Mistake(f"{ONE_PASS_FAR} ({name} is off by {error:.1e}, allowed {case.tolerance():.0e})")
    compare(name, got, right, variants, case.tolerance())


# ----------------------------------------------------------------------------------------------------------------
# 3. Float32 row statistics that stay accurate far from 0: x - mean and the variance.


@dataclass(frozen=True)
class RowsAt:
    """Rows of unit spread in float32, each at one of `offsets` (in turn), their first element `outlier` above the
    rest; x - mean held to `centred` and the variance to `relative` of float64's, relative; and what a mistake that
    only these rows show usually is."""

    shape: tuple[int, ...]
    offsets: tuple[float, ...]
    layout: str = "contiguous"
    explains: tuple[tuple[str, str], ...] = ()  # (output, why it is wrong here, when right on the cases before)
    outlier: float = 0.0
    centred: float = 1e-5
    relative: float = 1e-4

    def __str__(self) -> str:
        at = " and ".join(f"{o:g}" if abs(o) < 1e3 else f"{o:.0e}".replace("e+0", "e") for o in self.offsets)
        mixed = " in one batch" if len(self.offsets) > 1 else ""
        layout = "" if self.layout == "contiguous" else f", {self.layout} (not contiguous)"
        outlier = f", each row's first element {self.outlier:g} above the rest" if self.outlier else ""
        return f"x {list(self.shape)} float32, rows at offset {at}{mixed}{layout}{outlier}"

    def x(self) -> torch.Tensor:
        g = torch.Generator().manual_seed(9)
        n = math.prod(self.shape[:-1])
        offset = torch.tensor(self.offsets, dtype=torch.float64).repeat(n)[:n].reshape(*self.shape[:-1], 1)
        x = torch.randn(self.shape, generator=g, dtype=torch.float64) + offset
        x[..., 0] += self.outlier
        return laid_out(x.float(), self.layout)


# Ranks 1 to 4; widths 100 and 500 about the statement's 4 and 384. Rows at 1e4 of unit spread: float32's mean is off
# by about 1e-3 there, the one-pass variance by far more. A first element 100 above the rest: shifted by it, the row
# sits near -100, where the one-pass variance on the shifted row is off by 1e-4 relative and two passes by 4e-7.
EX3_CASES = [
    RowsAt((64, 384), (0.0,)),
    RowsAt((64, 384), (1e4,), explains=(("x - mean", MEAN_FAR), ("the variance", ONE_PASS))),
    RowsAt((4, 16, 100), (1e4,)),
    RowsAt((100,), (0.0,)),
    RowsAt((4, 16, 384), (0.0, 1e4), explains=(("x - mean", ONE_SHIFT), ("the variance", ONE_SHIFT))),
    RowsAt((2, 3, 4, 500), (1e4, 0.0)),
    RowsAt((64, 384), (1e4,), "transposed"),
    RowsAt(
        (16, 384), (1e4,), outlier=100.0, centred=1e-4, relative=1e-5, explains=(("the variance", ONE_PASS_SHIFTED),)
    ),
]


def variance_error(got: torch.Tensor, right: torch.Tensor) -> float:
    """The largest error of a variance relative to the right one (NaN counted as infinite)."""
    return ((got.detach().double() - right) / right).abs().nan_to_num(float("inf")).max().item()


def ex3_variants(x64: torch.Tensor) -> dict[str, list[tuple[str, torch.Tensor]]]:
    """The usual wrong x - mean and variances of x (float64), each with what it gets wrong."""
    variants: dict[str, list[tuple[str, torch.Tensor]]] = {
        "x - mean": [(SHIFTED_NOT_CENTRED, x64 - x64[..., :1])],
        "the variance": [(SAMPLE_VARIANCE, x64.var(-1))],
    }
    shifts = [(FIRST_ROW, x64[:1])] if x64.dim() > 1 else []
    shifts += [(FIRST_TOKEN, x64[:, :1])] if x64.dim() > 2 else []
    for why, shift in shifts:
        shifted = x64 - shift
        variants["x - mean"].append((why, shifted - shifted.mean(-1, keepdim=True)))
        variants["the variance"].append((why, shifted.var(-1, correction=0)))
    shifted = x64 - x64[..., :1]
    for width in (w for w in (4, 384) if w != x64.shape[-1]):  # the statement's widths, written in
        xc = shifted - shifted.sum(-1, keepdim=True) / width
        variants["x - mean"].append((FIXED_WIDTH.format(width=width), xc))
        variants["the variance"].append((FIXED_WIDTH.format(width=width), xc.square().sum(-1) / width))
    return variants


@graded("ex3_variance")
def check_ex3(module: ModuleType) -> None:
    """The statement's examples; then centre_and_variance on each case: two float32 tensors, x - mean to 1e-5 and
    the population variance to 1e-4 of float64's, relative (1e-4 and 1e-5 on rows whose first element is an
    outlier), no float64 anywhere inside, and x unchanged."""
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
        if x.dim() > 1 and [tuple(t.shape) for t in out if isinstance(t, torch.Tensor)] == [x.shape[:-1], x.shape]:
            raise Mistake("centre_and_variance returned (the variance, x - mean); the order is (x - mean, variance)")
        wrong = []
        for (name, right), got in zip(want.items(), out, strict=True):
            check_tensor(f"{name} on {case}", got, right.float())
            error = max_error(got, right) if name == "x - mean" else variance_error(got, right)
            if error > (case.centred if name == "x - mean" else case.relative):
                wrong.append((name, got, right, error))
        if not wrong:
            continue
        variants = ex3_variants(x64)
        for name, got, right, _ in wrong:  # a mistake of method, which the numbers name on any case
            for why, variant in variants[name]:
                if max_error(got, variant) <= 1e-3 * max(1.0, variant.abs().max().item()):
                    raise Mistake(f"{why} ({name} on {case} matches that; it is off by {max_error(got, right):.1e})")
        unexplained = [w for w in wrong if w[0] not in dict(case.explains)]
        if unexplained:
            name, got, right, _ = unexplained[0]
            raise Mistake(
                where_off(f"{name} on {case}", got, right, case.centred if name == "x - mean" else case.relative)
            )
        why: dict[str, list[str]] = {}  # each explanation once, with every output it explains
        for name, _, _, error in wrong:
            allowed = f"allowed {case.centred:.0e}" if name == "x - mean" else f"relative, allowed {case.relative:.0e}"
            why.setdefault(dict(case.explains)[name], []).append(f"{name} is off by {error:.1e}, {allowed}")
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


# Ranks 1 to 4, widths 6 and 12 about the statement's 8: a sum over dims (0, 1) is right for 3-D x only.
GRAD_CASES = [
    GradCase(Case((3, 4, 8), eps=1e-2)),
    GradCase(Case((3, 4, 8), layout="transposed", eps=1e-2), dy="transposed"),
    GradCase(Case((5, 12), eps=1e-2)),
    GradCase(Case((6,), eps=1e-2)),
    GradCase(Case((2, 3, 2, 6), eps=1e-2)),
]


def parameter_grad_shape(name: str, got: Any, C: int) -> None:
    """A parameter's gradient not summed over the rows, or summed with its dims kept, named: autograd.grad sums
    or reshapes it silently, a backward must."""
    if isinstance(got, torch.Tensor) and got.dim() == 0:
        raise Mistake(
            f"{name} has shape []; expected [{C}]: it is summed over the features too; sum over every dim but the "
            "last, whatever x's rank (.reshape(-1, C).sum(0))"
        )
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
    norm: str,
) -> None:
    """function.forward and .backward called directly on each GradCase: forward_right(x, weights, eps) gives
    (right, variants) for y; grads_right(x, weights, eps, dy) gives (name, right, variants) per gradient; the
    forward may not call torch's own `norm`. Then function.apply through autograd, with torch.autograd.gradcheck
    on float64, on each case."""
    names = ("x", *weights, "eps")
    for i, case in enumerate(GRAD_CASES):
        x = case.x.x(seed=4 + i)
        ws = dict(zip(weights, params(x.shape[-1], x.dtype, seed=5 + i), strict=False))
        ctx = Ctx(len(names))
        with Watched() as watched:
            y = call(f"forward on {case}", function.forward, {"ctx": ctx, "x": x, **ws, "eps": case.x.eps})
        from_scratch(watched, "forward", norm)
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

        def gradcheck(inputs: tuple = inputs, eps: float = case.x.eps) -> bool:
            return torch.autograd.gradcheck(
                lambda *tensors: function.apply(*tensors, eps), inputs, raise_exception=False
            )

        if not call(f"apply on {case}, through autograd", gradcheck, {}):
            raise Mistake(f"torch.autograd.gradcheck fails on {case}: the backward does not match finite differences")


def ln_grads(x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor, eps: float, dy: torch.Tensor) -> list:
    """LayerNorm's dbeta, dgamma and dx in float64, each with the usual wrong ones."""
    N = x[..., 0].numel()
    rstd = (x.var(-1, correction=0, keepdim=True) + eps).rsqrt()
    xhat = (x - x.mean(-1, keepdim=True)) * rstd
    dbeta = dy.reshape(-1, x.shape[-1]).sum(0)  # over every row (a 1-D x: one)
    dgamma = (dy * xhat).reshape(-1, x.shape[-1]).sum(0)
    g = dy * gamma
    mean_g = g.mean(-1, keepdim=True)
    along = xhat * (g * xhat).mean(-1, keepdim=True)
    dx_no_gamma = rstd * (dy - dy.mean(-1, keepdim=True) - xhat * (dy * xhat).mean(-1, keepdim=True))
    rstd_no_eps = x.var(-1, correction=0, keepdim=True).rsqrt()  # the backward's own rstd, eps forgotten
    xhat_no_eps = (x - x.mean(-1, keepdim=True)) * rstd_no_eps
    return [
        ("dbeta", dbeta, [(off_by_n("dbeta", N), dbeta / N)]),
        (
            "dgamma",
            dgamma,
            [
                (off_by_n("dgamma", N), dgamma / N),
                ("dgamma sums dy alone, which is dbeta; dgamma sums dy * xhat", dbeta),
                (
                    "dgamma sums dy * (x - mean); dgamma sums dy * xhat",
                    (dy * xhat / rstd).reshape(-1, x.shape[-1]).sum(0),
                ),
                (
                    "dgamma sums dy * x, the raw input; dgamma sums dy * xhat, the normalized x",
                    (dy * x).reshape(-1, x.shape[-1]).sum(0),
                ),
                (DGAMMA_FROM_Y, (dy * (xhat * gamma + beta)).reshape(-1, x.shape[-1]).sum(0)),
                (BACKWARD_NO_EPS, (dy * xhat_no_eps).reshape(-1, x.shape[-1]).sum(0)),
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
                (
                    "dx's xhat * mean(g * xhat) term divides the sum by C-1; the mean divides by C, as the "
                    "forward's variance does",
                    rstd * (g - mean_g - xhat * (g * xhat).sum(-1, keepdim=True) / (x.shape[-1] - 1)),
                ),
                (
                    BACKWARD_NO_EPS,
                    rstd_no_eps * (g - mean_g - xhat_no_eps * (g * xhat_no_eps).mean(-1, keepdim=True)),
                ),
            ],
        ),
    ]


@graded("ex4_backward")
def check_ex4(module: ModuleType) -> None:
    """The statement's examples; then LayerNormFunction's forward and backward called directly on each case (as
    autograd calls them, with a ctx): y (without torch's own layer_norm), then dx, dgamma, dbeta to 1e-8 of
    float64, each of its input's shape and dtype, dy unchanged, no autograd inside backward; then, on each case,
    torch.autograd.gradcheck through LayerNormFunction.apply."""
    forward = lambda x, gamma, beta, eps: (ln(x, gamma, beta, eps), ln_variants(x, gamma, beta, eps))  # noqa: E731
    check_function(module.LayerNormFunction, ("gamma", "beta"), forward, ln_grads, "layer_norm")


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


# Widths 3 and 10 about the statement's 5, each padded to a power of two. At offset 100 two passes hold to 1.2e-5,
# the one-pass E[x^2] - E[x]^2 is off by 1.9e-3: the last case is held to 1e-4.
EX5_CASES = [
    Case((6, 10), torch.float32, eps=1e-2),
    Case((4, 3), torch.float32, eps=1e-2),
    Case((6, 10), torch.float32, eps=1e-2, offset=100.0),
]


@graded("ex5_triton_forward")
def check_ex5(module: ModuleType) -> None:
    """The statement's examples; then layer_norm_triton on each case, C not a power of two (so the block has
    padding columns), to 1e-5 of float64 (1e-4 for rows at offset 100, which float32 rounds more coarsely)."""
    for case in EX5_CASES:
        x = case.x(seed=11)
        gamma, beta = params(case.shape[-1], torch.float32, seed=12)
        inputs = {"x": x, "gamma": gamma, "beta": beta, "eps": case.eps}
        got = call(f"layer_norm_triton on {case}", module.layer_norm_triton, inputs)
        check_tensor(f"layer_norm_triton's output on {case}", got, x)
        x64, w, b, eps = x.double(), gamma.double(), beta.double(), case.eps
        C, width = x.shape[-1], 1 << (x.shape[-1] - 1).bit_length()
        xc = x64 - x64.mean(-1, keepdim=True)
        padded_var = (xc.square().sum(-1, keepdim=True) + (width - C) * x64.mean(-1, keepdim=True).square()) / C
        wide_xc = x64 - x64.sum(-1, keepdim=True) / width
        wide_var = wide_xc.square().sum(-1, keepdim=True) / width
        inverted_var = (width - C) * x64.mean(-1, keepdim=True).square() / C  # only the padding's (0 - mean)^2
        variants = [
            (PADDING, xc / (padded_var + eps).sqrt() * w + b),
            (INVERTED_WHERE, xc / (inverted_var + eps).sqrt() * w + b),
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


class BatchRMS(LayerNorm):
    """Each feature divided by its root mean square over the batch: not per token, but even in x, so a batch of a
    token and its negative has each token's own statistics."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return x * torch.rsqrt(rows.square().mean(0) + self.eps) * self.weight + self.bias


class BatchAbsMax(LayerNorm):
    """Each feature divided by its largest magnitude over the batch: not per token, and even in x."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        return x / (rows.abs().amax(0) + self.eps) * self.weight + self.bias


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
    *(
        Judged(
            what,
            make,
            False,
            "a batch of a token and its negative cannot show a norm that mixes tokens through even statistics "
            "(x^2 and |x| are the same for t and -t): use N different random tokens",
        )
        for what, make in [
            ("a norm that divides each feature by its root mean square over the batch", BatchRMS),
            ("a norm that divides each feature by its largest magnitude over the batch", BatchAbsMax),
        ]
    ),
]
SUB_BATCH = (
    "it never ran a token alone: a sub-batch such as x[:4] still has batch statistics (and its tokens keep their "
    "positions): run each token alone, norm(x[i:i+1]), and compare it with norm(x)[i] for every row i"
)
SIGNED_MEAN = (
    "it ran each token alone and got rows up to {gap:.1e} from the batch's, yet said True: the signed differences "
    "cancel in a mean; compare the largest absolute difference, (a - b).abs().max()"
)


def judged_norm(judged: Judged, dim: int) -> torch.nn.Module:
    """A fresh norm with random weight and bias."""
    norm = judged.make(dim)
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(dim, generator=g))
        norm.bias.copy_(torch.randn(dim, generator=g))
    return norm


@graded("ex6_per_token")
def check_ex6(module: ModuleType) -> None:
    """The statement's examples; then is_per_token(norm, 16) on each norm below, and on LayerNorm and BatchNorm in
    training mode again at dim 12, each judged right (True or False, a bool), the norm's mode (training or eval)
    and weights left as they were. Some are made to fool a weak test."""
    for judged, dim in [*((j, 16) for j in NORMS), (NORMS[0], 12), (NORMS[4], 12)]:
        norm = judged_norm(judged, dim)
        mode, weights = norm.training, [p.detach().clone() for p in norm.parameters()]
        runs = recorded(norm, dim)
        what = judged.what if dim == 16 else f"{judged.what} of dim {dim}"
        try:
            said = call(f"is_per_token on {what}", module.is_per_token, {"norm": norm, "dim": dim})
        except Mistake as mistake:
            if dim == 16:
                raise
            raise Mistake(f"{mistake}: it runs at dim 16 and not at {dim}: make x of dim features, not 16") from None
        if norm.training != mode:
            raise Mistake(
                f"is_per_token switched {what} to {'training' if norm.training else 'eval'} mode: judge the "
                "norm as it is given (norm.eval() makes BatchNorm use its running averages)"
            )
        if not all(torch.equal(p, w) for p, w in zip(norm.parameters(), weights, strict=True)):
            raise Mistake(f"is_per_token changed the weights of {what}: judge the norm as it is given")
        if not isinstance(said, bool):
            raise Mistake(f"is_per_token must return True or False, got {type(said).__name__} {said!r:.40}")
        if said != judged.per_token:
            why = judged.why if judged.per_token else why_not_seen(runs, judged.why)
            raise Mistake(f"is_per_token said {said} for {what}; it is {judged.per_token}: {why}")


def recorded(norm: torch.nn.Module, dim: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The list into which each call of norm puts its input and output rows, to say what a test did."""
    runs: list[tuple[torch.Tensor, torch.Tensor]] = []
    norm.register_forward_hook(lambda _, args, y: runs.append(rows_of(args[0], y, dim)))
    return runs


def rows_of(x: Any, y: Any, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A call's input and output as rows of dim features (empty for what is not a tensor of dim features)."""
    if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape[-1:] == y.shape[-1:] == (dim,)):
        return torch.empty(0, dim), torch.empty(0, dim)
    return x.detach().reshape(-1, dim).clone(), y.detach().reshape(-1, dim).clone()


def why_not_seen(runs: list[tuple[torch.Tensor, torch.Tensor]], why: str) -> str:
    """Why a test said True for a norm that is not per token, read from the calls it made: sub-batches and no token
    alone, or each token alone and differences it averaged away; else the norm's own why."""
    sizes = [len(x) for x, _ in runs]
    if not sizes or max(sizes) < 2:
        return why
    if 1 not in sizes:
        return SUB_BATCH if any(1 < n < max(sizes) for n in sizes) else why
    batch_x, batch_y = runs[sizes.index(max(sizes))]
    gaps = [batch_y[(batch_x == x).all(1)] - y for x, y in runs if len(x) == 1]
    gaps = torch.cat([g for g in gaps if len(g)]) if any(len(g) for g in gaps) else torch.empty(0)
    if len(gaps) and gaps.abs().max() > 1e-2 and gaps.mean().abs() < 1e-3 * gaps.abs().max():
        return SIGNED_MEAN.format(gap=gaps.abs().max().item())
    return why


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
    dgamma = (dy * xn).reshape(-1, x.shape[-1]).sum(0)
    g = dy * gamma
    along = xn * (g * xn).mean(-1, keepdim=True)
    return [
        (
            "dgamma",
            dgamma,
            [
                (off_by_n("dgamma", N), dgamma / N),
                ("dgamma sums dy alone; it sums dy * x * rrms", dy.reshape(-1, x.shape[-1]).sum(0)),
                (
                    "dgamma sums dy * x; it sums dy * x * rrms, the normalized x",
                    (dy * x).reshape(-1, x.shape[-1]).sum(0),
                ),
                (
                    "dgamma sums dy * y, the output; it sums dy * xn, the normalized x (y = xn * gamma)",
                    (dy * xn * gamma).reshape(-1, x.shape[-1]).sum(0),
                ),
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
                    "dx's second term takes the sum of g * xn where the mean belongs: xn * mean(g * xn)",
                    rrms * (g - xn * (g * xn).sum(-1, keepdim=True)),
                ),
                (
                    "dx leaves out gamma: the gradient reaching xn is g = dy * gamma",
                    rrms * (dy - xn * (dy * xn).mean(-1, keepdim=True)),
                ),
            ],
        ),
    ]


@graded("ex7_rms_norm")
def check_ex7(module: ModuleType) -> None:
    """The statement's examples; then RMSNormFunction's forward and backward called directly on each case (as
    autograd calls them, with a ctx): y (without torch's own rms_norm), then dx and dgamma to 1e-8 of float64,
    each of its input's shape and dtype, dy unchanged, no autograd inside backward; then, on each case,
    torch.autograd.gradcheck through RMSNormFunction.apply."""
    check_function(module.RMSNormFunction, ("gamma",), rms_forward, rms_grads, "rms_norm")


# ----------------------------------------------------------------------------------------------------------------
# 8. One cached decoding step of a small attention layer, against the full pass; then with BatchNorm.


class AttentionLayer(torch.nn.Module):
    """The checker's own copy of exercise 8's Attention: its norm, qkv and proj, which decode_step reads."""

    def __init__(self, dim: int, norm: torch.nn.Module) -> None:
        super().__init__()
        self.norm, self.qkv, self.proj = norm, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)


@dataclass(frozen=True)
class Decoded:
    """x [B, T, C] decoded one token at a time through a layer whose norm is `norm`."""

    shape: tuple[int, int, int]
    norm: str

    def __str__(self) -> str:
        return f"x {list(self.shape)} float64, {self.norm}"

    def layer(self) -> AttentionLayer:
        C = self.shape[-1]
        make = {"LayerNorm": LayerNorm, "RMSNorm": RMSNorm, "BatchNorm in training mode": BatchNorm}[self.norm]
        torch.manual_seed(20)  # the Linear layers' weights; the norm's below
        layer = AttentionLayer(C, make(C)).double()
        g = torch.Generator().manual_seed(21)
        with torch.no_grad():
            layer.norm.weight.copy_(1 + 0.5 * torch.randn(C, generator=g, dtype=torch.float64))
            if layer.norm.bias is not None and not isinstance(layer.norm, RMSNorm):
                layer.norm.bias.copy_(torch.randn(C, generator=g, dtype=torch.float64))
        return layer

    def x(self) -> torch.Tensor:
        return torch.randn(self.shape, generator=torch.Generator().manual_seed(22), dtype=torch.float64)


# Widths 12 and 20 about the statement's 16; BatchNorm last: there the step is right when it normalises the new
# tokens alone, layer.norm(x_t), and the full pass is no longer what it gives.
EX8_CASES = [
    Decoded((2, 6, 16), "LayerNorm"),
    Decoded((1, 5, 12), "LayerNorm"),
    Decoded((3, 4, 20), "RMSNorm"),
    Decoded((3, 4, 12), "BatchNorm in training mode"),
]
NO_SELF = (
    "the new token does not attend to its own key: append its key and value to the cache before attending, and mask "
    "none of them (its row of the causal mask is the last, all True)"
)
NOT_APPENDED = "the cache returned holds {got} positions after token {t}; it holds {want}: append the new key and value"
PREPENDED = "the new key and value are put first in the cache; append them at the end, torch.cat([k, k_t], dim=1)"
SWAPPED_CACHE = "the cache is returned as (v, k); it is (k, v)"
PRESCALED = (
    "the cache holds k / sqrt(C): cache the keys as the full pass computes them (a cache is read by other code) and "
    "divide the scores, q . k / sqrt(C)"
)
CACHE_CHANGED = "decode_step changed the cache it was given ({what}): return a new one, torch.cat makes new tensors"


def attend(layer: AttentionLayer, x_t: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, **how: Any) -> Any:
    """One step's output in float64, and its wrong variants: the new token's (q from h) against keys and values
    [B, S, C]; how: scale (the divisor), h (the normalised x_t), residual (what is added back)."""
    h = how.get("h", layer.norm(x_t))
    q = layer.qkv(h).chunk(3, dim=-1)[0]
    scale = how.get("scale", math.sqrt(x_t.shape[-1]))
    scores = (q[:, None] @ keys.transpose(-2, -1)) / scale
    a = (scores.softmax(how.get("softmax_dim", -1)) @ values)[:, 0]
    return how.get("residual", x_t) + layer.proj(a)


def step_variants(layer: AttentionLayer, x_t: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> list:
    """The usual wrong outputs of one step whose right keys and values (the new token's last) are given."""
    C, T = x_t.shape[-1], keys.shape[1]
    h = layer.norm(x_t)
    variants = [(NO_SELF, attend(layer, x_t, keys[:, :-1], values[:, :-1]))] if T > 1 else []
    variants += [
        (
            "the scores are not divided by sqrt(C): q . k / sqrt(C), as in the full pass",
            attend(layer, x_t, keys, values, scale=1.0),
        ),
        (
            "the scores are divided by sqrt(T), the number of cached tokens; the full pass divides by sqrt(C)",
            attend(layer, x_t, keys, values, scale=math.sqrt(T)),
        ),
        ("the residual is left out: y_t = x_t + proj(a_t)", attend(layer, x_t, keys, values, residual=0.0)),
        ("the residual adds h = norm(x_t); it adds x_t, the input", attend(layer, x_t, keys, values, residual=h)),
        (
            "x_t is not normalised: q, k and v come from h = layer.norm(x_t)",
            own_norm_step(layer, x_t, keys, values, lambda x: x),
        ),
        (
            "you normalised with a LayerNorm of your own; use layer.norm, the layer's norm, whatever it is",
            own_norm_step(layer, x_t, keys, values, lambda x: F.layer_norm(x, (C,))),
        ),
        (
            "the new token attends to the first token only (a causal mask's first row); it sees every cached token",
            attend(layer, x_t, keys[:, :1], values[:, :1]),
        ),
        (
            "the softmax is taken over the batch (dim 0); it is over the keys, the last dim of the scores [B, T]",
            attend(layer, x_t, keys, values, softmax_dim=0),
        ),
    ]
    variants += [
        (
            f"the new token attends to the last {w} tokens only (a cache cut short); it attends to every token so far",
            attend(layer, x_t, keys[:, -w:], values[:, -w:]),
        )
        for w in range(2, T)
    ]
    return variants


def own_norm_step(
    layer: AttentionLayer, x_t: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, norm: Callable
) -> Any:
    """A step whose new key and value, like its query, come from norm(x_t) in place of layer.norm(x_t)."""
    h = norm(x_t)
    _, k, v = layer.qkv(h).chunk(3, dim=-1)
    keys, values = torch.cat([keys[:, :-1], k[:, None]], 1), torch.cat([values[:, :-1], v[:, None]], 1)
    return attend(layer, x_t, keys, values, h=h)


@graded("ex8_kv_cache")
def check_ex8(module: ModuleType) -> None:
    """The statement's examples; then decode_step on each case, token by token from an empty cache: each output
    [B, C] to 1e-10 of the full causal pass's row (with BatchNorm in training mode, of the step that normalises
    the new tokens alone, which the full pass is not), the cache returned (k, v), each [B, t + 1, C], holding the
    full pass's keys and values, and the cache given left as it was."""
    for case in EX8_CASES:
        layer, x = case.layer(), case.x()
        with torch.no_grad():
            if case.norm == "BatchNorm in training mode":  # what the cache can give: each step's tokens alone
                h = torch.stack([layer.norm(x[:, t]) for t in range(x.shape[1])], dim=1)
            else:
                h = layer.norm(x)
            _, all_keys, all_values = layer.qkv(h).chunk(3, dim=-1)
            cache = None
            for t in range(x.shape[1]):
                what = f"decode_step on {case}, token {t}"
                given = None if cache is None else tuple(c.clone() for c in cache)
                out = call(what, module.decode_step, {"layer": layer, "x_t": x[:, t], "cache": cache})
                if not layer.training:
                    raise Mistake(
                        f"decode_step switched the layer to eval mode ({what}): use it as it is given (layer.eval() "
                        "makes BatchNorm use its running averages)"
                    )
                if given is not None and not all(torch.equal(a, b) for a, b in zip(cache, given, strict=True)):
                    raise Mistake(CACHE_CHANGED.format(what=what))
                y_t, cache = decoded(what, out)
                keys, values = all_keys[:, : t + 1], all_values[:, : t + 1]
                check_tensor(f"y_t from {what}", y_t, x[:, t])
                right = attend(layer, x[:, t], keys, values, h=h[:, t])
                compare(f"y_t from {what}", y_t, right, step_variants(layer, x[:, t], keys, values), 1e-10)
                check_cache(what, cache, keys, values, t)


def decoded(what: str, out: Any) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    """(y_t, (k, v)) from what decode_step returned, its structure checked."""
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise Mistake(f"{what}: decode_step returns (y_t, (k, v)); got {type(out).__name__} {out!r:.40}")
    y_t, cache = out
    if not (isinstance(cache, tuple | list) and len(cache) == 2 and all(isinstance(c, torch.Tensor) for c in cache)):
        raise Mistake(f"{what}: the cache it returns is (k, v), two tensors [B, T + 1, C]; got {type(cache).__name__}")
    return y_t, tuple(cache)


def check_cache(
    what: str, cache: tuple[torch.Tensor, torch.Tensor], keys: torch.Tensor, values: torch.Tensor, t: int
) -> None:
    """The returned cache against the full pass's keys and values of tokens 0..t."""
    k, v = cache
    if k.dim() == 3 and k.shape[1] != t + 1:
        raise Mistake(f"{what}: {NOT_APPENDED.format(got=k.shape[1], t=t, want=t + 1)}")
    for name, got, right in (("k", k, keys), ("v", v, values)):
        check_tensor(f"the cache's {name} from {what}", got, right)
    if max_error(k, keys) <= 1e-10 and max_error(v, values) <= 1e-10:
        return
    if max_error(k, values) <= 1e-10 and max_error(v, keys) <= 1e-10:
        raise Mistake(f"{what}: {SWAPPED_CACHE}")
    if t and max_error(k, keys.roll(1, 1)) <= 1e-10:
        raise Mistake(f"{what}: {PREPENDED}")
    if max_error(k, keys / math.sqrt(k.shape[-1])) <= 1e-10:
        raise Mistake(f"{what}: {PRESCALED}")
    compare(f"the cache's k from {what}", k, keys, [], 1e-10)
    compare(f"the cache's v from {what}", v, values, [], 1e-10)


CHECKS: dict[int, Callable[[ModuleType], str]] = {
    1: check_ex1,
    2: check_ex2,
    3: check_ex3,
    4: check_ex4,
    5: check_ex5,
    6: check_ex6,
    7: check_ex7,
    8: check_ex8,
}
CASES: dict[int, list] = {
    1: EX1_CASES,
    2: EX2_CASES,
    3: EX3_CASES,
    4: GRAD_CASES,
    5: EX5_CASES,
    6: NORMS,
    7: GRAD_CASES,
    8: EX8_CASES,
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
