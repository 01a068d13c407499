"""Does a sequence's output depend on what else is in its batch? LayerNorm: no. BatchNorm: yes. Measured.

    python batch_independence.py                       # a small random model, seeded
    python batch_independence.py --out_dir=out-shakespeare-char
    TRITON_INTERPRET=1 python batch_independence.py    # include the Triton LayerNorm on a CPU-only machine
    python batch_independence.py --json

Every row runs the same weights with another norm (model.eval(): no dropout), except that BatchNorm's layers are put
in training mode, where they normalize with the statistics of the batch in front of them: the case this demo is
about. An extra row, batchnorm-eval, shows BatchNorm with its running averages instead. Three checks per row:

  (1) alone vs batch: a prompt decoded greedily, token by token with the KV cache, alone (batch of 1) and as row 0
      of a batch of other, different prompts of the same length: the largest |difference| of the logits over all
      steps, and whether the greedy tokens agree;
  (2) cached vs full: the batch's token-by-token cached decoding against one forward pass over the whole sequence
      of the same tokens, compared at every decoded position;
  (3) norm alone: the model's final norm layer on its own, norm(x)[i] against norm(x[i:i+1]) for every row i of x.

A row passes when every difference is within --tol (float32) and the tokens agree. The exit status is 1 when a
norm in --require fails (by default every LayerNorm and RMSNorm that ran), so the script doubles as a check.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from checkpoint import CheckpointError, checkpoint_config, checkpoint_weights, load_checkpoint
from layernorm import NORMS, TritonUnavailableError, check_triton_device, make_norm
from model import GPT, GPTConfig, KVCache
from sample import pick_device

LAYERNORMS = ("custom", "builtin", "triton")
EVAL_ROW = "batchnorm-eval"
NORM_KEYS = ("ln_1.", "ln_2.", "ln_f.")  # every norm's parameters and buffers live under these module names
RANDOM_MODEL = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64)

WHY_BATCHNORM_FAILS = (
    "batchnorm fails because it normalizes each feature with the mean and variance over every token of the batch: "
    "in a batch, each token's output depends on the other tokens; a batch of one token, which is what decoding one "
    "token at a time for one user feeds it, has no variance to take (its mean is the token itself, x - mean is 0), "
    "so BatchNorm's output for it is the bias alone: after the prompt, the final norm hands lm_head the same bias "
    "at every step, whatever the token and context, and the model decodes blind."
)
WHY_EVAL = (
    "batchnorm-eval uses the running averages (from training) in place of batch statistics: per token again, so it "
    "is batch independent at inference, but the model then computes a different function than the one it trained "
    "with (here the running buffers are at their init, mean 0 and variance 1)."
)
LEGEND = (
    "(1) alone vs batch: max |logit difference| over every step between a prompt decoded alone (batch 1, greedy, "
    "KV cache) and the same prompt decoded as row 0 of a batch of different prompts; tokens: do the greedy tokens "
    "agree.",
    "(2) cached vs full: max |logit difference| between token-by-token cached decoding (the batch of (1)) and one "
    "forward pass over the same whole sequences.",
    "(3) norm alone: the final norm layer on x [B, T, C]: max |norm(x)[i] - norm(x[i:i+1])| over rows i "
    "('bit-exact' when identical).",
)


@dataclass
class Check:
    max_abs_diff: float | None = None  # None when the check could not run (error)
    error: str | None = None


@dataclass
class AloneVsBatch(Check):
    per_step_max_abs_diff: list[float] = field(default_factory=list)
    steps_compared: int = 0
    tokens_agree: bool | None = None
    first_divergent_step: int | None = None  # the first step whose greedy token differs


@dataclass
class NormAlone(Check):
    bit_exact: bool | None = None


@dataclass
class Row:
    name: str  # the norm, or EVAL_ROW
    norm: str
    statistics: str  # what the norm normalizes with: per token, batch statistics, running statistics
    required: bool = False
    alone_vs_batch: AloneVsBatch = field(default_factory=AloneVsBatch)
    cached_vs_full: Check = field(default_factory=Check)
    norm_alone: NormAlone = field(default_factory=NormAlone)
    passed: bool = False


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure whether each norm's outputs depend on the rest of the batch (LayerNorm vs BatchNorm)."
    )
    p.add_argument("--out_dir", default=None, help="folder holding ckpt.pt; without it, a small random model")
    p.add_argument("--ckpt", default=None, help="path of a checkpoint file (instead of --out_dir)")
    p.add_argument("--norms", nargs="+", default=list(NORMS), help=f"norms to run (default: {' '.join(NORMS)})")
    p.add_argument(
        "--require",
        nargs="+",
        default=None,
        help="rows that must pass, else exit 1 (default: every LayerNorm and rmsnorm run); e.g. --require batchnorm",
    )
    p.add_argument("--prompt_len", type=int, default=16, help="tokens per prompt (default 16)")
    p.add_argument("--new_tokens", type=int, default=32, help="greedy tokens decoded (default 32)")
    p.add_argument("--batch_size", type=int, default=4, help="prompts in the batch of check (1) (default 4)")
    p.add_argument("--tol", type=float, default=1e-5, help="float32 tolerance on |differences| (default 1e-5)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the random model, prompts and x (default 1337)")
    p.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda, cuda:N, mps")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    args = p.parse_args(argv)
    args.norms = _split(args.norms)
    bad = [n for n in args.norms if n not in NORMS]
    if bad or not args.norms:
        p.error(f"--norms: unknown {', '.join(map(repr, bad)) or 'empty list'}; valid: {', '.join(NORMS)}")
    if args.require is not None:
        args.require = _split(args.require)
        valid = list(args.norms) + ([EVAL_ROW] if "batchnorm" in args.norms else [])
        bad = [n for n in args.require if n not in valid]
        if bad:
            p.error(f"--require: {', '.join(map(repr, bad))} not among the rows run; valid: {', '.join(valid)}")
    for name in ("prompt_len", "new_tokens", "batch_size"):
        if getattr(args, name) < (2 if name == "batch_size" else 1):
            p.error(f"--{name} must be >= {2 if name == 'batch_size' else 1}, got {getattr(args, name)}")
    if not args.tol >= 0:
        p.error(f"--tol must be >= 0, got {args.tol}")
    return args


def _split(values: Sequence[str]) -> list[str]:
    """'a,b c' -> ['a', 'b', 'c'], without duplicates, in order."""
    out: list[str] = []
    for v in values:
        out += [s for s in v.split(",") if s and s not in out]
    return out


# --- the model -----------------------------------------------------------------------------------------------------


def base_weights(args: argparse.Namespace) -> tuple[GPTConfig, dict[str, torch.Tensor], str]:
    """The config and weights every row shares, and a line saying where they come from."""
    if args.out_dir is None and args.ckpt is None:
        torch.manual_seed(args.seed)
        config = replace(RANDOM_MODEL, norm="custom")
        return config, GPT(config).state_dict(), f"random init (seed {args.seed}), the same weights in every row"
    path = Path(args.ckpt) if args.ckpt else Path(args.out_dir) / "ckpt.pt"
    try:
        ckpt = load_checkpoint(path)
        config, state = checkpoint_config(ckpt), checkpoint_weights(ckpt)
    except CheckpointError as e:
        raise SystemExit(f"error: {e}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SystemExit(f"error: {path} is incomplete or malformed ({type(e).__name__}: {e})") from None
    note = (
        f"checkpoint {path} (trained with norm={config.norm}), loaded into every row's model with strict=False: "
        f"the norms share weight/bias; batchnorm's running_mean/running_var stay at their init (0 and 1) "
        f"unless the checkpoint has them"
    )
    return config, state, note


def build_model(config: GPTConfig, state: dict[str, torch.Tensor], norm: str, device: str) -> GPT:
    """GPT with `norm`, the shared weights loaded; only norm entries may be missing or left over."""
    model = GPT(replace(config, norm=norm))
    result = model.load_state_dict(state, strict=False)
    stray = [k for k in result.missing_keys + result.unexpected_keys if not _is_norm_key(k)]
    if stray:
        raise SystemExit(f"error: the weights do not fit a GPT with norm={norm!r}: {stray[:5]}")
    return model.to(device).eval()


def _is_norm_key(key: str) -> bool:
    return any(part in key for part in NORM_KEYS)


def norm_layers(model: GPT) -> list[nn.Module]:
    blocks = list(model.transformer.h)
    return [b.ln_1 for b in blocks] + [b.ln_2 for b in blocks] + [model.transformer.ln_f]


def triton_skip_reason(device: str) -> str | None:
    """Why the Triton norm can't run here (layernorm's own answer, first sentence), or None when it can."""
    try:
        make_norm("triton", 8)  # is triton importable
        check_triton_device(device)  # and can its kernels run on this device
    except TritonUnavailableError as e:
        return str(e).split(". To fix")[0]
    return None


# --- the checks ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def decode_greedy(model: GPT, prompts: torch.Tensor, steps: int) -> tuple[torch.Tensor, torch.Tensor, str | None]:
    """Greedy decoding, token by token with the KV cache: what GPT.generate(temperature=0) does within block_size.

    Prefill the prompts [B, P] once, then feed each new token alone ([B, 1]). Returns the tokens [B, P + n], the
    logits each step chose from [B, n, V], and the error that stopped it early (n < steps), if any.
    """
    cache = KVCache(model.config, prompts.size(0), prompts.device, model.lm_head.weight.dtype)
    tokens, step_logits, error = prompts, [], None
    try:
        logits = model(prompts, kv_cache=cache)[0][:, -1]
        for step in range(steps):
            step_logits.append(logits)
            tokens = torch.cat((tokens, logits.argmax(-1, keepdim=True)), dim=1)
            if step + 1 < steps:
                logits = model(tokens[:, -1:], kv_cache=cache)[0][:, -1]
    except TritonUnavailableError:
        raise  # not a measurement: the row is skipped
    except (ValueError, RuntimeError) as e:
        error = f"step {len(step_logits)}: {_first_line(e)}"
    empty = torch.zeros(prompts.size(0), 0, model.config.vocab_size, device=prompts.device)
    return tokens, torch.stack(step_logits, dim=1) if step_logits else empty, error


def check_alone_vs_batch(model: GPT, prompts: torch.Tensor, steps: int) -> tuple[AloneVsBatch, tuple | None]:
    """Check (1); also returns the batch's decoding (tokens, logits) for check (2), or None if it failed."""
    alone_tokens, alone_logits, alone_error = decode_greedy(model, prompts[:1], steps)
    batch_tokens, batch_logits, batch_error = decode_greedy(model, prompts, steps)
    n = min(alone_logits.size(1), batch_logits.size(1))
    result = AloneVsBatch(steps_compared=n)
    if alone_error or batch_error:
        result.error = f"alone, {alone_error}" if alone_error else f"in the batch, {batch_error}"
    if n > 0:
        per_step = (alone_logits[0, :n] - batch_logits[0, :n]).abs().amax(dim=-1)
        result.per_step_max_abs_diff = per_step.tolist()
        result.max_abs_diff = per_step.max().item()
        p = prompts.size(1)
        differ = (alone_tokens[0, p : p + n] != batch_tokens[0, p : p + n]).nonzero()
        result.first_divergent_step = differ[0].item() if len(differ) else None
        result.tokens_agree = result.error is None and not len(differ)
    batch = None if batch_error else (batch_tokens, batch_logits)
    return result, batch


