"""Does a sequence's output depend on what else is in its batch? LayerNorm: no. BatchNorm: yes. Measured.

    python batch_independence.py                       # a small random model, seeded
    python batch_independence.py --out_dir=out-shakespeare-char
    TRITON_INTERPRET=1 python batch_independence.py    # include the Triton LayerNorm on a CPU-only machine
    python batch_independence.py --json

Every row runs the same weights with another norm (model.eval(): no dropout) through the three checks of LEGEND,
except that BatchNorm's layers normalize with the statistics of the batch in front of them (training mode): the case
this demo is about; the batchnorm-eval row uses its running averages. A row passes when every difference is within
--tol (float32) and the greedy tokens agree; the exit status is 1 when a row in --require fails (by default every
LayerNorm and RMSNorm that ran), so the script doubles as a check.
"""

import argparse
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from checkpoint import CheckpointError, checkpoint_config, checkpoint_weights, load_checkpoint
from device import DeviceError, resolve_device
from layernorm import NORMS, TritonUnavailableError, check_triton_device, make_norm
from model import GPT, GPTConfig, KVCache

EVAL_ROW = "batchnorm-eval"
NORM_NAMES = ("ln_1", "ln_2", "ln_f")  # model.py's norm layers: their parameters and buffers live under these names
RANDOM_MODEL = GPTConfig(block_size=64, vocab_size=65, n_layer=2, n_head=4, n_embd=64)
Logits = list[torch.Tensor]  # the logits [B, V] each decoded step chose its token from
CHECKS = ("alone_vs_batch", "cached_vs_full", "norm_alone")
HEADER = ("row", "normalizes with", "(1) alone vs batch", "tokens", "(2) cached vs full", "(3) norm alone", "result")

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
    split = lambda values: list(dict.fromkeys(s for v in values for s in v.split(",") if s))  # 'a,b a' -> [a, b]
    args.norms = split(args.norms)
    bad = [n for n in args.norms if n not in NORMS]
    if bad or not args.norms:
        p.error(f"--norms: unknown {', '.join(map(repr, bad)) or 'empty list'}; valid: {', '.join(NORMS)}")
    if args.require is not None:
        args.require = split(args.require)
        valid = args.norms + ([EVAL_ROW] if "batchnorm" in args.norms else [])
        if bad := [n for n in args.require if n not in valid]:
            p.error(f"--require: {', '.join(map(repr, bad))} not among the rows run; valid: {', '.join(valid)}")
    for name, least in (("prompt_len", 1), ("new_tokens", 1), ("batch_size", 2), ("tol", 0)):
        if not getattr(args, name) >= least:  # written `not >=` so that a nan tolerance is refused too
            p.error(f"--{name} must be >= {least}, got {getattr(args, name)}")
    return args


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
    stray = [k for k in result.missing_keys + result.unexpected_keys if not any(f"{n}." in k for n in NORM_NAMES)]
    if stray:
        raise SystemExit(f"error: the weights do not fit a GPT with norm={norm!r}: {stray[:5]}")
    return model.to(device).eval()


