"""The benchmark scripts run end to end on tiny sizes and write what they promise.

Nothing here times anything: the figures are meaningless at these sizes. What is checked is the plumbing: the
child processes, the log parsing (ours and nanoGPT's format), warmup and eval exclusion, the alternation of
sides, the outputs (JSON, Markdown, CSV, PNG), and bench/gpu.sh's CPU smoke mode. nanoGPT itself is not needed:
a stand-in prints nanoGPT's log lines.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_invariant  # noqa: E402
import bench_train  # noqa: E402
import common  # noqa: E402
import compare_norms  # noqa: E402

TINY = {"batch_size": 4, "block_size": 16, "n_layer": 1, "n_head": 2, "n_embd": 32, "dropout": 0.0,
        "gradient_accumulation_steps": 1, "max_iters": 6, "lr_decay_iters": 50, "warmup_iters": 2,
        "learning_rate": 1e-3, "min_lr": 1e-4, "beta2": 0.99}

# A stand-in for nanoGPT's train.py: reads --key=value flags the way nanoGPT's configurator does (literal types),
# records them, and prints nanoGPT's log lines for iterations 0..max_iters (nanoGPT runs max_iters + 1).
FAKE_NANOGPT = textwrap.dedent("""\
    import json, sys
    from ast import literal_eval
    args = {}
    for a in sys.argv[1:]:
        if a.startswith("--"):
            k, v = a[2:].split("=", 1)
            try:
                args[k] = literal_eval(v)
            except (SyntaxError, ValueError):
                args[k] = v
    with open("args.jsonl", "a") as f:
        f.write(json.dumps({"config": sys.argv[1], "args": args}) + "\\n")
    print("step 0: train loss 4.1000, val loss 4.2000")
    for i in range(args["max_iters"] + 1):
        ms = 500.0 if i == 0 else 10.0 + i % 3  # the first one holds the eval, as in nanoGPT
        print(f"iter {i}: loss 4.0000, time {ms:.2f}ms, mfu -100.00%")