@torch.no_grad()
def check_cached_vs_full(model: GPT, tokens: torch.Tensor, step_logits: torch.Tensor) -> Check:
    """Check (2): step s's logits were computed at position P - 1 + s of the sequence; one pass over it all."""
    steps = step_logits.size(1)
    p = tokens.size(1) - steps
    try:
        full = model(tokens[:, :-1])[0][:, p - 1 :]
    except TritonUnavailableError:
        raise  # not a measurement: the row is skipped
    except (ValueError, RuntimeError) as e:
        return Check(error=_first_line(e))
    return Check(max_abs_diff=(full - step_logits).abs().max().item())


@torch.no_grad()
def check_norm_alone(norm: nn.Module, x: torch.Tensor) -> NormAlone:
    """Check (3): norm(x)[i] against norm(x[i:i+1]) for every i, on a copy of the layer (its buffers may move)."""
    norm = copy.deepcopy(norm)
    try:
        together = norm(x)
        alone = torch.cat([norm(x[i : i + 1]) for i in range(x.size(0))])
    except TritonUnavailableError:
        raise  # not a measurement: the row is skipped
    except (ValueError, RuntimeError) as e:
        return NormAlone(error=_first_line(e))
    return NormAlone(max_abs_diff=(together - alone).abs().max().item(), bit_exact=torch.equal(together, alone))


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def run_row(row: Row, model: GPT, prompts: torch.Tensor, steps: int, x: torch.Tensor, tol: float) -> Row:
    row.alone_vs_batch, batch = check_alone_vs_batch(model, prompts, steps)
    if batch is None:
        row.cached_vs_full = Check(error="the batched decoding failed: see (1)")
    else:
        row.cached_vs_full = check_cached_vs_full(model, *batch)
    row.norm_alone = check_norm_alone(model.transformer.ln_f, x)
    checks = (row.alone_vs_batch, row.cached_vs_full, row.norm_alone)
    row.passed = bool(row.alone_vs_batch.tokens_agree) and all(
        c.error is None and c.max_abs_diff is not None and c.max_abs_diff <= tol for c in checks
    )
    return row


