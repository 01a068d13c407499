"""Can a trained GPT live without its LayerNorms? Remove them one kind at a time by fine-tuning, against a control.

    python experiments/remove_layernorm.py                   # the Quickstart's checkpoint, 3 seeds: about 8 minutes
    python experiments/remove_layernorm.py --ckpt=path/to/ckpt.pt --data_dir=data/shakespeare_char
    python experiments/remove_layernorm.py --init_from=path/to/gpt2-folder --data_dir=data/shakespeare --smoke
    python sample.py --out_dir=out-ln-free                   # the LayerNorm-free model it leaves
    python batch_independence.py --out_dir=out-ln-free --norms=frozen

A trained pre-norm GPT's LayerNorm divides each token by its own standard deviation, sqrt(var + eps), the one step
that is not linear. Here each is frozen to its linear part (layernorm.FrozenLayerNorm: the centring, one constant
scale, the same weight and bias): the constant is the mean of that norm's per-token scale over --measure_batches
training batches, measured on the model as it is when the norm is frozen. The norms go in three stages, in the order
of Heimersheim (2024) and Baroni et al. (2025): every block's ln_2 (the MLP's) at --remove_at[0], every ln_1 (the
attention's) at --remove_at[1], the final ln_f at --remove_at[2], with fine-tuning between and after, --iters
iterations in all (train.py's optimizer and step, a cosine schedule from --learning_rate). The control runs the
same iterations on the same batches with every norm kept. Both are evaluated every --eval_interval iterations on
--eval_batches fixed val batches, and each removal is evaluated right before and right after it.

For each seed: the control's and the LN-free model's curves, and the loss at each removal. For the first seed's
LN-free model, written as a checkpoint to --ln_free_dir (norm "frozen", so sample.py and batch_independence.py
build it): each norm's per-token scale before (the original model) and after (what each frozen norm now receives,
against its constant); its blocks' norms folded into the Linear that reads them (c_attn, c_fc) and the folded
logits against the frozen ones, in float32 and float64; batch_independence.py's checks on the checkpoint.
Writes remove_layernorm.json, .md and .png to --results_dir.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import statistics
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import common  # first: the repository's modules on sys.path, figures to files
import matplotlib.pyplot as plt
import torch
from torch import nn

import batch_independence
from bench.common import at_least
from layernorm import FROZEN, LAYERNORMS, FrozenLayerNorm, LayerNorm
from machinery.checkpoint import FORMAT, resolve_weights, save_checkpoint
from machinery.command import BadOption, Failure, first_line, run_command
from machinery.dataset import PreparedData
from machinery.measure import markdown_table
from machinery.step import get_lr, train_step
from model import GPT

ORDER = ("ln_2", "ln_1", "ln_f")  # the MLP's norms, then the attention's, then the final one
FOLDS_INTO = {"ln_1": "attn.c_attn", "ln_2": "mlp.c_fc"}  # the one Linear that reads each block norm (pre-norm)
SMOKE = {"iters": 6, "remove_at": [0, 2, 4], "eval_interval": 2, "eval_batches": 2, "measure_batches": 2}
FOLD_TOL = {"float32": 1e-5, "float64": 1e-12}  # max |folded - frozen logit| / max |logit|


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = common.parser(__doc__, "remove_layernorm", "a few iterations of everything: checks the pipeline", False)
    p.add_argument("--out_dir", default="out-shakespeare-char-cpu", help="folder holding the trained ckpt.pt")
    p.add_argument("--ckpt", help="path of a checkpoint file; overrides --out_dir")
    p.add_argument("--init_from", help="a GPT-2 folder instead (config.json, model.safetensors); needs --data_dir")
    p.add_argument("--data_dir", help="prepared data (default: the checkpoint's data_dir, else data/<dataset>)")
    p.add_argument("--ln_free_dir", default="out-ln-free", help="where the first seed's LN-free ckpt.pt goes")
    p.add_argument("--seeds", nargs="+", type=int, default=[1337, 1, 2], help="one control and one removal each")
    p.add_argument("--iters", type=at_least(1), default=480, help="fine-tuning iterations of each arm (default 480)")
    p.add_argument("--remove_at", nargs=3, type=int, default=[0, 80, 160], metavar=ORDER, help="iteration of each")
    p.add_argument("--learning_rate", type=float, default=6e-4)
    p.add_argument("--min_lr", type=float, default=6e-5)
    p.add_argument("--warmup_iters", type=int, default=20)
    p.add_argument(
        "--batch_size", type=at_least(1), help="windows per iteration (default: the checkpoint's run's, else 12)"
    )
    p.add_argument(
        "--block_size", type=at_least(1), help="tokens per window (default: the checkpoint's run's, else 64)"
    )
    p.add_argument("--eval_interval", type=at_least(1), default=40)
    p.add_argument("--eval_batches", type=at_least(1), default=100, help="fixed val batches of every evaluation")
    p.add_argument(
        "--measure_batches", type=at_least(1), default=20, help="fixed train batches each frozen scale is from"
    )
    args = p.parse_args(argv)
    args.argv = argv
    if args.smoke:
        vars(args).update(SMOKE, seeds=args.seeds[:1])
    if not all(0 <= at <= args.iters for at in args.remove_at) or sorted(args.remove_at) != args.remove_at:
        p.error(f"--remove_at must be 3 iterations in order within 0..--iters ({args.iters}), got {args.remove_at}")
    return args


# ---- the model: what is removed, and how ----


def named_norms(model: GPT, kind: str | None = None) -> dict[str, nn.Module]:
    """The model's norms by name ("h.0.ln_1", ..., "ln_f"), or only those of one kind of ORDER."""
    norms = {f"h.{i}.{n}": getattr(b, n) for i, b in enumerate(model.transformer.h) for n in ("ln_1", "ln_2")}
    norms["ln_f"] = model.transformer.ln_f
    return {name: m for name, m in norms.items() if kind is None or name.split(".")[-1] == kind}


