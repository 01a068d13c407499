"""What batch_invariant.py fixes, and what it costs: measured on this machine, in one run.

    python bench/bench_invariant.py --out bench/results/batch_invariant_cpu.json

1. ops: which operations give a row other bits depending on what else is computed with it (stock kernels):
   a linear layer's row alone or among m rows against the same row among 64; one query alone over its visible keys
   against the same query inside a causal pass over the whole sequence; one sequence's decoding step alone against
   the same step in a batch of 4.
2. model: a random 6 x 384 model (configs/shakespeare_char.json), greedy decoding with the KV cache: row 0 alone vs
   in a batch of 4 different prompts, and cached vs one full forward pass (max |logit difference|), with neither
   fix, each one alone, and both (the mode).
3. decode: tokens/s of cached greedy decoding (GPT.generate, temperature 0) at batch 1 and batch 8, for the CPU and
   the GPU model sizes: stock, the mode (ROWS = 1) and the mode with blocks of 8 rows, alternating, median and
   min-max of --repeats. Tokens/s counts every row.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import fmt, load_config, machine_info, markdown_table, median, spread, write_json  # noqa: E402

import batch_invariant as bi  # noqa: E402
from model import GPT, GPTConfig, KVCache  # noqa: E402

SIZES = ("shakespeare_char_cpu", "shakespeare_char")
SDPA = F.scaled_dot_product_attention


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


def measure_ops() -> dict[str, Any]:
    """Stock kernels only: where a row's result depends on its company."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, Any] = {"linear": []}
    for k in (128, 384):
        weight, x = torch.randn(3 * k, k, generator=gen) / k**0.5, torch.randn(64, k, generator=gen)
        among_64 = F.linear(x, weight)
        diffs = {m: max_diff(F.linear(x[:m], weight), among_64[:m]) for m in range(1, 17)}
        out["linear"].append({"in_features": k, "out_features": 3 * k, "rows_that_differ": [m for m, d in diffs.items()
                              if d > 0], "max_abs_diff": max(diffs.values())})
    q, k, v = (torch.randn(4, 6, 48, 64, generator=gen) for _ in range(3))
    whole = SDPA(q, k, v, is_causal=True)  # [B, nh, T, hs]: every query inside one causal pass
    alone = [max_diff(SDPA(q[:, :, i : i + 1], k[:, :, : i + 1], v[:, :, : i + 1]), whole[:, :, i : i + 1])
             for i in range(48)]
    step = SDPA(q[:, :, -1:], k, v)  # a decoding step of 4 sequences; the first of them alone
    out["attention"] = {"query_alone_vs_inside_causal_pass": max(alone),
                        "batch_row_alone_vs_in_batch_of_4": max_diff(SDPA(q[:1, :, -1:], k[:1], v[:1]), step[:1])}
    return out


@contextmanager
def fixes(linear: bool, attention: bool) -> Iterator[None]:
    """The mode's two pieces, each on its own (both: what batch_invariant() does)."""
    saved = F.linear, F.scaled_dot_product_attention
    F.linear = bi.linear if linear else saved[0]
    F.scaled_dot_product_attention = bi.attention if attention else saved[1]
    try:
        yield
    finally:
        F.linear, F.scaled_dot_product_attention = saved


def make_model(size: str) -> GPT:
    c = load_config(size)
    torch.manual_seed(1337)
    return GPT(GPTConfig(block_size=c["block_size"], n_layer=c["n_layer"], n_head=c["n_head"], n_embd=c["n_embd"],
                         vocab_size=65)).eval()


@torch.no_grad()
def measure_model(size: str, steps: int) -> list[dict[str, Any]]:
    model = make_model(size)
    prompts = torch.randint(65, (4, 16), generator=torch.Generator().manual_seed(1))

    def decode(p: torch.Tensor) -> torch.Tensor:
        cache, logits, tokens = KVCache(model.config, p.size(0), p.device, torch.float32), [], p
        for _ in range(steps):
            logits.append(model(tokens, kv_cache=cache)[0][:, -1])
            tokens = logits[-1].argmax(-1, keepdim=True)
        return torch.stack(logits, dim=1)

    rows = []
    for linear, attention in ((False, False), (True, False), (False, True), (True, True)):
        with fixes(linear, attention):
            alone, batch = decode(prompts[:1]), decode(prompts)
            full = model(torch.cat((prompts, batch.argmax(-1)[:, :-1]), dim=1))[0][:, 15:]
        rows.append({"fixed_linear": linear, "fixed_attention": attention,
                     "alone_vs_batch": max_diff(alone[0], batch[0]), "cached_vs_full": max_diff(batch, full)})
    return rows


