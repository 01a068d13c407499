"""bench/bench_layernorm.py runs and reports what it claims (a smoke run: no timing is judged here)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_layernorm", ROOT / "bench" / "bench_layernorm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run_writes_json_and_markdown(bench, tmp_path, capsys):
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["--device", "cpu", "--quick", "--rows", "16", "--sizes", "24,40", "--impls", "custom,builtin,naive"]
    report = bench.main([*argv, "--reps", "1", "--json", str(out_json), "--out", str(out_md)])
    saved = json.loads(out_json.read_text())
    assert saved["device"] == "cpu" and len(saved["results"]) == 6 == len(report["results"])
    for r in saved["results"]:
        assert r["correct"] and r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0 and r["copy_gbps"] > 0
        assert r["fwd_gbps"] == pytest.approx(2 * 16 * r["C"] * 4 / (r["fwd_ms"] * 1e-3) / 1e9)
    table = out_md.read_text()
    assert "| custom | [16, 24] | float32 |" in table and "%copy" in table
    assert "smoke run" in capsys.readouterr().out


def test_targets_are_checked_on_the_issue_shapes(bench):
    def row(impl, fwd, fb, pct=90.0, rows=16384, C=384, dtype="float32", device="cpu"):
        return {"impl": impl, "rows": rows, "C": C, "dtype": dtype, "device": device, "fwd_ms": fwd,
                "fwd_bwd_ms": fb, "bwd_ms": fb - fwd, "fwd_pct_copy": pct}

    checks = bench.targets([row("custom", 2.0, 9.0), row("builtin", 1.0, 4.0), row("naive", 3.0, 30.0)])
    assert [c["ok"] for c in checks] == [True]  # 7 ms backward vs 27 ms; the ratio to builtin is not a target
    cuda = [row("triton", 1.0, 3.0, 85.0, 32768, 4096, "bfloat16", "cuda"),
            row("builtin", 1.1, 2.9, 80.0, 32768, 4096, "bfloat16", "cuda")]
    assert [c["ok"] for c in bench.targets(cuda)] == [True, False, True]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "3,x"], "--sizes"),
        (["--dtype", "float8"], "unknown --dtype"),
        (["--impls", "custom,fast"], "unknown implementation"),
    ],
)
def test_bad_arguments_are_clear_errors(bench, argv, message):
    with pytest.raises(SystemExit, match=message):
        bench.main(["--device", "cpu", "--quick", *argv])


@pytest.mark.skipif(sys.platform != "linux", reason="the allocator settings are glibc's")
def test_script_reruns_itself_with_glibc_keeping_freed_memory(tmp_path):
    """Run as a script, the bench re-executes itself with STEADY_MALLOC (page faults out of the timings) and says
    so in its report; --system-malloc keeps the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    modes = []
    for extra in ([], ["--system-malloc"]):
        out = tmp_path / "r.json"
        argv = ["--device", "cpu", "--quick", "--rows", "8", "--sizes", "16", "--reps", "1", "--json", str(out)]
        proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_layernorm.py"), *argv, *extra],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        modes.append(json.loads(out.read_text())["machine"]["malloc"])
    assert modes == ["steady (glibc keeps freed memory)", "system default"]
