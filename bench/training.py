"""Training speed: train.py per norm and per mode, beside nanoGPT; the norm comparison (--compare); the whole run.

Each run is a fresh child process: no allocator, thread pool or compiled kernel leaks into the next (bench/README.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    Child,
    Interrupts,
    at_least,
    comma_list,
    fmt,
    median,
    parse,
    parser,
    report,
    run_child,
    spread,
    write_results,
)
from layernorm import NO_NORM, NORMS
from machinery.command import BadOption, run_command
from machinery.measure import markdown_table, output_of, progress, train_config
from machinery.options import TrainConfig
from machinery.runlog import read_metrics

# train.py's flags for each mode; all but eager need CUDA.
MODES = {
    "eager": [],
    "graphs": ["--cuda_graphs=True"],
    "compile": ["--compile=True", "--compile_mode=default"],
    "reduce-overhead": ["--compile=True", "--compile_mode=reduce-overhead"],
}
Side = tuple[str, str] | None  # one side of the comparison: ours as (norm, mode), or nanoGPT's (None)
# What decides the work of a step, and the schedule: nanoGPT gets each of these explicitly (its defaults differ).
NANOGPT_KEYS = tuple(
    "batch_size block_size n_layer n_head n_embd dropout bias gradient_accumulation_steps learning_rate weight_decay"
    " beta1 beta2 grad_clip decay_lr warmup_iters lr_decay_iters min_lr".split()
)
NANOGPT_ITER = re.compile(r"^iter (\d+): loss [^,]+, time ([\d.]+)ms")  # nanoGPT's log lines, the only ones parsed
NANOGPT_EVAL = re.compile(r"^step (\d+): train loss ([\d.naif]+), val loss ([\d.naif]+)")
HEADERS = (
    "side|runs ok|ms/iter|spread|tokens/s|peak RSS MiB|CUDA peak MiB|final val|best val|train s to val <= {}|wall s"
    "|x builtin eager|x nanoGPT"
).split("|")


def plan_sides(args: argparse.Namespace) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """[(norm, mode)] to run, and {side: why it is skipped}."""
    sides = []
    skipped = {}
    for mode in args.modes:
        for norm, _, only in (item.partition(":") for item in args.norms.split(",") if item):
            if norm not in (*NORMS, NO_NORM):
                raise BadOption(f"--norms: {norm!r} is not a norm; choose from {', '.join(NORMS)}, {NO_NORM}")
            if only and only != mode:
                continue
            if mode != "eager" and not args.device.startswith("cuda"):  # cuda, cuda:0, cuda:1 ...
                skipped[f"{norm} {mode}"] = "needs a CUDA device"
            elif norm == "triton" and not args.device.startswith("cuda") and os.environ.get("TRITON_INTERPRET") != "1":
                skipped[f"{norm} {mode}"] = "no CUDA device (on a CPU: TRITON_INTERPRET=1, Triton's slow interpreter)"
            else:
                sides.append((norm, mode))
    return sides, skipped


def schedule(args: argparse.Namespace, cfg: TrainConfig) -> dict[str, Any]:
    """The iterations and evals of one run: the timing default, or the config's schedule with --curves."""
    if args.curves:
        return {k: getattr(cfg, k) for k in ("max_iters", "eval_interval", "eval_iters", "log_interval")}
    max_iters = args.warmup + args.iters
    return {"max_iters": max_iters, "eval_interval": max_iters, "eval_iters": args.eval_iters, "log_interval": 1}


def commands(side: Side, cfg: TrainConfig, out_dir: Path, args: argparse.Namespace) -> tuple[list[str], Path]:
    """The command line and folder of one run: ours (norm, mode) or nanoGPT's (side None)."""
    both = {**schedule(args, cfg), "out_dir": out_dir, "device": args.device}
    if side is None:
        values = {**{k: getattr(cfg, k) for k in NANOGPT_KEYS}, **both}
        if not args.whole:  # nanoGPT has no option to save nothing: a timed run saves its best checkpoint only
            values["always_save_checkpoint"] = False
        if not args.device.startswith("cuda"):
            values.update(compile=False, dtype="float32")  # on CUDA its own defaults: compile on, bfloat16
        flags = [f"--{k}={v}" for k, v in values.items()]
        return [sys.executable, "train.py", "config/train_shakespeare_char.py", *flags], Path(args.nanogpt)
    norm, mode = side
    timing = {} if args.whole else {"save_checkpoint": False, "sample_at_end": False}  # metrics.jsonl has the figures
    ours = {**both, "norm": norm, **timing}
    ours.update({"data_dir": args.data_dir} if args.data_dir else {})
    flags = [*(f"--{item}" for item in args.set), *(f"--{k}={v}" for k, v in ours.items()), *MODES[mode]]
    return [sys.executable, "train.py", args.config, *flags], ROOT


