"""bench/gpu.sh: its dry run on the CPU runs the steps asked for and leaves the files a GPU run leaves; a missing
prerequisite stops it at once, saying what to give it."""

import json
import os
import re
import subprocess
import tarfile
import time

import pytest
from test_bench import make_fake_nanogpt

from bench.common import PACKED
from helpers import ROOT, needs_triton

SCRIPT = ROOT / "bench" / "gpu.sh"
STEPS = re.findall(r"\bstep (\w+) \d+ ", SCRIPT.read_text())  # `step NAME SHARE COMMAND`, in the script's order


def run_gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the dry run sets it itself
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env={**full_env, **env}, capture_output=True, text=True, timeout=600
    )


# The dry run's plumbing, at the cost of a few steps: the data, the first step (the tests that cover the paths no GPU
# had run), one benchmark's JSON; every other step planned and reported as not selected. (--norm=triton training on
# the CPU is test_train.py's; `bash bench/gpu.sh --dry-run` runs every step, a few minutes.)
SELECTED = ["data", "tests", "decode"]


@pytest.mark.slow  # three steps of the dry run, each a process
@needs_triton  # the dry run runs the kernels through Triton's interpreter
def test_dry_run_proves_its_plumbing_and_leaves_the_three_files(tmp_path, shakespeare_path):
    nanogpt = make_fake_nanogpt(tmp_path / "nanogpt")
    out = tmp_path / "out"
    proc = run_gpu_sh(
        "--dry-run",
        "--input",
        str(shakespeare_path),
        "--nanogpt",
        str(nanogpt),
        str(out),
        GPU_SH_STEPS=",".join(SELECTED),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == sorted(PACKED)
    results = json.loads((out / "results.json").read_text())
    rcs = {s["step"]: s["rc"] for s in results["steps"]}
    assert list(rcs) == STEPS, rcs  # every step planned, in the script's order (nanoGPT's too, since it was given)
    assert all(rcs[s] == ("0" if s in SELECTED else "skipped (not selected)") for s in STEPS), rcs
    assert STEPS[:5] == ["data", "tests", "triton_eager", "triton_graphs_float16", "triton_compile"]  # first
    assert results["machine"]["torch"] and results["decode"]  # a step's JSON reaches results.json
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} | 0 |" in summary for s in SELECTED) and "## decode" in summary
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        assert {f"gpu_results/{s}.log" for s in SELECTED} <= set(tar.getnames())
        logs = {s: tar.extractfile(f"gpu_results/{s}.log").read().decode() for s in SELECTED}
    assert "tests/test_gpu_paths.py::" in logs["tests"]  # the first step


@pytest.mark.slow  # bash and a torch import
def test_a_spent_budget_skips_the_steps_and_still_reports(tmp_path, shakespeare_path):
    proc = run_gpu_sh("--dry-run", "--input", str(shakespeare_path), str(tmp_path / "out"), GPU_SH_BUDGET_S="3")
    assert proc.returncode == 0, proc.stderr
    steps = json.loads((tmp_path / "out" / "results.json").read_text())["steps"]
    assert [s["step"] for s in steps] == [s for s in STEPS if s != "nanogpt"]  # no nanoGPT given: not planned
    assert all(s["rc"].startswith("skipped") for s in steps)


@pytest.mark.slow  # bash and a torch import per case
@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--dry-run", "--input", "/nonexistent/tiny.txt"], {}, "no Tiny Shakespeare at '/nonexistent/tiny.txt'"),
        (["--input", "SHAKESPEARE"], {}, "no CUDA device here"),  # this machine has no GPU
        (["--dry-run", "--input", "SHAKESPEARE"], {"PY": "/nonexistent/python"}, "cannot import torch"),
        (["--dry-run", "--input", "SHAKESPEARE", "--nanogpt", "/nonexistent"], {}, "is not a nanoGPT checkout"),
        (["--dry-run", "--fast"], {}, "unknown option '--fast'"),
        (["--dry-run", "--input", "SHAKESPEARE", "/proc/x"], {}, "is not writable"),
    ],
)
def test_missing_prerequisites_stop_at_once(shakespeare_path, args, env, message):
    t0 = time.monotonic()
    proc = run_gpu_sh(*[str(shakespeare_path) if a == "SHAKESPEARE" else a for a in args], **env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60  # a check, not a run
