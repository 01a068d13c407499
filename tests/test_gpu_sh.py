"""bench/gpu.sh: its steps' shares add up to its budget; its dry run on the CPU runs the steps asked for and leaves
the files a GPU run leaves, after every step, so a run cut short leaves what it did; a step cut at its limit, or a
run stopped, leaves no process behind; a missing prerequisite stops it at once, saying what to give it. Every run is
given this suite's own python as PY."""

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
from helpers import ROOT, needs_triton, wait_for

SCRIPT = ROOT / "bench" / "gpu.sh"
TEXT = SCRIPT.read_text()
STEPS = re.findall(r"^(?:\[\[ .* \]\] && )?step (\w+) ", TEXT, re.M)  # `step NAME COMMAND`, in the script's order


def gpu_sh(*args: str, **env: str) -> list[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the dry run sets it itself
    return ["bash", str(SCRIPT), *args], {**full_env, "PY": sys.executable, **env}


def run_gpu_sh(*args: str, **env: str) -> subprocess.CompletedProcess:
    cmd, full_env = gpu_sh(*args, **env)
    return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=600)


def shares(stdout: str) -> tuple[dict[str, int], int]:
    """The plan the script prints: each step's share of the budget in s, by name in its order; and their sum."""
    plan = re.search(r"each step's share in s \(estimate\): (.*); sum (\d+) s\.", stdout)
    items = re.findall(r"(\w+) (\d+) \(est\. \d+\)", plan[1])
    return {name: int(s) for name, s in items}, int(plan[2])


