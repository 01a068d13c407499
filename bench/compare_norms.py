"""Train the same model from the same seed with every norm, and compare: loss curves, speed, memory.

    python bench/compare_norms.py                 # CPU: shakespeare_char_cpu, 2000 iterations, about 10 min
    python bench/compare_norms.py --full          # GPU: shakespeare_char (6 layers, 384 wide), 5000 iterations

Each norm (custom, builtin, triton, rmsnorm, batchnorm, dyt and none, the no-norm baseline) is one `train.py` child
process with its own out_dir, the same config, the same seed (so the same initial weights wherever the layouts
agree, the same batches and the same eval batches). Its log lines are streamed with the norm's name in front.
Collected from each run's metrics.jsonl and rusage: train and val loss at every eval, ms/iter (median of the
logged windows, the first one, which holds the startup, dropped), tokens/s, peak memory (the child's max RSS on
CPU, torch.cuda.max_memory_allocated on CUDA). Written to --out_dir:

    results.json   everything, raw (plus the machine and the command)
    evals.csv      norm, iter, train_loss, val_loss
    summary.csv    one row per norm
    val_loss.png   val-loss curves of every norm (needs matplotlib)
    table.md       final val loss, ms/iter, tokens/s, peak memory, each relative to builtin
    runs/<norm>/   each run's metrics.jsonl and log.txt (checkpoints deleted unless --keep_checkpoints)

Triton runs on CUDA; on a CPU only through Triton's interpreter (very slow), and only when asked for with
--include_triton_interpreter. The three LayerNorms compute the same function, so their curves must agree: the
largest |val-loss difference| between them at any eval is reported (acceptance: <= 0.02).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (  # noqa: E402
    ROOT,
    config_path,
    fmt,
    fmt_mib,
    load_config,
    machine_info,
    markdown_table,
    median,
    parse_overrides,
    ratio,
    read_metrics,
    run_child,
    write_json,
)

ALL_NORMS = ("custom", "builtin", "triton", "rmsnorm", "batchnorm", "dyt", "none")
LAYERNORMS = ("custom", "builtin", "triton")
TOLERANCE = 0.02  # acceptance: the three LayerNorms' val losses agree within this at every eval

# Sizing. CPU: the shakespeare_char_cpu config as it is (4 layers, 128 wide, block 64, batch 12, 2000 iterations,
# so the final losses are that config's), evaluated every 100 iterations on 50 batches per split instead of 200
# (an eval of 200 batches costs about as much as 130 training steps). At ~40 ms/iter on two cores a run is
# 2000 * 40 ms + 21 evals * 100 forwards * ~13 ms + ~5 s startup = about 1.9 min, five runs about 9.5 min.
CPU_SIZING = {"config": "shakespeare_char_cpu", "eval_interval": 100, "eval_iters": 50, "log_interval": 25,
              "ms_per_iter_guess": 40.0}
# --full (a GPU): the shakespeare_char config as it is (5000 iterations, eval every 250 on 200 batches).
GPU_SIZING = {"config": "shakespeare_char", "eval_interval": None, "eval_iters": None, "log_interval": 100,
              "ms_per_iter_guess": 30.0}
STARTUP_S = 5.0


def available_norms() -> tuple[str, ...]:
    """The norms train.py accepts: layernorm.NORMS and "none"."""
    from options import VALID_NORMS

    return VALID_NORMS


def plan_norms(args: argparse.Namespace, device: str) -> tuple[list[str], dict[str, str]]:
    """(norms to run, {norm: why it is skipped})."""
    asked = [n for n in args.norms.split(",") if n] if args.norms else list(ALL_NORMS)
    unknown = [n for n in asked if n not in ALL_NORMS]
    if unknown:
        raise SystemExit(f"--norms: unknown {unknown}; valid: {', '.join(ALL_NORMS)}")
    known = available_norms()
    run, skipped = [], {}
    for norm in asked:
        if norm not in known:
            skipped[norm] = f"not available in this checkout (train.py accepts {', '.join(known)})"
        elif norm == "triton" and importlib.util.find_spec("triton") is None:
            skipped[norm] = "triton is not installed"
        elif norm == "triton" and device != "cuda" and not args.include_triton_interpreter:
            skipped[norm] = ("no CUDA device; run with --include_triton_interpreter to train it through Triton's "
                             "CPU interpreter (TRITON_INTERPRET=1, very slow)")
        else:
            run.append(norm)
    return run, skipped


def resolve_device(device: str, full: bool) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be auto, cpu or cuda, got {device!r}")
    return device


def sizing(args: argparse.Namespace) -> dict[str, Any]:
    """The config and the eval/log cadence of this comparison, after the command-line overrides."""
    base = dict(GPU_SIZING if args.full else CPU_SIZING)
    config_name = args.config or base["config"]
    config = load_config(config_name)
    overrides = parse_overrides(args.set)
    merged = {**config, **overrides}
    out = {
        "config": str(config_path(config_name)),
        "max_iters": args.max_iters if args.max_iters is not None else merged.get("max_iters", 2000),
        "eval_interval": args.eval_interval or base["eval_interval"] or merged.get("eval_interval", 250),
        "eval_iters": args.eval_iters or base["eval_iters"] or merged.get("eval_iters", 200),
        "log_interval": args.log_interval or base["log_interval"],
        "ms_per_iter_guess": args.ms_per_iter_guess or base["ms_per_iter_guess"],
        "model": {k: merged.get(k) for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "dropout",
                                             "bias", "gradient_accumulation_steps")},
        "overrides": overrides,
    }
    return out


def estimate_s(size: dict[str, Any], n_runs: int) -> float:
    ms = size["ms_per_iter_guess"]
    n_evals = size["max_iters"] // size["eval_interval"] + 1
    # An eval runs 2 * eval_iters forward passes, each about a third of a training step.
    per_run = size["max_iters"] * ms / 1000 + n_evals * 2 * size["eval_iters"] * ms / 3000 + STARTUP_S
    return n_runs * per_run


def train_command(norm: str, size: dict[str, Any], args: argparse.Namespace, run_dir: Path, device: str) -> list[str]:
    flags = {
        "norm": norm,
        "out_dir": str(run_dir),
        "device": device,
        "seed": args.seed,
        "max_iters": size["max_iters"],
        "eval_interval": size["eval_interval"],
        "eval_iters": size["eval_iters"],
        "log_interval": size["log_interval"],
        "always_save_checkpoint": False,
        "sample_at_end": False,
        "wandb_log": False,
    }
    if args.data_dir:
        flags["data_dir"] = str(Path(args.data_dir).resolve())
    flags.update(size["overrides"])
    return [args.python, str(ROOT / "train.py"), size["config"], *[f"--{k}={v}" for k, v in flags.items()]]


def collect(norm: str, run_dir: Path, result: Any, tokens_per_iter: int, device: str) -> dict[str, Any]:
    """One run's figures from its metrics.jsonl (and the child's rusage)."""
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [{"iter": r["iter"], "train_loss": r["train_loss"], "val_loss": r["val_loss"]}
             for r in records if r.get("kind") == "eval"]
    summary = next((r for r in reversed(records) if r.get("kind") == "summary"), None)
    # The first logged window holds the startup (first iteration, allocator warm-up): drop it.
    windows = [r["ms_per_iter"] for r in train[1:]] or [r["ms_per_iter"] for r in train]
    ms = median(windows)
    peak = (summary or {}).get("peak_memory_bytes") if device == "cuda" else result.max_rss_bytes
    return {
        "norm": norm,
        "status": "ok" if result.ok and summary is not None else ("timeout" if result.timed_out else "failed"),
        "returncode": result.returncode,
        "evals": evals,
        "final_val_loss": evals[-1]["val_loss"] if evals else None,
        "final_train_loss": evals[-1]["train_loss"] if evals else None,
        "best_val_loss": min((e["val_loss"] for e in evals), default=None),
        "ms_per_iter": ms,
        "tokens_per_s": tokens_per_iter / (ms / 1000) if windows else None,
        "peak_memory_bytes": peak,
        "max_rss_bytes": result.max_rss_bytes,
        "cuda_max_memory_allocated": (summary or {}).get("peak_memory_bytes") if device == "cuda" else None,
        "wall_s": result.wall_s,
        "summary": summary,
    }


def layernorm_agreement(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Largest |val-loss difference| between the LayerNorm runs at any eval they share."""
    ok = {n: r for n, r in runs.items() if n in LAYERNORMS and r["status"] == "ok"}
    if len(ok) < 2:
        return {"norms": sorted(ok), "max_abs_val_diff": None, "at_iter": None, "within_tolerance": None,
                "note": "fewer than two LayerNorm runs finished"}
    curves = {n: {e["iter"]: e["val_loss"] for e in r["evals"]} for n, r in ok.items()}
    shared = sorted(set.intersection(*(set(c) for c in curves.values())))
    worst, at = 0.0, None
    for it in shared:
        values = [c[it] for c in curves.values()]
        diff = max(values) - min(values)
        if diff >= worst:
            worst, at = diff, it
    pairs = {}
    names = sorted(ok)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs[f"{a}-{b}"] = max((abs(curves[a][it] - curves[b][it]) for it in shared), default=None)
    return {"norms": names, "evals_compared": len(shared), "max_abs_val_diff": worst, "at_iter": at,
            "pairs": pairs, "tolerance": TOLERANCE, "within_tolerance": worst <= TOLERANCE}


