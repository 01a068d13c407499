"""Training-step and decoding benchmarks: this project's train.py per norm, side by side with nanoGPT's.

    python bench/bench_train.py train [--nanogpt ../nanogpt] [--norms custom,builtin] [--sizes ...] [--repeats N]
    python bench/bench_train.py decode [--sizes ...] [--out_dir CKPT_DIR]
    python bench/bench_train.py report RUN_DIR [RUN_DIR ...]

train: every measurement is a fresh `train.py` child process run for warmup + iters iterations with
--log_interval=1 and the evals pushed past the end (only the unavoidable eval at iteration 0 runs, with the same
eval_iters on both sides). The per-iteration times are parsed from the log lines; the first `warmup` iterations
and any iteration that ran an eval are dropped; the run's figure is the median of the rest. Sides (our norms and
nanoGPT) alternate, A B A B ..., `repeats` times; a side's figure is the median of its runs' medians, with the
min-max of those as the spread. Peak memory is the child's max RSS (os.wait4) and, on CUDA,
torch.cuda.max_memory_allocated() read at the child's exit by the same small wrapper for both sides.

decode: tokens/s of GPT.generate with the KV cache against use_kv_cache=False (nanoGPT's way), batch 1, greedy,
a 32-token prompt and 200 new tokens, random-init model (or a checkpoint), median of a few repeats.

report: summarises finished training runs from their metrics.jsonl (used by bench/gpu.sh).
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import (  # noqa: E402
    ROOT,
    RunResult,
    fmt,
    fmt_mib,
    load_config,
    machine_info,
    markdown_table,
    median,
    parse_evals,
    parse_iter_times,
    parse_overrides,
    ratio,
    read_metrics,
    run_child,
    spread,
    timed_iter_keys,
    write_json,
)

SIZES = ("shakespeare_char_cpu", "shakespeare_char")

# Keys that decide what one training step computes. Both sides get every one of them explicitly, so neither
# side's defaults matter (nanoGPT's train.py defaults to bias=False, for instance).
SHAPE_KEYS = ("batch_size", "block_size", "n_layer", "n_head", "n_embd", "dropout", "bias",
              "gradient_accumulation_steps")
# Optimizer / schedule keys: they do not change the cost of a step, but keeping them equal keeps the runs equal.
OPTIM_KEYS = ("learning_rate", "weight_decay", "beta1", "beta2", "grad_clip", "decay_lr", "warmup_iters",
              "lr_decay_iters", "min_lr")
# nanoGPT's configurator insists that an override has the type of the default, so 0 must be written 0.0.
NANOGPT_FLOAT_KEYS = {"dropout", "learning_rate", "weight_decay", "beta1", "beta2", "grad_clip", "min_lr"}

# Per-size defaults: (warmup, timed iterations, repeats, eval_iters) for cpu and cuda. On two CPU cores one
# shakespeare_char step (6 layers, 384 wide, 64 x 256 tokens) takes 15-30 s, so that size gets a few iterations
# and one repeat there: its peak memory is the figure of interest.
PLANS: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "cpu": {"shakespeare_char_cpu": (10, 200, 5, 20), "shakespeare_char": (1, 3, 1, 1)},
    "cuda": {"shakespeare_char_cpu": (20, 300, 5, 20), "shakespeare_char": (20, 200, 5, 20)},
}
GUESS_MS = {"cpu": {"shakespeare_char_cpu": 40.0, "shakespeare_char": 20000.0},
            "cuda": {"shakespeare_char_cpu": 8.0, "shakespeare_char": 30.0}}

# Runs train.py (ours or nanoGPT's) the same way on both sides and reports the CUDA allocator's peak at exit.
# runpy does what `python train.py` does, except that sys.path[0] has to be set by hand.
WRAPPER = """\
import atexit, runpy, sys
script, args = sys.argv[1], sys.argv[2:]
def _report():
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        print(f"BENCH_CUDA_MAX_MEMORY_ALLOCATED {torch.cuda.max_memory_allocated()}", flush=True)
atexit.register(_report)
sys.argv = [script, *args]
sys.path.insert(0, ".")
runpy.run_path(script, run_name="__main__")
"""
CUDA_MEM_TAG = "BENCH_CUDA_MAX_MEMORY_ALLOCATED "


# ----------------------------------------------------------------------------------------------------------------
# train


def resolve_device(device: str) -> str:
    if device not in ("auto", "cpu", "cuda"):
        raise SystemExit(f"--device must be auto, cpu or cuda, got {device!r}")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: CUDA is not available here (torch {torch.__version__}); use --device cpu")
    if device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def train_defaults() -> dict[str, Any]:
    """Our train.py's defaults (options.TrainConfig), for keys a config file leaves out."""
    import dataclasses

    from options import TrainConfig

    return dataclasses.asdict(TrainConfig())


