"""train.py as processes: kill -9 then resume, Ctrl-C (SIGINT) and SIGTERM then resume, and several processes under
torchrun (DistributedDataParallel over gloo on the CPU), one of them interrupted.

Each interrupted run is a real process (the point is what a signal does to one, and the exit status a shell sees);
a resumed one-process run and the uninterrupted reference run in this process with the same single thread, and the
resumed run must give exactly the reference's losses, iteration by iteration. A 2-process run and a 1-process run
with the same global batch (gradient_accumulation_steps is the global number of micro-batches) see the same data and
must give the same losses, to float tolerance (the gradient all-reduce sums in another order).
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import train
from helpers import ROOT, n_train_records, records, start, subprocess_env, tiny_args, train_losses, wait_for
from machinery.checkpoint import load_checkpoint

# ---- one process, killed or interrupted ----


# dropout > 0: the dropout masks draw from the torch RNG, whose state must come back from the checkpoint too.
# (Every norm's exact resume: test_train.py::test_every_norm_resumes_with_the_losses_of_an_uninterrupted_run.)
@pytest.mark.slow
def test_kill_9_then_resume_continues_the_same_run(tmp_path: Path, tiny_data: Path) -> None:
    args = tiny_args(tiny_data, tmp_path / "run", "--eval_interval=10", "--lr_decay_iters=200", "--dropout=0.1")
    proc = start("train.py", *args, "--max_iters=100000")
    wait_for(lambda: n_train_records(tmp_path / "run") >= 15, proc)  # well past the checkpoint at 10, mid-run
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(timeout=30)
    assert (tmp_path / "run" / ".lock").read_text() == f"{proc.pid}\n"  # left by the killed run (held no more)
    k = load_checkpoint(tmp_path / "run" / "ckpt.pt")["iter_num"]
    assert k >= 10 and k % 10 == 0
    n = k + 6
    train.main(args + ["--init_from=resume", f"--max_iters={n}"])
    train.main([*args, f"--out_dir={tmp_path / 'whole'}", f"--max_iters={n}"])  # (a later flag wins)
    # metrics.jsonl of the killed-and-resumed run reads as one run: the killed tail was replaced.
    assert [r["iter"] for r in records(tmp_path / "run", "train")] == list(range(n))
    assert train_losses(tmp_path / "run") == train_losses(tmp_path / "whole")


@pytest.mark.slow
def test_one_run_per_folder_two_started_at_once_and_a_resume_while_it_runs_are_refused(tmp_path, tiny_data):
    """Two new runs started into one folder at once: one holds it, the other is refused in one line naming the
    holder; so is a resume (or an --overwrite) while the holder runs. The holder's checkpoint and record are whole."""
    out = tmp_path / "run"
    args = tiny_args(tiny_data, out, "--eval_interval=5", "--max_iters=100000")
    first, second = start("train.py", *args), start("train.py", *args)
    deadline = time.monotonic() + 90
    while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the one refused ends at once; the holder runs on
    loser, holder = (first, second) if first.poll() is not None else (second, first)
    wait_for(lambda: len(records(out, "eval")) >= 2 if (out / "metrics.jsonl").exists() else False, holder)
    in_use = f"error: out_dir {str(out)!r} is in use by a run that is still going (process {holder.pid} holds"
    assert loser.returncode == 1 and loser.stderr.read().strip().startswith(in_use)
    for extra in (["--init_from=resume"], ["--overwrite=True"]):
        proc = subprocess.run(
            [sys.executable, "train.py", *args, *extra], cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
        )
        assert proc.returncode == 1 and proc.stderr.strip().startswith(in_use), proc.stderr[-2000:]
    holder.send_signal(signal.SIGTERM)
    _, err = holder.communicate(timeout=60)
    assert holder.returncode == 143, err[-2000:]
    k = load_checkpoint(out / "ckpt.pt")["iter_num"]
    assert [r["iter"] for r in records(out, "train")] == list(range(k))  # one run's record, whole
    assert sorted(p.name for p in out.iterdir()) == ["ckpt.pt", "metrics.jsonl"]  # (.lock removed as it ended)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "always_save"),
    [(signal.SIGINT, True), (signal.SIGINT, False), (signal.SIGTERM, True)],
    ids=["ctrl-c", "ctrl-c-best-only", "sigterm"],
)
def test_a_signal_saves_a_checkpoint_exits_and_the_printed_command_resumes_it(
    tmp_path: Path, tiny_data: Path, sig: signal.Signals, always_save: bool
) -> None:
    """Ctrl-C exits 130, SIGTERM 143, each after saving a checkpoint; the command the message prints continues the
    run with exactly the losses of an uninterrupted one. In best-only mode neither the signal nor that command
    replaces the best model (ckpt.pt, saved at an evaluation every 3 iterations) with anything but a better one."""
    out = tmp_path / "run"
    every = 1000 if always_save else 3  # best-only: a best model in ckpt.pt before the signal
    flags = [f"--eval_interval={every}", "--lr_decay_iters=200", "--dropout=0.1"]
    flags.append(f"--always_save_checkpoint={always_save}")
    args = tiny_args(tiny_data, out, *flags)
    proc = start("train.py", *args, "--max_iters=100000")
    wait_for(lambda: n_train_records(out) >= 5, proc)
    proc.send_signal(sig)
    stdout, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (stdout[-1000:], err[-2000:])
    assert "Traceback" not in err
    # In best-only mode ckpt.pt is never overwritten by an interruption: the state goes beside it.
    saved = out / ("ckpt.pt" if always_save else "ckpt_interrupted.pt")
    k = load_checkpoint(saved)["iter_num"]  # always_save: eval_interval=1000, only the interruption saved one
    assert k >= 5
    best = None if always_save else load_checkpoint(out / "ckpt.pt")
    assert best is None or (
        best["iter_num"] <= k and best["best_val_loss"] == min(r["val_loss"] for r in records(out, "eval"))
    )
    assert f"interrupted ({sig.name}) after {k} iterations; saved {saved}. To continue the run: " in err
    command = err.split("To continue the run: ")[1].strip()
    assert command.count("python train.py ") == 1, command
    n = k + 4
    # as printed, run by a shell from the repository's root, its `python` this suite's interpreter
    line = command.replace("python train.py ", f"{shlex.quote(sys.executable)} train.py ")
    resumed = subprocess.run(
        f"{line} --max_iters={n}", shell=True, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True
    )
    assert resumed.returncode == 0 and f"resuming {saved} at iteration {k}" in resumed.stdout, resumed.stderr[-3000:]
    if best is not None:  # ckpt.pt is the best model still, or a better one the resumed run found
        now = load_checkpoint(out / "ckpt.pt")
        assert now["iter_num"] == best["iter_num"] or now["best_val_loss"] < best["best_val_loss"]
    train.main([*args, f"--out_dir={tmp_path / 'whole'}", "--always_save_checkpoint=True", f"--max_iters={n}"])
    assert sorted(train_losses(out)) == list(range(n))
    assert train_losses(out) == train_losses(tmp_path / "whole")


