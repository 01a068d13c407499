"""The exercises' checker: every reference solution passes, every stub is "not started", each diagnosis is what a
planted wrong solution gets, and the stubs' doctest examples hold for the solutions. The learner's own files are
never graded for PASS here, so half-finished work never fails the suite."""

from __future__ import annotations

import doctest
import importlib
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from exercises import check
from exercises.__main__ import FILES, grade
from helpers import ROOT

EXERCISES = sorted(FILES)


@pytest.mark.parametrize("n", EXERCISES)
def test_every_solution_passes(n: int) -> None:
    assert grade(n, "exercises.solutions") == check.PASS


@pytest.mark.parametrize("n", EXERCISES)
def test_every_stub_is_not_started(n: int) -> None:
    stub = importlib.import_module(f"exercises.{FILES[n]}")
    assert check.CHECKS[n](stub) == check.NOT_STARTED


@pytest.mark.parametrize("n", EXERCISES)
def test_the_stubs_examples_hold_for_the_solutions(n: int) -> None:
    stub = importlib.import_module(f"exercises.{FILES[n]}")
    solution = importlib.import_module(f"exercises.solutions.{FILES[n]}")
    tests = [t for t in doctest.DocTestFinder().find(stub) if t.examples]
    assert tests, f"{FILES[n]}.py has no doctest examples"
    runner = doctest.DocTestRunner()
    for test in tests:
        test.globs = dict(vars(solution))
        runner.run(test)
    assert runner.failures == 0


def test_the_cli_grades_one_or_all_and_exits_1_on_stubs() -> None:
    one = subprocess.run([sys.executable, "-m", "exercises", "3"], cwd=ROOT, capture_output=True, text=True)
    assert (one.returncode, one.stdout, one.stderr) == (1, "exercise 3 (ex3_backward.py): not started\n", "")
    every = subprocess.run([sys.executable, "-m", "exercises"], cwd=ROOT, capture_output=True, text=True)
    assert every.returncode == 1 and every.stdout.count("not started") == 6 and "Traceback" not in every.stderr
    bad = subprocess.run([sys.executable, "-m", "exercises", "7"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "N one of 1, 2, 3, 4, 5, 6; got 7" in bad.stderr


# ----------------------------------------------------------------------------------------------------------------
# Planted wrong solutions, each written as a learner would get it wrong.


def ln_sample_variance(x, gamma, beta, eps):
    return (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + eps) * gamma + beta


def ln_eps_outside(x, gamma, beta, eps):
    return (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True, correction=0) + eps) * gamma + beta


def ln_dim_1(x, gamma, beta, eps):  # right for a 2-D x only
    mean = x.mean(1, keepdim=True)
    return (x - mean) / torch.sqrt((x - mean).square().mean(1, keepdim=True) + eps) * gamma + beta


def ln_raises(x, gamma, beta, eps):
    return x.mean(dim=5)


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (ln_sample_variance, check.SAMPLE_VARIANCE),
        (ln_eps_outside, check.EPS_OUTSIDE),
        (ln_dim_1, "you reduced over dim 1; LayerNorm reduces over the last dim only"),
        (ln_raises, "IndexError: Dimension out of range"),
    ],
)
def test_ex1_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex1(SimpleNamespace(layer_norm=wrong))
    assert result.startswith(message) and "\n" not in result, result
    if wrong is ln_sample_variance:  # with the numbers that show it: matched to ~1e-16, off by more than 1e-2
        matched, off = (float(n) for n in re.search(r"matches that to (\S+); it is off by (\S+)\)", result).groups())
        assert matched < 1e-12 and off > 1e-2, result


class Textbook:
    """docs/01's LayerNorm1d as printed: the sample variance."""

    def __init__(self, dim, eps=1e-5):
        self.eps, self.gamma, self.beta = eps, torch.ones(dim), torch.zeros(dim)

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


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (Textbook, check.SAMPLE_VARIANCE),
        (OverTheBatch, check.reduced_over(0)),
        (KeepsARunningMean, "row 0's output changed by"),
    ],
)
def test_ex2_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex2(SimpleNamespace(LayerNorm1d=wrong))
    assert result.startswith(message), result
    if wrong is OverTheBatch:
        assert "you reduced over dim 0: the batch" in result


def layer_norm_function(backward):
    """A LayerNormFunction with the reference forward and the given backward(xhat, rstd, gamma, dy)."""
    solution = importlib.import_module("exercises.solutions.ex3_backward").LayerNormFunction

    class Planted(torch.autograd.Function):
        forward = staticmethod(solution.forward)

        @staticmethod
        def backward(ctx, dy):
            return backward(*ctx.saved_tensors, dy)

    return Planted


def rows_sum(t):
    return t.reshape(-1, t.shape[-1]).sum(0)


def rows_mean(t):
    return t.reshape(-1, t.shape[-1]).mean(0)


def right_dx(xhat, rstd, gamma, dy):
    g = dy * gamma
    return rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))