def write_csvs(out_dir: Path, runs: dict[str, dict[str, Any]]) -> None:
    with open(out_dir / "evals.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["norm", "iter", "train_loss", "val_loss"])
        for norm, r in runs.items():
            for e in r["evals"]:
                w.writerow([norm, e["iter"], e["train_loss"], e["val_loss"]])
    keys = ["norm", "status", "final_val_loss", "best_val_loss", "final_train_loss", "ms_per_iter", "tokens_per_s",
            "peak_memory_bytes", "max_rss_bytes", "cuda_max_memory_allocated", "wall_s"]
    with open(out_dir / "summary.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for r in runs.values():
            w.writerow([r.get(k) for k in keys])


def markdown(runs: dict[str, dict[str, Any]], skipped: dict[str, str], agreement: dict[str, Any],
             size: dict[str, Any], device: str) -> str:
    base = runs.get("builtin") if runs.get("builtin", {}).get("status") == "ok" else None
    mem_name = "peak CUDA memory" if device == "cuda" else "peak RSS"
    headers = ["norm", "final val loss", "vs builtin", "ms/iter", "x builtin", "tokens/s", "x builtin", mem_name,
               "x builtin"]
    rows = []
    for norm, r in runs.items():
        if r["status"] != "ok":
            rows.append([norm, f"{r['status']} (exit {r['returncode']})", "", "", "", "", "", "", ""])
            continue
        delta = (r["final_val_loss"] - base["final_val_loss"]) if base else None
        rows.append([
            norm, fmt(r["final_val_loss"], ".4f"), fmt(delta, "+.4f") if base else "",
            fmt(r["ms_per_iter"]), fmt(ratio(r["ms_per_iter"], base["ms_per_iter"]), ".3f") if base else "",
            fmt(r["tokens_per_s"], ".0f"), fmt(ratio(r["tokens_per_s"], base["tokens_per_s"]), ".3f") if base else "",
            fmt_mib(r["peak_memory_bytes"]),
            fmt(ratio(r["peak_memory_bytes"], base["peak_memory_bytes"]), ".3f") if base else "",
        ])
    for norm, why in skipped.items():
        rows.append([norm, f"skipped: {why}", "", "", "", "", "", "", ""])
    m = size["model"]
    lines = [
        f"### Norm comparison on {device}: {Path(size['config']).stem} ({m['n_layer']} layers, {m['n_embd']} wide, "
        f"block {m['block_size']}, batch {m['batch_size']}, dropout {m['dropout']}), {size['max_iters']} iterations,"
        f" eval every {size['eval_interval']} on {size['eval_iters']} batches per split",
        "",
        markdown_table(headers, rows),
        "",
    ]
    if agreement.get("max_abs_val_diff") is not None:
        verdict = "within" if agreement["within_tolerance"] else "NOT within"
        if agreement["max_abs_val_diff"] == 0:
            why = "their val losses are bit-identical at every eval"
        else:
            why = ("they compute the same function, but each sums the mean and variance in its own order, so "
                   "their outputs differ in the last bits, and training carries those rounding differences along")
        lines.append(
            f"LayerNorms ({', '.join(agreement['norms'])}): largest |val-loss difference| at any of "
            f"{agreement['evals_compared']} evals = {agreement['max_abs_val_diff']:.4f} (iteration "
            f"{agreement['at_iter']}), {verdict} {TOLERANCE}: {why}."
        )
    else:
        lines.append(f"LayerNorm agreement: {agreement.get('note')}")
    return "\n".join(lines) + "\n"


def plot(out_dir: Path, runs: dict[str, dict[str, Any]], size: dict[str, Any], device: str) -> Path | None:
    """val_loss.png: every norm's val-loss curve, the whole run and a zoom on its second half."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed, so no val_loss.png (the JSON, CSV and Markdown are written): "
              "`pip install matplotlib` and run again", flush=True)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    styles = {"custom": "-", "builtin": "--", "triton": ":"}
    for norm, r in runs.items():
        if not r["evals"]:
            continue
        its = [e["iter"] for e in r["evals"]]
        vals = [e["val_loss"] for e in r["evals"]]
        for ax in axes:
            ax.plot(its, vals, styles.get(norm, "-"), marker=".", label=norm, linewidth=1.5)
    half = size["max_iters"] // 2
    tail = [e["val_loss"] for r in runs.values() for e in r["evals"] if e["iter"] >= half]
    axes[1].set_xlim(half, size["max_iters"] * 1.02)
    if tail:
        finite = [v for v in tail if math.isfinite(v)]
        if finite:
            lo, hi = min(finite), max(finite)
            axes[1].set_ylim(lo - 0.02 * max(hi - lo, 0.1), hi + 0.05 * max(hi - lo, 0.1))
    m = size["model"]
    axes[0].set_title(f"val loss, {Path(size['config']).stem} ({m['n_layer']}x{m['n_embd']}, {device})")
    axes[1].set_title("second half (zoom)")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.set_ylabel("val loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    path = out_dir / "val_loss.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="the GPU size: configs/shakespeare_char.json as it is")
    p.add_argument("--norms", default=None, help=f"comma-separated subset of {','.join(ALL_NORMS)} (default all)")
    p.add_argument("--out_dir", default=None,
                   help="results folder (default bench/results/compare_norms_cpu, or _gpu with --full)")
    p.add_argument("--config", default=None, help="config name or JSON path (default per --full)")
    p.add_argument("--max_iters", type=int, default=None)
    p.add_argument("--eval_interval", type=int, default=None)
    p.add_argument("--eval_iters", type=int, default=None)
    p.add_argument("--log_interval", type=int, default=None)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--data_dir", default=None, help="train.py's --data_dir (default data/shakespeare_char)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra train.py option for every run, e.g. --set n_layer=2 (repeatable)")
    p.add_argument("--include_triton_interpreter", action="store_true",
                   help="on a CPU, also train triton through TRITON_INTERPRET=1 (very slow)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before one run is killed")
    p.add_argument("--keep_checkpoints", action="store_true", help="keep each run's ckpt.pt")
    p.add_argument("--ms_per_iter_guess", type=float, default=None, help="for the printed time estimate")
    p.add_argument("--quiet", action="store_true", help="do not stream the runs' log lines")
    p.add_argument("--plan_only", action="store_true", help="print the sizing and the commands, run nothing")
    p.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    device = resolve_device(args.device, args.full)
    size = sizing(args)
    norms, skipped = plan_norms(args, device)
    out_dir = Path(args.out_dir or ROOT / "bench" / "results" / f"compare_norms_{'gpu' if args.full else 'cpu'}")
    data_dir = Path(args.data_dir) if args.data_dir else ROOT / "data" / "shakespeare_char"
    if not (data_dir / "train.bin").exists():
        raise SystemExit(f"no train.bin in {data_dir}: run `python data/shakespeare_char/prepare.py` first "
                         f"(or pass --data_dir)")
    m = size["model"]
    tokens_per_iter = m["batch_size"] * m["block_size"] * (m["gradient_accumulation_steps"] or 1)
    est = estimate_s(size, len(norms))
    print(f"sizing: {Path(size['config']).stem} ({m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, "
          f"block {m['block_size']}, batch {m['batch_size']}, dropout {m['dropout']}), {size['max_iters']} "
          f"iterations, eval every {size['eval_interval']} iterations on {size['eval_iters']} batches per split, "
          f"log every {size['log_interval']}; {len(norms)} runs on {device}: {', '.join(norms)}; estimated "
          f"{est / 60:.1f} min at ~{size['ms_per_iter_guess']:g} ms/iter", flush=True)
    for norm, why in skipped.items():
        print(f"skipping {norm}: {why}", flush=True)

    if args.plan_only:
        for norm in norms:
            print("    " + " ".join(train_command(norm, size, args, out_dir / "runs" / norm, device)[1:]))
        return {"sizing": size, "norms_run": norms, "skipped": skipped, "runs": {}, "estimate_s": est}

    out_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    t0 = time.perf_counter()
    for k, norm in enumerate(norms):
        run_dir = out_dir / "runs" / norm
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("metrics.jsonl", "ckpt.pt"):
            (run_dir / stale).unlink(missing_ok=True)
        cmd = train_command(norm, size, args, run_dir, device)
        env = {"TRITON_INTERPRET": "1"} if norm == "triton" and device != "cuda" else None
        print(f"=== run {k + 1}/{len(norms)}: {norm} ({time.perf_counter() - t0:.0f} s elapsed) ===", flush=True)
        print("    " + " ".join(cmd[1:]), flush=True)
        result = run_child(cmd, cwd=ROOT, env=env, prefix=norm, timeout_s=args.timeout, echo=not args.quiet)
        (run_dir / "log.txt").write_text("\n".join(result.lines) + "\n", encoding="utf-8")
        if not args.keep_checkpoints:
            for ckpt in run_dir.glob("ckpt*.pt"):
                ckpt.unlink()
        runs[norm] = collect(norm, run_dir, result, tokens_per_iter, device)
        r = runs[norm]
        if r["status"] != "ok":
            print(f"!!! {norm} {r['status']} (exit {result.returncode}):\n{result.tail()}", flush=True)
        else:
            print(f"=== {norm}: final val loss {fmt(r['final_val_loss'], '.4f')}, {fmt(r['ms_per_iter'])} ms/iter, "
                  f"{fmt(r['tokens_per_s'], '.0f')} tok/s, peak {fmt_mib(r['peak_memory_bytes'])}, "
                  f"{r['wall_s']:.0f} s", flush=True)

    agreement = layernorm_agreement(runs)
    table = markdown(runs, skipped, agreement, size, device)
    write_csvs(out_dir, runs)
    (out_dir / "table.md").write_text(table, encoding="utf-8")
    png = plot(out_dir, runs, size, device)
    command = ["python", "bench/compare_norms.py", *(argv if argv is not None else sys.argv[1:])]
    out = {"command": command, "machine": machine_info(), "device": device, "sizing": size, "norms_run": norms,
           "skipped": skipped, "runs": runs, "layernorm_agreement": agreement,
           "total_wall_s": time.perf_counter() - t0}
    write_json(out_dir / "results.json", out)
    print()
    print(table)
    print(f"wrote {out_dir}/results.json, evals.csv, summary.csv, table.md" + (f", {png.name}" if png else ""))
    return out


def cli(argv: list[str] | None = None) -> int:
    out = main(argv)
    failed = [n for n, r in out["runs"].items() if r["status"] != "ok"]
    if failed:
        print(f"failed runs: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli())