def token_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """What LayerNorm divides each token of x [..., C] by: sqrt(var + eps), population variance -> [...]."""
    return (x.double().var(-1, unbiased=False) + eps).sqrt()


@torch.no_grad()
def measure_scales(model: GPT, batches: list, kind: str | None = None) -> dict[str, torch.Tensor]:
    """Every token's scale (token_scale of its input) at each norm of `kind` (None: all), over the batches."""
    found: dict[str, list[torch.Tensor]] = {}
    hooks = [
        norm.register_forward_pre_hook(
            lambda m, a, name=name: found.setdefault(name, []).append(token_scale(a[0], m.eps))
        )
        for name, norm in named_norms(model, kind).items()
    ]
    was_training = model.training
    model.eval()
    try:
        for x, _ in batches:
            model(x)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return {name: torch.cat([s.flatten() for s in scales]) for name, scales in found.items()}


def frozen_like(norm: LayerNorm, scale: float) -> FrozenLayerNorm:
    """norm's linear part: a FrozenLayerNorm dividing by `scale`, holding norm's own weight and bias (the same
    Parameters, so an optimizer over the model keeps updating them, with its state)."""
    frozen = FrozenLayerNorm(norm.dim, bias=norm.bias is not None, eps=norm.eps)
    frozen.weight, frozen.bias = norm.weight, norm.bias
    frozen.scale = torch.tensor(scale, dtype=norm.weight.dtype)  # (a float64 model's in float64)
    frozen.feeds_linear = norm.feeds_linear
    return frozen.to(norm.weight.device)


def freeze(model: GPT, kind: str, batches: list) -> dict[str, float]:
    """Replace every norm of `kind` by its linear part, each scale the mean of its tokens' scales over the batches,
    measured now; returns those constants by name."""
    constants = {name: s.mean().item() for name, s in measure_scales(model, batches, kind).items()}
    for name, norm in named_norms(model, kind).items():
        parent = model.transformer if name == "ln_f" else model.transformer.h[int(name.split(".")[1])]
        setattr(parent, kind, frozen_like(norm, constants[name]))
    return constants


@torch.no_grad()
def fold(model: GPT) -> GPT:
    """A copy of `model` with each block's frozen norm folded into the Linear that reads it, the norm an Identity.
    For a Linear (W, c) reading y = (x - mean(x)) / s * w + b:  W y + c = W' x + c', with W' = (W diag(w / s)) minus
    each row's mean (the centring, x - mean(x), is the matrix I - 11^T / C on the right), and c' = c + W b. ln_f is
    not folded: the head it feeds is the token embedding itself (tied), so W' would untie them, and the head has no
    bias to take W b."""
    folded = copy.deepcopy(model)
    for block in folded.transformer.h:
        for kind, path in FOLDS_INTO.items():
            norm, linear = getattr(block, kind), block.get_submodule(path)
            if not isinstance(norm, FrozenLayerNorm):
                continue
            weight = linear.weight * (norm.weight / norm.scale)  # [out, C]
            if linear.bias is not None and norm.bias is not None:
                linear.bias.add_(linear.weight @ norm.bias)
            linear.weight.copy_(weight - weight.mean(1, keepdim=True))
            setattr(block, kind, nn.Identity())
    return folded


