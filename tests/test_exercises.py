"""The exercises' checker: every reference solution passes, every stub is "not started", each message is what a
planted wrong solution gets, and the stubs' doctest examples hold for the solutions. The learner's work is never
graded here: a stub the learner has edited is skipped, so half-finished work never fails the suite."""

from __future__ import annotations

import ast
import doctest
import importlib
import re
import runpy
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from exercises import check
from exercises.__main__ import FILES, grade, main
from helpers import ROOT

TRITON_WHY = check.triton_unavailable()
needs_interpreter = pytest.mark.skipif(TRITON_WHY is not None, reason=f"the Triton exercise: {TRITON_WHY}")
EXERCISES = [pytest.param(n, marks=needs_interpreter) if n in check.TRITON_EXERCISES else n for n in sorted(FILES)]


GIVEN = ("layer_norm_fwd_kernel", "layer_norm_triton")  # exercise 5's kernel and launcher: read, not written


def functions(path: Path) -> dict[str, ast.FunctionDef]:
    return {f.name: f for f in ast.walk(ast.parse(path.read_text())) if isinstance(f, ast.FunctionDef)}


def shipped_stub(n: int) -> ModuleType:
    """The learner's file for exercise n, if it is still the stub as shipped: every function raises
    NotImplementedError but those given, which are as the solution has them. Else the test is skipped: the suite
    never grades the learner's work."""
    path = ROOT / "exercises" / f"{FILES[n]}.py"
    solution = functions(ROOT / "exercises" / "solutions" / path.name)
    for name, f in functions(path).items():
        raises = [ast.unparse(s) for s in f.body] == ["raise NotImplementedError"]
        given = name in GIVEN and name in solution and ast.dump(f) == ast.dump(solution[name])
        if not (raises or given):
            pytest.skip(f"exercises/{path.name} has been edited: the checker is tested on the stubs as shipped")
    return importlib.import_module(f"exercises.{FILES[n]}")


@pytest.mark.parametrize("n", EXERCISES)
def test_every_solution_passes(n: int) -> None:
    assert grade(n, "exercises.solutions") == check.PASS


@pytest.mark.parametrize("n", EXERCISES)
def test_every_stub_is_not_started(n: int) -> None:
    assert check.CHECKS[n](shipped_stub(n)) == check.NOT_STARTED


@pytest.mark.parametrize("n", EXERCISES)
def test_the_stubs_examples_hold_for_the_solutions(n: int) -> None:
    solution = importlib.import_module(f"exercises.solutions.{FILES[n]}")
    tests = [t for t in doctest.DocTestFinder().find(shipped_stub(n)) if t.examples]
    assert tests, f"{FILES[n]}.py has no doctest examples"
    runner = doctest.DocTestRunner()
    for test in tests:
        test.globs = dict(vars(solution))
        runner.run(test)
    assert runner.failures == 0


def test_main_prints_a_line_per_exercise_and_exits_0_when_each_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([], "exercises.solutions") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"exercise {n} ({FILES[n]}.py)" for n in FILES]
    assert all(line.endswith(": PASS") or ": skipped: " in line for line in lines), lines
    assert main(["4"], "exercises.solutions") == 0
    assert capsys.readouterr().out == "exercise 4 (ex4_backward.py): PASS\n"


