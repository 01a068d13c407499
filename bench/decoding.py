"""Decoding: tokens/s of GPT.generate uncached, cached and cached in the batch-invariant mode, beside the model's
Linear layers alone; --matmul: F.linear alone at decoding shapes, stock against the mode's (bench/README.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from batch_invariant import batch_invariant, refusal
from bench.common import (
    at_least,
    comma_list,
    fmt,
    median,
    parse,
    parser,
    report,
    spread,
    timed,
    write_results,
)
from layernorm import NORMS
from machinery import options
from machinery.checkpoint import resolve_weights
from machinery.command import Failure, first_line, run_command
from machinery.device import check_norm_device
from machinery.measure import markdown_table, progress
from model import GPT, GPTConfig

SIZES = ("configs/shakespeare_char_cpu.json", "configs/shakespeare_char.json")
PATHS = ("uncached", "cached", "mode", "linears")
MATMUL_ROWS = (1, 2, 4, 8, 16, 32, 64)


def models(args: argparse.Namespace) -> list[tuple[str, GPT]]:
    """(label, model): a random model per --sizes config, or the checkpoint (--out_dir, --ckpt) or GPT-2's weights
    (args.init_from) with each of --norms."""
    for norm in args.norms:
        check_norm_device(norm, args.device)  # one line saying what to do, before a model is loaded
    if args.checkpoint or args.init_from:
        ckpt, source = resolve_weights(args.out_dir or "out", args.ckpt, args.init_from)
        loaded = [GPT.from_checkpoint(ckpt, norm=norm).to(args.device) for norm in args.norms]
        return [(f"{source} norm={norm}", model) for norm, model in zip(args.norms, loaded, strict=True)]
    out = []
    for path in args.sizes.split(","):
        config = GPTConfig.from_options(options.read_config_file(path), norm=args.norms[0])
        out.append((Path(path).stem, GPT.from_seed(config, 1337).to(args.device).eval()))
    return out


def paths_here(paths: list[str], device: str) -> list[str]:
    """The paths that can run on `device`: the batch-invariant mode's is left out, in one line, where it refuses."""
    why = refusal(device) if "mode" in paths else None
    if why is None:
        return paths
    kept = [p for p in paths if p != "mode"]
    if not kept:
        raise ValueError(f"--paths mode cannot run here: {why}")
    print(f"leaving out path 'mode': {why}", flush=True)
    return kept


def linears_alone(model: GPT, batch: int, device: str) -> Callable[[int], None]:
    """steps -> None: the model's Linear layers in a cached step's order, one token per row, `steps` times."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(batch, 1, m.in_features, device=device) for m in layers]

    def run(steps: int) -> None:
        for _ in range(steps):
            for layer, x in zip(layers, inputs, strict=True):
                F.linear(x, layer.weight, layer.bias)

    return run


@torch.no_grad()
def decode(label: str, model: GPT, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(model.config.vocab_size, (batch, args.prompt_len), generator=gen).to(args.device)
    products = linears_alone(model, batch, args.device)

    new = {}  # path -> the tokens its last run decoded

    def run(name: str, n: int) -> None:
        if name == "linears":
            return products(n)
        with batch_invariant(enabled=name == "mode"):
            new[name] = model.generate(prompts, n, temperature=0, use_kv_cache=name != "uncached")[:, args.prompt_len :]

    for name in args.paths:  # warm-up: the allocator, the kernels
        run(name, min(8, args.new_tokens))
    rates = {name: [] for name in args.paths}  # the paths take turns, A B C A B C: tokens/s of each, round by round
    for _ in range(args.repeats):
        for name in args.paths:
            seconds = timed(lambda name=name: run(name, args.new_tokens), args.device)
            rates[name].append(batch * args.new_tokens / seconds)
    block = max(0, model.config.block_size - args.prompt_len)  # past it, cached and uncached keep other windows

    def agree(a: str, b: str, n: int | None = None) -> bool | None:
        return bool(torch.equal(new[a][:, :n], new[b][:, :n])) if {a, b} <= new.keys() else None

    sizes = {k: getattr(model.config, k) for k in ("n_layer", "n_embd", "block_size")}
    return {
        "model": label,
        **sizes,
        "batch": batch,
        "tokens_per_s": {k: median(v) for k, v in rates.items()},
        "spread": {k: spread(v) for k, v in rates.items()},
        "cached_equals_uncached_up_to_block": agree("cached", "uncached", block),
        "mode_equals_cached": agree("mode", "cached"),
        "tokens": next(iter(new.values())).tolist() if new else None,
    }


def ratio(a: float | None, b: float | None, unit: str = "") -> str:
    return f"{a / b:.2f}{unit}" if a and b else "n/a"


DECODE_HEADERS = (
    "cache speedup|mode's time per token|cached / linears|cached = uncached (to block)|mode = cached"
    "|same tokens as first model"
).split("|")
LINEARS_NOTE = """linears: the model's Linear layers alone, as a cached step runs them, one step per token (none is
produced): the most a cached step can reach without computing its matrix products differently.