def to_target(steps: list[tuple[int, float]], evals: list[dict[str, Any]], target: float | None) -> float | None:
    """Seconds of training steps up to the first eval at or below target; steps are (iter, ms) windows."""
    hit = next((e["iter"] for e in evals if target is not None and e["val_loss"] <= target), None)
    if hit is None:
        return None
    previous = [-1] + [it for it, _ in steps]  # each window stands for the iterations since the one before
    return sum(ms * (it - prev) for (it, ms), prev in zip(steps, previous, strict=False) if it <= hit) / 1000


def measure(side: Side, child: Child, out_dir: Path, cfg: TrainConfig, args: argparse.Namespace) -> dict[str, Any]:
    """One run's figures: ours from its metrics.jsonl, nanoGPT's from its log lines."""
    summary = {}
    if side is None:
        logged = {int(m[1]): float(m[2]) for m in map(NANOGPT_ITER.match, child.lines) if m}
        matches = [m for m in map(NANOGPT_EVAL.match, child.lines) if m]
        evals = [{"iter": int(m[1]), "train_loss": float(m[2]), "val_loss": float(m[3])} for m in matches]
        eval_iters = {e["iter"] for e in evals if e["iter"] > 0}
        timed = [ms for it, ms in logged.items() if it >= args.warmup and it not in eval_iters]
        typical = median(timed) or 0.0  # an eval iteration's step, at the median
        steps = [(it, typical if it in eval_iters else ms) for it, ms in sorted(logged.items())]
        tok_s = [cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps / ms * 1000 for ms in timed]
    else:
        records = read_metrics(out_dir / "metrics.jsonl")
        train = [r for r in records if r["kind"] == "train"]
        evals = [{k: r[k] for k in ("iter", "train_loss", "val_loss")} for r in records if r["kind"] == "eval"]
        summary = next((r for r in records if r["kind"] == "summary"), {})
        kept = [r for r in train[1:] if r["iter"] >= args.warmup]  # the first window holds the start-up
        timed = [r["ms_per_iter"] for r in kept]
        tok_s = [r["tokens_per_s"] for r in kept]
        steps = [(r["iter"], r["ms_per_iter"]) for r in train]
    cuda = summary.get("device", "").startswith("cuda")
    val = [e["val_loss"] for e in evals]
    return {
        "ok": child.ok and (side is None or bool(summary)),
        "returncode": child.returncode,
        "interrupted": child.interrupted,
        "timed_out": child.timed_out,
        "steps_timed": len(timed),
        "ms_per_iter": median(timed),
        "ms_range": spread(timed),
        "tokens_per_s": median(tok_s),
        "max_rss_bytes": child.max_rss_bytes,
        "wall_s": child.wall_s,
        "cuda_peak_bytes": summary.get("peak_memory_bytes") if cuda else None,
        "evals": evals,
        "best_val_loss": min(val, default=None),
        "final_val_loss": val[-1] if val else None,
        "train_s_to_target": to_target(steps, evals, args.target_val),
        "tail": [] if child.ok else child.lines[-5:],
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r["ok"] or r["steps_timed"]]  # a run cut by its time limit still timed its steps
    ms = [r["ms_per_iter"] for r in good if r["ms_per_iter"] is not None]
    medians = ("tokens_per_s", "cuda_peak_bytes", "final_val_loss", "best_val_loss", "train_s_to_target", "wall_s")
    side = {
        "runs_ok": sum(r["ok"] for r in runs),
        "runs": len(runs),
        "ms_per_iter": median(ms),
        "ms_spread": spread(ms) if len(ms) > 1 else good[0]["ms_range"] if good else None,
        "max_rss_mib": median([r["max_rss_bytes"] / 2**20 for r in good]),
    }
    return side | {k: median([r[k] for r in good if r[k] is not None]) for k in medians}


