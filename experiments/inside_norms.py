"""Inside a trained model: the residual stream's scale, what each norm does to it, and the norms' learned parameters.

    python experiments/inside_norms.py                       # the Quickstart's checkpoint, out-shakespeare-char-cpu
    python experiments/inside_norms.py --ckpt=path/to/ckpt.pt --data_dir=data/shakespeare_char

Runs the checkpoint on the CPU over windows of its dataset's val.bin; forward hooks on transformer.h[i], its ln_1 and
ln_2, and transformer.ln_f (found by name, wherever norm_position puts them) give every token's RMS over features:
of the residual stream entering each block and of each norm's output. Writes inside_norms.json (with the
percentiles of every norm's parameters) and inside_norms.png to --results_dir.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import common  # first: the repository's modules on sys.path, figures to files
import matplotlib.pyplot as plt
import numpy as np
import torch

from bench.common import at_least
from machinery.checkpoint import resolve_weights
from machinery.command import Failure, first_line, run_command
from machinery.dataset import DataError, PreparedData
from model import GPT


def stats(values: torch.Tensor) -> dict[str, float]:
    """Mean, RMS, min, max and percentiles of a flat set of numbers."""
    v = values.detach().double().flatten().numpy()
    out = {"mean": v.mean(), "rms": np.sqrt((v**2).mean()), "min": v.min(), "max": v.max()}
    out |= {f"p{q}": np.percentile(v, q) for q in (5, 10, 25, 50, 75, 90, 95)}
    return {k: round(float(x), 6) for k, x in out.items()}


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    p = common.parser(__doc__, "inside_norms", "one batch of two windows (for tests)", data_dir=False)
    p.add_argument("--out_dir", default="out-shakespeare-char-cpu", help="folder holding ckpt.pt")
    p.add_argument("--ckpt", help="path of a checkpoint file; overrides --out_dir")
    p.add_argument("--data_dir", help="folder with val.bin (default: the checkpoint's data_dir, else data/<dataset>)")
    p.add_argument("--batches", type=at_least(1), default=16, help="batches of validation windows (default 16)")
    p.add_argument(
        "--batch_size", type=at_least(1), default=32, help="windows of block_size tokens per batch (default 32)"
    )
    args = p.parse_args(argv)
    n_batches = 1 if args.smoke else args.batches
    batch_size = 2 if args.smoke else args.batch_size
    ckpt, ckpt_path = resolve_weights(args.out_dir, args.ckpt, None)
    try:
        model = GPT.from_checkpoint(ckpt)  # on the CPU, in eval mode
    except ValueError as e:  # weights that do not fit the model
        raise Failure(f"{ckpt_path}: {first_line(e)}") from None
    cfg = model.config
    train_cfg = ckpt.get("config") or {}
    data_dir = args.data_dir or train_cfg.get("data_dir")  # the checkpoint's dataset, unless --data_dir names another
    try:
        data = PreparedData(data_dir, train_cfg.get("dataset", ""), cfg.block_size)
    except DataError as e:
        raise Failure(f"{e}; or give --data_dir") from None
    if ckpt.get("tokenizer") is not None and data.meta.get("tokenizer") != ckpt["tokenizer"]:
        raise Failure(f"{data.dir} is not tokenized as the checkpoint's dataset was: give --data_dir")
    sizes = f"{cfg.n_layer} layers, {cfg.n_embd} wide, norm {cfg.norm}"
    print(f"{ckpt_path}: {sizes}; {data.tokens['val']:,} val tokens in {data.dir}", flush=True)

    # Per-token RMS over features, collected by hooks, keyed by what was measured.
    rms: dict[str, list[torch.Tensor]] = {}

    def keep(key: str, x: torch.Tensor) -> None:
        rms.setdefault(key, []).append(x.detach().float().pow(2).mean(-1).sqrt().flatten())

    h = model.transformer.h
    named = {f"{i}.{n}": getattr(b, n) for i, b in enumerate(h) for n in ("ln_1", "ln_2")}
    named["ln_f"] = model.transformer.ln_f  # an Identity where post-norm keeps none: it still sees the final stream
    norms = {k: m for k, m in named.items() if not isinstance(m, torch.nn.Identity)}  # the real norms
    named["ln_f"].register_forward_pre_hook(lambda m, a: keep("final", a[0]))  # the stream after the last block
    for i, block in enumerate(h):
        block.register_forward_pre_hook(lambda m, a, i=i: keep(f"resid.{i}", a[0]))
    for name, norm in norms.items():
        norm.register_forward_hook(lambda m, a, out, name=name: keep(name, out))

    starts = torch.linspace(0, data.num_starts("val") - 1, n_batches * batch_size).long()
    losses = []
    with torch.no_grad():
        for b, chunk in enumerate(starts.split(batch_size)):
            x, y = data.get("val", chunk, "cpu")
            _, loss = model(x, y)
            losses.append(loss.item())
            print(f"batch {b + 1}/{n_batches}: {x.numel()} tokens, loss {loss.item():.4f}", flush=True)
    data.close()
    measured = {k: stats(torch.cat(v)) for k, v in rms.items()}
    result = {
        "checkpoint": str(Path(ckpt_path).resolve()),
        "iter_num": ckpt.get("iter_num"),
        "model_args": ckpt["model_args"],
        "config": train_cfg,
        "data_dir": str(data.dir),
        "tokens": len(starts) * cfg.block_size,
        "val_loss": round(float(np.mean(losses)), 4),
        "token_rms": {
            "resid_in": [measured[f"resid.{i}"] for i in range(cfg.n_layer)],  # per layer; None: no norm
            **{f"{n}_out": [measured.get(f"{i}.{n}") for i in range(cfg.n_layer)] for n in ("ln_1", "ln_2")},
            "final_resid": measured.get("final"),
            "ln_f_out": measured.get("ln_f"),
        },
        "params": {name: {pn: stats(pv) for pn, pv in m.named_parameters()} for name, m in norms.items()},
    }
    out = Path(args.results_dir)
    plot(result, norms, out / "inside_norms.png")
    result["run_time_s"] = round(time.perf_counter() - t0, 2)
    common.write_json(out / "inside_norms.json", argv, result)
    print(f"wrote {out}/inside_norms.json and .png; total time {result['run_time_s']:.1f} s", flush=True)


def plot(result: dict, norms: dict[str, torch.nn.Module], path: Path) -> None:
    tr = result["token_rms"]
    n = len(tr["resid_in"])
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1.1, 1, 1]})
    ax = axes[0]
    series = [
        ("residual entering block (median, p10-p90)", tr["resid_in"] + [tr["final_resid"]], "k"),
        ("ln_1 output (median, p10-p90)", tr["ln_1_out"], "tab:blue"),
        ("ln_2 output (median, p10-p90)", tr["ln_2_out"], "tab:orange"),
        ("ln_f output (median, p10-p90)", [None] * n + [tr["ln_f_out"]], "tab:green"),
    ]
    for label, vals, color in series:
        pts = {i: v for i, v in enumerate(vals) if v}  # x -> stats, where measured
        if pts:
            low, mid, high = np.array([[v["p10"], v["p50"], v["p90"]] for v in pts.values()]).T
            ax.errorbar(list(pts), mid, [mid - low, high - mid], fmt="o-", color=color, capsize=3, label=label)
    ax.axhline(1, color="gray", ls=":", lw=1)
    ax.set_xticks(range(n + 1), [*map(str, range(n)), "final"])
    ax.set(yscale="log", title="Residual stream and norm outputs", ylabel="per-token RMS over features (log scale)")
    ax.set_xlabel("block (the stream after the last block enters ln_f)")
    ax.legend(fontsize=8)
    for ax, pname in zip(axes[1:], ("weight", "bias"), strict=True):
        names = [k for k, m in norms.items() if getattr(m, pname, None) is not None]
        data = [getattr(norms[k], pname).detach().float().numpy() for k in names]
        if data:
            ax.boxplot(data, whis=(5, 95), showfliers=False)
            ax.set_xticks(range(1, len(names) + 1), names, rotation=60 if len(names) > 10 else 30, fontsize=8)
        ax.axhline(1 if pname == "weight" else 0, color="gray", ls=":", lw=1)
        ax.set_title(f"Learned {pname} of each norm (box: quartiles, whiskers p5-p95)", fontsize=10)
    m = result["model_args"]
    fig.suptitle(
        f"Inside the trained model: {m['n_layer']} layers x {m['n_embd']}, norm={m['norm']}, "
        f"{m.get('norm_position', 'pre')}-norm, iter {result['iter_num']}, {result['tokens']:,} val tokens"
    )
    common.save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(run_command(main))
