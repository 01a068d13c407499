"""Helpers for several test files: the one tiny model, LayerNorms in float64, norms that can't run here, tiny runs.

Training runs use the tiny model TINY (2 layers, 32 wide, block 16) with batch 4 on a tiny character dataset written
by `make_dataset`, in-process through `command(capsys, train.cli, argv)` where a process adds nothing. Subprocesses
run with one thread: on a machine busy with other work torch's multi-threaded kernels slow down badly, and one
thread keeps results identical between processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from layernorm import TritonUnavailableError, layer_norm_naive, make_norm
from machinery.checkpoint import FORMAT, save_checkpoint
from machinery.command import run_command
from model import GPT, GPTConfig

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]  # the README, then the chapters in reading order
TEXT = "the quick brown fox jumps over the lazy dog; a stitch in time saves nine.\n" * 200
VOCAB = len(set(TEXT))  # 30

# The tests' model: every test that needs a GPT starts from this one (replace() what a test is about).
TINY = GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=32)
MODEL_FLAGS = ("n_layer", "n_head", "n_embd", "block_size")
# TINY as train.py's options, and a short run of it: tiny_args, and what test_readme_commands appends to train.py.
TINY_TRAIN = [
    *(f"--{name}={getattr(TINY, name)}" for name in MODEL_FLAGS),
    *"--batch_size=4 --eval_iters=2 --log_interval=1 --warmup_iters=2 --lr_decay_iters=40 --device=cpu".split(),
    "--sample_at_end=False",
]


def tiny_model(norm: str = "builtin", seed: int = 0, **overrides: object) -> GPT:
    """TINY (with `overrides`) and `norm`, its weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return GPT(replace(TINY, norm=norm, **overrides)).eval()