""")


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory, shakespeare_path):
    """A prepared char dataset, a tiny config and a fake nanoGPT checkout, in a temp dir."""
    base = tmp_path_factory.mktemp("bench")
    data = base / "data"
    subprocess.run([sys.executable, str(ROOT / "data" / "shakespeare_char" / "prepare.py"), "--input",
                    str(shakespeare_path), "--out_dir", str(data)], check=True, capture_output=True)
    config = base / "tiny.json"
    config.write_text(json.dumps(TINY))
    fake = base / "nanogpt"
    (fake / "config").mkdir(parents=True)
    (fake / "data" / "shakespeare_char").mkdir(parents=True)
    (fake / "train.py").write_text(FAKE_NANOGPT)
    (fake / "configurator.py").write_text("")
    (fake / "config" / "train_shakespeare_char.py").write_text("")
    (fake / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    return {"base": base, "data": data, "config": config, "nanogpt": fake}


def test_log_parsing_both_formats_and_the_timed_iterations():
    ours = ["step 0: train loss 4.1700, val loss 4.1800",
            "iter 0: loss 4.1759, lr 3.33e-04, 900.00 ms/iter, 26 tok/s",
            "iter 1: loss 4.1000, lr 5.00e-04, 40.50 ms/iter, 19000 tok/s",
            "iter 2: loss 4.0000, lr 6.00e-04, 41.00 ms/iter, 18700 tok/s",
            "step 3: train loss 4.0000, val loss 4.0100",
            "iter 3: loss 3.9000, lr 6.00e-04, 60.00 ms/iter, 12800 tok/s",
            "iter 4: loss 3.8000, lr 6.00e-04, 42.00 ms/iter, 18300 tok/s"]
    nano = ["iter 5: loss 3.8000, time 41.25ms, mfu 0.02%", "iter 6: loss 3.7000, time 40.00ms, mfu -100.00%"]
    times = common.parse_iter_times(ours, "ours")
    assert times == {0: 900.0, 1: 40.5, 2: 41.0, 3: 60.0, 4: 42.0}
    assert common.parse_iter_times(nano, "nanogpt") == {5: 41.25, 6: 40.0}
    assert common.parse_iter_times(nano, "ours") == {}
    evals = common.parse_evals(ours)
    assert [e["iter"] for e in evals] == [0, 3] and evals[1]["val_loss"] == 4.01
    # Warmup counts logged iterations; iterations that ran an eval are dropped; n_timed caps the rest.
    assert common.timed_iter_keys(times, [0, 3], warmup=1) == [1, 2, 4]
    assert common.timed_iter_keys(times, [0, 3], warmup=1, n_timed=2) == [1, 2]
    with pytest.raises(ValueError, match="style"):
        common.parse_iter_times(ours, "other")


def test_run_child_streams_reports_rss_and_kills_on_timeout(capsys):
    res = common.run_child([sys.executable, "-c", "print('hello'); print('world')"], prefix="kid")
    assert res.ok and res.lines == ["hello", "world"] and res.max_rss_bytes > 1_000_000
    assert "[kid] hello" in capsys.readouterr().out
    slow = common.run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=1, echo=False)
    assert slow.timed_out and not slow.ok and slow.wall_s < 20


def test_bench_train_alternates_with_nanogpt_and_writes_results(bench_env, tmp_path):
    out = tmp_path / "train.json"
    result = bench_train.main([
        "train", "--sizes", str(bench_env["config"]), "--norms", "builtin", "--nanogpt", str(bench_env["nanogpt"]),
        "--repeats", "2", "--iters", "3", "--warmup", "2", "--eval_iters", "1",
        "--data_dir", str(bench_env["data"]), "--device", "cpu", "--out", str(out),
    ])
    res = result["train"]["results"][0]
    builtin, nano = res["sides"]["builtin"], res["sides"]["nanogpt"]
    assert builtin["runs_ok"] == 2 and nano["runs_ok"] == 2
    for run in res["runs"]["builtin"] + res["runs"]["nanogpt"]:
        assert run["iters_timed"] == 3 and run["max_rss_bytes"] > 0
    # The stand-in's timed iterations (2, 3, 4: iteration 0 with its eval and 1 are warmup) are 12, 10, 11 ms.
    assert nano["ms_per_iter"] == 11.0 and nano["ms_spread"] == (11.0, 11.0)
    assert nano["tokens_per_s"] == pytest.approx(4 * 16 / 0.011)
    assert builtin["ms_per_iter"] > 0
    # nanoGPT got the same configuration, floats written as floats (its configurator checks types).
    calls = [json.loads(line) for line in (bench_env["nanogpt"] / "args.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    args = calls[-1]["args"]
    assert calls[-1]["config"] == "config/train_shakespeare_char.py"
    assert args["n_layer"] == 1 and args["n_embd"] == 32 and args["block_size"] == 16 and args["batch_size"] == 4
    assert isinstance(args["dropout"], float) and args["bias"] is True and args["compile"] is False
    assert args["max_iters"] == 5 and args["eval_interval"] == args["max_iters"] and args["log_interval"] == 1
    saved = json.loads(out.read_text())
    assert saved["machine"]["cpu_count"] >= 1 and "torch" in saved["machine"]
    table = out.with_suffix(".md").read_text()
    assert "| nanogpt |" in table and "ms ratio vs nanoGPT" in table


def test_bench_train_rejects_a_missing_nanogpt_checkout(bench_env, tmp_path):
    with pytest.raises(SystemExit, match="not a nanoGPT checkout"):
        bench_train.main(["train", "--sizes", str(bench_env["config"]), "--nanogpt", str(tmp_path),
                          "--data_dir", str(bench_env["data"]), "--device", "cpu"])


def test_decode_benchmark_cached_vs_uncached(bench_env, tmp_path):
    out = tmp_path / "decode.json"
    result = bench_train.main(["decode", "--sizes", str(bench_env["config"]), "--prompt_len", "4",
                               "--new_tokens", "20", "--repeats", "1", "--device", "cpu", "--out", str(out)])
    (r,) = result["decode"]["results"]
    assert r["cached_tokens_per_s"] > 0 and r["uncached_tokens_per_s"] > 0 and r["speedup"] > 0
    # block 16, prompt 4: the two paths agree on the first 12 new tokens; past that the windows differ.
    assert r["tokens_compared"] == 12 and r["tokens_identical"] and r["overflows_block"]
    assert "speedup" in out.with_suffix(".md").read_text()


def test_invariant_benchmark_measures_both_fixes_and_the_cost(tmp_path):
    out = tmp_path / "invariant.json"
    result = bench_invariant.main(["--sizes", "shakespeare_char_cpu", "--batches", "1,2", "--repeats", "1",
                                   "--model_steps", "3", "--new_tokens", "3", "--out", str(out)])
    fixes = {(r["fixed_linear"], r["fixed_attention"]): r for r in result["model"]}
    assert fixes[(True, True)]["alone_vs_batch"] == fixes[(True, True)]["cached_vs_full"] == 0.0  # the mode
    assert [(r["size"], r["batch"]) for r in result["decode"]] == [("shakespeare_char_cpu", b) for b in (1, 2)]
    for r in result["decode"]:
        assert r["stock_cost"] == 1.0 and r["invariant_cost"] > 0 and r["invariant_rows8_tokens_per_s"] > 0
    assert [r["in_features"] for r in result["ops"]["linear"]] == [128, 384]
    assert json.loads(out.read_text())["machine"]["commit"] and "mode costs" in out.with_suffix(".md").read_text()


def test_compare_norms_writes_curves_tables_and_skips_triton_on_cpu(bench_env, tmp_path):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "cmp"
    result = compare_norms.main([
        "--config", str(bench_env["config"]), "--norms", "custom,builtin,triton", "--max_iters", "6",
        "--eval_interval", "3", "--eval_iters", "1", "--log_interval", "1", "--data_dir", str(bench_env["data"]),
        "--out_dir", str(out_dir), "--device", "cpu", "--quiet",
    ])
    assert result["norms_run"] == ["custom", "builtin"]
    assert "TRITON_INTERPRET" in result["skipped"]["triton"]
    for norm in ("custom", "builtin"):
        run = result["runs"][norm]
        assert run["status"] == "ok" and [e["iter"] for e in run["evals"]] == [0, 3, 6]
        assert run["ms_per_iter"] > 0 and run["tokens_per_s"] > 0 and run["peak_memory_bytes"] > 0
        assert (out_dir / "runs" / norm / "metrics.jsonl").exists() and (out_dir / "runs" / norm / "log.txt").exists()
        assert not list((out_dir / "runs" / norm).glob("*.pt"))  # checkpoints are not left in the results
    agreement = result["layernorm_agreement"]
    assert agreement["norms"] == ["builtin", "custom"] and agreement["within_tolerance"]
    for name in ("results.json", "evals.csv", "summary.csv", "table.md", "val_loss.png"):
        assert (out_dir / name).stat().st_size > 0, name
    assert (out_dir / "evals.csv").read_text().count("\n") == 1 + 2 * 3
    table = (out_dir / "table.md").read_text()
    assert "| builtin | " in table and "skipped" in table and "vs builtin" in table


def test_compare_norms_unknown_norm_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown.*layer"):
        compare_norms.main(["--norms", "builtin,layer", "--device", "cpu"])


def test_gpu_sh_total_budget_caps_the_steps(tmp_path, shakespeare_path):
    """Once the total budget is spent, every remaining step is skipped, and the results still say so.

    (bench/gpu.sh's dry run itself, step by step, is tests/test_gpu_sh.py's.)
    """
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--dry-run", str(shakespeare_path)], cwd=ROOT,
                          env={**env, "OUT": str(out), "GPU_SH_BUDGET_S": "3"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads((out / "results.json").read_text())["steps"]
    assert [s["step"] for s in steps] == ["info", "data", "triton_check", "train_triton", "train_builtin",
                                          "train_report", "swap_norms", "bench_layernorm", "overhead", "tests"]
    assert all(s["rc"] == "skipped" for s in steps), steps
    assert "of a 3 s budget" in (out / "summary.md").read_text()