def test_main_exits_1_when_one_does_not_pass(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(check.CHECKS, 2, lambda module: check.SAMPLE_VARIANCE)
    assert main(["2"], "exercises.solutions") == 1
    assert capsys.readouterr().out == f"exercise 2 (ex2_layer_norm.py): {check.SAMPLE_VARIANCE}\n"


def test_python_m_exercises_refuses_an_n_that_is_no_exercise(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["exercises", "8"])
    with pytest.raises(SystemExit) as stopped:  # `python -m exercises 8`, its __main__ block included, in-process
        runpy.run_path(str(ROOT / "exercises" / "__main__.py"), run_name="__main__")
    assert stopped.value.code == 2
    assert capsys.readouterr() == ("", "usage: python -m exercises [N], N one of 1, 2, 3, 4, 5, 6, 7; got 8\n")


def test_the_triton_exercise_is_skipped_where_it_cannot_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError, as where it is missing
    assert grade(5, "exercises.solutions").startswith("skipped: triton cannot be imported here")
    assert main(["5"], "exercises.solutions") == 0  # skipped is no failure
    monkeypatch.undo()
    if TRITON_WHY is None:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert grade(5, "exercises.solutions").startswith("skipped: it runs under Triton's interpreter")


def test_a_file_that_does_not_import_gets_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "planted_syntax").mkdir()
    (tmp_path / "planted_syntax" / "ex2_layer_norm.py").write_text("def layer_norm(x, gamma, beta, eps)\n    pass\n")
    result = grade(2, "planted_syntax")
    assert result.startswith("ex2_layer_norm.py does not import: SyntaxError") and "\n" not in result, result


def test_an_exception_gets_one_line_that_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "planted_raises").mkdir()
    (tmp_path / "planted_raises" / "ex2_layer_norm.py").write_text(
        "def layer_norm(x, gamma, beta, eps):\n    return x.mean(dim=5)\n"
    )
    result = grade(2, "planted_raises")
    assert result.startswith("IndexError (in layer_norm, line 2): Dimension out of range"), result
    assert "\n" not in result and "Traceback" not in result


# ----------------------------------------------------------------------------------------------------------------
# Planted wrong solutions, each written as a learner would get it wrong, with the message it must get.


class Textbook:
    """docs/01's LayerNorm1d as printed: the sample variance."""

    def __init__(self, dim, eps=1e-5):
        self.eps = eps
        self.gamma = torch.ones(dim)
        self.beta = torch.zeros(dim)

    def __call__(self, x):
        xhat = (x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, keepdim=True) + self.eps)
        return self.gamma * xhat + self.beta


class OverTheBatch(Textbook):
    """BatchNorm1d's statistics: over dim 0."""

    def __call__(self, x):
        xhat = (x - x.mean(0, keepdim=True)) / torch.sqrt(x.var(0, keepdim=True, correction=0) + self.eps)
        return self.gamma * xhat + self.beta


class KeepsARunningMean(Textbook):
    """Right on its first call; then, like BatchNorm1d's running mean, it mixes the batch's mean into each row's."""

    def __call__(self, x):
        mean = x.mean(1, keepdim=True)
        var = x.var(1, keepdim=True, correction=0)
        if hasattr(self, "running_mean"):
            mean = 0.9 * mean + 0.1 * self.running_mean
        self.running_mean = x.mean()
        return self.gamma * (x - mean) / torch.sqrt(var + self.eps) + self.beta


class SmallerEps(Textbook):
    def __init__(self, dim, eps=1e-6):
        super().__init__(dim, eps)


class RandomGamma(Textbook):
    def __init__(self, dim, eps=1e-5):
        super().__init__(dim, eps)
        self.gamma = torch.randn(dim)


class CallNotWritten(Textbook):
    def __call__(self, x):
        raise NotImplementedError


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (Textbook, check.SAMPLE_VARIANCE),
        (OverTheBatch, "you reduced over dim 0: the batch; LayerNorm reduces over the last dim only"),
        (KeepsARunningMean, "row 0's output changed by"),
        (SmallerEps, "LayerNorm1d(16).eps is 1e-06; the default is 1e-5"),
        (RandomGamma, "LayerNorm1d(16).gamma must start as torch.ones(16)"),
        (CallNotWritten, "not finished: __init__ runs; __call__ still raises NotImplementedError"),
    ],
)
def test_ex1_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex1(SimpleNamespace(LayerNorm1d=wrong))
    assert result.startswith(message) and "\n" not in result, result


def centred(x, dims=-1):
    return x - x.mean(dims, keepdim=True)


def ln_sample_variance(x, gamma, beta, eps):
    return centred(x) / torch.sqrt(x.var(-1, keepdim=True) + eps) * gamma + beta


