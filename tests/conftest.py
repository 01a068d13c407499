"""Shared test setup.

Triton kernels run on the CPU through Triton's interpreter when no CUDA device is present. The interpreter must be
switched on before anything imports triton, so it is set here, before the tests import the project.
"""

import os
import sys
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