# --- the report ----------------------------------------------------------------------------------------------------


def _diff(check: Check) -> str:
    if check.max_abs_diff is None:
        return "error"
    if isinstance(check, NormAlone) and check.bit_exact:
        return "bit-exact"
    return "0" if check.max_abs_diff == 0 else f"{check.max_abs_diff:.1e}"


def _tokens(r: AloneVsBatch, steps: int) -> str:
    if r.tokens_agree:
        return f"{steps}/{steps} agree"
    if r.first_divergent_step is not None:
        return f"differ from step {r.first_divergent_step}"
    if r.error:
        return f"{'alone' if r.error.startswith('alone') else 'batch'} fails at step {r.steps_compared}"
    return "-"


def format_table(rows: list[Row], steps: int) -> list[str]:
    header = ("row", "normalizes with", "(1) alone vs batch", "tokens", "(2) cached vs full", "(3) norm alone")
    header += ("result",)
    cells = [header] + [
        (
            r.name,
            r.statistics,
            _diff(r.alone_vs_batch),
            _tokens(r.alone_vs_batch, steps),
            _diff(r.cached_vs_full),
            _diff(r.norm_alone),
            ("PASS" if r.passed else "FAIL") + ("" if r.required else "  (not required)"),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths if w))
    return lines


def report(result: dict[str, Any], rows: list[Row]) -> str:
    m = result["model"]
    out = [
        "Batch independence: does a sequence's output depend on the other sequences in its batch?",
        f"model: {result['source']}",
        f"       {m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, block {m['block_size']}, "
        f"vocab {m['vocab_size']}; device {result['device']}, float32, dropout off (eval)",
        f"decoding: prompts of {result['prompt_len']} tokens, {result['new_tokens']} greedy new tokens, a batch of "
        f"{result['batch_size']} different prompts; tolerance {result['tolerance']:g}",
    ]
    out += [f"note: {n}" for n in result["notes"]]
    out += [f"skipped {name}: {why}" for name, why in result["skipped"].items()]
    out += [""] + format_table(rows, result["new_tokens"]) + [""]
    out += [f"  {line}" for line in LEGEND]
    errors = [(r.name, c.error) for r in rows for c in (r.alone_vs_batch, r.cached_vs_full, r.norm_alone) if c.error]
    out += [f"  {name}: {err}" for name, err in errors]
    if any(r.norm == "batchnorm" for r in rows):
        out += ["", WHY_BATCHNORM_FAILS]
        if any(r.name == EVAL_ROW for r in rows):
            out += [WHY_EVAL]
    failed = [r.name for r in rows if r.required and not r.passed]
    required = [r.name for r in rows if r.required]
    out += [""]
    if failed:
        out += [f"FAIL: required rows that failed: {', '.join(failed)}"]
    else:
        out += [f"OK: every required row passes ({', '.join(required) or 'none required'})"]
    return "\n".join(out)