def ln_eps_outside(x, gamma, beta, eps):
    return centred(x) / (x.std(-1, keepdim=True, correction=0) + eps) * gamma + beta


def ln_eps_left_out(x, gamma, beta, eps):
    return centred(x) / x.std(-1, keepdim=True, correction=0) * gamma + beta


def ln_dim_1(x, gamma, beta, eps):  # right for a 2-D x only
    return centred(x, 1) / torch.sqrt(centred(x, 1).square().mean(1, keepdim=True) + eps) * gamma + beta


def ln_dim_0(x, gamma, beta, eps):
    return centred(x, 0) / torch.sqrt(x.var(0, keepdim=True, correction=0) + eps) * gamma + beta


def ln_every_dim(x, gamma, beta, eps):
    return (x - x.mean()) / torch.sqrt(x.var(correction=0) + eps) * gamma + beta


def ln_swapped(x, gamma, beta, eps):
    return centred(x) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps) * beta + gamma


def ln_no_affine(x, gamma, beta, eps):
    return centred(x) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps)


def ln_no_sqrt(x, gamma, beta, eps):
    return centred(x) / (x.var(-1, keepdim=True, correction=0) + eps) * gamma + beta


def ln_no_return(x, gamma, beta, eps):
    y = centred(x) / torch.sqrt(x.var(-1, keepdim=True, correction=0) + eps) * gamma + beta  # noqa: F841


def ln_rows_flattened(x, gamma, beta, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps).reshape(-1, x.shape[-1])


def ln_as_a_list(x, gamma, beta, eps):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], gamma, beta, eps).tolist()


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (ln_sample_variance, check.SAMPLE_VARIANCE),
        (ln_eps_outside, check.EPS_OUTSIDE),
        (ln_eps_left_out, check.EPS_LEFT_OUT),
        (ln_dim_1, "you reduced over dim 1; LayerNorm reduces over the last dim only"),
        (ln_dim_0, "you reduced over dim 0: the batch; LayerNorm reduces over the last dim only"),
        (ln_every_dim, check.ALL_DIMS),
        (ln_swapped, check.SWAPPED),
        (ln_no_affine, check.NO_AFFINE),
        (ln_no_sqrt, "layer_norm of x of shape [4, 3, 8] (eps=0.01) is off by"),
        (ln_no_return, "layer_norm of x of shape [4, 3, 8] (eps=0.01) is None: a return statement missing?"),
        (ln_rows_flattened, "layer_norm of x of shape [4, 3, 8] (eps=0.01) has shape [12, 8]; expected [4, 3, 8]"),
        (ln_as_a_list, "layer_norm of x of shape [4, 3, 8] (eps=0.01) must be a tensor, got list"),
    ],
)
def test_ex2_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex2(SimpleNamespace(layer_norm=wrong))
    assert result.startswith(message) and "\n" not in result, result


def test_ex2_gives_the_numbers_that_show_it() -> None:
    matched = check.check_ex2(SimpleNamespace(layer_norm=ln_sample_variance))
    to, off = (float(n) for n in re.search(r"matches that to (\S+); it is off by (\S+)\)", matched).groups())
    assert to < 1e-12 and off > 1e-2, matched
    unmatched = check.check_ex2(SimpleNamespace(layer_norm=ln_no_sqrt))
    error, at, want, got = re.search(r"off by (\S+) at index (\[.*?\]): expected (\S+), got (\S+) ", unmatched).groups()
    x = check.rows((4, 3, 8), torch.float64, seed=0)
    gamma, beta = check.params(8, torch.float64, seed=10)
    index = tuple(int(i) for i in at.strip("[]").split(", "))
    right = check.ln(x, gamma, beta, 1e-2)[index].item()
    wrong = ln_no_sqrt(x, gamma, beta, 1e-2)[index].item()
    assert (float(want), float(got)) == pytest.approx((right, wrong), rel=1e-5)
    assert float(error) == pytest.approx(abs(right - wrong), rel=1e-2), unmatched