def size_settings(size: str, overrides: dict[str, Any], defaults: dict[str, Any] | None) -> dict[str, Any]:
    """The shape and optimizer settings of one size, from configs/<size>.json, then overrides."""
    config = load_config(size)
    settings: dict[str, Any] = {}
    for key in SHAPE_KEYS + OPTIM_KEYS:
        if key in overrides:
            settings[key] = overrides[key]
        elif key in config:
            settings[key] = config[key]
        elif defaults is not None and key in defaults:
            settings[key] = defaults[key]
    missing = [k for k in SHAPE_KEYS if k not in settings]
    if missing:
        raise SystemExit(f"size {size!r}: no value for {missing} in configs/{size}.json nor train.py's defaults")
    return settings


def _fmt_value(key: str, value: Any, nanogpt: bool) -> str:
    if nanogpt and key in NANOGPT_FLOAT_KEYS:
        return repr(float(value))
    return str(value)


def build_commands(
    side: str,
    settings: dict[str, Any],
    *,
    device: str,
    max_iters: int,
    eval_iters: int,
    out_dir: Path,
    compile_model: bool,
    data_dir: Path | None,
    nanogpt: Path | None,
    python: str,
) -> tuple[list[str], Path]:
    """The command line and working directory of one timed run; side is a norm name or 'nanogpt'."""
    common = dict(settings)
    common.update(
        max_iters=max_iters,
        # Evals at iteration 0 and at max_iters only (both outside the timed window). Ours always ends with an
        # eval and saves a checkpoint when val improved; nanoGPT does the same at an eval iteration past 0. So
        # both sides do the same end-of-run work, and its memory counts on both sides alike.
        eval_interval=max_iters,
        eval_iters=eval_iters,
        log_interval=1,
        always_save_checkpoint=False,
        compile=compile_model,
        device=device,
        dtype="bfloat16" if device == "cuda" else "float32",
        out_dir=str(out_dir),
        wandb_log=False,
    )
    if side == "nanogpt":
        assert nanogpt is not None
        args = ["config/train_shakespeare_char.py"]
        args += [f"--{k}={_fmt_value(k, v, True)}" for k, v in common.items()]
        return [python, "-c", WRAPPER, "train.py", *args], nanogpt
    common.update(norm=side, seed=1337, sample_at_end=False)
    if data_dir is not None:
        common["data_dir"] = str(data_dir)
    args = [f"--{k}={_fmt_value(k, v, False)}" for k, v in common.items()]
    return [python, "-c", WRAPPER, "train.py", *args], ROOT


def measure_run(result: RunResult, side: str, warmup: int, iters: int, tokens_per_iter: int) -> dict[str, Any]:
    """One run's figures from its output: median ms/iter over the timed iterations, tokens/s, peak memory."""
    style = "nanogpt" if side == "nanogpt" else "ours"
    times = parse_iter_times(result.lines, style)
    evals = parse_evals(result.lines)
    keep = [times[i] for i in timed_iter_keys(times, [e["iter"] for e in evals], warmup, iters)]
    ms = median(keep)
    cuda_mem = None
    for line in result.lines:
        if line.startswith(CUDA_MEM_TAG):
            cuda_mem = int(line[len(CUDA_MEM_TAG):])
    return {
        "side": side,
        "ok": result.ok,
        "returncode": result.returncode,
        "timed_out": result.timed_out,
        "iters_logged": len(times),
        "iters_timed": len(keep),
        "ms_per_iter": ms,
        "tokens_per_s": tokens_per_iter / (ms / 1000) if keep else math.nan,
        "max_rss_bytes": result.max_rss_bytes,
        "cuda_max_memory_allocated": cuda_mem,
        "wall_s": result.wall_s,
        "ms_all": keep,
    }


