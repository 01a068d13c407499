"""The training, profile, resume and decoding benchmarks and bench/common.py, end to end at tiny sizes: the
plumbing, never timings.

nanoGPT itself is not needed: a stand-in prints nanoGPT's log lines.
"""

import json
import os
import resource
import signal
import sys
import tarfile
import textwrap
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from bench import common, decoding, profile, resume, training
from helpers import (
    MODEL_FLAGS,
    ROOT,
    TINY,
    assert_one_line_error,
    command,
    make_dataset,
    save_model,
    tiny_model,
)
from machinery import measure
from machinery.device import maxrss_bytes

# A config file for the benchmarks: the tests' model, a short schedule.
CONFIG = {
    **{name: getattr(TINY, name) for name in MODEL_FLAGS},
    **{"batch_size": 4, "dropout": 0.0, "max_iters": 6, "lr_decay_iters": 50, "warmup_iters": 2},
    **{"eval_interval": 3, "eval_iters": 1, "log_interval": 1},
}

# nanoGPT's train.py, as far as the benchmark sees it: reads --key=value flags as its configurator does (literal
# types), records them, prints an eval at 0 and at max_iters and one log line per iteration 0..max_iters.
FAKE_NANOGPT = textwrap.dedent("""\
    import json, sys
    from ast import literal_eval
    args = {}
    for a in sys.argv[2:]:
        k, v = a[2:].split("=", 1)
        try:
            args[k] = literal_eval(v)
        except (SyntaxError, ValueError):
            args[k] = v
    with open("args.jsonl", "a") as f:
        f.write(json.dumps(args) + "\\n")
    for i in range(args["max_iters"] + 1):
        if i % args["eval_interval"] == 0:
            print(f"step {i}: train loss 4.0, val loss {4.0 - i / 10}")
        print(f"iter {i}: loss 4.0000, time {ITER_MS(i):.2f}ms, mfu -100.00%")
""")


def cli(text: str, **values: object) -> list[str]:
    """A command line written as one string, {name}s filled in (with paths without spaces, as pytest's are)."""
    return text.format(**values).split()


ITER_MS = "lambda i: 500.0 if i == 0 else 10.0 + i % 3"  # the stand-in's step times; iteration 0 compiles
fake_ms = eval(ITER_MS)


@pytest.fixture(scope="module")
def bench_files(tmp_path_factory):
    base = tmp_path_factory.mktemp("bench")
    (base / "tiny.json").write_text(json.dumps(CONFIG))
    (base / "nanogpt" / "data" / "shakespeare_char").mkdir(parents=True)  # a nanoGPT checkout, as far as it is read
    (base / "nanogpt" / "data" / "shakespeare_char" / "train.bin").write_bytes(b"")
    (base / "nanogpt" / "train.py").write_text(f"ITER_MS = {ITER_MS}\n" + FAKE_NANOGPT)
    return {"data": make_dataset(base / "data"), "config": str(base / "tiny.json"), "nanogpt": base / "nanogpt"}