def naive_variance(x):
    return x.square().mean(-1) - x.mean(-1).square()


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (naive_variance, f"{check.PRECISION}: right at offset 0, off by"),
        (lambda x: x.var(-1), check.SAMPLE_VARIANCE),
        (lambda x: x.double().var(-1, correction=0), "variance returned torch.float64"),
        (lambda x: x.var(-1, keepdim=True, correction=0), "variance at offset 0 has shape [64, 1]; expected [64]"),
    ],
)
def test_ex3_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex3(SimpleNamespace(variance=wrong))
    assert result.startswith(message), result
    if wrong is naive_variance:  # the error far from 0 is the variance's own size or more, not float32 rounding
        assert float(result.split("off by ")[1].split()[0]) > 1e-2 and "at offset 1e4" in result, result


@pytest.mark.parametrize(
    "right",
    [lambda x: x.var(-1, correction=0), lambda x: centred(x).square().mean(-1)],
    ids=["torch's var", "two passes"],
)
def test_ex3_passes_other_right_answers(right) -> None:
    assert check.check_ex3(SimpleNamespace(variance=right)) == check.PASS


def function(forward, backward):
    """An autograd.Function: forward(x, *weights, eps) gives (y, what to save), backward(*saved, dy) the gradients."""

    class Planted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            y, saved = forward(*inputs)
            ctx.save_for_backward(*saved)
            return y

        @staticmethod
        def backward(ctx, dy):
            return backward(*ctx.saved_tensors, dy)

    return Planted


def rows_sum(t):
    return t.reshape(-1, t.shape[-1]).sum(0)


def rows_mean(t):
    return t.reshape(-1, t.shape[-1]).mean(0)


def ln_forward(x, gamma, beta, eps, correction=0):
    rstd = torch.rsqrt(x.var(-1, keepdim=True, correction=correction) + eps)
    xhat = centred(x) * rstd
    return xhat * gamma + beta, (xhat, rstd, gamma)


def ln_dx(xhat, rstd, gamma, dy, mean_term=True, along_term=True, gamma_in_g=True):
    g = dy * gamma if gamma_in_g else dy
    mean = g.mean(-1, keepdim=True) if mean_term else 0
    along = xhat * (g * xhat).mean(-1, keepdim=True) if along_term else 0
    return rstd * (g - mean - along)


def ln_backward(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat), rows_sum(dy), None


def ln_sample_forward(x, gamma, beta, eps):
    return ln_forward(x, gamma, beta, eps, correction=1)


def dgamma_mean(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), rows_mean(dy * xhat), rows_sum(dy), None


def dbeta_mean(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat), rows_mean(dy), None


def dgamma_of_dy(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), rows_sum(dy), rows_sum(dy), None


def dgamma_of_centred_x(xhat, rstd, gamma, dy):  # x - mean saved where xhat belongs
    return ln_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat / rstd), rows_sum(dy), None


def dx_without_the_mean(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy, mean_term=False), rows_sum(dy * xhat), rows_sum(dy), None


def dx_without_the_along(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy, along_term=False), rows_sum(dy * xhat), rows_sum(dy), None


def dx_without_either(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy, False, False), rows_sum(dy * xhat), rows_sum(dy), None


def dx_without_gamma(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy, gamma_in_g=False), rows_sum(dy * xhat), rows_sum(dy), None


def none_for_dgamma(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), None, rows_sum(dy), None


def no_none_for_eps(xhat, rstd, gamma, dy):
    return ln_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat), rows_sum(dy)


def backward_not_written(xhat, rstd, gamma, dy):
    raise NotImplementedError


def right_for_a_dense_dy(xhat, rstd, gamma, dy):  # wrong for gradcheck's one-hot dy: only gradcheck catches it
    dx = ln_dx(xhat, rstd, gamma, dy)
    return (dx if dy.count_nonzero() > 1 else 1.5 * dx), rows_sum(dy * xhat), rows_sum(dy), None