@torch.no_grad()
def measure_decode(size: str, batch: int, new_tokens: int, repeats: int) -> dict[str, Any]:
    model = make_model(size)
    prompts = torch.randint(65, (batch, 16), generator=torch.Generator().manual_seed(2))
    rows_per_product = {"stock": None, "invariant": bi.ROWS, "invariant_rows8": 8}
    times: dict[str, list[float]] = {name: [] for name in rows_per_product}
    tokens = {}
    for i in range(repeats + 1):  # the first round warms up and is not counted
        for name, rows in rows_per_product.items():  # alternate, A B C A B C
            with bi.batch_invariant(enabled=rows is not None), rows_per_block(rows or bi.ROWS):
                t0 = time.perf_counter()
                tokens[name] = model.generate(prompts, new_tokens, temperature=0)
                if i:
                    times[name].append(time.perf_counter() - t0)
    tps = {k: [batch * new_tokens / t for t in v] for k, v in times.items()}
    out = {"size": size, "n_layer": model.config.n_layer, "n_embd": model.config.n_embd, "batch": batch,
           "new_tokens": new_tokens, "prompt_len": 16, "repeats": repeats, "rows": bi.ROWS,
           "same_tokens_stock_and_mode": bool(torch.equal(tokens["stock"], tokens["invariant"]))}
    for name, values in tps.items():
        out[f"{name}_tokens_per_s"], out[f"{name}_spread"] = median(values), spread(values)
        out[f"{name}_cost"] = median(tps["stock"]) / median(values)  # x times stock's time per token
    return out


@contextmanager
def rows_per_block(rows: int) -> Iterator[None]:
    saved, bi.ROWS = bi.ROWS, rows
    try:
        yield
    finally:
        bi.ROWS = saved


def speed(r: dict[str, Any], name: str) -> str:
    low, high = r[f"{name}_spread"]
    return f"{fmt(r[f'{name}_tokens_per_s'], '.1f')} ({fmt(low, '.1f')}-{fmt(high, '.1f')})"


def report(result: dict[str, Any]) -> str:
    m, ops = result["machine"], result["ops"]
    lines = [f"### Batch invariance on {m.get('cpu') or 'cpu'}, torch {m.get('torch')}, {result['threads']} threads",
             "", "Stock kernels, row by row (max |difference| against the same row computed among 64 rows):", ""]
    lines += [markdown_table(["linear", "row counts that differ (of 1-16)", "max abs diff"],
                             [[f"{r['in_features']} -> {r['out_features']}", str(r["rows_that_differ"]),
                               f"{r['max_abs_diff']:.1e}"] for r in ops["linear"]])]
    a = ops["attention"]
    lines += ["", f"Attention (scaled_dot_product_attention, 4 x 6 heads x 48 x 64): a query alone over its visible "
              f"keys vs inside the causal pass {a['query_alone_vs_inside_causal_pass']:.1e}; a decoding step of one "
              f"sequence alone vs in a batch of 4 {a['batch_row_alone_vs_in_batch_of_4']:.1e}.", ""]
    lines += [f"Whole model, random {result['model_size']}, {result['model_steps']} greedy steps, "
              "max |logit difference|:",
              "", markdown_table(["fixed linear", "fixed attention", "alone vs batch", "cached vs full"],
                                 [[r["fixed_linear"], r["fixed_attention"], f"{r['alone_vs_batch']:.1e}",
                                   f"{r['cached_vs_full']:.1e}"] for r in result["model"]]), ""]
    lines += ["Decoding speed, cached greedy, tokens/s over all rows, median (min-max) of "
              f"{result['decode'][0]['repeats']}:", "",
              markdown_table(["size", "batch", "stock tok/s", f"mode (ROWS={result['decode'][0]['rows']}) tok/s",
                              "mode costs", "mode, ROWS=8, tok/s", "ROWS=8 costs", "same tokens stock/mode"],
                             [[f"{r['size']} ({r['n_layer']} x {r['n_embd']})", r["batch"], speed(r, "stock"),
                               speed(r, "invariant"), f"{r['invariant_cost']:.2f}x", speed(r, "invariant_rows8"),
                               f"{r['invariant_rows8_cost']:.2f}x", r["same_tokens_stock_and_mode"]]
                              for r in result["decode"]])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default=",".join(SIZES), help=f"configs for the decode speed (default {','.join(SIZES)})")
    p.add_argument("--batches", default="1,8", help="decoding batch sizes (default 1,8)")
    p.add_argument("--new_tokens", type=int, default=48, help="tokens decoded per row (default 48)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds of each (default 5)")
    p.add_argument("--model_steps", type=int, default=32, help="greedy steps of the whole-model check (default 32)")
    p.add_argument("--out", help="write the results as JSON here, and the table as .md beside it")
    args = p.parse_args(argv)
    result = {"command": ["python", "bench/bench_invariant.py", *(argv if argv is not None else sys.argv[1:])],
              "machine": machine_info(), "threads": torch.get_num_threads(), "ops": measure_ops(),
              "model_size": "shakespeare_char", "model_steps": args.model_steps,
              "model": measure_model("shakespeare_char", args.model_steps), "decode": []}
    for size in args.sizes.split(","):
        for batch in map(int, args.batches.split(",")):
            result["decode"].append(measure_decode(size, batch, args.new_tokens, args.repeats))
            print(result["decode"][-1], flush=True)
    table = report(result)
    print(table)
    if args.out:
        write_json(Path(args.out), result)
        Path(args.out).with_suffix(".md").write_text(table, encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
