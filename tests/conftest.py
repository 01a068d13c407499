"""Shared test setup.

Triton kernels run on the CPU through Triton's interpreter when no CUDA device is present. The interpreter must be
switched on before anything imports triton, so it is set here, before the tests import the project.
"""

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if (SHARED / "tiktoken").is_dir():  # offline copy of GPT-2's BPE ranks; elsewhere tiktoken downloads them
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tiktoken"))
sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    path = SHARED / "data" / "tinyshakespeare.txt"
    if not path.exists():
        pytest.skip(f"{path} not found (CI and developers have it at ../shared)")
    return path


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tests use tiny tensors: one torch thread is as fast, and far faster when other work shares the cores
    (idle OpenMP threads spin-wait). Child processes the tests start keep torch's default."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