@pytest.mark.parametrize(
    ("forward", "backward", "message"),
    [
        (ln_sample_forward, ln_backward, f"{check.SAMPLE_VARIANCE} (the forward's output matches"),
        (ln_forward, dgamma_mean, "dgamma is off by a factor of N=12: you took the mean over rows, not the sum"),
        (ln_forward, dbeta_mean, "dbeta is off by a factor of N=12: you took the mean over rows, not the sum"),
        (ln_forward, dgamma_of_dy, "dgamma sums dy alone, which is dbeta"),
        (ln_forward, dgamma_of_centred_x, "dgamma sums dy * (x - mean); dgamma sums dy * xhat"),
        (ln_forward, dx_without_the_mean, "dx leaves out the -mean(g) term"),
        (ln_forward, dx_without_the_along, "dx leaves out the -xhat * mean(g * xhat) term"),
        (ln_forward, dx_without_either, "dx leaves out both terms: it is only rstd * dy * gamma"),
        (ln_forward, dx_without_gamma, "dx leaves out gamma: the gradient reaching xhat is g = dy * gamma"),
        (ln_forward, none_for_dgamma, "backward returned None for dgamma"),
        (ln_forward, no_none_for_eps, "RuntimeError: function PlantedBackward returned an incorrect number"),
        (ln_forward, backward_not_written, "not finished: the forward runs; backward still raises"),
        (ln_forward, right_for_a_dense_dy, "torch.autograd.gradcheck fails"),
    ],
)
def test_ex4_names_the_mistake(forward, backward, message: str) -> None:
    result = check.check_ex4(SimpleNamespace(LayerNormFunction=function(forward, backward)))
    assert result.startswith(message) and "\n" not in result, result


def triton_solution_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, right: str, wrong: str) -> ModuleType:
    """The Triton solution with one line of its statistics made wrong, as a module of its own file."""
    text = (ROOT / "exercises" / "solutions" / "ex5_triton_forward.py").read_text()
    assert text.count(right) == 1
    (tmp_path / "planted_triton.py").write_text(text.replace(right, wrong))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "planted_triton", raising=False)
    return importlib.import_module("planted_triton")


@needs_interpreter
@pytest.mark.parametrize(
    ("right", "wrong", "message"),
    [
        ("tl.where(mask, x - mean, 0.0)", "x - mean", check.PADDING),
        ("tl.sqrt(var + eps)", "(tl.sqrt(var) + eps)", check.EPS_OUTSIDE),
        ("var = tl.sum(xc * xc, axis=0) / C", "var = tl.sum(xc * xc, axis=0) / (C - 1)", check.SAMPLE_VARIANCE),
        ("tl.sum(x, axis=0)", "tl.summ(x, axis=0)", "AttributeError (in row_statistics, line 10): module"),
    ],
)
def test_ex5_names_the_mistake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, right, wrong, message) -> None:
    result = check.check_ex5(triton_solution_with(tmp_path, monkeypatch, right, wrong))
    assert result.startswith(message) and "\n" not in result, result


def same_batch_twice(norm, dim):  # compares the batch with itself: never looks at a token alone
    x = torch.randn(8, dim)
    return bool(torch.equal(norm(x), norm(x)))


def one_copied_token(norm, dim):  # alone vs in a batch of copies of itself: nothing to differ by
    x = torch.randn(1, dim).expand(8, dim)
    with torch.no_grad():
        return bool(torch.allclose(norm(x)[:1], norm(x[:1]), atol=1e-6))


def by_class_name(norm, dim):
    return not isinstance(norm, check.BatchNorm)


def in_eval_mode(norm, dim):  # BatchNorm in eval mode uses its running averages: per token
    norm.eval()
    x = torch.randn(8, dim)
    with torch.no_grad():
        return torch.equal(norm(x), torch.cat([norm(x[i : i + 1]) for i in range(8)]))