@torch.no_grad()
def evaluate(model: GPT, batches: list) -> float:
    """Mean cross-entropy over the batches, in eval mode (the mode restored)."""
    was_training = model.training
    model.eval()
    loss = sum(model(x, y)[1].item() for x, y in batches) / len(batches)
    model.train(was_training)
    return loss


# ---- the runs ----


def fine_tune(model: GPT, args: argparse.Namespace, data: Any, seed: int, batches: dict, remove: bool) -> dict:
    """--iters iterations from `model` (changed in place) on the seed's batches; with `remove`, the norms frozen
    kind by kind at --remove_at. {"evals": [[iter, val loss]], "removals": [...], "wall_s"}."""
    t0 = time.perf_counter()
    torch.manual_seed(seed)  # dropout, if the model has any
    gen = torch.Generator().manual_seed(seed)  # the batches: the same for both arms of a seed
    schedule = SimpleNamespace(
        decay_lr=True,
        learning_rate=args.learning_rate,
        min_lr=args.min_lr,
        warmup_iters=args.warmup_iters,
        lr_decay_iters=args.iters,
    )
    optimizer = model.configure_optimizers(args.weight_decay, args.learning_rate, (0.9, args.beta2), "cpu")
    model.train()
    evals, removals = [], []
    for it in range(args.iters + 1):
        for kind, at in zip(ORDER, args.remove_at, strict=True):
            if remove and it == at:
                before = evaluate(model, batches["val"])
                constants = freeze(model, kind, batches["measure"])
                after = evaluate(model, batches["val"])
                removals.append({"kind": kind, "iter": it, "before": before, "after": after, "scales": constants})
                print(f"    seed {seed}: iter {it}, {kind} frozen: val loss {before:.4f} -> {after:.4f}", flush=True)
        if it % args.eval_interval == 0 or it == args.iters:
            evals.append([it, evaluate(model, batches["val"])])
        if it == args.iters:
            break
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it, schedule)
        starts = torch.randint(data.num_starts("train"), (1, args.batch_size), generator=gen)
        xs, ys = data.get("train", starts, "cpu")
        train_step(model, optimizer, xs, ys, grad_clip=args.grad_clip)
    arm = "LN-free" if remove else "control"
    print(f"  seed {seed}, {arm}: val loss {evals[-1][1]:.4f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"evals": evals, "removals": removals, "wall_s": round(time.perf_counter() - t0, 1)}


def spread(scales: torch.Tensor, constant: float | None = None) -> dict[str, float]:
    """The per-token scales' mean, percentiles and extremes, and each over `constant` (default: their mean)."""
    s = scales.double()
    c = s.mean().item() if constant is None else constant
    q = torch.quantile(s, torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64)).tolist()
    out = {"constant": c, "mean": s.mean().item(), "p5": q[0], "p50": q[1], "p95": q[2], "min": s.min().item()}
    out["max"] = s.max().item()
    out |= {f"{k}_ratio": out[k] / c for k in ("p5", "p50", "p95", "min", "max")}
    return {k: round(v, 6) for k, v in out.items()}


@torch.no_grad()
def fold_check(model: GPT, batches: list) -> dict[str, Any]:
    """The folded model's logits against the frozen model's, in float32 and float64, and the val loss of each, on
    the batches."""
    out = {}
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
        frozen = copy.deepcopy(model).to(dtype).eval()
        folded = fold(frozen)
        diff = scale = 0.0
        for x, _ in batches:
            a, b = frozen(x)[0], folded(x)[0]
            diff, scale = max(diff, (a - b).abs().max().item()), max(scale, a.abs().max().item())
        out[name] = {"max_abs_diff": diff, "max_abs_logit": scale, "relative": diff / scale, "tol": FOLD_TOL[name]}
    kinds = {type(m).__name__ for m in named_norms(fold(model)).values()}
    losses = {"val_loss_frozen": evaluate(model, batches), "val_loss_folded": evaluate(fold(model), batches)}
    return out | {"norms_left": sorted(kinds), "batches": len(batches), **losses}


