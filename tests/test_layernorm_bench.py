"""bench/kernels.py, the LayerNorm kernels benchmark, at tiny sizes: what it writes, not how fast anything is."""

import json
import os
import sys

import pytest

from bench import kernels
from helpers import assert_one_line_error, command, needs_triton, python


def test_tiny_run_writes_every_implementation_and_shape(tmp_path):
    out = tmp_path / "k.json"
    argv = "--device cpu --rows 16,8 --sizes 24,40 --impls custom,builtin,naive --reps 1 --out".split()
    result = kernels.main([*argv, str(out)])
    saved = json.loads(out.read_text())
    assert [(r["impl"], r["rows"], r["C"]) for r in saved["results"]] == [
        (i, n, c) for n in (16, 8) for c in (24, 40) for i in ("custom", "builtin", "naive")
    ]
    for r in result["results"]:  # the same function: within float32 rounding of the built-in
        assert r["max_abs_err_vs_builtin"] < 1e-5
        two_passes = 2 * r["rows"] * r["C"] * 4  # bytes: float32 read once and written once
        assert r["fwd_gbps"] == pytest.approx(two_passes / (r["fwd_ms"] / 1e3) / 1e9)
    assert "| custom | [16, 24] | float32 |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--sizes", "3,x"], "--sizes: 'x' is not a positive integer"),
        (["--dtype", "float8"], "'float8'"),
        (["--impls", "custom,fast"], "'fast'"),
    ],
)
def test_bad_arguments_are_one_line(argv, message, capsys):
    assert_one_line_error(command(capsys, kernels.main, ["--device", "cpu", *argv]), 2, message)


@needs_triton
def test_overhead_stubs_the_launches_and_puts_them_back():
    import layernorm_triton

    before = dict(vars(layernorm_triton))
    result = kernels.main(["--device", "cpu", "--overhead", "--calls", "3", "--repeats", "1"])
    assert {(r["impl"], r["what"]) for r in result["overhead"]} == {
        (i, w) for i in ("builtin", "triton") for w in ("fwd", "fwd+bwd")
    }
    assert vars(layernorm_triton) == before  # every real kernel back, for everything after


@pytest.mark.slow  # the script re-executes itself: two processes, twice
@pytest.mark.skipif(sys.platform != "linux", reason="the allocator settings are glibc's")
def test_script_reruns_itself_with_glibc_keeping_freed_memory(tmp_path):
    malloc = tuple(k for k in os.environ if k.startswith("MALLOC_"))
    modes = []
    for extra in ([], ["--system-malloc"]):
        argv = ["--device", "cpu", "--rows", "8", "--sizes", "16", "--impls", "builtin", "--reps", "1"]
        proc = python("-m", "bench.kernels", *argv, *extra, "--out", tmp_path / "r.json", timeout=300, drop=malloc)
        assert proc.returncode == 0, proc.stderr
        modes.append(json.loads((tmp_path / "r.json").read_text())["malloc"])
    assert modes == ["steady", "system default"]