def left_behind(tmp_path) -> list[str]:
    """The processes still running whose command line names tmp_path (every step's does: its TMPDIR, its files)."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if str(tmp_path) in line and "ps -eo" not in line]


# The dry run's plumbing, at the cost of a few steps: the data, the first measurement, one benchmark's JSON, the tests
# (collected); every other step planned and reported as not selected. (`bash bench/gpu.sh --dry-run` runs every step:
# about a minute and a half on two cores.)
SELECTED = ["data", "decode", "tests"]


@pytest.mark.slow  # three steps of the dry run, each a process
@needs_triton  # the dry run runs the kernels through Triton's interpreter
def test_dry_run_proves_its_plumbing_and_leaves_the_three_files(tmp_path, shakespeare_path):
    out = tmp_path / "out"
    nanogpt = tmp_path / "nanogpt"  # what the script checks of a nanoGPT checkout before it plans nanoGPT's step
    nanogpt.mkdir()
    (nanogpt / "train.py").write_text("")
    default = {p: p.stat().st_mtime_ns for p in (ROOT / "bench" / "results" / "gpu").iterdir()}  # OUT's default
    args = ["--dry-run", "--input", str(shakespeare_path), "--nanogpt", str(nanogpt), "--commit", "abc1234"]
    proc = run_gpu_sh(*args, GPU_SH_STEPS=",".join(SELECTED), OUT=str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "bench" / "results" / "gpu").iterdir()} == default
    plan, total = shares(proc.stdout)  # the dry run's 1440 s: each of the 480 s's shares times 3
    assert list(plan) == ["report", *STEPS]  # every step has a share, in the order they run, and nothing else does
    assert sum(plan.values()) == total == 1440 and proc.stdout.startswith("Commit abc1234. ")
    assert plan["nanogpt"] > 0 and plan["grid_12x768"] == 0  # nanoGPT's step takes the wide grid's share
    assert sorted(p.name for p in out.iterdir()) == sorted(PACKED)
    results = json.loads((out / "results.json").read_text())
    rcs = {s["step"]: s["rc"] for s in results["steps"]}
    assert list(rcs) == STEPS, rcs  # every step planned, in the script's order (nanoGPT's too, since it was given)
    assert all(rcs[s] == ("0" if s in SELECTED else "skipped (not selected)") for s in STEPS), rcs
    assert results["machine"]["commit"] == results["decode"]["machine"]["commit"] == "abc1234"  # no git needed
    summary = (out / "summary.md").read_text()
    assert all(f"| {s} | 0 |" in summary for s in SELECTED) and "## decode" in summary
    assert summary.startswith("# bench/gpu.sh at commit abc1234")
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        assert {f"gpu_results/{s}.log" for s in SELECTED} <= set(tar.getnames())
        tests_log = tar.extractfile("gpu_results/tests.log").read().decode()
    assert "tests/test_batch_invariant_triton.py::" in tests_log


@pytest.mark.slow  # the dry run's first steps, one of them cut
@needs_triton
def test_a_step_cut_at_its_limit_leaves_no_process_behind(tmp_path, shakespeare_path):
    """The step grid cut at 8 s (bench.training, its train.py child and whatever that started), during a run or
    between two, whichever a machine's speed makes it: the step exits 124 (timeout's), the benchmark still writes
    the JSON of what it measured, saying it was interrupted, and nothing of it runs on."""
    out = tmp_path / "out"
    args = ("--dry-run", "--input", str(shakespeare_path))
    proc = run_gpu_sh(*args, GPU_SH_STEPS="data,grid_6x384:8", TMPDIR=str(tmp_path), OUT=str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert left_behind(tmp_path) == []
    results = json.loads((out / "results.json").read_text())
    assert {s["step"]: s["rc"] for s in results["steps"]}["grid_6x384"] == "124"
    grid = results["grid_6x384"]
    runs = [run for runs in grid["runs"].values() for run in runs]
    finished = sum(not run["interrupted"] for run in runs)  # (a run that was cut is measured as far as it went)
    assert re.fullmatch(rf"after {finished} of \d+ runs; the rest not started", grid.get("interrupted", "")), grid


@pytest.mark.slow  # the dry run's first steps, then a signal
def test_a_run_stopped_leaves_the_steps_it_finished_and_no_process(tmp_path, shakespeare_path):
    """As a caller's time limit does: SIGTERM to the whole process group during a step (the grid, which runs for
    minutes in a dry run: a step that ends at once would race the signal); the three files hold the steps finished
    before it, and the step's own process group (timeout's) is stopped with the script."""
    out = tmp_path / "out"
    cmd, env = gpu_sh("--dry-run", "--input", str(shakespeare_path), GPU_SH_STEPS="data,grid_6x384", OUT=str(out))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**env, "TMPDIR": str(tmp_path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    summary = out / "summary.md"
    wait_for(lambda: summary.exists() and "| data | 0 |" in summary.read_text(), proc, timeout=120)
    time.sleep(2)  # into the grid's first run
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    time.sleep(1)
    assert left_behind(tmp_path) == []
    assert sorted(p.name for p in out.iterdir()) == sorted(PACKED)
    steps = {s["step"]: s["rc"] for s in json.loads((out / "results.json").read_text())["steps"]}
    assert steps["data"] == "0" and "grid_6x384" not in steps
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        assert "gpu_results/data.log" in tar.getnames()


@pytest.mark.slow  # bash and a torch import
def test_a_spent_budget_skips_the_steps_and_still_reports(tmp_path, shakespeare_path):
    """14 s: every share under the 5 s a step needs; without nanoGPT its step has no share, the wide grid one."""
    proc = run_gpu_sh("--dry-run", "--input", str(shakespeare_path), GPU_SH_BUDGET_S="14", OUT=str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
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
        (  # the python's own error first, then what to do
            ["--dry-run", "--input", "SHAKESPEARE"],
            {"PY": "/nonexistent/python"},
            "/nonexistent/python: No such file or directory\nbench/gpu.sh: '/nonexistent/python' could not report",
        ),
        (["--dry-run", "--input", "SHAKESPEARE", "--nanogpt", "/nonexistent"], {}, "is not a nanoGPT checkout"),
        (["--dry-run", "--fast"], {}, "unknown option '--fast'"),
        (["--dry-run", "--input", "SHAKESPEARE"], {"OUT": "/proc/x"}, "output folder '/proc/x' is not writable"),
        (["--dry-run", "results/"], {}, "unexpected argument 'results/': the output folder is $OUT (OUT=results/ bash"),
    ],
)
def test_missing_prerequisites_stop_at_once(shakespeare_path, args, env, message):
    proc = run_gpu_sh(*[str(shakespeare_path) if a == "SHAKESPEARE" else a for a in args], **env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_help_prints_the_usage_and_exits_0():
    proc = run_gpu_sh("--help")
    assert proc.returncode == 0 and proc.stdout.startswith("Every GPU measurement in one run"), proc.stderr
    assert "OUT=FOLDER bash bench/gpu.sh [--dry-run]" in proc.stdout and "tree without git.\n" in proc.stdout