def randomize_norms(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Every norm's weight and bias away from their init (1, 0), so a test sees whether they are used."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f." in name or name in ("weight", "bias"):
                noise = 0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
                p.copy_(1 + noise if name.endswith("weight") else noise)
    return model


def sharpen_logits(model: GPT, factor: float = 5.0) -> GPT:
    """Larger token embeddings, so larger logits: greedy choices are clear-cut, not float near-ties."""
    with torch.no_grad():
        model.transformer.wte.weight.mul_(factor)
    return model


# ---- Triton: where it can run, and the skip where it cannot ----


def _triton_skip_reason() -> str | None:
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton cannot be imported here (it ships for Linux only): the Triton norm and kernels are skipped"
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return "Triton's kernels need a CUDA GPU, or TRITON_INTERPRET=1 to run on the CPU"
    return None


TRITON_SKIP = _triton_skip_reason()
needs_triton = pytest.mark.skipif(TRITON_SKIP is not None, reason=TRITON_SKIP or "")


def skip_an_interpreter_block(code: str) -> None:
    """Skip a doc's Python block that runs the Triton kernels on CPU tensors, where it cannot: triton missing, or
    imported here without its interpreter (on a CUDA machine), which the block's own TRITON_INTERPRET=1 comes too
    late to switch on."""
    if "layernorm_triton" not in code:
        return
    if TRITON_SKIP is not None:
        pytest.skip(TRITON_SKIP)
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported here without TRITON_INTERPRET=1: the block needs a new python")


def norm_params(names: Sequence[str], slow_triton: bool = False) -> list:
    """`names` for pytest.mark.parametrize, with "triton" skipped where Triton cannot run (and, with slow_triton,
    left out of the quick tier: a whole model through Triton's interpreter takes seconds)."""
    triton_marks = [needs_triton, pytest.mark.slow] if slow_triton else [needs_triton]
    return [pytest.param(n, marks=triton_marks) if n == "triton" else n for n in names]


def skip_unless_runs(norm: str) -> None:
    """Skip a test for a norm that can't run here (Triton without CUDA or its CPU interpreter)."""
    try:
        make_norm(norm, 8)(torch.randn(2, 8))
    except TritonUnavailableError as e:
        pytest.skip(f"{norm} can't run here: {str(e).splitlines()[0]}")


# ---- LayerNorms against float64 ----

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_inputs(
    lead: Sequence[int], C: int, dtype: torch.dtype = torch.float32, seed: int = 0, offset: float = 2.0
) -> tuple[torch.Tensor, ...]:
    """(x, weight, bias, dy) on DEVICE: x [*lead, C] of nonzero mean, non-unit weight and bias, a random dy."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, C, generator=g, dtype=torch.float64) * 1.5 + offset
    w = torch.randn(C, generator=g, dtype=torch.float64) * 0.5 + 1.0
    b = torch.randn(C, generator=g, dtype=torch.float64) * 0.3
    dy = torch.randn(*lead, C, generator=g, dtype=torch.float64)
    return tuple(t.to(device=DEVICE, dtype=dtype) for t in (x, w, b, dy))


def layer_norm_reference(x, weight, bias, dy, eps=1e-5, correction=0, name="layernorm") -> tuple[torch.Tensor, ...]:
    """(y, dx, dweight[, dbias]) in float64, autograd through the formula (of RMSNorm for name="rmsnorm")."""
    x, weight = x.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    bias = None if bias is None else bias.detach().double().requires_grad_()
    if name == "rmsnorm":
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * weight
        y = y if bias is None else y + bias
    else:
        y = layer_norm_naive(x, weight, bias, eps, correction)
    inputs = (x, weight) if bias is None else (x, weight, bias)
    return y.detach(), *torch.autograd.grad(y, inputs, dy.double())


def norm_with(name: str, weight: torch.Tensor, bias: torch.Tensor | None, eps: float = 1e-5) -> torch.nn.Module:
    """make_norm(name)'s module holding `weight` and `bias` (None: bias=False), in their dtype and on their device."""
    norm = make_norm(name, weight.shape[0], bias=bias is not None, eps=eps).to(weight)
    with torch.no_grad():
        norm.weight.copy_(weight)
        if bias is not None:
            norm.bias.copy_(bias)
    return norm


def forward_backward(name: str, x, weight, bias, dy, eps=1e-5) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """y and (dx, dweight[, dbias]) of norm_with(name, weight, bias) on x (its strides kept), for upstream dy."""
    norm = norm_with(name, weight, bias, eps)
    x = x.detach().requires_grad_()
    y = norm(x)
    return y.detach(), torch.autograd.grad(y, (x, *norm.parameters()), dy)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| over max |ref| (0 when both are 0): one number per tensor, insensitive to tiny entries."""
    scale = ref.abs().max().item()
    err = (out.double() - ref).abs().max().item()
    return err / scale if scale > 0 else err


def assert_matches_reference(name: str, x, weight, bias, dy, tol: float = 1e-5) -> None:
    y, grads = forward_backward(name, x, weight, bias, dy)
    for out, ref in zip((y, *grads), layer_norm_reference(x, weight, bias, dy, name=name), strict=True):
        assert rel_err(out, ref) <= tol, rel_err(out, ref)


class RunsCodeOnLoad:
    """Pickled, this object is the call `function(*args)`: unpickling it makes that call."""

    def __init__(self, function: Callable[..., object], *args: object) -> None:
        self.function = function
        self.args = args

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return self.function, self.args


# What a malicious checkpoint could hold: an object whose unpickling writes `marker`. torch's weights_only loader
# refuses both, with different errors: Path.touch is a global it does not allow, os.system comes from a module it
# blocks outright.
PAYLOADS: dict[str, Callable[[Path], RunsCodeOnLoad]] = {
    "Path.touch": lambda marker: RunsCodeOnLoad(Path.touch, marker),
    "os.system": lambda marker: RunsCodeOnLoad(os.system, f"echo ran > {shlex.quote(str(marker))}"),
}


def make_dataset(folder: Path, text: str = TEXT, val_fraction: float = 0.1) -> Path:
    """A character-level dataset in the data/<name>/ format: train.bin, val.bin (uint16), meta.json."""
    folder.mkdir(parents=True, exist_ok=True)
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    n = len(ids) - int(len(ids) * val_fraction)
    ids[:n].tofile(folder / "train.bin")
    ids[n:].tofile(folder / "val.bin")
    sha256 = {
        f"{split}_sha256": hashlib.sha256(part.tobytes()).hexdigest()
        for split, part in (("train", ids[:n]), ("val", ids[n:]))
    }
    meta = {
        "vocab_size": len(chars),
        "tokenizer": {"kind": "char", "itos": chars},
        "train_tokens": n,
        "val_tokens": len(ids) - n,
        "train_bytes": len(text[:n].encode("utf-8")),
        "val_bytes": len(text[n:].encode("utf-8")),
        **sha256,
    }
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder


def tiny_args(data_dir: Path, out_dir: Path, *extra: str) -> list[str]:
    return [f"--data_dir={data_dir}", f"--out_dir={out_dir}", *TINY_TRAIN, *extra]


def subprocess_env(drop: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **extra}


# Downloads forced to fail at once, even on a machine with internet access.
NO_DOWNLOADS = {name: "http://127.0.0.1:9" for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")}
NO_DOWNLOADS.update(NO_PROXY="", no_proxy="")


def python(
    *args: str | Path, cwd: Path = ROOT, timeout: float = 120, drop: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    """`python ARGS` run by this suite's interpreter from `cwd`, its output captured."""
    argv = [sys.executable, *map(str, args)]
    env_ = subprocess_env(drop, **env)
    return subprocess.run(argv, cwd=cwd, env=env_, capture_output=True, text=True, encoding="utf-8", timeout=timeout)


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str


def command(capsys: pytest.CaptureFixture[str], main: Callable[[list[str]], object], argv: Sequence[str]) -> Run:
    """A command's main(ARGV) in this process, through the front door its `python COMMAND ARGV` exits by
    (machinery.command.run_command): the exit status, and what it printed."""
    capsys.readouterr()
    code = run_command(lambda: main(list(argv)))
    out, err = capsys.readouterr()
    return Run(code, out, err)


def diverge_at(monkeypatch: pytest.MonkeyPatch, at: int, factor: float) -> None:
    """The model's training loss multiplied by `factor` (nan, inf) at its `at`-th training forward pass (counted
    from 0: iteration `at` of a run from scratch with one micro-step). Everything after the loss (backward, the
    weights, the read-back that must notice) is the real thing."""
    forward = GPT.forward
    calls = [0]

    def diverging_forward(self: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None, kv_cache=None):
        logits, loss = forward(self, idx, targets, kv_cache)
        if self.training and targets is not None:
            if calls[0] == at:
                loss = loss * factor
            calls[0] += 1
        return logits, loss

    monkeypatch.setattr(GPT, "forward", diverging_forward)


def start(*args: str | Path, **env: str) -> subprocess.Popen[str]:
    """`python ARGS` started in the background from the repository's root, `env` added to its environment."""
    return subprocess.Popen(
        [sys.executable, *map(str, args)],
        cwd=ROOT,
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:  # (what it printed: stderr, or stdout where stderr goes into it)
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.communicate()}"[-3000:])
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the run")
        time.sleep(0.02)


def n_train_records(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.exists() else 0


def records(out_dir: Path, kind: str) -> list[dict]:
    lines = (out_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def train_losses(out_dir: Path) -> dict[int, float]:
    return {r["iter"]: r["loss"] for r in records(out_dir, "train")}


def tree(root: Path) -> dict[str, bytes]:
    """Every file under `root` and its bytes: what 'nothing on disk changed' compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_one_line_error(proc: subprocess.CompletedProcess[str] | Run, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def save_model(path: Path, model: GPT, tokenizer: dict, config: dict | None = None) -> None:
    """`model` saved at `path` in the form train.py saves it, with no training state to resume from."""
    checkpoint = {
        "format": FORMAT,
        "model": model.state_dict(),
        "model_args": asdict(model.config),
        "optimizer": {},
        "iter_num": 0,
        "best_val_loss": 9.9,
        "config": config or {},
        "tokenizer": tokenizer,
        "rng": {},
    }
    save_checkpoint(path, checkpoint)


# ---- nanoGPT's files, as its train.py and prepare.py write them ----

CHARS = sorted(set("\n !',-.:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"))  # Tiny Shakespeare's


def nanogpt_model(vocab_size: int, bias: bool, n_embd: int = 32) -> GPT:
    """A random GPT in nanoGPT's shape (its GPT and this one share names and layout), TINY at block 32; norms and
    embeddings moved off their init, so that every weight matters and the greedy choices are clear-cut."""
    model = tiny_model(block_size=32, vocab_size=vocab_size, n_embd=n_embd, bias=bias)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".ln_" in name or "ln_f" in name or name.endswith(".bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return sharpen_logits(model)


def save_nanogpt_checkpoint(out_dir: Path, model: GPT) -> Path:
    """ckpt.pt as nanoGPT's train.py saves it from a compiled model (torch.compile's "_orig_mod." on every key),
    with the "attn.bias" causal masks it registers where PyTorch has no flash attention."""
    c = model.config
    state = {f"_orig_mod.{k}": v for k, v in model.state_dict().items()}
    mask = torch.tril(torch.ones(c.block_size, c.block_size)).view(1, 1, c.block_size, c.block_size)
    state.update({f"_orig_mod.transformer.h.{i}.attn.bias": mask for i in range(c.n_layer)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 4, dtype=torch.long))[0].sum().backward()
    optimizer.step()  # a real optimizer state: tensors and step counts
    model.zero_grad(set_to_none=True)
    model_args = {k: getattr(c, k) for k in ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")}
    checkpoint = {
        "model": state,
        "optimizer": optimizer.state_dict(),
        "model_args": {**model_args, "dropout": 0.0},
        "iter_num": 40,
        "best_val_loss": torch.tensor(2.5),  # nanoGPT's estimate_loss returns tensors
        "config": {"out_dir": out_dir.name, "dataset": "shakespeare_char", "compile": True, "learning_rate": 1e-3},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out_dir / "ckpt.pt")
    return out_dir / "ckpt.pt"


def write_meta(path: Path, chars: list[str] = CHARS, protocol: int | None = None) -> Path:
    """meta.pkl as nanoGPT's data/shakespeare_char/prepare.py writes it."""
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": {ch: i for i, ch in enumerate(chars)}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(meta, protocol))
    return path


def make_bpe_dataset(folder: Path, ids: np.ndarray) -> Path:
    """Token ids of GPT-2's BPE as a prepared dataset in the data/<name>/ format, the first 9/10 to train on."""
    folder.mkdir(parents=True, exist_ok=True)
    n = len(ids) * 9 // 10
    ids[:n].astype(np.uint16).tofile(folder / "train.bin")
    ids[n:].astype(np.uint16).tofile(folder / "val.bin")
    meta = {"vocab_size": 50257, "tokenizer": {"kind": "tiktoken", "encoding": "r50k_base"}}
    (folder / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return folder
