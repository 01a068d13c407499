"""Does a sequence's output depend on what else is in its batch? LayerNorm: no. BatchNorm: yes. Measured.

    python batch_independence.py                       # a small random model, seeded
    python batch_independence.py --out_dir=out-shakespeare-char
    python batch_independence.py --ckpt=../nanoGPT/out-shakespeare-char/ckpt.pt  # nanoGPT's checkpoint
    python batch_independence.py --out_dir=out-ln-free --norms=frozen  # experiments/remove_layernorm.py's model
    python batch_independence.py --init_from=gpt2 --norms=custom,builtin  # GPT-2's weights (model.gpt2_checkpoint)
    TRITON_INTERPRET=1 python batch_independence.py    # include the Triton LayerNorm on a CPU-only machine
    python batch_independence.py --config=configs/shakespeare_char.json  # a random model of that size
    python batch_independence.py --device=cuda --dtype=bfloat16  # on a GPU, under bfloat16 autocast

Every row runs with PyTorch's kernels, where it passes when every difference is within the dtype's tolerance
(relative to the largest value compared) and the greedy tokens agree, and in the batch-invariant mode
(batch_invariant/), where every difference must be 0. TF32 is off. Exit 1 when a --require row fails.
"""

from machinery.command import quiet_until_started

quiet_until_started(__name__)  # Ctrl-C while torch loads ends the process at once, quietly

import json
import os
import sys
from argparse import Namespace
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from batch_invariant import batch_invariant, refusal
from layernorm import FROZEN, LAYERNORMS, NORMS, TritonUnavailableError
from machinery.checkpoint import resolve_weights
from machinery.command import ArgumentParser, Failure, first_line, run_command
from machinery.device import DEVICE_HELP, autocast, resolve_device
from machinery.nanogpt import FORMAT as NANOGPT_FORMAT
from machinery.options import SEEDS, ConfigError, read_config_file
from model import GPT, GPTConfig, pad_left

EVAL_ROW = "batchnorm-eval"
STATISTICS = {"batchnorm": "batch statistics", EVAL_ROW: "running averages", "dyt": "per element", FROZEN: "none"}
RANDOM_MODEL = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64, norm="custom")
CHECKS = ("alone_vs_batch", "cached_vs_full", "norm_alone")
# A row passes with PyTorch's kernels when every difference is at most this times the largest |value| compared (the
# logits, or the norm's output): some 80 float32 roundings, or 6 of bfloat16's (its 8 bits are 2**16 times coarser)
TOLERANCE = {"float32": 1e-5, "bfloat16": 5e-2}
WORLDS = {
    "rows": "With PyTorch's kernels:",
    "batch_invariant_rows": "In the batch-invariant mode, batch_invariant/ (tolerance 0):",
}
RAGGED_COLUMNS = {"rows": "PyTorch's kernels", "batch_invariant_rows": "batch-invariant mode"}
SUFFIX = {"rows": "", "batch_invariant_rows": " (batch-invariant)"}  # after a row's name among errors and failures
LEGEND = (
    "(1) alone vs batch: max |logit difference| over every step, a prompt decoded alone vs in row 0 of the batch.",
    "(2) cached vs full: max |logit difference| between the batch's cached decoding and one full forward pass.",
    "(3) norm alone: the final norm layer on x [B, T, C]: max |norm(x)[i] - norm(x[i:i+1])| over rows i.",
    "(4) ragged, below the tables: prompts of different lengths left padded into one batch with an attention mask: "
    "max |logit difference| over every row and step, each row decoded in the batch vs alone, and their tokens.",
    "With PyTorch's kernels, the per-token rows' (1) and (2) (about 1e-6 in float32) are the matrix products' "
    "rounding: a product over 1 row, over 4, or over a cached prefix may add in another order; (3) isolates the norm.",
    "The batch-invariant mode (batch_invariant/) makes every matrix product and attention add in one "
    "fixed order however the work is batched or cached: there every difference of a per-token row is 0.",
)
WHY_BATCHNORM_FAILS = (
    "batchnorm fails, in every table, because it normalizes each feature over every token of the batch: a token's "
    "output depends on the other tokens, which no order of additions can undo. A decoding step alone is a batch of one "
    "token: its mean is the token itself and there is no variance to take, so its output is the bias alone; after the "
    "prompt the final norm hands lm_head that same bias at every step, whatever the token, and the model decodes blind."
)
WHY_EVAL = (
    "batchnorm-eval uses its running averages instead: per token again, so batch independent, but not the "
    "function the model trained with (the averages are at their init unless the checkpoint had them)."
)


