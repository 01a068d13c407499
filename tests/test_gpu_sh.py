"""bench/gpu.sh: its steps' shares add up to its budget; its dry run on the CPU runs the steps asked for and leaves
the files a GPU run leaves, after every step, so a run cut short leaves what it did; a missing prerequisite stops
it at once, saying what to give it. Every run is given this suite's own python as PY."""

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest

from bench.common import PACKED
from helpers import ROOT, needs_triton

SCRIPT = ROOT / "bench" / "gpu.sh"
TEXT = SCRIPT.read_text()
STEPS = re.findall(r"^(?:\[\[ .* \]\] && )?step (\w+) ", TEXT, re.M)  # `step NAME COMMAND`, in the script's order


def gpu_sh(*args: str, **env: str) -> list[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the dry run sets it itself
    return ["bash", str(SCRIPT), *args], {**full_env, "PY": sys.executable, **env}


def run_gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    cmd, full_env = gpu_sh(*args, **env)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)


def fake_nanogpt(folder):
    """What the script checks of a nanoGPT checkout before it plans nanoGPT's step."""
    folder.mkdir()
    (folder / "train.py").write_text("")
    return folder


def shares(stdout: str) -> tuple[dict[str, int], int]:
    """The plan the script prints: each step's share of the budget in s, by name in its order; and their sum."""
    plan = re.search(r"each step's share in s: (.*); sum (\d+) s\.", stdout)
    return {name: int(s) for name, s in (item.rsplit(" ", 1) for item in plan[1].split(", "))}, int(plan[2])


# The dry run's plumbing, at the cost of a few steps: the data, the first step (the tests that cover the paths no GPU
# had run), one benchmark's JSON; every other step planned and reported as not selected. (`bash bench/gpu.sh
# --dry-run` runs every step: under two minutes on two cores.)
SELECTED = ["data", "tests", "decode"]


@pytest.mark.slow  # three steps of the dry run, each a process
@needs_triton  # the dry run runs the kernels through Triton's interpreter
def test_dry_run_proves_its_plumbing_and_leaves_the_three_files(tmp_path, shakespeare_path):
    out = tmp_path / "out"
    nanogpt = fake_nanogpt(tmp_path / "nanogpt")
    args = ["--dry-run", "--input", str(shakespeare_path), "--nanogpt", str(nanogpt), str(out)]
    proc = run_gpu_sh(*args, GPU_SH_STEPS=",".join(SELECTED))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    plan, total = shares(proc.stdout)  # the dry run's 1260 s: each of the 420 s's shares times 3
    assert list(plan) == ["report", *STEPS]  # every step has a share, in the order they run, and nothing else does
    assert sum(plan.values()) == total == 1260
    assert plan["nanogpt"] > 0 and plan["grid_12x768"] == 0  # nanoGPT's step takes the wide grid's share
    assert sorted(p.name for p in out.iterdir()) == sorted(PACKED)
    results = json.loads((out / "results.json").read_text())
    rcs = {s["step"]: s["rc"] for s in results["steps"]}
    assert list(rcs) == STEPS, rcs  # every step planned, in the script's order (nanoGPT's too, since it was given)
    assert all(rcs[s] == ("0" if s in SELECTED else "skipped (not selected)") for s in STEPS), rcs
    assert STEPS[:6] == ["data", "tests", "triton_eager", "triton_graphs_float16", "triton_compile", "resume_graphs"]
    assert results["machine"]["torch"] and results["decode"]  # a step's JSON reaches results.json
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} | 0 |" in summary for s in SELECTED) and "## decode" in summary
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        assert {f"gpu_results/{s}.log" for s in SELECTED} <= set(tar.getnames())
        tests_log = tar.extractfile("gpu_results/tests.log").read().decode()
    assert tests_log.index("tests/test_gpu_paths.py::") < tests_log.index("tests/test_batch_invariant_triton.py::")


@pytest.mark.slow  # the dry run's first steps, then a kill
def test_a_run_cut_short_leaves_the_steps_it_finished(tmp_path, shakespeare_path):
    """As a caller's time limit does: the whole process group is stopped during a step; the three files hold the
    steps finished before it."""
    out = tmp_path / "out"
    cmd, env = gpu_sh("--dry-run", "--input", str(shakespeare_path), str(out), GPU_SH_STEPS="data,resume_graphs")
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while "| data | 0 |" not in ((out / "summary.md").read_text() if (out / "summary.md").exists() else ""):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "timeout"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert sorted(p.name for p in out.iterdir()) == sorted(PACKED)
    steps = {s["step"]: s["rc"] for s in json.loads((out / "results.json").read_text())["steps"]}
    assert steps["data"] == "0" and "resume_graphs" not in steps
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        assert "gpu_results/data.log" in tar.getnames()


@pytest.mark.slow  # bash and a torch import
def test_a_spent_budget_skips_the_steps_and_still_reports(tmp_path, shakespeare_path):
    """14 s: every share under the 5 s a step needs; without nanoGPT its step has no share, the wide grid one."""
    proc = run_gpu_sh("--dry-run", "--input", str(shakespeare_path), str(tmp_path / "out"), GPU_SH_BUDGET_S="14")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"BUDGET=\$\{GPU_SH_BUDGET_S:-\$\(\(DRY \? 1260 : 420\)\)\}", TEXT)  # 7 minutes on a GPU
    plan, _ = shares(proc.stdout)
    assert plan["nanogpt"] == 0 and plan["grid_12x768"] > 0, plan
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