"""


def decode_table(result: dict[str, Any]) -> str:
    paths = result["paths"]
    rows = []
    for r in result["runs"]:
        tps = r["tokens_per_s"]
        cached = tps.get("cached")
        rows.append(
            [
                f"{r['model']} ({r['n_layer']} x {r['n_embd']}, block {r['block_size']})",
                r["batch"],
                *[f"{fmt(tps[p], '.1f')} ({'-'.join(fmt(v, '.1f') for v in r['spread'][p])})" for p in paths],
                ratio(cached, tps.get("uncached"), "x"),
                ratio(cached, tps.get("mode"), "x"),
                ratio(cached, tps.get("linears")),
                r["cached_equals_uncached_up_to_block"],
                r["mode_equals_cached"],
                r["same_tokens_as_first"],
            ]
        )
    title = (
        f"### Greedy decoding on {result['device']}, float32, {result['prompt_len']}-token prompts, "
        f"{result['new_tokens']} new tokens, tokens/s over all rows, median (min-max) of {result['repeats']}"
    )
    headers = ["model", "batch", *[f"{p} tok/s" for p in paths], *DECODE_HEADERS]
    return f"{title}\n\n{LINEARS_NOTE if 'linears' in paths else ''}{markdown_table(headers, rows)}"


def matmul(device: str, widths: list[int]) -> list[dict]:
    """F.linear at MATMUL_ROWS rows, stock and in the mode: us per call, and the gap to the same rows among 64."""
    out = []
    gen = torch.Generator().manual_seed(0)
    for dtype in [torch.float32] + ([torch.bfloat16] if device.startswith("cuda") else []):
        for k in widths:
            w = (torch.randn(k, k, generator=gen) / k**0.5).to(device, dtype)
            x = torch.randn(max(MATMUL_ROWS), k, generator=gen).to(device, dtype)
            for m in MATMUL_ROWS:
                row = {"dtype": str(dtype).removeprefix("torch."), "K=N": k, "M": m}
                for name in ("stock", "mode"):
                    with batch_invariant(enabled=name == "mode"):
                        fn = lambda m=m, x=x, w=w: F.linear(x[:m], w)
                        fn()
                        row[f"{name}_us"] = median([timed(fn, device, calls=20) * 1e6 for _ in range(7)])
                        row[f"{name}_diff"] = (F.linear(x[:m], w) - F.linear(x, w)[:m]).abs().max().item()
                out.append(row)
    return out


MATMUL_HEADERS = "dtype|K = N|M|stock us|mode us|mode / stock|stock: row vs among 64|mode: row vs among 64".split("|")


def matmul_table(rows: list[dict], device: str) -> str:
    cells = [
        [r["dtype"], r["K=N"], r["M"], *[fmt(r[k], ".1f") for k in ("stock_us", "mode_us")]]
        + [fmt(r["mode_us"] / r["stock_us"], ".2f"), f"{r['stock_diff']:.1e}", f"{r['mode_diff']:.1e}"]
        for r in rows
    ]
    title = f"### F.linear at decoding shapes on {device}: M rows x K, K x N weight, us per call"
    return f"{title}\n\n{markdown_table(MATMUL_HEADERS, cells)}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--sizes", default=",".join(SIZES), help="comma list of config files (random-init models)")
    p.add_argument("--out_dir", help="decode the checkpoint <out_dir>/ckpt.pt instead, with each of --norms")
    p.add_argument("--ckpt", help="decode this checkpoint file instead; overrides --out_dir")
    p.add_argument("--init_from", help="decode GPT-2's weights instead: gpt2 ... gpt2-xl, or a folder")
    p.add_argument("--norms", default=["builtin"], type=comma_list(NORMS), help="comma list of norms (default builtin)")
    p.add_argument("--paths", default=list(PATHS), type=comma_list(PATHS), help=f"comma list from {', '.join(PATHS)}")
    p.add_argument("--batches", default=[1, 8], type=comma_list(), help="comma list of batch sizes (default 1,8)")
    p.add_argument("--prompt_len", type=at_least(1), default=16)
    p.add_argument("--new_tokens", type=at_least(1), default=48)
    p.add_argument("--repeats", type=at_least(1), default=5)
    p.add_argument("--matmul", action="store_true", help="the matrix product alone instead of decoding")
    p.add_argument("--widths", default=[384, 1536], type=comma_list(), help="--matmul's K = N (default 384,1536)")
    args = parse(p, argv)
    args.checkpoint = args.out_dir or args.ckpt  # (else random models of --sizes)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t0 = time.perf_counter()
    try:
        if args.matmul:
            runs = matmul(args.device, args.widths)
            result = {"device": args.device, "matmul": runs}
            table = matmul_table(runs, args.device)
        else:
            args.paths = paths_here(args.paths, args.device)
            settings = {k: getattr(args, k) for k in ("paths", "prompt_len", "new_tokens", "repeats")}
            todo = [(m, b) for m in models(args) for b in args.batches]
            result = {"device": args.device, **settings, "runs": [], "runs_planned": len(todo)}
            first: dict[int, list] = {}  # batch -> the first model's tokens
            for done, ((label, model), batch) in enumerate(todo):
                run = decode(label, model, batch, args)
                tokens = run.pop("tokens")
                run["same_tokens_as_first"] = (
                    first.setdefault(batch, tokens) == tokens if args.checkpoint or args.init_from else None
                )
                result["runs"].append(run)
                print(f"{label}, batch {batch}: {run['tokens_per_s']}; {progress(done + 1, len(todo), t0)}", flush=True)
                write_results(args, "bench.decoding", result, decode_table(result))  # a run cut short keeps these
            table = decode_table(result)
    except Failure:  # already one line, with its exit status (a ConfigError is a ValueError too)
        raise
    except ValueError as e:  # a norm that computes another function than the weights', weights that do not fit
        raise Failure(first_line(e)) from None
    return report(args, "bench.decoding", result, table)


if __name__ == "__main__":
    sys.exit(run_command(main, "--batches, --new_tokens or --sizes"))
