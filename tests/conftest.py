"""Shared test setup.

Triton kernels run on the CPU through Triton's interpreter when no CUDA device is present. The interpreter must be
switched on before anything imports triton, so it is set here, before the tests import the project, and only where
triton can be imported (it ships for Linux only): elsewhere every Triton test is skipped, saying why. torch is
imported only in a process that runs tests: pytest-xdist's controller runs none, and starts its workers sooner.
"""

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT / "data" / "shakespeare_char" / "input.txt"  # where the Quickstart's prepare step puts it

sys.path.insert(0, str(ROOT))


def pytest_configure(config: pytest.Config) -> None:
    """TRITON_INTERPRET=1 where there is no GPU, before the tests import triton (triton.jit reads it then)."""
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        return  # xdist's controller: its workers run the tests and decide for themselves
    import torch

    if not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ and importlib.util.find_spec("triton"):
        os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session")
def shakespeare_path() -> Path:
    if not SHAKESPEARE.is_file():
        pytest.skip("no Tiny Shakespeare at data/shakespeare_char/input.txt: run the Quickstart first")
    return SHAKESPEARE


@pytest.fixture(scope="session")
def gpt2_bpe() -> object:
    """GPT-2's BPE (tiktoken's r50k_base); tiktoken downloads its ranks once, or reads them from TIKTOKEN_CACHE_DIR."""
    tiktoken = pytest.importorskip("tiktoken")
    try:
        return tiktoken.get_encoding("r50k_base")
    except Exception as e:  # no internet and no cache: tiktoken's own error, whatever it is
        pytest.skip(f"tiktoken cannot load GPT-2's BPE ranks (r50k_base) here ({type(e).__name__}): no internet?")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One prepared tiny character dataset (helpers.TEXT) for every test that only reads it."""
    from helpers import make_dataset

    return make_dataset(tmp_path_factory.mktemp("tiny_data"))


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    """Tests use tiny tensors: one torch thread is as fast, and far faster when other work shares the cores (idle
    OpenMP threads spin-wait). For the whole session, so that module- and session-scoped fixtures run with it too;
    the processes the tests start get OMP_NUM_THREADS=1 (helpers.subprocess_env)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, dict]:
    """One finished 12-iteration run of the tiny model on tiny_data, evaluated at 0, 5, 10, 12: (out_dir, summary).
    Tests only read it: one that resumes it copies it first."""
    import train
    from helpers import tiny_args

    out = tmp_path_factory.mktemp("trained") / "out"
    return out, train.main(tiny_args(tiny_data, out, "--max_iters=12", "--eval_interval=5"))


@pytest.fixture
def triton_compiled_for_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in a Python started without TRITON_INTERPRET: the Triton kernels (where triton imports) defined for a GPU,
    unable to take CPU tensors. Imported first, so that a first import here still defines them for the interpreter
    that the tests after this one use."""
    try:
        import layernorm_triton
    except ImportError:  # no triton here (macOS, Windows): the Triton norm cannot run at all
        layernorm_triton = None
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if layernorm_triton is not None:
        monkeypatch.setattr(layernorm_triton, "INTERPRET", False)