# --- main ----------------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the table (or JSON); 0 when every required row passes, else 1."""
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.out_dir is None and args.ckpt is None:
        # The random model is tiny: one thread is as fast, and far faster when other work shares the cores
        # (idle OpenMP threads spin-waiting for a busy core).
        torch.set_num_threads(1)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(threads)


def _run(args: argparse.Namespace) -> int:
    device = pick_device(args.device)
    torch.set_float32_matmul_precision("highest")  # no TF32: the comparisons are about float32
    config, state, source = base_weights(args)
    notes: list[str] = []
    prompt_len, steps = args.prompt_len, args.new_tokens
    if prompt_len + steps > config.block_size:  # check (2) compares within one block (see model.py)
        prompt_len = min(prompt_len, max(1, config.block_size // 2))
        steps = max(1, config.block_size - prompt_len)
        notes.append(f"prompt {prompt_len} + new {steps} tokens, to fit block_size {config.block_size}")

    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(config.vocab_size, (args.batch_size, prompt_len), generator=gen).to(device)
    x = (torch.randn(args.batch_size, prompt_len, config.n_embd, generator=gen) * 2 + 1).to(device)

    skipped: dict[str, str] = {}
    rows: list[Row] = []
    plan = [(n, n) for n in args.norms] + ([(EVAL_ROW, "batchnorm")] if "batchnorm" in args.norms else [])
    for name, norm in plan:
        if norm == "triton" and (why := triton_skip_reason(device)):
            skipped[name] = why
            continue
        try:
            model = build_model(config, state, norm, device)
        except TritonUnavailableError as e:
            skipped[name] = _first_line(e)
            continue
        statistics = "per token"
        if norm == "batchnorm":
            batch_stats = name != EVAL_ROW
            for layer in norm_layers(model):
                layer.train(batch_stats)  # the rest of the model stays in eval mode (no dropout)
            statistics = "batch statistics" if batch_stats else "running averages"
        required = (name in args.require) if args.require is not None else norm in LAYERNORMS + ("rmsnorm",)
        row = Row(name=name, norm=norm, statistics=statistics, required=required)
        try:
            rows.append(run_row(row, model, prompts, steps, x, args.tol))
        except TritonUnavailableError as e:  # the Triton norm built but can't run its kernels here
            skipped[name] = _first_line(e)
    missing = [n for n in (args.require or []) if n in skipped]
    notes += [f"{n} is required but was skipped: counted as a failure" for n in missing]

    ok = all(r.passed for r in rows if r.required) and not missing
    result = {
        "source": source,
        "model": {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")},
        "device": device,
        "dtype": "float32",
        "prompt_len": prompt_len,
        "new_tokens": steps,
        "batch_size": args.batch_size,
        "tolerance": args.tol,
        "notes": notes,
        "skipped": skipped,
        "legend": list(LEGEND),
        "rows": [asdict(r) for r in rows],
        "ok": ok,
    }
    print(json.dumps(result, indent=2) if args.json else report(result, rows), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