# ---- several processes ----


def torchrun(args: list[str]) -> subprocess.Popen[str]:
    """`torchrun --standalone --nproc_per_node=2 train.py ARGS` with this suite's interpreter, started."""
    return start("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py", *args)


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tmp_path: Path, tiny_data: Path) -> None:
    args = ["--gradient_accumulation_steps=4", "--max_iters=4", "--eval_interval=2", "--dropout=0.0"]
    proc = torchrun(tiny_args(tiny_data, tmp_path / "ddp", *args))
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert stdout.count("iter 3: loss") == 1  # only rank 0 prints
    single = train.main(tiny_args(tiny_data, tmp_path / "one", *args))

    assert [r["iter"] for r in records(tmp_path / "ddp", "train")] == [0, 1, 2, 3]  # one record each: rank 0 writes
    assert train_losses(tmp_path / "ddp") == pytest.approx(train_losses(tmp_path / "one"), abs=1e-5)
    ddp_evals, one_evals = eval_losses(tmp_path / "ddp"), eval_losses(tmp_path / "one")
    assert sorted({it for it, _ in one_evals}) == [0, 2, 4]
    assert ddp_evals == pytest.approx(one_evals, abs=1e-5)
    (summary,) = records(tmp_path / "ddp", "summary")
    assert summary["world_size"] == 2 and summary["final_val_loss"] == pytest.approx(single["final_val_loss"], abs=1e-5)

    # The checkpoint is rank 0's model, the one-process run's.
    ckpt = load_checkpoint(tmp_path / "ddp" / "ckpt.pt")
    assert ckpt["iter_num"] == 4
    for key, value in load_checkpoint(tmp_path / "one" / "ckpt.pt")["model"].items():
        torch.testing.assert_close(ckpt["model"][key], value, atol=1e-5, rtol=1e-4)


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
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()  # torchrun's processes
    rank1 = next(int(pid) for pid in children if b"RANK=1\0" in Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(rank1, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    ckpt = load_checkpoint(out / "ckpt.pt")
    it = ckpt["iter_num"]
    assert 0 < it < 1000000
    assert f"interrupted (SIGINT) after {it} iterations" in stderr, stderr[-2000:]
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


def eval_losses(out_dir: Path) -> dict[tuple[int, str], float]:
    """(iteration, split) -> the evaluation's loss, from metrics.jsonl."""
    return {(r["iter"], split): r[f"{split}_loss"] for r in records(out_dir, "eval") for split in ("train", "val")}