def parse_args(argv: Sequence[str] | None) -> Namespace:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out_dir", help="folder holding ckpt.pt (this project's or nanoGPT's); without it, a random model")
    p.add_argument("--ckpt", help="path of a checkpoint file; overrides --out_dir")
    p.add_argument("--init_from", help="GPT-2's weights instead: a hub id (gpt2, distilgpt2, ...) or a folder")
    p.add_argument("--config", help="a random model of this JSON config's size (default: 2 layers, 64 wide)")
    p.add_argument("--norms", nargs="+", default=list(NORMS), help=f"norms to run (default: {' '.join(NORMS)})")
    p.add_argument("--require", nargs="+", help="rows that must pass, else exit 1 (default: LayerNorms, rmsnorm)")
    p.add_argument("--prompt_len", type=int, default=16, help="tokens per prompt (default 16)")
    p.add_argument("--new_tokens", type=int, default=32, help="greedy tokens decoded (default 32)")
    p.add_argument("--batch_size", type=int, default=4, help="prompts in the batch of check (1) (default 4)")
    p.add_argument("--dtype", choices=TOLERANCE, default="float32", help="float32, or bfloat16 autocast")
    p.add_argument("--tol", type=float, help=f"relative tolerance (default per dtype: {TOLERANCE})")
    p.add_argument("--seed", type=int, default=1337, help="seed of the random model, prompts and x (default 1337)")
    p.add_argument("--device", default="auto", help=DEVICE_HELP)
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--out", help="also write the JSON to this file, after every row (a run cut short keeps its rows)")
    args = p.parse_args(argv)
    split = lambda values: list(dict.fromkeys(s for v in values for s in v.split(",") if s))  # 'a,b a' -> [a, b]
    args.norms = split(args.norms)
    valid = (*NORMS, FROZEN)  # frozen: a LayerNorm-free checkpoint's (experiments/remove_layernorm.py)
    if (bad := [n for n in args.norms if n not in valid]) or not args.norms:
        p.error(f"--norms: unknown {', '.join(map(repr, bad)) or 'empty list'}; valid: {', '.join(valid)}")
    args.rows = args.norms + ([EVAL_ROW] if "batchnorm" in args.norms else [])
    args.require = None if args.require is None else split(args.require)
    if bad := [n for n in args.require or [] if n not in args.rows]:
        p.error(f"--require: {', '.join(map(repr, bad))} not among the rows run; valid: {', '.join(args.rows)}")
    args.tol = TOLERANCE[args.dtype] if args.tol is None else args.tol
    if args.out and (Path(args.out).is_dir() or not Path(args.out).parent.is_dir()):
        why = "a folder" if Path(args.out).is_dir() else "its folder does not exist"
        p.error(f"--out {args.out}: {why}; give the path of a file")
    if args.seed not in SEEDS:
        p.error(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    for name, least in (("prompt_len", 1), ("new_tokens", 1), ("batch_size", 2), ("tol", 0)):
        if not getattr(args, name) >= least:  # written `not >=` so that a nan tolerance is refused too
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    return args


def base_weights(args: Namespace) -> tuple[GPTConfig, dict[str, torch.Tensor], str]:
    """The config and weights every row shares, and a line saying where they come from."""
    if args.out_dir is None and args.ckpt is None and args.init_from is None:
        size = read_config_file(args.config) if args.config else {}  # a ConfigError says what is wrong with it
        try:
            config = replace(RANDOM_MODEL, **{k: v for k, v in size.items() if k in ("n_layer", "n_head", "n_embd")})
        except ValueError as e:  # sizes that do not fit one another
            raise ConfigError(f"--config: {e}") from None
        return (
            config,
            GPT.from_seed(config, args.seed).state_dict(),
            f"random init (seed {args.seed}), the same weights in every row",
        )
    ckpt, path = resolve_weights(args.out_dir or "out", args.ckpt, args.init_from)
    config = GPTConfig.from_options(ckpt["model_args"])
    try:  # weights that do not fit their own model_args, refused once (a LayerNorm's built as builtin: one layout)
        GPT.from_checkpoint(ckpt, norm="builtin" if config.norm in LAYERNORMS else None)
    except ValueError as e:  # (each row's model then differs from it only in its norm layers' entries)
        raise Failure(f"cannot build the model from {path}: {first_line(e)}") from None
    if args.init_from is not None:
        return config, ckpt["model"], f"GPT-2's weights from {args.init_from}"
    owner = "nanoGPT's checkpoint" if ckpt["format"] == NANOGPT_FORMAT else "checkpoint"
    source = f"{owner} {path} (trained with norm={config.norm}), loaded into every row's model with strict=False"
    return config, ckpt["model"], f"{source}: the norms share weight/bias"


def attempt(measure: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """The checks' one error path: (measure(...), None), or (None, 'Kind: first line') when it raised a ValueError
    or RuntimeError. TritonUnavailableError is not a measurement: it propagates, and the row is skipped."""
    try:
        return measure(*args, **kwargs), None
    except TritonUnavailableError:
        raise
    except (ValueError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {first_line(e)}"


def compare(pair: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """Checks (2) and (3): max |a - b| over the two tensors that pair() computes, the largest |b| (the scale the
    tolerance is relative to), or the error that stopped it."""
    out, error = attempt(lambda: [t.float() for t in pair()])
    return {
        "max_abs_diff": None if out is None else (out[0] - out[1]).abs().max().item(),
        "scale": None if out is None else out[1].abs().max().item(),
        "error": error,
        "bit_exact": out and torch.equal(*out),
    }


@torch.no_grad()
def run_row(
    name: str, config: GPTConfig, state: dict[str, Tensor], prompts: Tensor, x: Tensor, args: Namespace, invariant: bool
) -> dict[str, Any]:
    """Row `name`: its GPT with the shared weights, the three checks of LEGEND, and whether the row passed."""
    model = GPT(replace(config, norm="batchnorm" if name == EVAL_ROW else name, dropout=0.0))
    model.load_state_dict(state, strict=False)  # the weights fit (base_weights): only norm entries may differ
    # Dropout is 0, so the mode matters only to BatchNorm: training mode (the batchnorm row) uses batch statistics
    model.to(prompts.device).train(name == "batchnorm")
    # GPT.generate's greedy decoding with the KV cache: (tokens [B, P + n], logits [B, n, V]), or the error
    greedy = lambda idx, **mask: attempt(
        model.generate, idx, args.new_tokens, temperature=0, return_logits=True, **mask
    )
    with autocast(prompts.device.type, args.dtype), batch_invariant(enabled=invariant):
        alone, alone_error = greedy(prompts[:1])  # (1) row 0 alone
        batch, batch_error = greedy(prompts)  # and in the batch
        error = f"alone, {alone_error}" if alone_error else f"in the batch, {batch_error}" if batch_error else None
        per_step = [] if error else (alone[1][0].float() - batch[1][0].float()).abs().amax(-1).tolist()
        differ = [] if error else (alone[0][0] != batch[0][0]).nonzero().flatten().tolist()  # token positions
        alone_vs_batch = {
            "max_abs_diff": max(per_step, default=None),
            "scale": None if error else alone[1].float().abs().max().item(),
            "error": error,
            "per_step_max_abs_diff": per_step,
            "tokens_agree": None if error else not differ,
            "first_divergent_step": differ[0] - prompts.size(1) if differ else None,  # the first token that differs
        }
        # (2) the batch's step s chose from the logits at position P - 1 + s; here one forward pass over the sequences
        # (the last chosen token is never fed back)
        cached_vs_full = (
            {"max_abs_diff": None, "error": "the batched decoding failed: see (1)", "bit_exact": None}
            if batch_error
            else compare(lambda: (model(batch[0][:, :-1])[0][:, prompts.size(1) - 1 :], batch[1]))
        )
        ragged_vs_alone = ragged(greedy, prompts)  # (4) prompts of different lengths, left padded
        ln_f = model.transformer.ln_f  # (3) the final norm layer alone; last, as it may move BatchNorm's buffers
        norm_alone = compare(lambda: (ln_f(x), torch.cat([ln_f(x[i : i + 1]) for i in range(x.size(0))])))
    checks = (alone_vs_batch, cached_vs_full, norm_alone)
    tol = 0 if invariant else args.tol  # the mode promises the same bits
    within_tol = all(c["error"] is None and c["max_abs_diff"] <= tol * c["scale"] for c in (*checks, ragged_vs_alone))
    return {
        "name": name,
        "statistics": STATISTICS.get(name, "per token"),
        "required": name in args.require if args.require is not None else model.config.norm != "batchnorm",
        **dict(zip(CHECKS, checks, strict=True)),
        "ragged_vs_alone": ragged_vs_alone,
        # within_tol: no error, so the tokens were compared
        "passed": within_tol and alone_vs_batch["tokens_agree"] and ragged_vs_alone["tokens_agree"],
    }


def ragged(greedy: Callable[..., tuple[Any, str | None]], prompts: Tensor) -> dict[str, Any]:
    """Check (4): row i keeps the last of its prompt's tokens, from all of them down, as evenly spaced as they fit, at
    least 1; the rows left padded into one batch with an attention mask (model.pad_left); each row's logits at every
    step, decoded in the batch, against the row decoded alone."""
    batch_size, prompt_len = prompts.shape
    lengths = [max(1, prompt_len * (batch_size - i) // batch_size) for i in range(batch_size)]
    rows = [prompt[-n:].tolist() for prompt, n in zip(prompts, lengths, strict=True)]
    idx, mask = pad_left(rows)
    batch, batch_error = greedy(idx.to(prompts.device), attention_mask=mask.to(prompts.device))
    error = batch_error and f"in the batch, {batch_error}"
    diffs, scale, agree = [], 0.0, True
    for i, row in enumerate([] if error else rows):  # each row alone, once the batch decoded
        alone, alone_error = greedy(torch.tensor([row], device=prompts.device))
        if alone_error:
            error = f"row {i} alone, {alone_error}"
            break
        diffs.append((alone[1][0].float() - batch[1][i].float()).abs().max().item())
        scale = max(scale, alone[1].float().abs().max().item())
        agree = agree and torch.equal(alone[0][0, len(row) :], batch[0][i, idx.size(1) :])
    return {
        "lengths": lengths,
        "max_abs_diff": None if error else max(diffs),
        "scale": None if error else scale,
        "error": error,
        "tokens_agree": None if error else agree,
    }


def show_diff(d: float | None) -> str:
    """A check's max |difference| as a table shows it."""
    return "error" if d is None else "bit-exact" if d == 0 else f"{d:.1e}"


def aligned(cells: list[tuple[str, ...]], rule: bool = False) -> list[str]:
    """Rows of cells as text lines, each column as wide as its widest cell; rule: a line of dashes under the first."""
    widths = [max(len(c[i]) for c in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    if rule:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One world's rows as aligned text lines."""
    cells = [
        ("row", "normalizes with", "(1) alone vs batch", "tokens", "(2) cached vs full", "(3) norm alone", "result")
    ]
    for r in rows:
        ab = r["alone_vs_batch"]
        steps = len(ab["per_step_max_abs_diff"])
        tokens = f"{steps}/{steps} agree"  # if they agree, every step was compared
        if ab["first_divergent_step"] is not None:
            tokens = f"differ from step {ab['first_divergent_step']}"
        elif not ab["tokens_agree"]:
            tokens = f"{'alone' if ab['error'].startswith('alone') else 'batch'} fails"
        verdict = ("PASS" if r["passed"] else "FAIL") + ("" if r["required"] else "  (not required)")
        diffs = [show_diff(r[c]["max_abs_diff"]) for c in CHECKS]
        cells.append((r["name"], r["statistics"], diffs[0], tokens, *diffs[1:], verdict))
    return aligned(cells, rule=True)


def ragged_table(result: dict[str, Any]) -> list[str]:
    """Check (4) of every row, in each world, as aligned text lines under a title naming the prompts' lengths."""
    worlds = [w for w in WORLDS if w in result]  # "rows" always; the mode's where it ran
    if not result["rows"]:  # every row skipped
        return []
    lengths = ", ".join(map(str, result["rows"][0]["ragged_vs_alone"]["lengths"]))
    cells = [("row", *(RAGGED_COLUMNS[w] for w in worlds))]
    for i, row in enumerate(result["rows"]):
        checks = [result[w][i]["ragged_vs_alone"] for w in worlds]
        shown = [f"{show_diff(c['max_abs_diff'])}, tokens {'agree' if c['tokens_agree'] else 'differ'}" for c in checks]
        cells.append((row["name"], *shown))
    title = f"(4) ragged: prompts of {lengths} tokens left padded into one batch, each row vs alone:"
    return [title, *aligned(cells)]


def report(result: dict[str, Any]) -> str:
    """The two tables and what they mean, read from the JSON."""
    m = result["model"]
    lines = [
        "Batch independence: does a sequence's output depend on the other sequences in its batch?",
        f"model: {result['source']}",
        f"       {m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, block {m['block_size']}, "
        f"vocab {m['vocab_size']}; device {result['device']}, {result['dtype']}, TF32 off, dropout off",
        f"decoding: prompts of {result['prompt_len']} tokens, {result['new_tokens']} greedy new tokens (KV cache), "
        f"a batch of {result['batch_size']} different prompts; tolerance {result['tolerance']:g} x max |value|",
    ]
    lines += [f"note: {note}" for note in result["notes"]]
    lines += [f"skipped {name}: {why}" for name, why in result["skipped"].items()]
    for world, title in WORLDS.items():
        if world in result:
            lines += ["", title, *table(result[world])]
    lines += ["", *ragged_table(result)]
    lines += ["", *(f"  {line}" for line in LEGEND)]
    for world in WORLDS:  # the errors that stopped a check, one line each
        for r in result.get(world, []):
            lines += [
                f"  {r['name']}{SUFFIX[world]}: {r[c]['error']}" for c in (*CHECKS, "ragged_vs_alone") if r[c]["error"]
            ]
    if any(r["name"] == "batchnorm" for world in WORLDS for r in result.get(world, [])):
        lines += ["", WHY_BATCHNORM_FAILS, WHY_EVAL]
    failed = ", ".join(result["failed"])
    lines += ["", f"FAIL: required rows that failed: {failed}" if failed else "OK: every required row passes"]
    return "\n".join(lines)


def write_json(result: dict[str, Any], path: str | None) -> None:
    """The result so far in the file --out names, replaced whole (a run cut while it writes keeps the one before)."""
    if path:
        Path(f"{path}.part").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        os.replace(f"{path}.part", path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the tables (or JSON); 0 when every required row passes in both worlds, else 1."""
    args = parse_args(argv)
    device = resolve_device(args.device)
    config, state, source = base_weights(args)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 computed as float32
    torch.backends.cudnn.allow_tf32 = False
    notes = []  # from here on, args.prompt_len and args.new_tokens are what ran
    if args.prompt_len + args.new_tokens > config.block_size:  # check (2) compares within one block (see model.py)
        args.prompt_len = min(args.prompt_len, max(1, config.block_size // 2))
        args.new_tokens = max(1, config.block_size - args.prompt_len)
        notes.append(f"prompt {args.prompt_len} + new {args.new_tokens} tokens, to fit block_size {config.block_size}")
    if why := refusal(device):  # the mode refuses a device it has no implementation for
        notes.append(f"no batch-invariant rows: {why}")
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(config.vocab_size, (args.batch_size, args.prompt_len), generator=gen).to(device)
    x = (torch.randn(args.batch_size, args.prompt_len, config.n_embd, generator=gen) * 2 + 1).to(device)
    worlds = ["rows"] if why else list(WORLDS)
    rows = {world: [] for world in worlds}
    result = {
        "source": source,
        "model": {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")},
        "device": device,
        "dtype": args.dtype if args.dtype == "float32" else f"{args.dtype} autocast",
        **{k: getattr(args, k) for k in ("prompt_len", "new_tokens", "batch_size")},
        "tolerance": args.tol,
        "notes": notes,
        "skipped": {},
        **rows,  # "rows": with PyTorch's kernels; "batch_invariant_rows": in the mode (absent where it refuses)
    }
    for name in args.rows:  # the Triton norm refuses to build, or its first forward refuses, where it cannot run
        try:
            for world in worlds:
                rows[world].append(run_row(name, config, state, prompts, x, args, world != "rows"))
                write_json(result, args.out)  # (result holds the lists of rows)
        except TritonUnavailableError as e:  # not a measurement: the row is skipped, with its message
            result["skipped"][name] = str(e)
    missing = [n for n in args.require or [] if n in result["skipped"]]
    notes += [f"{n} is required but was skipped: counted as a failure" for n in missing]
    failed = [r["name"] + SUFFIX[w] for w in worlds for r in rows[w] if r["required"] and not r["passed"]] + missing
    result |= {"failed": failed, "ok": not failed}
    write_json(result, args.out)
    print(json.dumps(result, indent=2) if args.json else report(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(run_command(main, "--batch_size or --new_tokens, or use a smaller --config"))