def summarise_side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if r["ok"] and r["iters_timed"] > 0]
    ms = [r["ms_per_iter"] for r in good]
    rss = [r["max_rss_bytes"] for r in good if r["max_rss_bytes"] is not None]
    cuda = [r["cuda_max_memory_allocated"] for r in good if r["cuda_max_memory_allocated"] is not None]
    return {
        "runs_ok": len(good),
        "runs": len(runs),
        "ms_per_iter": median(ms),
        "ms_spread": spread(ms),
        "tokens_per_s": median([r["tokens_per_s"] for r in good]),
        "max_rss_bytes": median(rss) if rss else None,
        "rss_spread": spread(rss) if rss else None,
        "cuda_max_memory_allocated": median(cuda) if cuda else None,
    }


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    device = resolve_device(args.device)
    norms = [n for n in args.norms.split(",") if n] if args.norms else ["custom", "builtin"] + (
        ["triton"] if device == "cuda" else [])
    sides = norms + (["nanogpt"] if args.nanogpt else [])
    nanogpt = Path(args.nanogpt).resolve() if args.nanogpt else None
    if nanogpt is not None:
        if not (nanogpt / "train.py").exists() or not (nanogpt / "configurator.py").exists():
            raise SystemExit(f"--nanogpt {nanogpt}: not a nanoGPT checkout (no train.py / configurator.py there)")
        if not (nanogpt / "data" / "shakespeare_char" / "train.bin").exists():
            raise SystemExit(
                f"nanoGPT's data is not prepared: copy Tiny Shakespeare to "
                f"{nanogpt}/data/shakespeare_char/input.txt and run `python data/shakespeare_char/prepare.py` there"
            )
    data_dir = Path(args.data_dir).resolve() if args.data_dir else None
    if not (data_dir or ROOT / "data" / "shakespeare_char").joinpath("train.bin").exists():
        raise SystemExit("our data is not prepared: run `python data/shakespeare_char/prepare.py` (or --data_dir)")
    overrides = parse_overrides(args.set)
    try:
        defaults = train_defaults()
    except ImportError as e:  # the config files should hold every shape key anyway
        print(f"note: train.py's defaults unavailable ({e}); using the config files only")
        defaults = None
    sizes = [s for s in args.sizes.split(",") if s] if args.sizes else list(SIZES)
    work = Path(tempfile.mkdtemp(prefix="bench_train_", dir=args.work_dir))
    plans = []
    for size in sizes:
        warmup, iters, repeats, eval_iters = PLANS[device].get(Path(size).stem, PLANS[device]["shakespeare_char_cpu"])
        plan = {
            "size": Path(size).stem,
            "warmup": args.warmup if args.warmup is not None else warmup,
            "iters": args.iters if args.iters is not None else iters,
            "repeats": args.repeats if args.repeats is not None else repeats,
            "eval_iters": args.eval_iters if args.eval_iters is not None else eval_iters,
            "settings": size_settings(size, overrides, defaults),
        }
        guess = GUESS_MS[device].get(Path(size).stem, 50.0)
        est = len(sides) * plan["repeats"] * ((plan["warmup"] + plan["iters"] + 3 * plan["eval_iters"]) * guess
                                              / 1000 + 5)
        print(f"plan {size}: sides {sides}, warmup {plan['warmup']} + {plan['iters']} timed iterations, "
              f"{plan['repeats']} repeats, eval_iters {plan['eval_iters']}, about {est / 60:.1f} min "
              f"(at a guessed {guess:g} ms/iter)", flush=True)
        plans.append(plan)

    if args.plan_only:
        shutil.rmtree(work, ignore_errors=True)
        return {"device": device, "sides": sides, "results": []}
    results = []
    try:
        for plan in plans:
            s = plan["settings"]
            tokens_per_iter = s["batch_size"] * s["block_size"] * s["gradient_accumulation_steps"]
            max_iters = plan["warmup"] + plan["iters"]
            per_side: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
            for rep in range(plan["repeats"]):
                for side in sides:  # A B A B ...: drift in the machine's speed hits every side alike
                    out_dir = work / f"{plan['size']}_{side}_{rep}"
                    cmd, cwd = build_commands(
                        side, s, device=device, max_iters=max_iters, eval_iters=plan["eval_iters"],
                        out_dir=out_dir, compile_model=args.compile, data_dir=data_dir, nanogpt=nanogpt,
                        python=args.python,
                    )
                    label = f"{plan['size']} {side} {rep + 1}/{plan['repeats']}"
                    print(f"== {label}: {' '.join(cmd[:2])} <wrapper> {' '.join(cmd[3:])} (cwd {cwd})", flush=True)
                    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
                    result = run_child(cmd, cwd=cwd, env=env, prefix=label, timeout_s=args.timeout,
                                       echo=args.verbose)
                    run = measure_run(result, side, plan["warmup"], plan["iters"], tokens_per_iter)
                    if not run["ok"]:
                        print(f"!! {label} failed (exit {result.returncode}"
                              f"{', timed out' if result.timed_out else ''}):\n{result.tail()}", flush=True)
                    else:
                        print(f"   {label}: {fmt(run['ms_per_iter'])} ms/iter over {run['iters_timed']} iterations,"
                              f" peak RSS {fmt_mib(run['max_rss_bytes'])}", flush=True)
                    per_side[side].append(run)
            summary = {side: summarise_side(runs) for side, runs in per_side.items()}
            results.append({**plan, "device": device, "tokens_per_iter": tokens_per_iter, "sides": summary,
                            "runs": per_side})
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    commit = None
    if nanogpt is not None:  # which nanoGPT was measured
        git = subprocess.run(["git", "-C", str(nanogpt), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = git.stdout.strip() or None
    return {"device": device, "sides": sides, "threads": args.threads, "nanogpt_commit": commit, "results": results}


def train_table(train: dict[str, Any]) -> str:
    lines = []
    cuda = train["device"] == "cuda"
    for res in train["results"]:
        sides = res["sides"]
        base = sides.get("nanogpt")
        builtin = sides.get("builtin")
        headers = ["side", "runs ok", "ms/iter (median)", "spread (min-max)", "tokens/s", "peak RSS", "RSS spread"]
        if cuda:
            headers.append("CUDA max allocated")
        headers += ["ms ratio vs nanoGPT", "RSS ratio vs nanoGPT"]
        if cuda:
            headers.append("CUDA memory ratio vs nanoGPT")
        headers.append("ms ratio vs builtin")
        rows = []
        for side, s in sides.items():
            lo, hi = s["ms_spread"]
            rss_lo, rss_hi = s["rss_spread"] or (None, None)
            row: list[Any] = [side, f"{s['runs_ok']}/{s['runs']}", fmt(s["ms_per_iter"]), f"{fmt(lo)}-{fmt(hi)}",
                              fmt(s["tokens_per_s"], ".0f"), fmt_mib(s["max_rss_bytes"]),
                              f"{fmt_mib(rss_lo)}-{fmt_mib(rss_hi)}"]
            if cuda:
                row.append(fmt_mib(s["cuda_max_memory_allocated"]))
            row.append(fmt(ratio(s["ms_per_iter"], base["ms_per_iter"]), ".3f") if base else "")
            row.append(fmt(ratio(s["max_rss_bytes"], base["max_rss_bytes"]), ".3f") if base else "")
            if cuda:
                row.append(fmt(ratio(s["cuda_max_memory_allocated"], base["cuda_max_memory_allocated"]), ".3f")
                           if base else "")
            row.append(fmt(ratio(s["ms_per_iter"], builtin["ms_per_iter"]), ".3f") if builtin else "")
            rows.append(row)
        st = res["settings"]
        title = (f"### {res['size']} on {res['device']}: {st['n_layer']} layers, {st['n_embd']} wide, block "
                 f"{st['block_size']}, batch {st['batch_size']}; {res['warmup']} warmup + {res['iters']} timed "
                 f"iterations, {res['repeats']} alternating repeats"
                 + (f", OMP_NUM_THREADS={train['threads']}" if train.get("threads") else ""))
        lines += [title, "", markdown_table(headers, rows), ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# decode


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def decode_models(args: argparse.Namespace, device: str) -> list[tuple[str, Any]]:
    """(label, model) pairs: random-init models of each size, or the checkpoint in --out_dir."""
    import torch

    from model import GPT, GPTConfig

    if args.out_dir:
        from checkpoint import load_checkpoint, model_from_checkpoint

        ckpt = load_checkpoint(Path(args.out_dir) / "ckpt.pt", map_location=device)
        return [(f"checkpoint {args.out_dir}", model_from_checkpoint(ckpt, norm=args.norm, device=device))]
    sizes = [s for s in args.sizes.split(",") if s] if args.sizes else list(SIZES)
    overrides = parse_overrides(args.set)
    out = []
    for size in sizes:
        config = {**load_config(size), **overrides}
        gpt_config = GPTConfig(
            block_size=config["block_size"], vocab_size=config.get("vocab_size", 65), n_layer=config["n_layer"],
            n_head=config["n_head"], n_embd=config["n_embd"], dropout=0.0, bias=config.get("bias", True),
            norm=args.norm,
        )
        torch.manual_seed(1337)
        model = GPT(gpt_config).to(device).eval()
        out.append((Path(size).stem, model))
    return out


def time_generate(model: Any, prompt: Any, new_tokens: int, use_kv_cache: bool, device: str) -> tuple[float, Any]:
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(prompt, new_tokens, temperature=0.0, use_kv_cache=use_kv_cache)
    _sync(device)
    return time.perf_counter() - t0, out


def cmd_decode(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    device = resolve_device(args.device)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    for label, model in decode_models(args, device):
        model = model.to(dtype=dtype)
        cfg = model.config
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(cfg.vocab_size, (1, args.prompt_len), generator=gen).to(device)
        for use_cache in (True, False):  # warm up both paths (allocator, kernels)
            model.generate(prompt, min(8, args.new_tokens), temperature=0.0, use_kv_cache=use_cache)
        times: dict[str, list[float]] = {"cached": [], "uncached": []}
        outs = {}
        for _ in range(args.repeats):
            for name, use_cache in (("cached", True), ("uncached", False)):  # alternate, A B A B
                dt, outs[name] = time_generate(model, prompt, args.new_tokens, use_cache, device)
                times[name].append(dt)
        tps = {k: [args.new_tokens / t for t in v] for k, v in times.items()}
        # Up to block_size tokens in all the two paths compute the same thing (model.py's docstring): check it.
        same_len = max(0, min(args.new_tokens, cfg.block_size - args.prompt_len))
        a = outs["cached"][0, args.prompt_len:args.prompt_len + same_len]
        b = outs["uncached"][0, args.prompt_len:args.prompt_len + same_len]
        res = {
            "size": label,
            "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "block_size": cfg.block_size, "norm": cfg.norm,
            "device": device, "dtype": args.dtype, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "cached_tokens_per_s": median(tps["cached"]), "cached_spread": spread(tps["cached"]),
            "uncached_tokens_per_s": median(tps["uncached"]), "uncached_spread": spread(tps["uncached"]),
            "speedup": ratio(median(tps["cached"]), median(tps["uncached"])),
            "tokens_compared": same_len, "tokens_identical": bool(torch.equal(a, b)),
            "overflows_block": args.prompt_len + args.new_tokens > cfg.block_size,
        }
        print(f"decode {label}: cached {fmt(res['cached_tokens_per_s'], '.1f')} tok/s, uncached "
              f"{fmt(res['uncached_tokens_per_s'], '.1f')} tok/s, speedup {fmt(res['speedup'])}x", flush=True)
        results.append(res)
    return {"device": device, "results": results}


def decode_table(decode: dict[str, Any]) -> str:
    headers = ["size", "layers x width, block", "cached tok/s (min-max)", "uncached tok/s (min-max)", "speedup",
               "greedy tokens equal where defined"]
    rows = []
    for r in decode["results"]:
        c_lo, c_hi = r["cached_spread"]
        u_lo, u_hi = r["uncached_spread"]
        note = f"{r['tokens_identical']} (first {r['tokens_compared']})"
        rows.append([r["size"], f"{r['n_layer']} x {r['n_embd']}, {r['block_size']}",
                     f"{fmt(r['cached_tokens_per_s'], '.1f')} ({fmt(c_lo, '.1f')}-{fmt(c_hi, '.1f')})",
                     f"{fmt(r['uncached_tokens_per_s'], '.1f')} ({fmt(u_lo, '.1f')}-{fmt(u_hi, '.1f')})",
                     f"{fmt(r['speedup'])}x", note])
    r0 = decode["results"][0] if decode["results"] else {}
    title = (f"### Decoding on {decode['device']}: batch 1, greedy, {r0.get('prompt_len')}-token prompt, "
             f"{r0.get('new_tokens')} new tokens, {r0.get('dtype')}, norm {r0.get('norm')}, median of "
             f"{r0.get('repeats')}")
    foot = ("Past block_size (prompt + new tokens > block) the two paths keep different windows (model.py's "
            "overflow policy: the cache re-prefills half a block; the uncached path slides by one token), so "
            "only the tokens up to block_size are compared.")
    return "\n".join([title, "", markdown_table(headers, rows), "", foot, ""])


# ----------------------------------------------------------------------------------------------------------------
# report


def report_run(run_dir: Path, warmup: int) -> dict[str, Any]:
    records = read_metrics(run_dir / "metrics.jsonl")
    if not records:
        return {"run": str(run_dir), "ok": False, "error": "no metrics.jsonl"}
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    summary = next((r for r in reversed(records) if r.get("kind") == "summary"), {})
    times = {int(r["iter"]): float(r["ms_per_iter"]) for r in train}
    tps = {int(r["iter"]): float(r["tokens_per_s"]) for r in train}
    keys = timed_iter_keys(times, [int(e["iter"]) for e in evals], warmup)
    return {
        "run": str(run_dir), "ok": bool(summary), "norm": summary.get("norm"), "device": summary.get("device"),
        "iters": summary.get("iters", len(times)), "ms_per_iter": median([times[i] for i in keys]),
        "tokens_per_s": median([tps[i] for i in keys]), "iters_timed": len(keys),
        "final_val_loss": summary.get("final_val_loss", evals[-1]["val_loss"] if evals else None),
        "best_val_loss": summary.get("best_val_loss"), "wall_s": summary.get("wall_s"),
        "peak_memory_bytes": summary.get("peak_memory_bytes"),
        "evals": [(e["iter"], e.get("train_loss"), e.get("val_loss")) for e in evals],
    }


def report_table(runs: list[dict[str, Any]]) -> str:
    headers = ["run", "norm", "device", "iters", "ms/iter (median)", "tokens/s", "final val loss", "best val loss",
               "wall s", "peak memory"]
    rows = []
    for r in runs:
        if not r.get("ok") and "error" in r:
            rows.append([r["run"], "", "", "", "", "", "", "", "", r["error"]])
            continue
        rows.append([Path(r["run"]).name, r["norm"], r["device"], r["iters"], fmt(r["ms_per_iter"]),
                     fmt(r["tokens_per_s"], ".0f"), fmt(r["final_val_loss"], ".4f"), fmt(r["best_val_loss"], ".4f"),
                     fmt(r["wall_s"], ".1f"), fmt_mib(r["peak_memory_bytes"])])
    return markdown_table(headers, rows)


# ----------------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="ms/iter and peak memory of train.py per norm (and nanoGPT)")
    t.add_argument("--norms", default=None,
                   help="comma-separated norms of ours (default custom,builtin, and triton on CUDA)")
    t.add_argument("--nanogpt", default=None, help="path to a nanoGPT checkout with data/shakespeare_char prepared")
    t.add_argument("--sizes", default=None, help=f"comma-separated config names (default {','.join(SIZES)})")
    t.add_argument("--repeats", type=int, default=None, help="alternating repeats per side (default: per size)")
    t.add_argument("--iters", type=int, default=None, help="timed iterations per run (default: per size)")
    t.add_argument("--warmup", type=int, default=None, help="iterations dropped at the start (default: per size)")
    t.add_argument("--eval_iters", type=int, default=None, help="eval_iters of the one eval at iteration 0")
    t.add_argument("--compile", action="store_true", help="--compile=True on both sides (CUDA)")
    t.add_argument("--timeout", type=float, default=3600.0, help="seconds before a run is killed")
    t.add_argument("--work_dir", default=None, help="where the runs' out_dirs go (default: a temp dir)")
    t.add_argument("--keep", action="store_true", help="keep the runs' out_dirs")
    t.add_argument("--verbose", action="store_true", help="echo the children's log lines")
    t.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for every child (default: torch's, one per core)")
    t.add_argument("--plan_only", action="store_true", help="print the plan and the time estimate, run nothing")
    t.add_argument("--data_dir", default=None, help="our train.py's --data_dir (default data/shakespeare_char)")

    d = sub.add_parser("decode", help="tokens/s of generation with and without the KV cache")
    d.add_argument("--sizes", default=None, help=f"comma-separated config names (default {','.join(SIZES)})")
    d.add_argument("--out_dir", default=None, help="decode the checkpoint <out_dir>/ckpt.pt instead")
    d.add_argument("--norm", default="builtin")
    d.add_argument("--prompt_len", type=int, default=32)
    d.add_argument("--new_tokens", type=int, default=200)
    d.add_argument("--repeats", type=int, default=5)
    d.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    d.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for both paths (default: torch's, one per core); batch-1 decoding is "
                        "a chain of tiny matrix-vector products, where extra threads mostly add synchronization")

    r = sub.add_parser("report", help="summarise finished train.py runs from their metrics.jsonl")
    r.add_argument("runs", nargs="+", help="out_dirs of train.py runs")
    r.add_argument("--warmup", type=int, default=10, help="iterations dropped at the start")

    for q in (t, d, r):
        q.add_argument("--device", default="auto", help="auto, cpu or cuda")
        q.add_argument("--out", default=None, help="write the results as JSON here (and a .md next to it)")
    for q in (t, d):
        q.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config key for every side, e.g. --set n_layer=2 (repeatable)")
        q.add_argument("--python", default=sys.executable, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        body = cmd_train(args)
        table = train_table(body)
    elif args.command == "decode":
        body = cmd_decode(args)
        table = decode_table(body)
    else:
        runs = [report_run(Path(p), args.warmup) for p in args.runs]
        body = {"runs": runs}
        table = report_table(runs)
    out = {"command": ["python", "bench/bench_train.py", *(argv if argv is not None else sys.argv[1:])],
           "machine": machine_info(), args.command: body}
    print()
    print(table)
    if args.out:
        path = Path(args.out)
        write_json(path, out)
        path.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
        print(f"wrote {path} and {path.with_suffix('.md')}")
    return out


def cli(argv: list[str] | None = None) -> int:
    """main(), with exit status 1 when a run failed (train) or a run folder had no results (report)."""
    out = main(argv)
    if "train" in out:
        failed = [f"{r['size']} {side}" for r in out["train"]["results"] for side, s in r["sides"].items()
                  if s["runs_ok"] < s["runs"]]
    elif "report" in out:
        failed = [r["run"] for r in out["report"]["runs"] if not r.get("ok")]
    else:
        failed = []
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(cli())