def attempt(measure: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """The checks' one error path: (measure(...), None), or (None, 'Kind: first line') when it raised a ValueError
    or RuntimeError. TritonUnavailableError is not a measurement: it propagates, and the row is skipped."""
    try:
        return measure(*args, **kwargs), None
    except TritonUnavailableError:
        raise
    except (ValueError, RuntimeError) as e:
        return None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def decode_greedy(model: GPT, prompts: torch.Tensor, steps: int) -> tuple[Logits, str | None]:
    """Greedy decoding, token by token with the KV cache: what GPT.generate(temperature=0) does within block_size.
    Prefill the prompts [B, P] once, then feed each new token alone ([B, 1]). Returns the logits [B, V] each step
    chose its token from (their argmax), and the error that stopped it before `steps`, if any."""
    cache = KVCache(model.config, prompts.size(0), prompts.device, model.lm_head.weight.dtype)
    logits: Logits = []
    error = None
    while len(logits) < steps and error is None:
        out, error = attempt(model, logits[-1].argmax(-1, keepdim=True) if logits else prompts, kv_cache=cache)
        logits += [] if out is None else [out[0][:, -1]]
    return logits, error and f"step {len(logits)}: {error}"


def check_alone_vs_batch(model: GPT, prompts: torch.Tensor, steps: int) -> tuple[dict[str, Any], Logits | None]:
    """Check (1); also returns the batch's step logits for check (2), or None if its decoding failed."""
    alone, alone_error = decode_greedy(model, prompts[:1], steps)
    batch, batch_error = decode_greedy(model, prompts, steps)
    error = f"alone, {alone_error}" if alone_error else batch_error and f"in the batch, {batch_error}"
    pairs = list(zip(alone, batch, strict=False))  # the steps both decoded: row 0 alone and row 0 in the batch
    per_step = [(a[0] - b[0]).abs().max().item() for a, b in pairs]
    differ = [step for step, (a, b) in enumerate(pairs) if a[0].argmax() != b[0].argmax()]
    result = {
        "max_abs_diff": max(per_step, default=None),
        "error": error,
        "per_step_max_abs_diff": per_step,
        "steps_compared": len(pairs),
        "tokens_agree": (error is None and not differ) if pairs else None,
        "first_divergent_step": differ[0] if differ else None,  # the first step whose greedy token differs
    }
    return result, None if batch_error else batch


def check_cached_vs_full(model: GPT, prompts: torch.Tensor, step_logits: Logits | None) -> dict[str, Any]:
    """Check (2): step s chose from the logits at position P - 1 + s; here one forward pass over the whole sequence."""
    if step_logits is None:
        return {"max_abs_diff": None, "error": "the batched decoding failed: see (1)"}
    cached = torch.stack(step_logits, dim=1)  # [B, n, V]
    tokens = torch.cat((prompts, cached.argmax(-1)[:, :-1]), dim=1)  # the last chosen token is never fed back
    out, error = attempt(model, tokens)
    diff = None if out is None else (out[0][:, prompts.size(1) - 1 :] - cached).abs().max().item()
    return {"max_abs_diff": diff, "error": error}


def check_norm_alone(norm: torch.nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Check (3): norm(x)[i] against norm(x[i:i+1]) for every i (the model's last use: BatchNorm's buffers may move)."""
    out, error = attempt(lambda: (norm(x), torch.cat([norm(x[i : i + 1]) for i in range(x.size(0))])))
    if out is None:
        return {"max_abs_diff": None, "error": error, "bit_exact": None}
    return {"max_abs_diff": (out[0] - out[1]).abs().max().item(), "error": None, "bit_exact": torch.equal(*out)}


@torch.no_grad()
def run_row(name: str, model: GPT, prompts: torch.Tensor, x: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """The three checks on one model; BatchNorm's layers normalize with batch statistics, except in EVAL_ROW."""
    norm = model.config.norm
    for layer_name, layer in model.named_modules():
        if norm == "batchnorm" and layer_name.rsplit(".", 1)[-1] in NORM_NAMES:
            layer.train(name != EVAL_ROW)  # the rest of the model stays in eval mode (no dropout)
    alone_vs_batch, batch = check_alone_vs_batch(model, prompts, args.new_tokens)
    checks = (alone_vs_batch, check_cached_vs_full(model, prompts, batch), check_norm_alone(model.transformer.ln_f, x))
    within_tol = all(c["error"] is None and c["max_abs_diff"] <= args.tol for c in checks)
    return {
        "name": name,
        "norm": norm,
        "statistics": {"batchnorm": "batch statistics", EVAL_ROW: "running averages"}.get(name, "per token"),
        "required": name in args.require if args.require is not None else norm != "batchnorm",
        **dict(zip(CHECKS, checks, strict=True)),
        "passed": within_tol and alone_vs_batch["tokens_agree"],  # within_tol: no error, so the tokens were compared
    }


def _diff(check: dict[str, Any]) -> str:
    if check["max_abs_diff"] is None:
        return "error"
    if check.get("bit_exact"):
        return "bit-exact"
    return "0" if check["max_abs_diff"] == 0 else f"{check['max_abs_diff']:.1e}"


def _tokens(check: dict[str, Any], steps: int) -> str:
    if check["tokens_agree"]:
        return f"{steps}/{steps} agree"
    if check["first_divergent_step"] is not None:
        return f"differ from step {check['first_divergent_step']}"
    return f"{'alone' if check['error'].startswith('alone') else 'batch'} fails at step {check['steps_compared']}"


def format_table(rows: list[dict[str, Any]], steps: int) -> list[str]:
    cells = [HEADER]
    for r in rows:
        ab = r["alone_vs_batch"]
        checks = (_diff(ab), _tokens(ab, steps), _diff(r["cached_vs_full"]), _diff(r["norm_alone"]))
        verdict = ("PASS" if r["passed"] else "FAIL") + ("" if r["required"] else "  (not required)")
        cells.append((r["name"], r["statistics"], *checks, verdict))
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return lines[:1] + ["  ".join("-" * w for w in widths)] + lines[1:]


def report(result: dict[str, Any]) -> str:
    m, rows = result["model"], result["rows"]
    out = [
        "Batch independence: does a sequence's output depend on the other sequences in its batch?",
        f"model: {result['source']}",
        f"       {m['n_layer']} layers, {m['n_head']} heads, {m['n_embd']} wide, block {m['block_size']}, "
        f"vocab {m['vocab_size']}; device {result['device']}, float32, dropout off (eval)",
        f"decoding: prompts of {result['prompt_len']} tokens, {result['new_tokens']} greedy new tokens, a batch of "
        f"{result['batch_size']} different prompts; tolerance {result['tolerance']:g}",
        *(f"note: {n}" for n in result["notes"]),
        *(f"skipped {name}: {why}" for name, why in result["skipped"].items()),
        "",
        *format_table(rows, result["new_tokens"]),
        "",
        *(f"  {line}" for line in LEGEND),
        *(f"  {r['name']}: {r[c]['error']}" for r in rows for c in CHECKS if r[c]["error"]),
    ]
    if any(r["norm"] == "batchnorm" for r in rows):
        out += ["", WHY_BATCHNORM_FAILS] + ([WHY_EVAL] if any(r["name"] == EVAL_ROW for r in rows) else [])
    required = ", ".join(r["name"] for r in rows if r["required"]) or "none required"
    if result["failed"]:
        return "\n".join([*out, "", f"FAIL: required rows that failed: {', '.join(result['failed'])}"])
    return "\n".join([*out, "", f"OK: every required row passes ({required})"])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks, print the table (or JSON); 0 when every required row passes, else 1."""
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
    except DeviceError as e:
        raise SystemExit(f"error: --device: {e}") from None
    threads = torch.get_num_threads()
    if args.out_dir is None and args.ckpt is None:
        # The random model is tiny: one thread is as fast, and far faster when other work shares the cores
        # (idle OpenMP threads spin-waiting for a busy core).
        torch.set_num_threads(1)
    try:
        result = run(args, device)
    finally:
        torch.set_num_threads(threads)
    print(json.dumps(result, indent=2) if args.json else report(result), flush=True)
    return 0 if result["ok"] else 1


def run(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """Every row's checks on the shared weights, and the setting they ran in: what --json prints."""
    torch.set_float32_matmul_precision("highest")  # no TF32: the comparisons are about float32
    config, state, source = base_weights(args)
    notes = []  # from here on, args.prompt_len and args.new_tokens are what ran
    if args.prompt_len + args.new_tokens > config.block_size:  # check (2) compares within one block (see model.py)
        args.prompt_len = min(args.prompt_len, max(1, config.block_size // 2))
        args.new_tokens = max(1, config.block_size - args.prompt_len)
        notes.append(f"prompt {args.prompt_len} + new {args.new_tokens} tokens, to fit block_size {config.block_size}")
    gen = torch.Generator().manual_seed(args.seed)
    prompts = torch.randint(config.vocab_size, (args.batch_size, args.prompt_len), generator=gen).to(device)
    x = (torch.randn(args.batch_size, args.prompt_len, config.n_embd, generator=gen) * 2 + 1).to(device)
    rows, skipped = [], {}
    for name in args.norms + ([EVAL_ROW] if "batchnorm" in args.norms else []):
        norm = "batchnorm" if name == EVAL_ROW else name
        try:
            if norm == "triton":  # can triton be imported, and can its kernels run here? If not, skip the row now
                make_norm("triton", 8)
                check_triton_device(device)
            rows.append(run_row(name, build_model(config, state, norm, device), prompts, x, args))
        except TritonUnavailableError as e:  # not a measurement: the row is skipped, with layernorm's reason
            skipped[name] = str(e).split(". To fix")[0]
    missing = [n for n in args.require or [] if n in skipped]
    notes += [f"{n} is required but was skipped: counted as a failure" for n in missing]
    failed = [r["name"] for r in rows if r["required"] and not r["passed"]] + missing
    return {
        "source": source,
        "model": {k: getattr(config, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")},
        "device": device,
        "dtype": "float32",
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "batch_size": args.batch_size,
        "tolerance": args.tol,
        "notes": notes,
        "skipped": skipped,
        "legend": list(LEGEND),
        "rows": rows,
        "failed": failed,
        "ok": not failed,
    }


if __name__ == "__main__":
    raise SystemExit(main())