def check_batch_independence(ckpt: Path) -> dict[str, Any]:
    """batch_independence.py's three checks on the checkpoint, its frozen norms as they are (--norms=frozen)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = batch_independence.main([f"--ckpt={ckpt}", f"--norms={FROZEN}", "--json", "--device=cpu"])
    result = json.loads(out.getvalue())
    keep = ("alone_vs_batch", "cached_vs_full", "norm_alone")
    rows = {
        world: [{k: r[k] for k in ("name", "passed", *keep)} for r in result.get(world, [])]
        for world in ("rows", "batch_invariant_rows")
    }
    for world in rows.values():
        for r in world:
            r["alone_vs_batch"].pop("per_step_max_abs_diff", None)
    return {"command": f"python batch_independence.py --ckpt={ckpt} --norms={FROZEN}", "exit": code, **rows}


def save_ln_free(model: GPT, path: Path, source: dict, iters: int, val_loss: float) -> None:
    """The LN-free model as a checkpoint sample.py and batch_independence.py build (norm "frozen")."""
    config = replace(model.config, norm=FROZEN, dropout=0.0)
    checkpoint = {
        "format": FORMAT,
        "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "model_args": asdict(config),
        "iter_num": iters,
        "best_val_loss": val_loss,
        "config": source.get("config") or {},
        "tokenizer": source["tokenizer"],
    }
    save_checkpoint(path, checkpoint)


# ---- reading the inputs ----


def load_source(args: argparse.Namespace) -> tuple[dict, GPT, str]:
    """The checkpoint (with its tokenizer), its model with builtin LayerNorms, and a line saying what it is."""
    if args.init_from and not args.data_dir:
        raise BadOption("--init_from needs --data_dir, a dataset prepared in GPT-2's BPE")
    ckpt, where = resolve_weights(args.out_dir, args.ckpt, args.init_from)
    if args.init_from:
        where = f"GPT-2's weights from {args.init_from}"
    norm, position = ckpt["model_args"].get("norm"), ckpt["model_args"].get("norm_position", "pre")
    if norm not in LAYERNORMS or position != "pre":
        raise Failure(
            f"{where} is a {position}-norm model with norm={norm!r}: this experiment removes the "
            f"LayerNorms ({', '.join(LAYERNORMS)}) of a pre-norm model"
        )
    try:
        model = GPT.from_checkpoint(ckpt, norm="builtin")  # the same function as any LayerNorm, on the CPU
    except ValueError as e:  # weights that do not fit
        raise Failure(f"{where}: {first_line(e)}") from None
    if "tokenizer" not in ckpt:
        raise Failure(f"{where} has no tokenizer entry: sample.py could not read the LN-free model")
    return ckpt, model, where


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    args = parse(argv)
    ckpt, base, where = load_source(args)
    run = ckpt.get("config") or {}
    args.batch_size = args.batch_size or run.get("batch_size", 12)
    args.block_size = min(args.block_size or run.get("block_size", 64), base.config.block_size)
    if args.smoke:
        args.batch_size, args.block_size = min(args.batch_size, 4), min(args.block_size, 16)
    args.weight_decay, args.beta2, args.grad_clip = (
        run.get(k, d) for k, d in (("weight_decay", 0.1), ("beta2", 0.99), ("grad_clip", 1.0))
    )
    data = PreparedData(args.data_dir or run.get("data_dir"), run.get("dataset", ""), args.block_size)
    if data.meta.get("tokenizer") != ckpt["tokenizer"]:
        raise Failure(f"{data.dir} is not tokenized as {where}'s data was: give --data_dir")
    batches = {
        "val": common.fixed_batches(data, "val", args.batch_size, args.eval_batches, seed=0),
        "measure": common.fixed_batches(data, "train", args.batch_size, args.measure_batches, seed=1),
    }
    trained_tokens = run.get("max_iters", 0) * run.get("batch_size", 0) * run.get("block_size", 0)
    trained_tokens *= run.get("gradient_accumulation_steps", 1)
    tokens_per_iter = args.batch_size * args.block_size
    cfg = base.config
    print(
        f"{where}: {cfg.n_layer} layers x {cfg.n_embd}; {len(args.seeds)} seeds x 2 arms of {args.iters} "
        f"iterations of {tokens_per_iter} tokens",
        flush=True,
    )

    original = evaluate(base, batches["val"])
    before = {name: spread(s) for name, s in measure_scales(base, batches["measure"]).items()}
    runs = []
    for i, seed in enumerate(args.seeds):
        control, ln_free = copy.deepcopy(base), copy.deepcopy(base)
        runs.append(
            {
                "seed": seed,
                "control": fine_tune(control, args, data, seed, batches, remove=False),
                "ln_free": fine_tune(ln_free, args, data, seed, batches, remove=True),
            }
        )
        if i == 0:
            first = ln_free
    constants = {name: norm.scale.item() for name, norm in named_norms(first).items()}
    after = {name: spread(s, constants[name]) for name, s in measure_scales(first, batches["measure"]).items()}
    path = Path(args.ln_free_dir) / "ckpt.pt"
    save_ln_free(first, path, ckpt, args.iters, runs[0]["ln_free"]["evals"][-1][1])
    result = {
        "source": where,
        "model_args": asdict(cfg),
        "trained_tokens": trained_tokens,
        "fine_tuning_tokens": args.iters * tokens_per_iter,
        "settings": {
            k: getattr(args, k)
            for k in (
                "iters",
                "remove_at",
                "learning_rate",
                "min_lr",
                "warmup_iters",
                "batch_size",
                "block_size",
                "eval_interval",
                "eval_batches",
                "measure_batches",
                "weight_decay",
                "beta2",
                "grad_clip",
            )
        },
        "order": list(ORDER),
        "original": {"val_loss": original, "bits_per_byte": data.bits_per_byte("val", original)},
        "scales_before": before,
        "scales_after": after,
        "runs": runs,
        "fold": fold_check(first, batches["val"][:4]),
        "ln_free_checkpoint": str(path),
        "batch_independence": check_batch_independence(path),
    }
    result["summary"] = summarize(result, data)
    data.close()
    results = Path(args.results_dir)
    result["run_time_s"] = round(time.perf_counter() - t0, 1)
    write(result, results, args)
    print(f"wrote {results}/remove_layernorm.json, .md, .png and {path}; total time {result['run_time_s']:.0f} s")


# ---- what is reported ----


def mean_std(values: list[float]) -> dict[str, Any]:
    return {
        "each": values,
        "mean": statistics.mean(values),
        "std": statistics.stdev(values) if len(values) > 1 else None,
    }


def summarize(result: dict, data: Any) -> dict[str, Any]:
    """Over the seeds: the final val loss (and bits per byte) of each arm, the gap, the loss after each removal."""
    runs = result["runs"]
    control = mean_std([r["control"]["evals"][-1][1] for r in runs])
    ln_free = mean_std([r["ln_free"]["evals"][-1][1] for r in runs])
    gap = mean_std([r["ln_free"]["evals"][-1][1] - r["control"]["evals"][-1][1] for r in runs])
    removals = {
        kind: {
            "iter": runs[0]["ln_free"]["removals"][k]["iter"],
            "before": mean_std([r["ln_free"]["removals"][k]["before"] for r in runs]),
            "after": mean_std([r["ln_free"]["removals"][k]["after"] for r in runs]),
        }
        for k, kind in enumerate(ORDER)
    }
    bpb = {arm: data.bits_per_byte("val", v["mean"]) for arm, v in (("control", control), ("ln_free", ln_free))}
    return {"control": control, "ln_free": ln_free, "gap": gap, "bits_per_byte": bpb, "removals": removals}


def write(result: dict, results: Path, args: argparse.Namespace) -> None:
    s, o = result["summary"], result["original"]
    fmt = lambda v: "-" if v is None else f"{v:.4f}"
    seeds = len(result["runs"])
    rows = [
        ["original", "-", fmt(o["val_loss"]), "-", fmt(o["bits_per_byte"])],
        [
            "control (norms kept)",
            seeds,
            fmt(s["control"]["mean"]),
            fmt(s["control"]["std"]),
            fmt(s["bits_per_byte"]["control"]),
        ],
        ["LN-free", seeds, fmt(s["ln_free"]["mean"]), fmt(s["ln_free"]["std"]), fmt(s["bits_per_byte"]["ln_free"])],
        ["LN-free - control", seeds, f"{s['gap']['mean']:+.4f}", fmt(s["gap"]["std"]), "-"],
    ]
    text = markdown_table(["model", "seeds", "val loss (mean)", "std", "bits/byte"], rows)
    removal_rows = [
        [
            kind,
            r["iter"],
            fmt(r["before"]["mean"]),
            fmt(r["after"]["mean"]),
            f"{r['after']['mean'] - r['before']['mean']:+.4f}",
        ]
        for kind, r in s["removals"].items()
    ]
    text += "\n\n" + markdown_table(["frozen", "at iter", "val loss before", "right after", "jump"], removal_rows)
    results.mkdir(parents=True, exist_ok=True)
    (results / "remove_layernorm.md").write_text(text + "\n", encoding="utf-8")
    plot(result, results / "remove_layernorm.png")
    common.write_json(results / "remove_layernorm.json", args.argv, result)
    print(text)


def ln_free_curve(arm: dict) -> list[tuple[int, float]]:
    """The LN-free arm's evaluations with each removal's loss before and right after it, in order."""
    points = [(it, 1, loss) for it, loss in arm["evals"]]
    points += [(rem["iter"], 0, rem["before"]) for rem in arm["removals"]]
    points += [(rem["iter"], 1, rem["after"]) for rem in arm["removals"]]
    return [(it, loss) for it, _, loss in sorted(set(points))]


def plot(result: dict, path: Path) -> None:
    runs, tokens = result["runs"], result["fine_tuning_tokens"] / result["settings"]["iters"]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    for i, r in enumerate(runs):
        style = {"alpha": 1 if i == 0 else 0.35, "lw": 1.5 if i == 0 else 1}
        its, losses = zip(*r["control"]["evals"], strict=True)
        ax.plot(
            [t * tokens for t in its], losses, color="C0", label="control (norms kept)" if i == 0 else None, **style
        )
        its, losses = zip(*ln_free_curve(r["ln_free"]), strict=True)
        ax.plot([t * tokens for t in its], losses, color="C3", label="LN-free" if i == 0 else None, **style)
    for rem in runs[0]["ln_free"]["removals"]:
        ax.annotate(
            f"{rem['kind']} frozen",
            (rem["iter"] * tokens, rem["after"]),
            fontsize=8,
            xytext=(4, 0),
            textcoords="offset points",
        )
    ax.axhline(result["original"]["val_loss"], color="gray", ls="--", lw=1, label="original")
    ax.set(xlabel="fine-tuning tokens", ylabel="val loss", title=f"Fine-tuning ({len(runs)} seeds; faint: the others)")
    ax.legend(fontsize=8)
    ax = axes[1]
    for i, r in enumerate(runs):
        control = dict(r["control"]["evals"])
        its = [it for it, _ in r["ln_free"]["evals"]]
        gaps = [loss - control[it] for it, loss in r["ln_free"]["evals"]]
        ax.plot([t * tokens for t in its], gaps, "o-", ms=3, color="C3", alpha=1 if i == 0 else 0.35)
    ax.axhline(0.07, color="gray", ls="--", lw=1, label="0.07: GPT-2 small's gap (Baroni et al. 2025)")
    ax.axhline(0, color="k", lw=0.8)
    ax.set(xlabel="fine-tuning tokens", ylabel="LN-free minus control val loss", title="The gap")
    ax.legend(fontsize=8)
    ax = axes[2]
    names = list(result["scales_before"])
    for k, (key, color, label) in enumerate(
        (
            ("scales_before", "C0", "original: scale / its mean"),
            ("scales_after", "C3", "LN-free: input scale / frozen constant"),
        )
    ):
        stats = [result[key][n] for n in names]
        x = [j + (k - 0.5) * 0.3 for j in range(len(names))]
        mid = [st["p50_ratio"] for st in stats]
        low = [m - st["p5_ratio"] for m, st in zip(mid, stats, strict=True)]
        high = [st["p95_ratio"] - m for m, st in zip(mid, stats, strict=True)]
        ax.errorbar(x, mid, [low, high], fmt="o", color=color, capsize=3, label=f"{label} (median, p5-p95)")
        ax.plot(x, [st["min_ratio"] for st in stats], "v", color=color, ms=4, alpha=0.6)
        ax.plot(x, [st["max_ratio"] for st in stats], "^", color=color, ms=4, alpha=0.6)
    ax.axhline(1, color="gray", ls=":", lw=1)
    ax.set_xticks(range(len(names)), names, rotation=45, fontsize=8)
    ax.set(ylabel="per-token scale over the constant", title="Each norm's per-token scale (markers: min, max)")
    ax.legend(fontsize=8)
    m = result["model_args"]
    fig.suptitle(f"Removing LayerNorm by fine-tuning: {m['n_layer']} layers x {m['n_embd']}, {result['source']}")
    common.save_figure(fig, path, dpi=110)


if __name__ == "__main__":
    sys.exit(run_command(main))