def table(result: dict[str, Any]) -> str:
    sides = result["sides"]
    c = result["config"]
    s = result["schedule"]
    base = sides.get("builtin eager", {}).get("ms_per_iter")
    nano = sides.get("nanogpt", {}).get("ms_per_iter")
    rows = []
    for name, v in sides.items():  # in HEADERS' order
        ms = v["ms_per_iter"]
        cuda = v["cuda_peak_bytes"]
        rows.append(
            [
                name,
                f"{v['runs_ok']}/{v['runs']}",
                fmt(ms),
                "-".join(fmt(x) for x in v["ms_spread"] or [None]),
                fmt(v["tokens_per_s"], ".0f"),
                fmt(v["max_rss_mib"], ".0f"),
                fmt(cuda and cuda / 2**20, ".0f"),
                fmt(v["final_val_loss"], ".4f"),
                fmt(v["best_val_loss"], ".4f"),
                fmt(v["train_s_to_target"], ".1f"),
                fmt(v["wall_s"], ".1f"),
                *[fmt(ms and to and ms / to, ".3f") for to in (base, nano)],
            ]
        )
    rows += [[name, f"skipped: {why}", *[""] * 11] for name, why in result["skipped"].items()]
    title = (
        f"### {Path(c['config']).stem}: {c['n_layer']} x {c['n_embd']}, block {c['block_size']}, batch "
        f"{c['batch_size']}, on {result['device']}; {s['max_iters']} iterations, eval every {s['eval_interval']} "
        f"on {s['eval_iters']} batches, {result['repeats']} alternating repeats"
    )
    headers = [h.format(result["target_val"] or "--target_val") for h in HEADERS]
    return f"{title}\n\n{markdown_table(headers, rows)}"