def bit_for_bit(norm, dim):  # what the hint allows: torch.equal
    x = torch.randn(8, dim)
    with torch.no_grad():
        return torch.equal(norm(x), torch.cat([norm(x[i : i + 1]) for i in range(8)]))


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (same_batch_twice, "is_per_token said True for BatchNorm in training mode"),
        (one_copied_token, "is_per_token said True for BatchNorm in training mode"),
        (in_eval_mode, "is_per_token said True for BatchNorm in training mode"),
        (by_class_name, "is_per_token said False for BatchNorm in eval mode"),
        (lambda norm, dim: False, "is_per_token said False for LayerNorm; it is True"),
        (lambda norm, dim: torch.tensor(True), "is_per_token must return True or False, got Tensor"),
    ],
)
def test_ex6_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex6(SimpleNamespace(is_per_token=wrong))
    assert result.startswith(message), result


def test_ex6_passes_a_bit_for_bit_comparison() -> None:
    assert check.check_ex6(SimpleNamespace(is_per_token=bit_for_bit)) == check.PASS


def rms_forward(x, gamma, eps, subtract_mean=False, sum_of_squares=False, eps_outside=False, dim=-1, scale=True):
    x = centred(x) if subtract_mean else x
    squares = x.square().sum(dim, keepdim=True) if sum_of_squares else x.square().mean(dim, keepdim=True)
    rrms = 1 / (squares.sqrt() + eps) if eps_outside else torch.rsqrt(squares + eps)
    xn = x * rrms
    return (xn * gamma if scale else xn), (xn, rrms, gamma)


def rms_dx(xn, rrms, gamma, dy, along_term=True, mean_term=False, gamma_in_g=True):
    g = dy * gamma if gamma_in_g else dy
    mean = g.mean(-1, keepdim=True) if mean_term else 0
    along = xn * (g * xn).mean(-1, keepdim=True) if along_term else 0
    return rrms * (g - mean - along)


def rms_backward(xn, rrms, gamma, dy):
    return rms_dx(xn, rrms, gamma, dy), rows_sum(dy * xn), None


@pytest.mark.parametrize(
    ("forward", "backward", "message"),
    [
        ({"subtract_mean": True}, rms_backward, "you subtracted the mean: RMSNorm does not centre the row"),
        ({"eps_outside": True}, rms_backward, "eps is added outside the square root: sqrt(mean(x^2)) + eps"),
        ({"sum_of_squares": True}, rms_backward, "you divided by the root of the sum of squares"),
        ({"dim": 0}, rms_backward, "you reduced over dim 0: the batch; RMSNorm reduces over the last dim only"),
        ({"scale": False}, rms_backward, "your output ignores gamma: y = x * rrms * gamma"),
        (
            {},
            lambda xn, r, g, dy: (rms_dx(xn, r, g, dy), rows_mean(dy * xn), None),
            "dgamma is off by a factor of N=12",
        ),
        ({}, lambda xn, r, g, dy: (rms_dx(xn, r, g, dy), rows_sum(dy), None), "dgamma sums dy alone"),
        (
            {},
            lambda xn, r, g, dy: (rms_dx(xn, r, g, dy, along_term=False), rows_sum(dy * xn), None),
            "dx leaves out the -xn",
        ),
        (
            {},
            lambda xn, r, g, dy: (rms_dx(xn, r, g, dy, mean_term=True), rows_sum(dy * xn), None),
            "dx subtracts mean(g)",
        ),
        (
            {},
            lambda xn, r, g, dy: (rms_dx(xn, r, g, dy, gamma_in_g=False), rows_sum(dy * xn), None),
            "dx leaves out gamma",
        ),
        ({}, backward_not_written, "not finished: the forward runs; backward still raises NotImplementedError"),
    ],
)
def test_ex7_names_the_mistake(forward: dict, backward, message: str) -> None:
    planted = function(lambda x, gamma, eps: rms_forward(x, gamma, eps, **forward), backward)
    result = check.check_ex7(SimpleNamespace(RMSNormFunction=planted))
    assert result.startswith(message) and "\n" not in result, result
