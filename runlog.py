"""The record a training run leaves: metrics.jsonl (one JSON object a line: train, eval, summary), the same
figures in Weights & Biases when asked for, and the summary train.main() returns."""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import checkpoint
from device import Dist, peak_memory
from options import TrainConfig


@contextlib.contextmanager
def open_log(cfg: TrainConfig, dist: Dist, resumed_at: int | None) -> Any:
    """log(record, wandb=None): one line of metrics.jsonl and, if asked for, the same figures under wandb's names
    (rank 0; the other processes log nothing). On resume, what describes the run up to the checkpoint is kept."""
    with contextlib.ExitStack() as closing:
        metrics = run = None
        if dist.master:
            path = Path(cfg.out_dir) / "metrics.jsonl"
            metrics = closing.enter_context(checkpoint.open_metrics(path, resumed_at, append=cfg.eval_only))
            if cfg.wandb_log:  # (build_config made sure that wandb can be imported)
                import wandb

                name = cfg.wandb_run_name or f"{cfg.dataset}-{cfg.norm}-{time.strftime('%Y%m%d-%H%M%S')}"
                run = wandb.init(project=cfg.wandb_project, name=name, config=asdict(cfg))
                closing.callback(run.finish)

        def log(rec: dict[str, Any], wandb: dict[str, float] | None = None) -> None:
            if metrics is not None:
                metrics.write(json.dumps(rec) + "\n")
                metrics.flush()
            if run is not None and wandb is not None:
                run.log(wandb, step=rec["iter"])
            if run is not None and rec["kind"] == "summary":
                run.summary.update(rec)

        yield log


def summarize(it: int, ms_per_iter: list[float], last_val: float | None, best_val: float,
              tokens_per_iter: int, t_start: float, facts: dict[str, Any], stop_reason: str) -> dict[str, Any]:
    timed = ms_per_iter[1:] if len(ms_per_iter) > 1 else ms_per_iter  # the first holds startup
    median_ms = statistics.median(timed) if timed else None
    return {
        "kind": "summary", "iters": it, "final_val_loss": last_val,
        "best_val_loss": best_val if math.isfinite(best_val) else None,
        "peak_memory_bytes": peak_memory(facts["device"]), "median_ms_per_iter": median_ms,
        "median_tokens_per_s": tokens_per_iter / (median_ms / 1000) if median_ms else None,
        "wall_s": time.perf_counter() - t_start, **facts, "stop_reason": stop_reason,
    }