def write_curves(out: Path, result: dict[str, Any]) -> None:
    """evals.csv (norm, iter, train_loss, val_loss) and val_loss.png: every side's curve, and its second half."""
    from matplotlib.figure import Figure

    curves = {name.split()[0]: runs[0]["evals"] for name, runs in result["runs"].items()}
    lines = [f"{n},{e['iter']},{e['train_loss']},{e['val_loss']}\n" for n, evals in curves.items() for e in evals]
    (out.parent / "evals.csv").write_text("norm,iter,train_loss,val_loss\n" + "".join(lines))
    fig = Figure(figsize=(12, 4.5))
    axes = fig.subplots(1, 2)
    halves = ((0, "val loss"), (result["schedule"]["max_iters"] // 2, "second half"))
    for ax, (start, title) in zip(axes, halves, strict=True):
        for norm, evals in curves.items():
            kept = [e for e in evals if e["iter"] >= start]
            ax.plot([e["iter"] for e in kept], [e["val_loss"] for e in kept], marker=".", label=norm)
        ax.set(title=title, xlabel="iteration", ylabel="val loss")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out.parent / "val_loss.png", dpi=120)


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every planned run, the sides alternating; with --out, the results written after every run, so that a
    benchmark cut short keeps what it measured."""
    cfg = train_config(args.config, args.set)
    sides, skipped = plan_sides(args)
    sched = schedule(args, cfg)
    names = [f"{n} {m}" for n, m in sides] + (["nanogpt"] if args.nanogpt else [])
    plan = [(rep, name, side) for rep in range(args.repeats) for name, side in zip(names, [*sides, None], strict=False)]
    result = {
        "device": args.device,
        "config": {"config": args.config, **dataclasses.asdict(cfg)},
        "schedule": sched,
        "repeats": args.repeats,
        "target_val": args.target_val,
        "skipped": skipped,
        "sides": {},  # filled run by run
        "runs": {name: [] for name in names},
    }
    if args.nanogpt:
        result["nanogpt_commit"] = output_of("git", "-C", args.nanogpt, "rev-parse", "--short", "HEAD")
    print(f"{len(plan)} runs of {sched['max_iters']} iterations: {', '.join(names)}", flush=True)
    print("".join(f"skipping {k}: {why}\n" for k, why in skipped.items()), end="", flush=True)
    t0 = time.perf_counter()
    work = tempfile.TemporaryDirectory(prefix="bench_training_", ignore_cleanup_errors=True)
    with work, Interrupts() as between:  # (a SIGINT during a run is its child's to see)
        for done, (rep, name, side) in enumerate(plan):
            if between.seen:
                break
            out_dir = Path(work.name, f"{name.replace(' ', '_')}_{rep}")
            cmd, cwd = commands(side, cfg, out_dir, args)
            print(f"== {name}, repeat {rep + 1}/{args.repeats}: {' '.join(cmd[1:])}", flush=True)
            child = run_child(cmd, cwd=cwd, timeout_s=args.time_limit, echo=name if args.verbose else None)
            run = measure(side, child, out_dir, cfg, args)
            result["runs"][name].append(run)
            result["sides"][name] = summarise(result["runs"][name])
            failed = "" if run["ok"] else ", FAILED: " + " | ".join(run["tail"])
            figures = f"{fmt(run['ms_per_iter'])} ms/iter, best val {fmt(run['best_val_loss'], '.4f')}{failed}"
            print(f"   {name}: {figures}; {progress(done + 1, len(plan), t0)}", flush=True)
            write_results(args, "bench.training", result, table(result))
            if child.interrupted:  # (its figures so far are in its record)
                between.seen = True
        if between.seen:  # what was measured is written, saying so; the runs not started are not
            finished = sum(not run["interrupted"] for runs in result["runs"].values() for run in runs)
            result["interrupted"] = f"after {finished} of {len(plan)} runs; the rest not started"
            print(f"interrupted {result['interrupted']}", flush=True)
            write_results(args, "bench.training", result, table(result))
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__, config=True)
    p.add_argument("--norms", default="custom,builtin", help="comma list of norms; NORM:MODE runs it in that mode only")
    p.add_argument("--modes", default=["eager"], type=comma_list(MODES), help=f"comma list from {', '.join(MODES)}")
    p.add_argument("--nanogpt", help="a nanoGPT checkout with data/shakespeare_char prepared, run beside ours")
    p.add_argument("--repeats", type=at_least(1), default=5, help="alternating runs per side (default 5)")
    p.add_argument(
        "--warmup", type=at_least(0), default=10, help="iterations not timed at the start of a run (default 10)"
    )
    p.add_argument("--iters", type=at_least(1), default=200, help="timed iterations per run (default 200)")
    p.add_argument(
        "--eval_iters",
        type=at_least(1),
        default=20,
        help="batches of the evals at 0 and at the end (default 20)",
    )
    p.add_argument("--curves", action="store_true", help="the config's own iterations and evals (loss curves)")
    p.add_argument("--whole", action="store_true", help="--curves, with each side's checkpoints and our sample")
    p.add_argument("--compare", action="store_true", help="every norm once, --curves; evals.csv, val_loss.png")
    p.add_argument(
        "--target_val", type=at_least(0.0, float), default=None, help="report the training time to this val loss"
    )
    p.add_argument("--time_limit", type=at_least(1e-9, float), default=None, help="seconds before a run is killed")
    p.add_argument("--data_dir", help="our train.py's --data_dir (default: the config's dataset)")
    p.add_argument("--verbose", action="store_true", help="echo every line of the runs")
    args = parse(p, argv)
    args.curves = args.curves or args.whole or args.compare
    if args.compare:
        args.repeats = 1
        args.norms = args.norms if "--norms" in args.argv else ",".join((*NORMS, NO_NORM))
    if args.data_dir and not (Path(args.data_dir) / "train.bin").exists():  # else every run fails alike
        why = "no train.bin there; prepare it first: python data/shakespeare_char/prepare.py --out_dir"
        raise BadOption(f"--data_dir {args.data_dir}: {why} {args.data_dir}")
    if args.nanogpt and not (Path(args.nanogpt) / "data" / "shakespeare_char" / "train.bin").exists():
        why = "no data/shakespeare_char/train.bin there; put Tiny Shakespeare in its data/shakespeare_char/input.txt"
        raise BadOption(f"--nanogpt {args.nanogpt}: {why} and run its prepare.py there")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    result = run_all(args)
    if args.out and args.compare:
        write_curves(args.out, result)
    return report(args, "bench.training", result, table(result))


def all_ok(result: dict[str, Any]) -> int:
    """The exit status: 130 if interrupted, else 0 when every run of every side was ok."""
    if result.get("interrupted"):
        return 130
    return 0 if all(s["runs_ok"] == s["runs"] for s in result["sides"].values()) else 1


if __name__ == "__main__":
    sys.exit(run_command(lambda: all_ok(main()), "the model's size (--set n_layer=..., --set n_embd=...)"))