def dgamma_mean(xhat, rstd, gamma, dy):
    return right_dx(xhat, rstd, gamma, dy), rows_mean(dy * xhat), rows_sum(dy), None


def dbeta_mean(xhat, rstd, gamma, dy):
    return right_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat), rows_mean(dy), None


def dx_without_the_mean(xhat, rstd, gamma, dy):
    g = dy * gamma
    return rstd * (g - xhat * (g * xhat).mean(-1, keepdim=True)), rows_sum(dy * xhat), rows_sum(dy), None


def no_none_for_eps(xhat, rstd, gamma, dy):
    return right_dx(xhat, rstd, gamma, dy), rows_sum(dy * xhat), rows_sum(dy)


@pytest.mark.parametrize(
    ("backward", "message"),
    [
        (dgamma_mean, "dgamma is off by a factor of N=12"),
        (dbeta_mean, "dbeta is off by a factor of N=12"),
        (dx_without_the_mean, "dx leaves out the -mean(g) term"),
        (no_none_for_eps, "RuntimeError: function PlantedBackward returned an incorrect number of gradients"),
    ],
)
def test_ex3_names_the_mistake(backward, message: str) -> None:
    result = check.check_ex3(SimpleNamespace(LayerNormFunction=layer_norm_function(backward)))
    assert result.startswith(message) and "\n" not in result, result


def test_ex3_gradcheck_catches_what_the_variants_do_not() -> None:
    """A backward right for a dense dy, the checker's, and wrong for gradcheck's one-hot ones."""

    def right_for_a_dense_dy(xhat, rstd, gamma, dy):
        dx = right_dx(xhat, rstd, gamma, dy)
        return (dx if dy.count_nonzero() > 1 else 1.5 * dx), rows_sum(dy * xhat), rows_sum(dy), None

    result = check.check_ex3(SimpleNamespace(LayerNormFunction=layer_norm_function(right_for_a_dense_dy)))
    assert result.startswith("torch.autograd.gradcheck fails"), result


def rms_norm_function(forward_centred: bool = False, dx_like_layer_norm: bool = False, dgamma_mean: bool = False):
    class Planted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, gamma, eps):
            xc = x - x.mean(-1, keepdim=True) if forward_centred else x
            rrms = torch.rsqrt(xc.square().mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(xc * rrms, rrms, gamma)
            return xc * rrms * gamma

        @staticmethod
        def backward(ctx, dy):
            xn, rrms, gamma = ctx.saved_tensors
            g = dy * gamma
            dx = rrms * (g - xn * (g * xn).mean(-1, keepdim=True))
            if dx_like_layer_norm:
                dx = dx - rrms * g.mean(-1, keepdim=True)
            return dx, (rows_mean if dgamma_mean else rows_sum)(dy * xn), None

    return Planted


@pytest.mark.parametrize(
    ("planted", "message"),
    [
        ({"forward_centred": True}, "you subtracted the mean: RMSNorm does not centre the row"),
        ({"dx_like_layer_norm": True}, "dx subtracts mean(g): that term is LayerNorm's"),
        ({"dgamma_mean": True}, "dgamma is off by a factor of N=12"),
    ],
)
def test_ex4_names_the_mistake(planted: dict, message: str) -> None:
    result = check.check_ex4(SimpleNamespace(RMSNormFunction=rms_norm_function(**planted)))
    assert result.startswith(message), result


def same_batch_twice(norm, dim):  # compares the batch with itself: never looks at a token alone
    x = torch.randn(8, dim)
    return bool(torch.equal(norm(x), norm(x)))


def one_copied_token(norm, dim):  # alone vs in a batch of copies of itself: nothing to differ by
    x = torch.randn(1, dim).expand(8, dim)
    with torch.no_grad():
        return bool(torch.allclose(norm(x)[:1], norm(x[:1]), atol=1e-6))


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (same_batch_twice, "is_per_token said True for BatchNorm in training mode"),
        (lambda norm, dim: False, "is_per_token said False for LayerNorm; it is True"),
        (lambda norm, dim: torch.tensor(True), "is_per_token must return True or False, got Tensor"),
    ],
)
def test_ex5_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex5(SimpleNamespace(is_per_token=wrong))
    assert result.startswith(message), result


def test_ex5_a_batch_of_copies_cannot_tell_batchnorm() -> None:
    result = check.check_ex5(SimpleNamespace(is_per_token=one_copied_token))
    assert result.startswith("is_per_token said True for BatchNorm in training mode"), result


def naive_variance(x):
    return x.square().mean(-1) - x.mean(-1).square()


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (naive_variance, f"{check.NAIVE}: error"),
        (lambda x: x.var(-1), check.SAMPLE_VARIANCE),
        (lambda x: x.double().var(-1, correction=0), "variance returned torch.float64"),
    ],
)
def test_ex6_names_the_mistake(wrong, message: str) -> None:
    result = check.check_ex6(SimpleNamespace(variance=wrong))
    assert result.startswith(message), result
    if wrong is naive_variance:
        error = float(result.split("error ")[1].split()[0])
        assert error > 1e-2 and "at offset 1e4" in result, result
