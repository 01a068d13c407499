"""Helpers shared by several test files."""

import pytest
import torch

from layernorm import TritonUnavailableError, make_norm


def skip_unless_runs(norm: str) -> None:
    """Skip a test for a norm that can't run here (Triton without CUDA or its CPU interpreter)."""
    try:
        make_norm(norm, 8)(torch.randn(2, 8))
    except TritonUnavailableError as e:
        pytest.skip(f"{norm} can't run here: {str(e).splitlines()[0]}")
