"""train.py with several processes: torchrun, DistributedDataParallel over gloo on the CPU.

A 2-process run and a 1-process run with the same global batch (gradient_accumulation_steps is the global number
of micro-batches) see the same data and must give the same losses, to float tolerance (the gradient all-reduce
sums in another order).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from helpers import ROOT, make_dataset, records, subprocess_env, tiny_args, train_losses, wait_for
from machinery.checkpoint import load_checkpoint
from machinery.options import ConfigError


def torchrun(args: list[str]) -> subprocess.Popen[str]:
    """`torchrun --standalone --nproc_per_node=2 train.py ARGS` with this suite's interpreter, started."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *args]
    pipe = subprocess.PIPE
    return subprocess.Popen(argv, cwd=ROOT, env=subprocess_env(), stdout=pipe, stderr=pipe, text=True)


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path: Path, tiny_data: Path) -> None:
    args = ["--gradient_accumulation_steps=4", "--max_iters=4", "--eval_interval=2", "--dropout=0.0"]
    proc = torchrun(tiny_args(tiny_data, tmp_path / "ddp", *args))
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert "processes=2" in stdout
    assert stdout.count("iter 3: loss") == 1  # only rank 0 prints
    single = train.main(tiny_args(tiny_data, tmp_path / "one", *args))

    ddp_losses, one_losses = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "one")
    assert sorted(ddp_losses) == sorted(one_losses) == [0, 1, 2, 3]  # one record per iteration: rank 0 writes
    for it in one_losses:
        assert ddp_losses[it] == pytest.approx(one_losses[it], abs=1e-5), it
    ddp_evals, one_evals = records(tmp_path / "ddp", "eval"), records(tmp_path / "one", "eval")
    assert [r["iter"] for r in ddp_evals] == [r["iter"] for r in one_evals] == [0, 2, 4]
    for a, b in zip(ddp_evals, one_evals, strict=True):
        assert a["val_loss"] == pytest.approx(b["val_loss"], abs=1e-5)
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5)
    (summary,) = records(tmp_path / "ddp", "summary")
    assert summary["world_size"] == 2 and summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=1e-5)

    # The checkpoint is rank 0's unwrapped model (no "module." prefixes), and one process can resume it.
    ckpt = load_checkpoint(tmp_path / "ddp" / "ckpt.pt")
    assert ckpt["iter_num"] == 4 and not any(k.startswith("module.") for k in ckpt["model"])
    one = load_checkpoint(tmp_path / "one" / "ckpt.pt")
    for key, value in one["model"].items():
        torch.testing.assert_close(ckpt["model"][key], value, atol=1e-5, rtol=1e-4)


def test_accumulation_steps_must_divide_among_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "data")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as e:
        train.main(tiny_args(data, tmp_path / "out", "--gradient_accumulation_steps=3"))
    assert "gradient_accumulation_steps=3" in str(e.value) and "processes (2)" in str(e.value)


@pytest.mark.slow
def test_ctrl_c_in_one_process_stops_every_process_and_the_resumed_run_gets_the_uninterrupted_losses(
    tmp_path: Path, tiny_data: Path
) -> None:
    """With no log line to wait for (log_interval is huge), a signal to rank 1 alone still stops both processes
    at the next iteration, and rank 0 saves that iteration's state, each process's own dropout stream among it.
    Resumed from it, the 2-process run gets the losses of a run never interrupted."""
    args = ["--gradient_accumulation_steps=2", "--dropout=0.2", "--eval_interval=1000000"]
    out = tmp_path / "cut"
    proc = torchrun(tiny_args(tiny_data, out, *args, "--max_iters=1000000", "--log_interval=1000000"))
    wait_for(lambda: (out / "metrics.jsonl").exists() and bool(records(out, "eval")), proc, timeout=180)
    time.sleep(0.5)  # into training
    rank1 = next(pid for pid in children(proc.pid) if b"RANK=1\0" in Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(rank1, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert "interrupted (SIGINT)" in stderr and "To continue the run" in stderr, stderr[-2000:]
    ckpt = load_checkpoint(out / "ckpt.pt")
    it = ckpt["iter_num"]
    assert 0 < it < 1000000
    assert f"after {it} iterations" in stderr
    ranks = ckpt["rng_ranks"]
    assert len(ranks) == 2 and not torch.equal(ranks[0]["torch"], ranks[1]["torch"])

    end = it + 3
    for out_dir, extra in ((out, ["--init_from=resume"]), (tmp_path / "whole", [])):
        done = torchrun(tiny_args(tiny_data, out_dir, *args, f"--max_iters={end}", "--log_interval=1", *extra))
        stdout, stderr = done.communicate(timeout=240)
        assert done.returncode == 0, stdout[-2000:] + stderr[-3000:]
    whole, cut = train_losses(tmp_path / "whole"), train_losses(out)
    assert sorted(whole) == list(range(end)) and sorted(cut) == [0, *range(it, end)]
    assert [cut[i] for i in range(it, end)] == [whole[i] for i in range(it, end)]


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
