"""bench/gpu.sh, the one-shot GPU run: its dry run on the CPU leaves exactly the files a GPU run leaves (the device
machine returns at most 8 files of at most 16 MiB), and a missing prerequisite stops it at once with what to do."""

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.sh"
PACKED = {"summary.md", "results.json", "gpu_results.tar.gz"}  # bench/gpu_report.py's PACKED_FILES
STEPS = ["info", "data", "triton_check", "train_triton", "train_builtin", "train_report", "swap_norms",
         "bench_layernorm", "overhead", "tests"]


def run_gpu_sh(*args: str, out: Path, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OUT": str(out), **env}
    full_env.pop("TRITON_INTERPRET", None)  # the script sets it itself for the dry run
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=full_env, capture_output=True, text=True,
                          timeout=900)


def test_dry_run_leaves_the_files_a_gpu_run_leaves(tmp_path, shakespeare_path):
    out = tmp_path / "out"
    proc = run_gpu_sh("--dry-run", str(shakespeare_path), out=out, GPU_SH_COMMIT="abc1234")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = {p.name: p.stat().st_size for p in out.iterdir()}
    assert set(files) == PACKED and len(files) <= 8, files
    assert all(0 < size <= 16 * 2**20 for size in files.values()), files
    results = json.loads((out / "results.json").read_text())
    assert results["commit"] == "abc1234" and results["dry_run"] is True
    assert [s["step"] for s in results["steps"]] == STEPS
    assert all(s["rc"] == "0" for s in results["steps"]), results["steps"]
    assert all(results[k] for k in ("machine", "triton_check", "train_report", "swap_norms", "overhead"))
    assert all(results["swap_norms"]["identical"].values())  # one checkpoint, three LayerNorms, the same text
    summary = (out / "summary.md").read_text()
    assert "commit abc1234" in summary and all(f"| {s} | 0 |" in summary for s in STEPS)
    with tarfile.open(out / "gpu_results.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {f"{s}.log" for s in STEPS} <= names and {"metrics_triton.jsonl", "metrics_builtin.jsonl"} <= names


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["--dry-run", "/nonexistent/tiny.txt"], {}, "Tiny Shakespeare not found at '/nonexistent/tiny.txt'"),
        ([], {}, "no CUDA device here"),  # this machine has no GPU
        (["--dry-run"], {"PY": "/nonexistent/python"}, "cannot import torch"),
    ],
)
def test_missing_prerequisites_stop_at_once_saying_what_to_bring(tmp_path, shakespeare_path, args, env, message):
    if args == []:
        args = [str(shakespeare_path)]
    t0 = time.monotonic()
    proc = run_gpu_sh(*args, out=tmp_path / "out", **env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert time.monotonic() - t0 < 60  # a check, not a run (generous: python starts in a second or two)


def test_unwritable_results_folder_is_refused(tmp_path, shakespeare_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = run_gpu_sh("--dry-run", str(shakespeare_path), out=blocker / "out")
    assert proc.returncode == 2 and "is not writable" in proc.stderr, proc.stderr