@pytest.mark.slow  # four child processes
def test_training_alternates_with_nanogpt_and_reads_our_metrics(bench_files, tmp_path):
    out = tmp_path / "train.json"
    command = "--config {config} --data_dir {data} --norms builtin --nanogpt {nanogpt} --repeats 2 --warmup 2"
    command += " --iters 3 --target_val 3.85 --device cpu --out {out}"
    result = training.main(cli(command, **bench_files, out=out))
    ours, nano = result["sides"]["builtin eager"], result["sides"]["nanogpt"]
    assert ours["runs_ok"] == nano["runs_ok"] == 2 and ours["max_rss_mib"] > 10
    # nanoGPT ran 0..5; its eval iterations (0 and 5) and the warm-up (0, 1) are not timed: 2, 3, 4 are.
    assert nano["ms_per_iter"] == sorted(fake_ms(i) for i in (2, 3, 4))[1]
    assert nano["best_val_loss"] == pytest.approx(3.5)
    # To val <= 3.85 (the eval at 5): iterations 0-4 as logged, 5 at the median.
    assert nano["train_s_to_target"] == pytest.approx((sum(map(fake_ms, range(5))) + nano["ms_per_iter"]) / 1000)
    calls = [json.loads(line) for line in (bench_files["nanogpt"] / "args.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and all(calls[-1][k] == CONFIG[k] for k in training.NANOGPT_KEYS if k in CONFIG)
    assert isinstance(calls[-1]["dropout"], float) and calls[-1]["compile"] is False and calls[-1]["log_interval"] == 1
    saved = json.loads(out.read_text())
    assert saved["machine"]["torch"] and saved["command"][:3] == ["python", "-m", "bench.training"]
    assert "| nanogpt | 2/2 |" in out.with_suffix(".md").read_text()


def test_whole_runs_each_config_as_its_command_does(bench_files, tmp_path):
    """--whole: the config's own schedule, each side's checkpoints as its config saves them, and our sample; without
    it our timed run saves no checkpoint and prints no sample, nanoGPT's saves its best one only."""
    for whole in (True, False):
        args = training.parse_args(
            ["--config", bench_files["config"], "--nanogpt", str(bench_files["nanogpt"])] + ["--whole"] * whole
        )
        cfg = measure.train_config(args.config, args.set)
        sched = training.schedule(args, cfg)
        ours, _ = training.commands(("builtin", "eager"), cfg, tmp_path, args)
        nano, _ = training.commands(None, cfg, tmp_path, args)
        assert (sched["max_iters"], sched["eval_interval"]) == ((6, 3) if whole else (210, 210))
        assert ("--sample_at_end=False" in ours) != whole
        assert ("--save_checkpoint=False" in ours) != whole
        assert ("--always_save_checkpoint=False" in nano) != whole


def test_measure_takes_our_figures_from_metrics_jsonl(bench_files, tmp_path):
    records = [
        {"kind": "eval", "iter": 0, "train_loss": 4.0, "val_loss": 4.1},
        *[  # windows of 2 iterations
            {"kind": "train", "iter": i, "loss": 3.0, "lr": 1e-3, "ms_per_iter": 10.0 * (i + 1), "tokens_per_s": 1.0}
            for i in range(0, 10, 2)
        ],
        {"kind": "eval", "iter": 8, "train_loss": 2.0, "val_loss": 2.5},
        {"kind": "summary", "device": "cpu"},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tr')
    child = common.Child(0, [], 1.0, 2**20, False)
    cfg = measure.train_config(bench_files["config"], [])
    run = training.measure(("builtin", "eager"), child, tmp_path, cfg, SimpleNamespace(warmup=3, target_val=3.0))
    assert run["ok"] and run["steps_timed"] == 3 and run["ms_per_iter"] == 70.0  # iters 4, 6, 8; not 0 nor 2
    assert run["best_val_loss"] == 2.5
    assert run["train_s_to_target"] == pytest.approx((10 + 2 * (30 + 50 + 70 + 90)) / 1000)


@pytest.mark.slow  # a child train.py per norm
def test_compare_writes_the_curves_and_skips_triton_without_a_gpu(bench_files, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # as a user's shell: no interpreter
    out = tmp_path / "cmp" / "table.json"
    command = "--compare --config {config} --data_dir {data} --norms custom,builtin,triton --device cpu --out {out}"
    sets = " --set eval_interval=3 --set eval_iters=1 --set log_interval=1"
    result = training.main(cli(command + sets, **bench_files, out=out))
    assert list(result["sides"]) == ["custom eager", "builtin eager"] and "triton eager" in result["skipped"]
    for runs in result["runs"].values():
        assert [e["iter"] for e in runs[0]["evals"]] == [0, 3, 6]
    lines = (out.parent / "evals.csv").read_text().splitlines()
    assert lines[0] == "norm,iter,train_loss,val_loss" and len(lines) == 1 + 2 * 3
    assert (out.parent / "val_loss.png").stat().st_size > 1000 and "skipped" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--norms", "layer"], "'layer' is not a norm"),
        (["--modes", "fast"], "'fast' is not one of eager"),
        (["--set", "batchsize=3"], "--set batchsize=3: unknown argument"),
        (["--out", "/proc/no/x.json"], "--out /proc/no/x.json: its folder cannot be created"),
        (["--out", "/tmp"], "--out /tmp: a folder; give a file path"),
        (["--target_val", "nan"], "--target_val: must be >= 0.0, got nan"),
        (["--data_dir", "/proc/no"], "--data_dir /proc/no: no train.bin there; prepare it first"),
    ],
)
def test_training_bad_input_is_one_line(argv, message, capsys):
    """Refused before anything is measured: argparse's errors without its usage block (machinery.options)."""
    assert_one_line_error(command(capsys, training.main, ["--device", "cpu", *argv]), 2, message)


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_every_mode_and_triton_are_planned_on_any_cuda_device(device):
    args = SimpleNamespace(modes=list(training.MODES), norms="builtin,triton", device=device)
    sides, skipped = training.plan_sides(args)
    assert skipped == {} and sides == [(n, m) for m in training.MODES for n in ("builtin", "triton")]


@pytest.mark.slow  # torch.profiler over a few training steps
def test_profile_sorts_a_training_step_into_its_categories(bench_files, tmp_path):
    out = tmp_path / "profile.json"
    command = "--config {config} --data_dir {data} --norms builtin,custom --device cpu --out {out}"
    result = profile.main(cli(command, **bench_files, out=out))
    for row in result["norms"].values():
        assert row["kernels_per_step"] is None and row["cpu_us_per_step"]
        assert all(row["category_us_per_step"][c] > 0 for c in profile.CATEGORIES)
        assert row["matmul_gflop_per_step"] > 0 and row["matmul_gflops_alone"] > 0
    assert out.with_suffix(".png").stat().st_size > 1000 and "| custom |" in out.with_suffix(".md").read_text()


def chain(*names: str) -> SimpleNamespace:
    """A profiler event and its callers, outermost first: the innermost event."""
    event = None
    for name in names:
        event = SimpleNamespace(name=name, cpu_parent=event)
    return event


@pytest.mark.parametrize(
    "names, category",
    [
        (("aten::linear", "aten::addmm"), "matrix products"),
        (("aten::scaled_dot_product_attention", "aten::bmm"), "attention"),
        (("autograd::engine::evaluate_function: MmBackward0", "aten::mm"), "matrix products"),
        (("norm", "aten::mean"), "norms"),
        (("Optimizer.step#AdamW.step", "aten::_fused_adamw_"), "optimizer"),
        (("Optimizer.zero_grad#AdamW.zero_grad",), "optimizer"),
        # the clip's ops are the optimizer's, though no range of ours wraps them (step.train_step runs them)
        *[
            ((op,), "optimizer")
            for op in ("aten::_foreach_norm", "aten::stack", "aten::linalg_vector_norm", "aten::_foreach_mul_")
        ],
        (("data", "aten::randint"), "data"),
        (("aten::add",), "everything else"),
    ],
)
def test_profile_categories_follow_the_outermost_caller(names: tuple[str, ...], category: str) -> None:
    assert profile.category(chain(*names)) == category


@pytest.mark.slow  # three train.py processes
def test_resume_interrupted_is_an_interrupt_not_a_failed_run(monkeypatch):
    """Ctrl-C kills the train.py child: bench.resume stops as interrupted (run_command: 130), not 'train.py failed'
    with the killed child's empty reason."""
    monkeypatch.setattr(resume, "run_child", lambda cmd: common.Child(-9, [], 1.0, 0, False, interrupted=True))
    with pytest.raises(KeyboardInterrupt):
        resume.main(["--device", "cpu"])


@pytest.mark.slow  # two train.py processes, 35 s in all; that a resume is exact: tests/test_train.py
def test_resume_compares_every_loss_the_straight_run_logged(bench_files, tmp_path):
    """bench/resume's plumbing: both runs evaluate at the cut and log each iteration, the resumed run's losses
    reach the comparison, --rtol the verdict. (That a resume is exact: tests/test_train.py.)"""
    command = "--config {config} --set data_dir={data} --set device=cpu --rtol 1 --out {out}"
    result = resume.main(cli(command, **bench_files, out=tmp_path / "resume.json"))
    logged = [(kind, it, resumed is not None) for kind, it, _, resumed in result["losses"]]
    assert logged == [("eval", 0, True), ("eval", 2, True), ("eval", 4, True), *[("train", i, True) for i in range(4)]]
    assert "(allowed 1); final weights'" in (tmp_path / "resume.md").read_text()


def test_resume_comparison_sees_a_different_loss_or_weight(tmp_path):
    """compare() on two hand-made run folders: one logged loss off by 1e-3 relative, one weight off by 0.5."""
    for name, loss, shift in (("a", 2.0, 0.0), ("b", 2.002, 0.5)):
        folder = tmp_path / name
        folder.mkdir()
        records = [{"kind": "train", "iter": 0, "loss": 3.0}, {"kind": "train", "iter": 1, "loss": loss}]
        records.append({"kind": "eval", "iter": 2, "train_loss": 1.0, "val_loss": 1.5})
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        model = tiny_model()
        with torch.no_grad():
            model.lm_head.weight.add_(shift)
        save_model(folder / "ckpt.pt", model, {"kind": "char", "itos": list("abc")})
    result = resume.compare(tmp_path / "a", tmp_path / "b", rtol=1e-4)
    assert result["max_relative_loss_gap"] == pytest.approx(1e-3) and result["max_weight_gap"] == pytest.approx(0.5)
    assert not result["same"] and resume.compare(tmp_path / "a", tmp_path / "a", rtol=0)["same"]


def test_decoding_times_every_path_at_every_batch(bench_files, tmp_path):
    out = tmp_path / "decode.json"
    command = "--sizes {config} --batches 1,2 --prompt_len 4 --new_tokens 16 --repeats 1 --device cpu --out {out}"
    result = decoding.main(cli(command, **bench_files, out=out))
    assert [(r["batch"], sorted(r["tokens_per_s"])) for r in result["runs"]] == [
        (b, sorted(decoding.PATHS)) for b in (1, 2)
    ]
    assert "mode's time per token" in out.with_suffix(".md").read_text()
    assert "cached / linears" in out.with_suffix(".md").read_text()


def test_decoding_cut_short_leaves_the_batches_it_measured(bench_files, tmp_path, monkeypatch):
    """As bench/gpu.sh's time limit cuts it (SIGINT: KeyboardInterrupt) during the second batch size."""
    out = tmp_path / "decode.json"
    calls = []

    def cut_at_the_second(*args, real=decoding.decode):
        calls.append(args[2])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(decoding, "decode", cut_at_the_second)
    command = "--sizes {config} --batches 1,2 --prompt_len 4 --new_tokens 4 --repeats 1 --device cpu --out {out}"
    with pytest.raises(KeyboardInterrupt):
        decoding.main(cli(command, **bench_files, out=out))
    saved = json.loads(out.read_text())
    assert [r["batch"] for r in saved["runs"]] == [1] and saved["runs_planned"] == 2
    assert "| 1 |" in out.with_suffix(".md").read_text()


def test_linears_alone_are_the_matrix_products_of_a_forward_pass_in_order():
    """The ceiling path runs each Linear (weight and bias) once a step, in the order the model's forward does."""

    class Weights(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is F.linear:  # (weight, bias), as nn.Linear passes them
                self.seen.append((id(args[1]), id(args[2] if len(args) > 2 else (kwargs or {}).get("bias"))))
            return func(*args, **(kwargs or {}))

    model = tiny_model()
    with Weights() as forward:
        model.generate(torch.zeros(1, 3, dtype=torch.long), 1, temperature=0)  # one forward pass
    with Weights() as alone:
        decoding.linears_alone(model, 1, "cpu")(2)  # two steps
    assert len(forward.seen) == TINY.n_layer * 4 + 1  # per block c_attn, c_proj, c_fc, c_proj; then the head
    assert alone.seen == forward.seen * 2


def test_matmul_times_f_linear_at_each_count_of_rows():
    """--matmul's plumbing (that the mode's rows do not depend on their company: test_batch_invariant_triton.py)."""
    result = decoding.main(["--matmul", "--widths", "16", "--device", "cpu"])
    assert [(r["K=N"], r["M"]) for r in result["matmul"]] == [(16, m) for m in decoding.MATMUL_ROWS]


@pytest.mark.slow  # children that allocate, and one that must be killed
def test_run_child_reports_the_childs_peak_memory_and_kills_on_timeout():
    # A child's ru_maxrss starts at this process's peak (Linux carries it over fork and exec): allocate beyond it.
    mib = maxrss_bytes(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) // 2**20 + 300
    big = common.run_child([sys.executable, "-c", f"b = bytearray({mib} * 2**20); print('done')"])
    small = common.run_child([sys.executable, "-c", "print('done')"], echo="kid")
    assert big.ok and big.lines == ["done"] and big.max_rss_bytes >= mib * 2**20 > small.max_rss_bytes
    slow = common.run_child([sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=1)
    assert slow.timed_out and not slow.ok and slow.wall_s < 20


@pytest.mark.slow  # a child process, and a signal
def test_an_interrupted_benchmark_kills_its_child_and_returns_what_it_has():
    """SIGINT (Ctrl-C, or bench/gpu.sh's time limit) while a child runs: the child is killed, not left running,
    and its lines so far come back, marked interrupted."""
    code = "import os, signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print(os.getpid()); time.sleep(60)"
    timer = threading.Timer(3, lambda: os.kill(os.getpid(), signal.SIGINT))  # to this process, as timeout sends it
    timer.start()
    child = common.run_child([sys.executable, "-c", code])
    timer.join()
    assert child.interrupted and not child.ok and child.wall_s < 30
    with pytest.raises(ProcessLookupError):  # reaped: no such process any more
        os.kill(int(child.lines[0]), 0)


def test_signals_in_an_interrupts_block_raise_nothing_and_leave_the_handler_as_it_was():
    """timeout sends SIGINT twice (to the benchmark, then to its process group): neither may raise in the middle of
    a benchmark's bookkeeping, and outside the block Ctrl-C raises again."""
    before = signal.getsignal(signal.SIGINT)
    with common.Interrupts() as interrupts:
        for _ in range(2):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # (each one handled before the next comes)
    assert interrupts.seen and signal.getsignal(signal.SIGINT) is before


def test_machine_info_needs_no_git(monkeypatch, tmp_path):
    """A copy of the tree without git (or without .git): the commit passed in BENCH_COMMIT, else None."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no git, no nvidia-smi on it
    monkeypatch.setenv("BENCH_COMMIT", "abc1234+changes")
    assert measure.machine_info()["commit"] == "abc1234+changes"
    monkeypatch.delenv("BENCH_COMMIT")
    info = measure.machine_info()
    assert info["commit"] is None and info["torch"] == torch.__version__


def test_pack_makes_the_three_files(tmp_path):
    res = tmp_path / "res"
    res.mkdir()
    (res / "steps.tsv").write_text("a\t0\t3\t10\nb\t124\t10\t10\n")
    (res / "a.md").write_text("| x |\n|---|\n| 1 |\n")
    (res / "a.json").write_text('{"x": 1}')
    (res / "b.log").write_text("".join(f"line {i}\n" for i in range(40)))
    common.pack(res, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(common.PACKED)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["a"] == {"x": 1} and [s["rc"] for s in results["steps"]] == ["0", "124"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| 1 |" in summary and "line 39" in summary and "line 14\n" not in summary  # the log's last 25 lines
    with tarfile.open(tmp_path / "out" / "gpu_results.tar.gz") as tar:
        assert {"gpu_results/b.log", "gpu_results/a.md"} <= set(tar.getnames())


def test_the_plot_refuses_what_it_would_draw_wrong_and_draws_the_rest(tmp_path, capsys):
    """A folder as --out (matplotlib would write FOLDER.png), a name without a format it writes, a difference that
    is not finite (a line with a gap no reader sees): one line each, nothing written. (The committed JSON drawn:
    the README's command, run as printed by test_readme_commands.py.)"""
    pytest.importorskip("matplotlib")
    from bench import plot_batch_independence as plot

    source = ROOT / "bench" / "results" / "batch_independence_cpu.json"
    result = json.loads(source.read_text())
    result["rows"][0]["alone_vs_batch"]["per_step_max_abs_diff"][2] = float("nan")
    (tmp_path / "nan.json").write_text(json.dumps(result))
    refused = {
        f"--out {tmp_path}": f"--out {tmp_path} is a folder: give a file name, such as {tmp_path}",
        f"--out {tmp_path / 'x.xyz'}": "give a file name ending in .png, .svg, .pdf",
        f"--json {tmp_path / 'nan.json'} --out {tmp_path / 'x.png'}": "custom: a difference that is not finite (nan at",
    }
    for argv, message in refused.items():
        assert_one_line_error(command(capsys, plot.main, argv.split()), 1, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nan.json"]
