"""The record a training run leaves: losses read back, log lines, metrics.jsonl (one JSON object a line: train,
eval, summary), the same figures in Weights & Biases when asked for, and the summary train.main() returns."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from machinery.command import Failure, first_line
from machinery.device import Dist
from machinery.options import TrainConfig


class LossWindow:
    """The losses of the iterations not yet read back, kept on the device so the loop never waits for them, and
    the wall time they took. `read()` syncs once for them all: each iteration's loss, averaged over the processes."""

    def __init__(self, dist: Dist, tokens_per_iter: int, log: Callable[..., None]) -> None:
        self.dist = dist
        self.tokens_per_iter = tokens_per_iter
        self.log = log
        self.pending = []
        self.n_read = 0
        self.ms_per_iter = []
        self.t0 = time.perf_counter()
        self.paused_s = 0.0  # pauses: evaluations and checkpoints

    def read(self) -> list[tuple[int, float, float]]:
        pending = self.pending
        self.pending = []
        if not pending:
            return []
        losses = self.dist.all_reduce(torch.stack([loss for _, loss, _ in pending]).float()) / self.dist.world_size
        self.n_read += len(pending)
        return [(it, loss, lr) for (it, _, lr), loss in zip(pending, losses.tolist(), strict=True)]

    def log_line(self, last: tuple[int, float, float]) -> None:
        """The log line and metrics record of the last iteration read, with the time per iteration since the last
        line (pauses left out)."""
        it, loss, lr = last
        now = time.perf_counter()
        ms = (now - self.t0 - self.paused_s) * 1000 / max(self.n_read, 1)
        self.t0 = now
        self.paused_s = 0.0
        self.n_read = 0
        self.ms_per_iter.append(ms)
        tok_s = self.tokens_per_iter / (ms / 1000) if ms > 0 else 0.0
        self.dist.print(f"iter {it}: loss {loss:.4f}, lr {lr:.2e}, {ms:.2f} ms/iter, {tok_s:.0f} tok/s")
        self.log(
            {"kind": "train", "iter": it, "loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s},
            wandb={"train/loss": loss, "lr": lr, "ms_per_iter": ms, "tokens_per_s": tok_s},
        )

    def summary(self, **record: Any) -> dict[str, Any]:
        """The summary record: `record` with the median time and speed per iteration (the first line's, startup
        included, left out when there are others)."""
        timed = self.ms_per_iter[1:] if len(self.ms_per_iter) > 1 else self.ms_per_iter
        median_ms = statistics.median(timed) if timed else None
        speed = self.tokens_per_iter / (median_ms / 1000) if median_ms else None
        return {"kind": "summary", **record, "median_ms_per_iter": median_ms, "median_tokens_per_s": speed}


@contextlib.contextmanager
def open_log(cfg: TrainConfig, dist: Dist, resumed_at: int | None) -> Iterator[Callable[..., None]]:
    """log(record, wandb=None): one line of metrics.jsonl and, if asked for, the same figures under wandb's names
    (rank 0; the other processes log nothing). metrics.jsonl starts afresh, or stays as it is (eval_only), or on a
    resume after `resumed_at` iterations drops the records at or after it (the tail a killed run wrote after its
    checkpoint) and a line cut short by a kill, so that it reads as one run."""
    with contextlib.ExitStack() as closing:
        metrics = None
        run = None
        if dist.master:
            # wandb first, so that failing to start leaves metrics.jsonl as it was (build_config made sure it imports)
            if cfg.wandb_log:
                import wandb

                name = cfg.wandb_run_name or f"{cfg.dataset}-{cfg.norm}-{time.strftime('%Y%m%d-%H%M%S')}"
                try:
                    run = wandb.init(project=cfg.wandb_project, name=name, config=asdict(cfg))
                except Exception as e:  # a key refused, no network, a server down: wandb's errors vary
                    raise Failure(
                        f"wandb could not start a run ({type(e).__name__}: {first_line(e)}): check the key and the "
                        f"network, run with WANDB_MODE=offline, or drop --wandb_log"
                    ) from None
                closing.callback(run.finish)
            path = Path(cfg.out_dir) / "metrics.jsonl"
            if not cfg.eval_only:
                records = read_metrics(path) if resumed_at is not None else []
                kept = [
                    json.dumps(rec) + "\n"
                    for rec in records
                    if not isinstance(rec.get("iter"), int)  # (none, or a record edited by hand: kept as it is)
                    or rec["iter"] < resumed_at
                    or (rec.get("kind") == "eval" and rec["iter"] == resumed_at)
                ]
                path.with_suffix(".jsonl.tmp").write_text("".join(kept), encoding="utf-8")
                os.replace(path.with_suffix(".jsonl.tmp"), path)
            metrics = closing.enter_context(open(path, "a+b"))  # (writes go to the end, wherever it reads)
            size = metrics.seek(0, os.SEEK_END)
            metrics.seek(max(size - 1, 0))
            if size and metrics.read(1) != b"\n":  # (eval_only) after a line a kill cut short: a record of its own
                metrics.write(b"\n")

        def log(rec: dict[str, Any], wandb: dict[str, float] | None = None) -> None:
            if metrics is not None:
                try:  # one write of the whole line: a kill leaves it whole or cut short, never two run together
                    metrics.write((json.dumps(rec) + "\n").encode("utf-8"))
                    metrics.flush()
                except OSError as e:  # a full disk: name the file (a write's error names none)
                    raise OSError(e.errno, e.strerror, str(path)) from None
            if run is not None and wandb is not None:  # (a figure of None, such as val/bpb without byte counts: none)
                run.log({k: v for k, v in wandb.items() if v is not None}, step=rec["iter"])
            if run is not None and rec["kind"] == "summary":
                run.summary.update(rec)

        yield log


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl file ([] if there is none). A damaged line (not UTF-8, not a JSON object) is
    skipped and named on stderr, except the last one when a kill cut it short (no newline after it)."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")  # (a folder, or unreadable: an OSError naming it, for the front door)
    records, damaged = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif line.strip() and number < len(lines):  # the last piece has no newline: a kill's
            damaged.append(number)
    if damaged:
        print(f"note: {path}: skipped damaged line(s) {', '.join(map(str, damaged[:10]))}", file=sys.stderr)
    return records
